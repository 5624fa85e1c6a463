"""Resampling a ViT's learned position embeddings to another patch grid,
as each source does: timm's antialiased bicubic, DINO's and MSN's
`F.interpolate(mode='bicubic', scale_factor=...)`."""

import tensorflow as tf

# timm's `resample_abs_pos_embed` (the default), DINO's and MSN's
# `interpolate_pos_encoding`. DINOv2's is DINO's for its ViTs without
# registers and timm's for those with registers (its hub's settings).
TIMM, DINO, MSN = 'timm', 'dino', 'msn'
INTERPOLATIONS = (TIMM, DINO, MSN)
# The Keys cubic of PIL's and PyTorch's antialiased bicubic resize.
CUBIC_A = -0.5
# PyTorch's bicubic without antialiasing uses a = -0.75
# (aten/src/ATen/native/UpSample.h, `get_cubic_upsample_coefficients`).
TORCH_CUBIC_A = -0.75
# facebookresearch/dino vision_transformer.py `interpolate_pos_encoding`
# adds 0.1 to the new grid's sides before dividing them by the old one
# ("to avoid floating point error in the interpolation").
DINO_OFFSET = 0.1


def _cubic(x, a=CUBIC_A):
    """Keys' cubic convolution kernel with parameter `a`, zero for
    |x| >= 2."""
    x = tf.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1  # |x| < 1
    far = ((x - 5) * x + 8) * x * a - 4 * a  # 1 <= |x| < 2
    return tf.where(x < 1, near, tf.where(x < 2, far, tf.zeros_like(x)))


def resample_matrix(new_size, old_size):
    """Weights [new_size, old_size] float32 of PyTorch's
    `F.interpolate(mode='bicubic', antialias=True)` along one axis.

    Output sample i sits at (i + 0.5) * old / new in input pixels; when
    shrinking, the cubic is stretched by old / new (antialiasing, as PIL
    does); each row is renormalised over the input samples it covers.
    `tf.image.resize(..., 'bicubic', antialias=True)` gives the same
    values, but its op has no XLA kernel (ScaleAndTranslate), so a compiled
    train step with local views could not run it. At equal sizes the
    matrix is the identity exactly (the cubic is 1 at 0, 0 at +-1 and +-2).

    Args:
        new_size, old_size: int or int32 scalar tensor, >= 1.

    Returns:
        [new_size, old_size] float32, rows summing to 1.
    """
    new = tf.cast(new_size, tf.float32)
    old = tf.cast(old_size, tf.float32)
    scale = old / new
    stretch = tf.maximum(scale, 1.0)
    centers = (tf.range(new) + 0.5) * scale  # [new]
    offsets = tf.range(old) + 0.5 - centers[:, None]  # [new, old]
    weights = _cubic(offsets / stretch)
    return weights / tf.reduce_sum(weights, axis=1, keepdims=True)


def scaled_matrix(new_size, old_size, scale):
    """Weights [new_size, old_size] float32 of PyTorch's
    `F.interpolate(mode='bicubic', scale_factor=1 / scale)` along one axis
    (no antialiasing, `align_corners=False`).

    Output sample i reads the input at x = (i + 0.5) * scale - 0.5, from
    the four samples floor(x) - 1 ... floor(x) + 2 weighted by the cubic
    of a = -0.75, indices clamped to the edges (`upsample_bicubic2d`'s
    `upsample_get_value_bounded`): the weight of a sample past an edge
    goes to the edge sample.

    Args:
        new_size, old_size: int or int32 scalar tensor, >= 1.
        scale: float32 scalar, input samples per output sample.

    Returns:
        [new_size, old_size] float32.
    """
    positions = (tf.range(tf.cast(new_size, tf.float32)) + 0.5) * scale - 0.5
    floor = tf.floor(positions)  # [new]
    fraction = positions - floor
    matrix = 0.0
    for tap in (-1, 0, 1, 2):
        index = tf.clip_by_value(tf.cast(floor, tf.int32) + tap, 0,
                                 tf.cast(old_size, tf.int32) - 1)
        weight = _cubic(fraction - tap, TORCH_CUBIC_A)  # [new]
        matrix += weight[:, None] * tf.one_hot(index, old_size)
    return matrix  # [new, old]


def _source_matrices(new_size, old_size, interpolation):
    """(rows, columns) matrices of `interpolation` from the old grid's
    (h, w) to `new_size`, both int32 pairs."""
    if interpolation == TIMM:
        return tuple(resample_matrix(new, old)
                     for new, old in zip(new_size, old_size))
    # The sources compute their scale factors in Python floats (float64)
    # and PyTorch takes 1 / scale_factor in float64 before its float32
    # kernel: a float32 quotient differs in its last bit, 2e-5 in the
    # resampled values of a 37-wide grid.
    new = tf.cast(tf.stack(new_size), tf.float64)
    old = tf.cast(tf.stack(old_size), tf.float64)
    if interpolation == DINO:
        # scale_factor = (w0 + 0.1) / sqrt(N) on each axis.
        scales = old / (new + DINO_OFFSET)
    else:
        # MSN: scale_factor = sqrt(npatch / N), one factor for both axes,
        # of a square grid; a grid of other sides is scaled per axis.
        scales = old / new
    scales = tf.cast(scales, tf.float32)
    return tuple(scaled_matrix(new_size[axis], old_size[axis], scales[axis])
                 for axis in (0, 1))


def resample_positions(grid, new_size, interpolation=TIMM):
    """The patches' position embeddings resampled to another grid.

    'timm': timm's `resample_abs_pos_embed`, bicubic with antialiasing as
    PyTorch's `F.interpolate` computes it. 'dino' and 'msn': their
    `interpolate_pos_encoding`, bicubic without antialiasing at the scale
    they give `F.interpolate`. Each returns `grid` unchanged at its own
    size (DINO and MSN do not interpolate there; timm's bicubic is the
    identity).

    Args:
        grid: [h, w, D] float32 embeddings of an h x w patch grid.
        new_size: (height, width), ints or int32 scalar tensors.
        interpolation: one of `INTERPOLATIONS`.

    Returns:
        [height, width, D] float32.
    """
    old_size = tf.unstack(tf.shape(grid)[:2])

    def resampled():
        rows, columns = _source_matrices(new_size, old_size, interpolation)
        return tf.einsum('ih,hwd,jw->ijd', rows, grid, columns)

    if interpolation == TIMM:
        return resampled()
    # Only another grid is resampled: at the learned one the matrices and
    # the product are not computed.
    same = tf.logical_and(tf.equal(new_size[0], old_size[0]),
                          tf.equal(new_size[1], old_size[1]))
    return tf.cond(same, lambda: grid, resampled)
