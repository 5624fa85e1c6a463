"""Seeded image operations of the augmentations, on float32 in [0, 1]."""

import math

import numpy as np
import PIL.Image
import PIL.ImageFilter
import tensorflow as tf

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
    """Bilinear resize to float32 in [0, 1]; uint8 is scaled after resizing."""
    resized = tf.image.resize(image, size, antialias=antialias)  # float32
    return resized * _UINT8_SCALE if image.dtype == tf.uint8 else resized


def sample_crop_box(height, width, seed, scale, ratio=(3 / 4, 4 / 3)):
    """Samples a box as torchvision `RandomResizedCrop.get_params` does: its
    10 candidates are drawn at once and the first valid one taken.

    Args:
        height, width: int or int32 scalar tensors, the image's H and W.
        seed: [2] int32/int64 stateless seed.
        scale: (min, max) fraction of the image area.
        ratio: (min, max) aspect ratio w/h, sampled log-uniformly.

    Returns:
        (offset_y, offset_x, h, w), int32 scalars with
        0 <= offset_y <= H - h and 0 <= offset_x <= W - w.
    """
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

    Args:
        image: [H, W, C] uint8 (scaled by 1/255) or float in [0, 1].
        seed, scale, ratio: as `sample_crop_box` takes them.
        size: int or (height, width) of the output.
        antialias: widen the filter when shrinking, as PIL does.
    """
    image = tf.convert_to_tensor(image)
    shape = tf.shape(image)
    offset_y, offset_x, h, w = sample_crop_box(shape[0], shape[1], seed,
                                               scale, ratio)
    crop = image[offset_y:offset_y + h, offset_x:offset_x + w]
    return resize(crop, (size, size) if isinstance(size, int) else size,
                   antialias=antialias)


def on_uint8(op, image):
    """`op` applied to a float [0, 1] image rounded to uint8, the image PIL
    would hold."""
    pixels = tf.cast(tf.round(tf.clip_by_value(image, 0.0, 1.0) * 255.0),
                     tf.uint8)
    return tf.cast(op(pixels), tf.float32) * _UINT8_SCALE


def random_apply(coin, prob, op, image):
    """`op(image)` if the uniform draw `coin` is below `prob`, else `image`."""
    return tf.cond(coin < prob, lambda: op(image), lambda: image)


def _pil_blur(image, sigma):
    """NumPy side of `pil_gaussian_blur`: [H, W, C] uint8 through PIL."""
    plane = image[..., 0] if image.shape[-1] == 1 else image
    # float32 sigma widens to float64 exactly.
    blurred = PIL.Image.fromarray(plane).filter(
        PIL.ImageFilter.GaussianBlur(radius=float(sigma)))
    return np.asarray(blurred).reshape(image.shape)


def pil_gaussian_blur(image, sigma):
    """PIL `ImageFilter.GaussianBlur(radius=sigma)` of a uint8 image.

    The official blur is PIL's own, so the view is blurred by PIL itself:
    the same values by construction, and a fraction of the CPU time of its
    fixed-point arithmetic in TensorFlow ops. PIL releases the GIL while it
    blurs, so the parallel calls of a `tf.data` map blur on every core.

    Args:
        image: [H, W, C] uint8 tensor, C 1 or 3; the result alike.
        sigma: scalar float32 standard deviation, in pixels.
    """
    blurred = tf.numpy_function(_pil_blur, [image, sigma], tf.uint8,
                                stateful=False)
    blurred.set_shape(image.shape)
    return blurred


def gaussian_blur(image, seed, prob=0.5, sigma_range=(0.1, 2.0)):
    """The official PAWS random Gaussian blur (PIL, on the uint8 image).

    Args:
        image: [H, W, C] float in [0, 1]; the result float32, multiples of
            1/255 where blurred.
        seed: [2] int32/int64 stateless seed.
        prob: probability of blurring.
        sigma_range: (min, max) of the uniform sigma, in pixels.
    """
    image = tf.cast(image, tf.float32)
    u = tf.random.stateless_uniform([2], seed)
    sigma = sigma_range[0] + (sigma_range[1] - sigma_range[0]) * u[1]
    return random_apply(
        u[0], prob,
        lambda x: on_uint8(lambda v: pil_gaussian_blur(v, sigma), x), image)


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
