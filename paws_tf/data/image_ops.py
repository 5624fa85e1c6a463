"""Seeded image operations of the augmentations, on float32 in [0, 1]."""

import math

import tensorflow as tf

# The largest blur sigma `pil_gaussian_blur` computes exactly (box radius 63).
MAX_BLUR_SIGMA = 64.0
# Multiply, never divide, by constants: Grappler's constant folding turns
# x / c into x * (1 / c), so eager and traced results would differ by 1 ulp.
_UINT8_SCALE = 1 / 255


def split_seed(seed, num):
    """`num` independent stateless seeds derived from `seed`."""
    # stateless_split keeps the seed dtype: cast, so int32 == int64 seeds.
    seed = tf.cast(seed, tf.int64)
    return tf.unstack(tf.random.experimental.stateless_split(seed, num))


def num_channels(image):
    """The static channel count of `image`, which must be 1 or 3."""
    if image.shape[-1] not in (1, 3):
        raise ValueError(f'Need a static channel count of 1 or 3, got '
                         f'shape {image.shape}.')
    return image.shape[-1]


def resize(image, size, antialias=False):
    """Bilinear resize of [H, W, C] to float32 in [0, 1]; uint8 is scaled
    after resizing. With `antialias`, `tf.image.resize(image, size,
    antialias=True)`'s values, in less CPU time (see `_resample_rows`;
    `benchmarks/profile_view.py --resize` times both)."""
    resized = (_antialiased_resize(image, size) if antialias
               else tf.image.resize(image, size))  # float32
    return resized * _UINT8_SCALE if image.dtype == tf.uint8 else resized


def _resample_rows(x, size, scale):
    """[n, m] `x` resampled along axis 0 to [size, m] float32, as
    `tf.image.resize(..., antialias=True)` resamples an image's rows.

    Its kernel (ScaleAndTranslate) resamples the rows first, each output
    row a weighted sum of whole input rows (a loop the compiler vectorises),
    then the columns, each output pixel its own sum over the channels (a
    scalar loop, most of a view's crop-and-resize time). Here a call with
    one column of m channels, whose column pass copies each value (weight
    1), resamples axis 0 only; on the transposed result, a second call
    resamples the other axis by the same loop. Both passes keep the
    kernel's weights (the same sizes and scales give the same spans) and
    its order of summation, so the values are the same bits.
    """
    resampled = tf.raw_ops.ScaleAndTranslate(
        images=x[None, :, None], size=tf.stack([size, 1]),
        scale=tf.stack([scale, 1.0]), translation=tf.zeros([2]),
        kernel_type='triangle', antialias=True)  # [1, size, 1, m]
    return resampled[0, :, 0]


def _antialiased_resize(image, size):
    """`tf.image.resize(image, size, antialias=True)` of [H, W, C]: the
    rows, then the columns as rows of the transposed image."""
    image = tf.convert_to_tensor(image)
    size = tf.convert_to_tensor(size, tf.int32)
    static_size = tf.get_static_value(size)
    shape = tf.shape(image)
    channels = image.shape[-1] or shape[2]
    # tf.image.resize's scale: output over input size, in float32.
    scale = tf.cast(size, tf.float32) / tf.cast(shape[:2], tf.float32)
    x = _resample_rows(tf.reshape(image, [shape[0], -1]), size[0], scale[0])
    x = tf.transpose(tf.reshape(x, [size[0], shape[1], channels]), [1, 0, 2])
    x = _resample_rows(tf.reshape(x, [shape[1], -1]), size[1], scale[1])
    x = tf.transpose(tf.reshape(x, [size[1], size[0], channels]), [1, 0, 2])
    if static_size is not None:
        x = tf.ensure_shape(x, [*static_size, image.shape[-1]])
    return x  # [size[0], size[1], C]


def sample_crop_box(height, width, seed, scale, ratio=(3 / 4, 4 / 3)):
    """`(offset_y, offset_x, h, w)`, int32 scalars, of a box of an image
    of `height` x `width` sampled as torchvision
    `RandomResizedCrop.get_params` does, of area `scale` (min, max) of the
    image's and aspect `ratio` w/h drawn log-uniformly: its 10 candidates
    are drawn at once (`seed`) and the first valid one taken."""
    attempts = 10  # Candidates before the centre-crop fallback.
    height, width = (tf.cast(v, tf.float64) for v in (height, width))
    u = tf.random.stateless_uniform([2 * attempts + 2], seed, dtype=tf.float64)
    # torchvision: area * U(scale), exp(U(log r0, log r1)), round() to even.
    target_area = height * width * (
        scale[0] + (scale[1] - scale[0]) * u[:attempts])
    log_r0, log_r1 = math.log(ratio[0]), math.log(ratio[1])
    aspect = tf.exp(log_r0 + (log_r1 - log_r0) * u[attempts:2 * attempts])
    w = tf.round(tf.sqrt(target_area * aspect))  # [attempts]
    h = tf.round(tf.sqrt(target_area / aspect))  # [attempts]
    valid = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    # argmax does not promise the first index among ties; this does.
    first = tf.reduce_min(tf.where(valid, tf.range(attempts), attempts))
    found = first < attempts
    first = tf.minimum(first, attempts - 1)

    # torchvision fallback: centred crop, aspect clamped to [r_min, r_max].
    in_ratio = width / height
    r_min, r_max = min(ratio), max(ratio)
    fallback_w = tf.where(in_ratio > r_max, tf.round(height * r_max), width)
    fallback_h = tf.where(in_ratio < r_min, tf.round(width / r_min), height)
    h = tf.where(found, h[first], fallback_h)
    w = tf.where(found, w[first], fallback_w)
    # randint(0, H - h + 1) for a sampled box, (H - h) // 2 for the fallback.
    offset_y = tf.where(found, tf.floor(u[-2] * (height - h + 1)),
                        tf.floor((height - h) / 2))
    offset_x = tf.where(found, tf.floor(u[-1] * (width - w + 1)),
                        tf.floor((width - w) / 2))
    return tuple(tf.cast(v, tf.int32) for v in (offset_y, offset_x, h, w))


def random_resized_crop(image, seed, size, scale, ratio=(3 / 4, 4 / 3),
                        antialias=True):
    """torchvision `RandomResizedCrop`: a random box resized bilinearly to
    [size, size, C] float32 in [0, 1].

    The official PAWS code runs it on PIL images, whose bilinear resize
    widens its triangle filter when it shrinks: with `antialias` the view
    matches PIL's to within its uint8 rounding; without it, the resize
    samples the box like torchvision on tensors or SimCLR's TF code, which
    aliases when the box is larger than the view. Slice + resize with
    half-pixel centres: `tf.image.crop_and_resize` is slower on CPU, and
    float rounding of its align-corners boxes put ~6% of edge-touching
    samples outside the image (extrapolation value 0).

    `image`: [H, W, C] uint8 (scaled by 1/255) or float in [0, 1]; `seed`,
    `scale`, `ratio` as `sample_crop_box` takes them; `size`: int or
    (height, width).
    """
    image = tf.convert_to_tensor(image)
    shape = tf.shape(image)
    offset_y, offset_x, h, w = sample_crop_box(shape[0], shape[1], seed,
                                               scale, ratio)
    crop = image[offset_y:offset_y + h, offset_x:offset_x + w]
    return resize(crop, (size, size) if isinstance(size, int) else size,
                   antialias=antialias)


def uint8_values(image):
    """The uint8 values PIL would hold for a float [0, 1] image, as
    float32 integers."""
    return tf.round(tf.clip_by_value(image, 0.0, 1.0) * 255.0)


def on_uint8(op, image):
    """`op` applied to a float [0, 1] image rounded to uint8, the image PIL
    would hold."""
    pixels = tf.cast(uint8_values(image), tf.uint8)
    return tf.cast(op(pixels), tf.float32) * _UINT8_SCALE


def random_apply(coin, prob, op, image):
    """`op(image)` if the uniform draw `coin` is below `prob`, else `image`."""
    return tf.cond(coin < prob, lambda: op(image), lambda: image)


def box_blur_radius(sigma, passes=3):
    """PIL's extended-box radius whose `passes` boxes approximate a Gaussian
    of standard deviation `sigma` (Gwosdek et al. 2011, Eqs. 7, 11, 14), in
    PIL's float32 arithmetic (its square root and floor in float64)."""
    sigma2 = tf.cast(sigma, tf.float32) ** 2 / passes
    length = tf.cast(tf.sqrt(12.0 * tf.cast(sigma2, tf.float64) + 1.0),
                     tf.float32)
    whole = tf.cast(tf.floor((tf.cast(length, tf.float64) - 1.0) / 2.0),
                    tf.float32)
    fraction = (2 * whole + 1) * (whole * (whole + 1) - 3 * sigma2) / (
        6 * (sigma2 - (whole + 1) * (whole + 1)))
    return whole + fraction


def _box_taps(radius):
    """(r, taps): PIL's integer box radius r = int(radius) and its 2r + 3
    fixed-point weights, float32 integers summing to at most 2^24: fw,
    (2r + 1) x ww, fw."""
    r = tf.cast(radius, tf.int32)
    inner = tf.floor(2.0 ** 24 / (radius * 2 + 1))  # ww, float32 as in PIL
    outer = tf.floor((2.0 ** 24 - tf.cast(2 * r + 1, tf.float32) * inner) / 2)
    return r, tf.concat([[outer], tf.fill([2 * r + 1], inner), [outer]], 0)


def _box_passes(x, r, high, low, passes):
    """`passes` of PIL's extended box along axis 0 of [n, m] float32 pixel
    values (edge rows repeated); `high`, `low`: the taps' scaled parts."""
    n, m = tf.shape(x)[0], tf.shape(x)[1]
    beyond = tf.clip_by_value(tf.range(-r - 1, n + r + 1), 0, n - 1)
    # The m columns are the depthwise convolution's channels, which its
    # CPU kernels vectorise over (3 colour channels would fill few lanes).
    filters = [tf.tile(t[:, None, None, None], [1, 1, m, 1])
               for t in (high, low)]  # [2r + 3, 1, m, 1]
    for _ in range(passes):
        padded = tf.gather(x, beyond)[None, :, None]  # [1, n + 2r + 2, 1, m]
        high_sum, low_sum = (
            tf.nn.depthwise_conv2d(padded, f, [1, 1, 1, 1], 'VALID')[0, :, 0]
            for f in filters)  # [n, m]
        x = tf.floor(high_sum + tf.floor(low_sum + 2.0 ** 15) * 2.0 ** -16)
    return x


def pil_gaussian_blur(image, sigma, passes=3):
    """PIL `ImageFilter.GaussianBlur(radius=sigma)` of a uint8 image, the
    same values, in TensorFlow ops (no Python runs in a `tf.data` map, so
    its iterator can be destroyed at any time).

    PIL blurs with `passes` extended boxes along the rows, then along the
    columns, edge pixels repeated; each pass takes (ww * box sum + fw *
    (the two pixels beyond) + 2^23) >> 24 in uint32. Here the weights are
    split at 2^8 into high and low parts, two depthwise convolutions sum
    each part exactly in float32 (every partial sum an integer multiple of
    a power of two below 2^24), and the low sum's carry is added to the
    high one before the shift: exact up to `MAX_BLUR_SIGMA` (box radius 63).
    The image is blurred as [W, H * C], then as [H, W * C], along axis 0.

    `image`: [H, W, C] uint8, or float32 holding uint8 values (which saves
    the conversions); the result alike. `sigma` in pixels.
    """
    image = tf.convert_to_tensor(image)
    r, taps = _box_taps(box_blur_radius(sigma, passes))
    high = tf.floor(taps * 2.0 ** -8)
    # Scaled by powers of two so that the shift is one floor at the end.
    high, low = high * 2.0 ** -16, (taps - high * 2.0 ** 8) * 2.0 ** -8
    height, width, channels = tf.unstack(tf.shape(image))
    columns = tf.cast(tf.transpose(image, [1, 0, 2]), tf.float32)
    x = _box_passes(tf.reshape(columns, [width, -1]), r, high, low, passes)
    rows = tf.transpose(tf.reshape(x, [width, height, channels]), [1, 0, 2])
    x = _box_passes(tf.reshape(rows, [height, -1]), r, high, low, passes)
    return tf.ensure_shape(
        tf.cast(tf.reshape(x, [height, width, channels]), image.dtype),
        image.shape)


def gaussian_blur(image, seed, prob=0.5, sigma_range=(0.1, 2.0)):
    """The official PAWS random Gaussian blur (PIL's, on the uint8 image)
    of [H, W, C] float `image` in [0, 1], with probability `prob` and a
    sigma drawn uniformly in `sigma_range` pixels; the result float32,
    multiples of 1/255 where blurred."""
    if not 0 <= sigma_range[0] <= sigma_range[1] <= MAX_BLUR_SIGMA:
        raise ValueError(f'sigma_range must be (min, max) with 0 <= min <= '
                         f'max <= {MAX_BLUR_SIGMA}, got {sigma_range}.')
    image = tf.cast(image, tf.float32)
    u = tf.random.stateless_uniform([2], seed)
    sigma = sigma_range[0] + (sigma_range[1] - sigma_range[0]) * u[1]
    return random_apply(
        u[0], prob,
        lambda x: pil_gaussian_blur(uint8_values(x), sigma) * _UINT8_SCALE,
        image)


def random_flip(image, seed):
    """Flips [H, W, C] left-right with probability 0.5."""
    return tf.image.stateless_random_flip_left_right(image, seed)


def normalize(image, mean, std):
    """Returns float32 (image - mean) / std, with length-C `mean` and `std`."""
    if image.shape[-1] is not None and not (
            len(mean) == len(std) == image.shape[-1]):
        raise ValueError(f'mean {mean} / std {std} do not match image shape '
                         f'{image.shape}.')
    shape = tf.shape(image)
    # Broadcasting [C] along the innermost axis is slow in Eigen; use
    # [W * C] rows of the [H, W * C] view instead.
    mean = tf.tile(tf.constant(mean, tf.float32), shape[1:2])
    inv_std = tf.tile(tf.constant([1 / s for s in std], tf.float32),
                      shape[1:2])
    rows = tf.reshape(tf.cast(image, tf.float32), [shape[0], -1])
    return tf.reshape((rows - mean) * inv_std, shape)
