"""The faster forms of image ops give TensorFlow's own ops' bits.

`image_ops.resize(antialias=True)` rearranges `tf.image.resize(...,
antialias=True)`'s two passes for speed; the views' pixels (and
`benchmarks/bench_input.py --digest`) rest on its values being the same
float32 bits, not merely close ones.
"""

import numpy as np
import pytest
import tensorflow as tf

from paws_tf.data import image_ops

_RNG = np.random.default_rng(58)


def _photo_like(height, width, channels):
    """Smooth uint8 content with edges (blocks, bilinearly enlarged) plus
    noise, so that neighbouring pixels differ as in photographs."""
    blocks = _RNG.integers(0, 256, (height // 8 + 2, width // 8 + 2,
                                    channels)).astype(np.float32)
    smooth = tf.image.resize(blocks, (height, width)).numpy()
    noise = _RNG.normal(0, 12, smooth.shape)
    return np.clip(smooth + noise, 0, 255).astype(np.uint8)


@pytest.mark.parametrize('shape, size', [
    ((375, 500, 3), (224, 224)),   # a global view's shrink
    ((97, 131, 3), (96, 96)),      # a local view's, different factors
    ((40, 30, 3), (96, 96)),       # enlargement (no antialiasing widening)
    ((257, 180, 1), (18, 31)),     # one channel, strong shrink
    ((1, 7, 3), (5, 1)),           # degenerate sides
])
@pytest.mark.parametrize('dtype', [tf.uint8, tf.float32])
def test_antialiased_resize_is_tf_image_resize_bit_for_bit(shape, size,
                                                          dtype):
    """Catches resampling the columns before the rows, or a pass that
    sums in another order (the column pass as a matmul with the resize's
    own weights): each changes some low bits."""
    pixels = _photo_like(*shape)
    image = tf.constant(pixels if dtype == tf.uint8 else pixels / 255,
                        dtype)
    expected = tf.image.resize(image, size, antialias=True).numpy()
    if dtype == tf.uint8:
        expected = expected * np.float32(1 / 255)
    got = image_ops.resize(image, size, antialias=True).numpy()
    assert got.shape == expected.shape
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32),
                                  expected.view(np.uint32))


def test_antialiased_resize_keeps_static_shape():
    """Catches a result whose static shape is lost in the reshapes (the
    views' shapes must be static for the model)."""
    fn = tf.function(lambda x: image_ops.resize(x, (224, 96),
                                                antialias=True))
    spec = tf.TensorSpec([None, None, 3], tf.uint8)
    assert fn.get_concrete_function(spec).structured_outputs.shape == (
        224, 96, 3)
