"""A tiny PAWSModel with random weights and batch-norm statistics."""

import numpy as np

from paws_tf import backbones
from paws_tf import heads
from paws_tf import model as model_lib

# The smallest small_resnet the tests use. Strided 1x1 convolutions need 8
# input channels under oneDNN (backbones._check_onednn_safe), hence 8, 16.
TINY = dict(widths=(8, 16), blocks_per_stage=(1, 1), stage_strides=(2, 2))


def build(channels=3, size=16, seed=0):
    """Returns a built PAWSModel (F = 16, D = 6) with random variables.

    Moving means and variances are random too, so inference-mode batch norm
    differs from training mode and from the initial identity.
    """
    backbone = backbones.build_backbone('small_resnet',
                                        input_channels=channels, **TINY)
    projection = heads.ProjectionHead(hidden_dim=8, output_dim=6)
    model = model_lib.PAWSModel(
        backbone, projection, heads.PredictionHead(hidden_dim=4, output_dim=6),
        classes_per_replica=2, images_per_class=2, multicrop=0,
        diagnostics_every=0)
    model(np.zeros([1, size, size, channels], np.float32))
    rng = np.random.default_rng(seed)
    for variable in model.variables:
        value = rng.normal(scale=0.5, size=variable.shape)
        if 'variance' in variable.name:
            value = rng.uniform(0.5, 2.0, size=variable.shape)
        variable.assign(value.astype(np.float32))
    return model
