"""A backbone family declared outside paws_tf: its module and a registry line
in `backbones.FAMILIES` are all it takes, and a config swaps an included
config's backbone for it with one binding."""

import gin
import numpy as np
import pytest
import tf_keras

from paws_tf import bindings
from paws_tf import checks
from paws_tf import configurables
from paws_tf import model as model_lib
from paws_tf import nets
from paws_tf.nets import backbones


@gin.configurable(denylist=['name', 'input_channels'])
def strided_pool(name, *, input_channels=3, stride=2, scale=1.0):
    """[B, H, W, C] -> [B, C]: `scale` times the mean of the pixels at
    every `stride`-th row and column."""
    inputs = tf_keras.Input([None, None, input_channels])
    x = tf_keras.layers.Lambda(lambda x: scale * x[:, ::stride, ::stride])(
        inputs)
    model = tf_keras.Model(
        inputs, tf_keras.layers.GlobalAveragePooling2D()(x), name=name)
    model.output_dim, model.side_multiple = input_channels, 1
    return model


STRIDED_POOL = nets.Family(
    names=('strided_pool',), configurable=strided_pool,
    build=lambda name, *, input_channels, batch_norm, **arguments: (
        strided_pool(name, input_channels=input_channels, **arguments)),
    downsampling=lambda name: bindings.arguments(strided_pool)['stride'][0],
    settings=('scale',))


def test_a_family_takes_its_registry_line_only(clean_gin, monkeypatch):
    """debug.gin (a small_resnet config, its arguments bound) with
    `build_backbone.name = 'strided_pool'`: the model's features are the
    family's, under its own bound arguments, and the image-size check
    takes its downsampling. Seen failing on a `backbones.family` that knew
    the shipped families by name, and on a downsampling table of them."""
    del clean_gin
    monkeypatch.setitem(backbones.FAMILIES, 'strided_pool', STRIDED_POOL)
    configurables.parse(['debug.gin'], [
        "build_backbone.name = 'strided_pool'", 'strided_pool.stride = 3',
        'strided_pool.scale = 2.0'])
    paws = model_lib.build_model(input_channels=2, sync_bn=False)
    images = np.random.default_rng(0).random([2, 7, 7, 2], np.float32)
    expected = 2.0 * images[:, ::3, ::3].mean(axis=(1, 2))  # [2, 2]
    np.testing.assert_allclose(paws(images)['features'], expected,
                               rtol=1e-6)
    with pytest.raises(checks.ConfigError, match=(
            r"^IMAGE = 2 is smaller than 3 px, the downsampling of "
            r"build_backbone\.name = 'strided_pool'")):
        backbones.check_image_sizes([('IMAGE', 2)])
    assert STRIDED_POOL.architecture() == ['stride']
    with pytest.raises(checks.ConfigError, match=(
            r"build_backbone\.widths \(an argument of 'small_resnet'\) is "
            r"not an argument of backbone 'strided_pool'")):
        backbones.build_backbone('strided_pool', widths=(8,))
