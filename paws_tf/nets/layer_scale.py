"""LayerScale: a learned per-channel scale of a residual branch (CaiT,
arXiv 2103.17239 Sec. 2.1), as DINOv2's ViT blocks hold it."""

import tensorflow as tf
import tf_keras

# facebookresearch/dinov2 hub/backbones.py `_make_dinov2_model` builds its
# ViTs with `init_values=1.0`. Its weight is named `gamma`, so that LARS
# leaves it out of weight decay with the norms' (lars.py
# BIAS_AND_NORM_NAMES; AdamW leaves it out by its rank, 1), as DINOv2 does
# (dinov2 utils/param_groups.py `get_params_groups_with_decay`:
# wd_multiplier 0 for "gamma" in the name).
INIT_VALUE = 1.0


@tf_keras.saving.register_keras_serializable(package='paws_tf')
class LayerScale(tf_keras.layers.Layer):
    """x * gamma, gamma [D] initialised to `init_value` (dinov2
    layers/layer_scale.py `LayerScale`): [..., D] -> [..., D]."""

    def __init__(self, init_value=INIT_VALUE, **kwargs):
        super().__init__(**kwargs)
        self.init_value = init_value
        self.gamma = None

    def build(self, input_shape):
        self.gamma = self.add_weight(
            'gamma', shape=[int(input_shape[-1])],
            initializer=tf_keras.initializers.Constant(self.init_value))
        super().build(input_shape)

    def call(self, x):
        return x * tf.cast(self.gamma, x.dtype)

    def get_config(self):
        return {**super().get_config(), 'init_value': self.init_value}
