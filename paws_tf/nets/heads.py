"""Projection and prediction MLP heads on [B, F] backbone features."""

import gin
import tf_keras

from paws_tf import checks
from paws_tf import nets
from paws_tf.nets import backbones
from paws_tf.nets import sync_batch_norm

# Activations of the heads' hidden layers: ReLU (the official ResNet heads)
# or GELU (the ViT recipe), the exact erf form as PyTorch's `nn.GELU()`.
ACTIVATIONS = ('relu', 'gelu')


@tf_keras.saving.register_keras_serializable(package='paws_tf')
class Linear(tf_keras.layers.Dense):
    """Dense layer initialised as PyTorch's `nn.Linear`, as every layer of
    the official PAWS heads is: weights and bias U(+-1/sqrt(fan_in))
    (`nets.torch_default_init`), fan_in being known when built."""

    def build(self, input_shape):
        init = nets.torch_default_init(int(input_shape[-1]))
        self.kernel_initializer = init['kernel_initializer']
        self.bias_initializer = init['bias_initializer']
        super().build(input_shape)


class _MLPHead(tf_keras.layers.Layer):
    """Runs `mlp_layers` in order; `training` selects the BN statistics.
    `SIZES` names the subclass's size arguments (integers >= 1), kept as
    attributes and, with the activation and the batch-norm settings, in the
    config."""

    SIZES = ()

    def __init__(self, sizes, *, activation, sync_bn, sync_bn_impl,
                 bn_momentum, bn_epsilon, **kwargs):
        super().__init__(**kwargs)
        checks.one_of('sync_bn_impl', sync_bn_impl, nets.IMPLEMENTATIONS)
        self.activation = checks.one_of('activation', activation,
                                        ACTIVATIONS)
        for arg, value in zip(self.SIZES, sizes):
            setattr(self, arg, checks.integer(arg, value))
        self.sync_bn = sync_bn
        self.sync_bn_impl = sync_bn_impl
        self.bn_momentum = bn_momentum
        self.bn_epsilon = bn_epsilon

    def _batch_norm(self, name):
        return sync_batch_norm.batch_norm(name, sync_bn=self.sync_bn,
                                          impl=self.sync_bn_impl,
                                          momentum=self.bn_momentum,
                                          epsilon=self.bn_epsilon)

    def _activation(self, index):
        if self.activation == 'gelu':
            # tf_keras' 'gelu' is the erf form (approximate=False).
            return tf_keras.layers.Activation('gelu', name=f'gelu{index}')
        return tf_keras.layers.ReLU(name=f'relu{index}')

    def call(self, inputs, training=None):
        x = inputs  # [B, F]
        for layer in self.mlp_layers:
            # Keras drops `training` for layers whose call does not take it.
            x = layer(x, training=training)
        return x  # [B, output_dim]

    def get_config(self):
        keys = self.SIZES + ('activation', 'sync_bn', 'sync_bn_impl',
                             'bn_momentum', 'bn_epsilon')
        return {**super().get_config(),
                **{key: getattr(self, key) for key in keys}}


@gin.configurable(denylist=backbones.SET_BY_BUILD_MODEL)
class ProjectionHead(_MLPHead):
    """PAWS projection head: `num_layers`-layer MLP with BN on hidden layers.

    Hidden layers are Dense(hidden_dim, bias) -> BN -> ReLU; the last layer is
    Dense(output_dim, bias) without BN or ReLU (PAWS Sec. 5 and App. A: three
    layers of 2048 for ResNet-50, of 128 for WideResNet-28-2 in App. C). The
    official code sets hidden_dim to the backbone's F (4096 / 8192 for the
    2x / 4x ResNet-50). The ViT-S/16 recipe of facebookresearch/suncet#26
    has three layers of 256 with GELU.

    Args:
        num_layers: number of Dense layers (>= 1).
        hidden_dim: width of the hidden layers.
        output_dim: width of the output representation h.
        activation: one of `ACTIVATIONS`, after each hidden BN.
        sync_bn, sync_bn_impl, bn_momentum, bn_epsilon: the batch norms'
            settings, as `backbones.build_backbone`'s.
        name: layer name.
        **kwargs: passed to `tf_keras.layers.Layer`.

    Raises:
        ValueError: a size is < 1, or a bad `sync_bn_impl`.
    """

    SIZES = ('num_layers', 'hidden_dim', 'output_dim')

    def __init__(self, num_layers=3, hidden_dim=2048, output_dim=2048, *,
                 activation='relu', sync_bn=False, sync_bn_impl=nets.KERAS,
                 bn_momentum=0.9, bn_epsilon=1e-5, name='projection_head',
                 **kwargs):
        super().__init__((num_layers, hidden_dim, output_dim),
                         activation=activation, sync_bn=sync_bn,
                         sync_bn_impl=sync_bn_impl, bn_momentum=bn_momentum,
                         bn_epsilon=bn_epsilon, name=name, **kwargs)
        self.mlp_layers = []
        for i in range(1, num_layers):
            self.mlp_layers.extend([
                Linear(hidden_dim, name=f'fc{i}'),
                self._batch_norm(f'bn{i}'),
                self._activation(i),
            ])
        self.mlp_layers.append(Linear(output_dim, name=f'fc{num_layers}'))


# Its output is the projection's width, which `model.build_model` passes.
@gin.configurable(denylist=backbones.SET_BY_BUILD_MODEL + ['output_dim'])
class PredictionHead(_MLPHead):
    """PAWS prediction head: BN -> Dense -> BN -> ReLU -> Dense (App. A).

    Maps the projection h to z; the official code uses a 4x bottleneck,
    hidden_dim = output_dim / 4 (512 for 2048). The ViT-S/16 recipe of
    facebookresearch/suncet#26 has widths [256, 256] with GELU.

    Args:
        hidden_dim: width of the hidden layer.
        output_dim: width of the output z.
        activation, sync_bn, sync_bn_impl, bn_momentum, bn_epsilon, name,
            **kwargs: as `ProjectionHead`'s.

    Raises:
        ValueError: a size is < 1, or a bad `sync_bn_impl`.
    """

    SIZES = ('hidden_dim', 'output_dim')

    def __init__(self, hidden_dim=512, output_dim=2048, *,
                 activation='relu', sync_bn=False, sync_bn_impl=nets.KERAS,
                 bn_momentum=0.9, bn_epsilon=1e-5, name='prediction_head',
                 **kwargs):
        super().__init__((hidden_dim, output_dim), activation=activation,
                         sync_bn=sync_bn,
                         sync_bn_impl=sync_bn_impl, bn_momentum=bn_momentum,
                         bn_epsilon=bn_epsilon, name=name, **kwargs)
        self.mlp_layers = [
            self._batch_norm('bn0'),
            Linear(hidden_dim, name='fc1'),
            self._batch_norm('bn1'),
            self._activation(1),
            Linear(output_dim, name='fc2'),
        ]
