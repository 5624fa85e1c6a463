"""Stateless SimCLR image augmentations and PAWS multi-crop views."""

import dataclasses
import math

import gin
import tensorflow as tf

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)
# Registered as gin constants (%IMAGENET_MEAN, ...) by paws_tf.configurables.
GIN_CONSTANTS = ('IMAGENET_MEAN', 'IMAGENET_STD', 'CIFAR10_MEAN',
                 'CIFAR10_STD')
# Fixed normalisations by name, for `load_data.normalization`.
NORMALIZATIONS = {'imagenet': (IMAGENET_MEAN, IMAGENET_STD),
                  'cifar10': (CIFAR10_MEAN, CIFAR10_STD)}
# ITU-R 601 luma, the weights of torchvision's rgb_to_grayscale.
LUMA_WEIGHTS = (0.2989, 0.587, 0.114)
# tf.matmul([H, W, 3], _LUMA_TO_RGB) is the luma in all three channels:
# several times faster in Eigen than broadcasting [H, W, 1] to [H, W, 3].
_LUMA_TO_RGB = tuple((w,) * 3 for w in LUMA_WEIGHTS)
# Multiply, never divide, by constants: Grappler's constant folding turns
# x / c into x * (1 / c), so eager and traced results would differ by 1 ulp.
_UINT8_SCALE = 1 / 255
# Colour distortions (`color_distortion`): colour jitter, then grayscale
# (SimCLR, the official ImageNet views) or solarize + equalize (the official
# PAWS CIFAR-10 views).
DISTORTIONS = ('simclr', 'cifar10')


def _split(seed, num):
    # stateless_split keeps the seed dtype: cast, so int32 == int64 seeds.
    seed = tf.cast(seed, tf.int64)
    return tf.unstack(tf.random.experimental.stateless_split(seed, num))


def _channels(image):
    if image.shape[-1] not in (1, 3):
        raise ValueError(f'Need a static channel count of 1 or 3, got '
                         f'shape {image.shape}.')
    return image.shape[-1]


def _resize(image, size, antialias=False):
    """Bilinear resize to float32 in [0, 1]; uint8 is scaled after resizing."""
    resized = tf.image.resize(image, size, antialias=antialias)  # float32
    return resized * _UINT8_SCALE if image.dtype == tf.uint8 else resized


def sample_crop_box(height, width, seed, scale, ratio=(3 / 4, 4 / 3),
                    attempts=10):
    """Samples a box with torchvision `RandomResizedCrop.get_params` semantics.

    The `attempts` candidates are drawn at once and the first valid one is
    taken, which is what torchvision's sequential loop returns.

    Args:
        height: int or int32 scalar tensor, image height H.
        width: int or int32 scalar tensor, image width W.
        seed: [2] int32/int64 stateless seed.
        scale: (min, max) fraction of the image area.
        ratio: (min, max) aspect ratio w/h, sampled log-uniformly.
        attempts: number of candidates before the centre-crop fallback.

    Returns:
        (offset_y, offset_x, h, w), int32 scalars with
        0 <= offset_y <= H - h and 0 <= offset_x <= W - w.
    """
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
                        attempts=10, antialias=True):
    """torchvision `RandomResizedCrop`: crop a random box, resize bilinearly.

    The official PAWS code runs it on PIL images, whose bilinear resize
    widens its triangle filter when it shrinks (antialiasing): with
    `antialias` (the default) the view matches PIL's to within its uint8
    rounding, as evaluation's `center_view` does. Without it, the resize
    samples the box like torchvision on tensors or SimCLR's TF code, which
    aliases when the box is larger than the view. Slice + resize with
    half-pixel centres: `tf.image.crop_and_resize` is slower on CPU, and
    float rounding of its align-corners boxes put ~6% of edge-touching
    samples outside the image (extrapolation value 0).

    Args:
        image: [H, W, C] uint8 (scaled by 1/255) or float in [0, 1].
        seed: [2] int32/int64 stateless seed.
        size: int or (height, width) of the output.
        scale: (min, max) fraction of the image area.
        ratio: (min, max) aspect ratio w/h.
        attempts: candidate boxes before the centre-crop fallback.
        antialias: widen the filter when shrinking, as PIL does.

    Returns:
        [size, size, C] float32 in [0, 1].
    """
    image = tf.convert_to_tensor(image)
    shape = tf.shape(image)
    offset_y, offset_x, h, w = sample_crop_box(
        shape[0], shape[1], seed, scale, ratio, attempts)
    crop = image[offset_y:offset_y + h, offset_x:offset_x + w]
    return _resize(crop, (size, size) if isinstance(size, int) else size,
                   antialias=antialias)


def adjust_brightness(image, factor):
    """torchvision `adjust_brightness`: clip(factor * x)."""
    return tf.clip_by_value(image * factor, 0.0, 1.0)


def adjust_contrast(image, factor):
    """torchvision `adjust_contrast`: blend with the mean of the luma."""
    if _channels(image) == 3:
        mean = tf.reduce_mean(tf.matmul(image, _LUMA_TO_RGB))
    else:
        mean = tf.reduce_mean(image)
    return tf.clip_by_value(factor * image + (1 - factor) * mean, 0.0, 1.0)


def adjust_saturation(image, factor):
    """torchvision `adjust_saturation`: blend with the luma (1-channel: id)."""
    if _channels(image) == 1:
        return image
    # factor * x + (1 - factor) * gray(x) is one linear colour map.
    blend = factor * tf.eye(3) + (1 - factor) * tf.constant(_LUMA_TO_RGB)
    return tf.clip_by_value(tf.matmul(image, blend), 0.0, 1.0)


def adjust_hue(image, factor):
    """torchvision `adjust_hue`: hue += factor turns (1-channel: identity)."""
    if _channels(image) == 1:
        return image
    return tf.image.adjust_hue(image, factor)


# Indexed as torchvision's ColorJitter fn_idx: 0 brightness, 1 contrast,
# 2 saturation, 3 hue.
_JITTER_OPS = (adjust_brightness, adjust_contrast, adjust_saturation,
               adjust_hue)


def jitter_params(seed, strength):
    """Samples `ColorJitter(0.8s, 0.8s, 0.8s, 0.2s)` parameters (SimCLR).

    Args:
        seed: [2] int32/int64 stateless seed.
        strength: colour distortion strength s, 0 <= s <= 2.5.

    Returns:
        (order, factors): order is a uniformly random [4] int32 permutation
        (order[k] = op applied k-th); factors is [4] float32 (brightness,
        contrast, saturation in [max(0, 1 - 0.8s), 1 + 0.8s], hue in
        [-0.2s, 0.2s]).
    """
    if not 0 <= strength <= 2.5:
        raise ValueError(f'strength must be in [0, 2.5] (hue <= 0.5 turn as '
                         f'torchvision requires), got {strength}.')
    order_seed, factor_seed = _split(seed, 2)
    order = tf.argsort(tf.random.stateless_uniform([4], order_seed))
    low = tf.constant([max(0.0, 1 - 0.8 * strength)] * 3 + [-0.2 * strength])
    high = tf.constant([1 + 0.8 * strength] * 3 + [0.2 * strength])
    u = tf.random.stateless_uniform([4], factor_seed)
    return order, low + (high - low) * u


def color_jitter(image, seed, strength):
    """Applies the four ColorJitter ops of `jitter_params`, in its order.

    Args:
        image: [H, W, C] float32 in [0, 1], C in (1, 3).
        seed: [2] int32/int64 stateless seed.
        strength: colour distortion strength s.

    Returns:
        [H, W, C] float32 in [0, 1].
    """
    order, factors = jitter_params(seed, strength)
    for step in range(4):
        # switch_case runs only the selected op; all 24 orders share 4 Cases.
        image = tf.switch_case(order[step], [
            lambda op=op, i=i, x=image: op(x, factors[i])
            for i, op in enumerate(_JITTER_OPS)])
    return image


def quantize(image):
    """Float [0, 1] -> uint8, rounded: the image PIL would hold."""
    return tf.cast(tf.round(tf.clip_by_value(image, 0.0, 1.0) * 255.0),
                   tf.uint8)


def _on_uint8(op, image):
    """`op` applied to the uint8 quantisation of a float [0, 1] image."""
    return tf.cast(op(quantize(image)), tf.float32) * _UINT8_SCALE


def solarize(image, threshold=128):
    """PIL `ImageOps.solarize`: values >= `threshold` become 255 - value.

    Args:
        image: [H, W, C] uint8.
        threshold: scalar; PIL keeps value v where v < threshold.

    Returns:
        [H, W, C] uint8.
    """
    image = tf.convert_to_tensor(image, tf.uint8)
    return tf.where(tf.cast(image, tf.float32) < threshold, image,
                    255 - image)


def equalize(image):
    """PIL `ImageOps.equalize`, each channel on its own histogram.

    PIL's look-up table: with h the channel's histogram and `step` =
    (pixels - count of its highest occupied value) // 255, value i maps to
    (step // 2 + pixels below i) // step, capped at 255; a channel with one
    occupied value or `step` 0 is left unchanged.

    Args:
        image: [H, W, C] uint8, static C.

    Returns:
        [H, W, C] uint8.
    """
    image = tf.convert_to_tensor(image, tf.uint8)
    channels = image.shape[-1]
    pixels = tf.reshape(tf.cast(image, tf.int32), [-1, channels])  # [N, C]
    bins = 256 * channels
    histogram = tf.reshape(tf.math.bincount(
        pixels + 256 * tf.range(channels), minlength=bins, maxlength=bins,
        dtype=tf.int32), [channels, 256])  # [C, 256]
    occupied = tf.cast(histogram > 0, tf.int32)
    highest = 255 - tf.argmax(tf.reverse(occupied, [1]), axis=1,
                              output_type=tf.int32)  # [C]
    step = (tf.shape(pixels)[0] -
            tf.gather(histogram, highest, batch_dims=1)) // 255  # [C]
    divisor = tf.maximum(step, 1)[:, None]
    lut = tf.minimum((divisor // 2 + tf.cumsum(histogram, axis=1,
                                               exclusive=True)) // divisor,
                     255)  # [C, 256]
    unchanged = (tf.reduce_sum(occupied, axis=1) <= 1) | (step == 0)
    lut = tf.where(unchanged[:, None], tf.range(256)[None], lut)
    mapped = tf.gather(lut, tf.transpose(pixels), batch_dims=1)  # [C, N]
    return tf.reshape(tf.cast(tf.transpose(mapped), tf.uint8),
                      tf.shape(image))


def _random_apply(coin, prob, op, image):
    return tf.cond(coin < prob, lambda: op(image), lambda: image)


def color_distortion(image, seed, strength=1.0, kind='simclr',
                     jitter_prob=0.8, grayscale_prob=0.2, solarize_prob=0.2,
                     equalize_prob=0.2):
    """Random-order colour jitter, then the second half of `kind`.

    Both kinds start with RandomApply(ColorJitter(0.8s, 0.8s, 0.8s, 0.2s),
    p=jitter_prob) (suncet / SimCLR `get_color_distortion(s)`):
      'simclr': then RandomGrayscale(grayscale_prob) (the ImageNet views);
      'cifar10': then Solarize(solarize_prob) with a threshold drawn
          uniformly in [0, 256), then Equalize(equalize_prob), PIL's
          operations on the uint8 image (the official PAWS CIFAR-10 views,
          suncet `src/data_manager.py`).
    With strength 0 the whole distortion is skipped.

    Args:
        image: [H, W, C] float in [0, 1], C in (1, 3); for C = 1 only
            brightness and contrast act in the jitter.
        seed: [2] int32/int64 stateless seed.
        strength: colour distortion strength s.
        kind: one of `DISTORTIONS`.
        jitter_prob, grayscale_prob, solarize_prob, equalize_prob: the
            probabilities of each operation.

    Returns:
        [H, W, C] float32 in [0, 1].
    """
    check_distortion(kind)
    image = tf.cast(image, tf.float32)
    if strength == 0:
        return image
    coin_seed, jitter_seed = _split(seed, 2)
    coins = tf.random.stateless_uniform([4], coin_seed)
    image = _random_apply(coins[0], jitter_prob,
                          lambda x: color_jitter(x, jitter_seed, strength),
                          image)
    if kind == 'simclr':
        if _channels(image) == 3:
            image = _random_apply(coins[1], grayscale_prob,
                                  lambda x: tf.matmul(x, _LUMA_TO_RGB), image)
        return tf.clip_by_value(image, 0.0, 1.0)
    # torch.rand(1) * 256, as the official Solarize draws its threshold.
    threshold = 256.0 * coins[3]
    image = _random_apply(
        coins[1], solarize_prob,
        lambda x: _on_uint8(lambda u: solarize(u, threshold), x), image)
    return _random_apply(coins[2], equalize_prob,
                         lambda x: _on_uint8(equalize, x), image)


def check_distortion(kind):
    """Raises ValueError naming `DISTORTIONS` if `kind` is not one."""
    if kind not in DISTORTIONS:
        raise ValueError(
            f'Unknown colour distortion {kind!r}: use one of {DISTORTIONS} '
            "(MultiCropConfig.distortion, e.g. 'cifar10' for the official "
            "PAWS CIFAR-10 views, 'simclr' for ImageNet's).")


def box_blur_radius(sigma, passes=3):
    """PIL's extended-box radius whose `passes` boxes approximate a Gaussian
    of standard deviation `sigma` (Gwosdek et al. 2011, Eqs. 7, 11, 14),
    in PIL's float32 arithmetic."""
    sigma2 = tf.cast(sigma, tf.float32) ** 2 / passes
    length = tf.cast(tf.sqrt(12.0 * tf.cast(sigma2, tf.float64) + 1.0),
                     tf.float32)
    whole = tf.cast(tf.floor((tf.cast(length, tf.float64) - 1.0) / 2.0),
                    tf.float32)
    fraction = (2 * whole + 1) * (whole * (whole + 1) - 3 * sigma2) / (
        6 * (sigma2 - (whole + 1) * (whole + 1)))
    return whole + fraction


def _box_blur_pass(x, axis, radius):
    """One pass of PIL's extended box blur of float64 integers along `axis`
    of [H, W, C]: 2r + 1 taps of weight ww / 2^24 and the two beyond of fw /
    2^24 (r = int(radius)), edge pixels repeated, rounded to integers, in
    PIL's fixed-point arithmetic (exact in float64)."""
    n = tf.shape(x)[axis]
    r = tf.cast(radius, tf.int32)
    inner = tf.cast(tf.floor(2.0 ** 24 / (radius * 2 + 1)), tf.float64)
    outer = tf.floor((2.0 ** 24 - tf.cast(2 * r + 1, tf.float64) * inner) / 2)
    padded = tf.gather(x, tf.clip_by_value(tf.range(-r - 1, n + r + 1), 0,
                                           n - 1), axis=axis)
    sums = tf.cumsum(padded, axis=axis)

    def window(t, start):  # t[start:start + n] along `axis`.
        begin = tf.one_hot(axis, 3, on_value=start, off_value=0)
        size = tf.one_hot(axis, 3, on_value=n, off_value=-1)
        return tf.slice(t, begin, size)

    inside = window(sums, 2 * r + 1) - window(sums, 0)
    beyond = window(padded, 0) + window(padded, 2 * r + 2)
    return tf.floor((inside * inner + beyond * outer + 2.0 ** 23) / 2.0 ** 24)


def box_gaussian_blur(image, sigma, passes=3):
    """PIL `ImageFilter.GaussianBlur(radius=sigma)` of a uint8 image.

    PIL approximates the Gaussian with `passes` extended box blurs along the
    rows, then along the columns, each rounded to uint8, with the edge
    pixels repeated: no kernel truncation; the same values as PIL.

    Args:
        image: [H, W, C] uint8.
        sigma: scalar standard deviation, in pixels.
        passes: boxes per direction (PIL: 3).

    Returns:
        [H, W, C] uint8.
    """
    radius = box_blur_radius(sigma, passes)
    x = tf.cast(image, tf.float64)
    for axis in (1, 0):
        for _ in range(passes):
            x = _box_blur_pass(x, axis, radius)
    return tf.cast(x, tf.uint8)


def gaussian_blur(image, seed, prob=0.5, sigma_range=(0.1, 2.0)):
    """The official PAWS random Gaussian blur (PIL, on the uint8 image).

    Args:
        image: [H, W, C] float in [0, 1].
        seed: [2] int32/int64 stateless seed.
        prob: probability of blurring.
        sigma_range: (min, max) of the uniform sigma, in pixels.

    Returns:
        [H, W, C] float32 in [0, 1] (multiples of 1/255 where blurred).
    """
    image = tf.cast(image, tf.float32)
    u = tf.random.stateless_uniform([2], seed)
    sigma = sigma_range[0] + (sigma_range[1] - sigma_range[0]) * u[1]
    return _random_apply(
        u[0], prob,
        lambda x: _on_uint8(lambda v: box_gaussian_blur(v, sigma), x), image)


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


def make_view(image, seed, *, size, scale, mean, std, color_strength=1.0,
              blur_prob=0.0, flip=True, ratio=(3 / 4, 4 / 3),
              distortion='simclr'):
    """One view: crop, flip, colour distortion, blur, normalise.

    The official PAWS order (suncet `src/data_manager.py`).

    Args:
        image: [H, W, C] uint8 or float in [0, 1].
        seed: [2] int32/int64 stateless seed.
        size: int or (height, width) of the view.
        scale: (min, max) area fraction of the random resized crop.
        mean: length-C channel means.
        std: length-C channel standard deviations.
        color_strength: colour distortion strength; 0 skips it.
        blur_prob: Gaussian blur probability; 0 skips it.
        flip: whether to flip left-right with probability 0.5.
        ratio: (min, max) aspect ratio of the crop.
        distortion: colour distortion kind, one of `DISTORTIONS`.

    Returns:
        [size, size, C] float32, normalised.
    """
    crop_seed, flip_seed, color_seed, blur_seed = _split(seed, 4)
    view = random_resized_crop(image, crop_seed, size, scale, ratio)
    if flip:
        view = random_flip(view, flip_seed)
    if color_strength:
        view = color_distortion(view, color_seed, color_strength,
                                kind=distortion)
    if blur_prob:
        view = gaussian_blur(view, blur_seed, blur_prob)
    return normalize(view, mean, std)


def center_view(image, size, *, crop_fraction, mean, std):
    """Evaluation view: torchvision Resize(size / crop_fraction), CenterCrop.

    The shorter side is resized (bilinear, antialiased like PIL) to
    round(size / crop_fraction); with crop_fraction 1 and a size x size
    input the result is the normalised input, uncropped.

    Args:
        image: [H, W, C] uint8 or float in [0, 1].
        size: int, output height and width.
        crop_fraction: in (0, 1], e.g. 0.875 for ImageNet, 1.0 for CIFAR-10.
        mean: length-C channel means.
        std: length-C channel standard deviations.

    Returns:
        [size, size, C] float32, normalised.
    """
    if not 0 < crop_fraction <= 1:
        raise ValueError(f'crop_fraction must be in (0, 1], got '
                         f'{crop_fraction}.')
    short = round(size / crop_fraction)
    shape = tf.shape(image)
    height, width = shape[0], shape[1]
    # torchvision: the longer side becomes int(short * long / shorter).
    resized_h = tf.where(height <= width, short, short * height // width)
    resized_w = tf.where(height <= width, short * width // height, short)
    image = _resize(tf.convert_to_tensor(image), [resized_h, resized_w],
                    antialias=True)
    # torchvision CenterCrop: int(round((H - size) / 2)).
    top = tf.cast(tf.round((resized_h - size) / 2), tf.int32)
    left = tf.cast(tf.round((resized_w - size) / 2), tf.int32)
    image = tf.image.crop_to_bounding_box(image, top, left, size, size)
    return normalize(image, mean, std)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class MultiCropConfig:
    """SwAV/PAWS multi-crop: 2 global views and `num_local` local views.

    Attributes:
        global_size, local_size: output side of global / local views.
        global_scale, local_scale: (min, max) crop area fractions.
        num_local: number m of local views.
        color_strength: colour distortion strength (0 disables it).
        blur_prob: Gaussian blur probability; like `color_strength`, applied
            to global and local views alike, as in the official PAWS code.
        mean, std: length-C normalisation constants; None (both) when the
            run's normalisation (`load_data.normalization`) gives them, as
            in the folder recipes (`pipeline.make_pretrain_dataset_fn` fills
            them in).
        distortion: colour distortion kind, one of `DISTORTIONS`.
    """
    global_size: int
    global_scale: tuple
    local_size: int
    local_scale: tuple
    num_local: int
    color_strength: float
    blur_prob: float
    mean: tuple = None
    std: tuple = None
    distortion: str = 'simclr'

    def __post_init__(self):
        # gin passes lists; keep the (frozen) config hashable.
        for name in ('global_scale', 'local_scale', 'mean', 'std'):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        check_distortion(self.distortion)


# PAWS (arXiv 2104.13963) Sec. 5 and App. A: 224 px at (0.14, 1), 6 x 96 px
# at (0.05, 0.14); colour strength 1 (suncet configs/paws/imgnt_train.yaml).
IMAGENET_MULTICROP = MultiCropConfig(
    global_size=224, global_scale=(0.14, 1.0), local_size=96,
    local_scale=(0.05, 0.14), num_local=6, color_strength=1.0, blur_prob=0.5,
    mean=IMAGENET_MEAN, std=IMAGENET_STD)
# PAWS App. C: 32 px at (0.75, 1), 6 x 18 px at (0.3, 0.75), no blur; colour
# strength 0.5 (suncet cifar10_train.yaml), followed by random solarize and
# equalize (p = 0.2 each) where SimCLR has grayscale (suncet
# src/data_manager.py).
CIFAR10_MULTICROP = MultiCropConfig(
    global_size=32, global_scale=(0.75, 1.0), local_size=18,
    local_scale=(0.3, 0.75), num_local=6, color_strength=0.5, blur_prob=0.0,
    mean=CIFAR10_MEAN, std=CIFAR10_STD, distortion='cifar10')


@gin.configurable
def imagenet_multicrop(**overrides):
    """`IMAGENET_MULTICROP` with fields replaced by `overrides` (gin)."""
    return dataclasses.replace(IMAGENET_MULTICROP, **overrides)


@gin.configurable
def cifar10_multicrop(**overrides):
    """`CIFAR10_MULTICROP` with fields replaced by `overrides` (gin)."""
    return dataclasses.replace(CIFAR10_MULTICROP, **overrides)


def multicrop_views(image, seed, config):
    """Multi-crop views of one image, each with its own sub-seed.

    Args:
        image: [H, W, C] uint8 or float in [0, 1].
        seed: [2] int32/int64 stateless seed.
        config: a `MultiCropConfig`.

    Returns:
        (global_views, local_views): tuples of 2 [global_size, global_size,
        C] and `num_local` [local_size, local_size, C] float32 views.
    """
    seeds = _split(seed, 2 + config.num_local)
    common = dict(color_strength=config.color_strength,
                  blur_prob=config.blur_prob, mean=config.mean, std=config.std,
                  distortion=config.distortion)
    global_views = tuple(
        make_view(image, s, size=config.global_size, scale=config.global_scale,
                  **common) for s in seeds[:2])
    local_views = tuple(
        make_view(image, s, size=config.local_size, scale=config.local_scale,
                  **common) for s in seeds[2:])
    return global_views, local_views
