"""Stateless SimCLR and CIFAR-10 augmentations, and PAWS multi-crop views."""

import dataclasses
import functools

import gin
import tensorflow as tf

from paws_tf import as_written  # noqa: F401  (AutoGraph leaves paws_tf)
from paws_tf import checks
from paws_tf.data import image_ops

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)
# Fixed normalisations by name, for `load_data.normalization`.
NORMALIZATIONS = {'imagenet': (IMAGENET_MEAN, IMAGENET_STD),
                  'cifar10': (CIFAR10_MEAN, CIFAR10_STD)}
# tf.matmul([H, W, 3], _LUMA_TO_RGB) is the luma (ITU-R 601, torchvision's
# rgb_to_grayscale weights) in all three channels: several times faster in
# Eigen than broadcasting [H, W, 1] to [H, W, 3].
_LUMA_TO_RGB = tuple((w,) * 3 for w in (0.2989, 0.587, 0.114))
# The kinds of `color_distortion`.
DISTORTIONS = ('simclr', 'cifar10')


def adjust_brightness(image, factor):
    """torchvision `adjust_brightness`: clip(factor * x)."""
    return tf.clip_by_value(image * factor, 0.0, 1.0)


def adjust_contrast(image, factor):
    """torchvision `adjust_contrast`: blend with the mean of the luma."""
    gray = (tf.matmul(image, _LUMA_TO_RGB)
            if image_ops.num_channels(image) == 3 else image)
    mean = tf.reduce_mean(gray)
    return tf.clip_by_value(factor * image + (1 - factor) * mean, 0.0, 1.0)


def adjust_saturation(image, factor):
    """torchvision `adjust_saturation`: blend with the luma (1-channel: id)."""
    if image_ops.num_channels(image) == 1:
        return image
    # factor * x + (1 - factor) * gray(x) is one linear colour map.
    blend = factor * tf.eye(3) + (1 - factor) * tf.constant(_LUMA_TO_RGB)
    return tf.clip_by_value(tf.matmul(image, blend), 0.0, 1.0)


def adjust_hue(image, factor):
    """torchvision `adjust_hue`: hue += factor turns (1-channel: identity)."""
    if image_ops.num_channels(image) == 1:
        return image
    return tf.image.adjust_hue(image, factor)


# Indexed as torchvision's ColorJitter fn_idx: 0 brightness, 1 contrast,
# 2 saturation, 3 hue.
_JITTER_OPS = (adjust_brightness, adjust_contrast, adjust_saturation,
               adjust_hue)


def jitter_params(seed, strength):
    """`(order, factors)` of SimCLR's `ColorJitter(0.8s, 0.8s, 0.8s,
    0.2s)` of `strength` s in [0, 2.5], drawn from the stateless `seed`: a
    uniformly random [4] int32 permutation (op order[k] applied k-th) and
    [4] float32 factors (brightness, contrast, saturation in
    [max(0, 1 - 0.8s), 1 + 0.8s], hue in [-0.2s, 0.2s])."""
    if not 0 <= strength <= 2.5:
        raise ValueError(f'strength must be in [0, 2.5] (hue <= 0.5 turn as '
                         f'torchvision requires), got {strength}.')
    order_seed, factor_seed = image_ops.split_seed(seed, 2)
    order = tf.argsort(tf.random.stateless_uniform([4], order_seed))
    low = tf.constant([max(0.0, 1 - 0.8 * strength)] * 3 + [-0.2 * strength])
    high = tf.constant([1 + 0.8 * strength] * 3 + [0.2 * strength])
    u = tf.random.stateless_uniform([4], factor_seed)
    return order, low + (high - low) * u


def color_jitter(image, seed, strength):
    """The four ColorJitter ops of `jitter_params(seed, strength)`, in its
    order, on `image`, [H, W, C] float32 in [0, 1] (C 1 or 3)."""
    order, factors = jitter_params(seed, strength)

    def step(k, x):
        # switch_case runs only the selected op; all 24 orders share one
        # Case, which a loop traces once instead of once per step.
        return k + 1, tf.ensure_shape(tf.switch_case(order[k], [
            lambda op=op, i=i: op(x, factors[i])
            for i, op in enumerate(_JITTER_OPS)]), x.shape)

    return tf.while_loop(lambda k, x: k < 4, step, (0, image))[1]


def solarize(image, threshold=128):
    """PIL `ImageOps.solarize` of [H, W, C] uint8: values >= the scalar
    `threshold` become 255 - value."""
    image = tf.convert_to_tensor(image, tf.uint8)
    return tf.where(tf.cast(image, tf.float32) < threshold, image, 255 - image)


def equalize(image):
    """PIL `ImageOps.equalize`, each channel on its own histogram.

    PIL's look-up table: with h the channel's histogram and `step` =
    (pixels - count of its highest occupied value) // 255, value i maps to
    (step // 2 + pixels below i) // step, capped at 255; a channel with one
    occupied value or `step` 0 is left unchanged.

    `image`: [H, W, C] uint8, static C; the result alike.
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
    return tf.reshape(tf.cast(tf.transpose(mapped), tf.uint8), tf.shape(image))


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

    Args:
        image: [H, W, C] float in [0, 1], C in (1, 3); for C = 1 only
            brightness and contrast act in the jitter; the result float32.
        seed: [2] int32/int64 stateless seed.
        strength: colour distortion strength s; 0 skips the distortion.
        kind: one of `DISTORTIONS`.
        jitter_prob, grayscale_prob, solarize_prob, equalize_prob: each
            operation's probability.
    """
    check_distortion(kind)
    image = tf.cast(image, tf.float32)
    if strength == 0:
        return image
    coin_seed, jitter_seed = image_ops.split_seed(seed, 2)
    coins = tf.random.stateless_uniform([4], coin_seed)
    image = image_ops.random_apply(
        coins[0], jitter_prob,
        lambda x: color_jitter(x, jitter_seed, strength), image)
    if kind == 'simclr':
        if image_ops.num_channels(image) == 3:
            image = image_ops.random_apply(
                coins[1], grayscale_prob,
                lambda x: tf.matmul(x, _LUMA_TO_RGB), image)
        return tf.clip_by_value(image, 0.0, 1.0)
    # torch.rand(1) * 256, as the official Solarize draws its threshold.
    threshold = 256.0 * coins[3]
    image = image_ops.random_apply(
        coins[1], solarize_prob,
        lambda x: image_ops.on_uint8(lambda u: solarize(u, threshold), x),
        image)
    return image_ops.random_apply(
        coins[2], equalize_prob,
        lambda x: image_ops.on_uint8(equalize, x), image)


def check_distortion(kind):
    """Raises ValueError naming `DISTORTIONS` if `kind` is not one."""
    if kind not in DISTORTIONS:
        raise ValueError(
            f'Unknown colour distortion {kind!r}: use one of {DISTORTIONS} '
            "(MultiCropConfig.distortion, e.g. 'cifar10' for the official "
            "PAWS CIFAR-10 views, 'simclr' for ImageNet's).")


def make_view(image, seed, *, size, scale, mean, std, color_strength=1.0,
              blur_prob=0.0, distortion='simclr'):
    """One view, [size, size, C] float32: crop, flip, colour distortion,
    blur, normalise (the official PAWS order, suncet `src/data_manager.py`).

    Args:
        image: [H, W, C] uint8 or float in [0, 1].
        seed: [2] int32/int64 stateless seed.
        size, scale: int or (height, width) of the view; (min, max) area
            fraction of the random resized crop.
        mean, std: length-C channel means and standard deviations.
        color_strength, blur_prob: 0 skips the colour distortion, the blur.
        distortion: colour distortion kind, one of `DISTORTIONS`.
    """
    crop_seed, flip_seed, color_seed, blur_seed = image_ops.split_seed(seed, 4)
    view = image_ops.random_resized_crop(image, crop_seed, size, scale)
    view = image_ops.random_flip(view, flip_seed)
    view = color_distortion(view, color_seed, color_strength, kind=distortion)
    if blur_prob:
        view = image_ops.gaussian_blur(view, blur_seed, blur_prob)
    return image_ops.normalize(view, mean, std)


def view_function(*, size, scale, mean, std, color_strength, blur_prob,
                  distortion):
    """`make_view` with these settings as a `tf.function` of (image, seed),
    one per process: each image signature is traced once, however many
    views and pipelines call it (a function call in each `tf.data` map).
    The settings are keyed by value (a list as its tuple, as gin gives
    either), whatever order the keywords come in."""
    return _traced_view(size, tuple(scale), tuple(mean), tuple(std),
                        color_strength, blur_prob, distortion)


@functools.lru_cache(maxsize=None)
def _traced_view(size, scale, mean, std, color_strength, blur_prob,
                 distortion):
    """`view_function`'s cache: one `tf.function` per setting."""
    return tf.function(functools.partial(
        make_view, size=size, scale=scale, mean=mean, std=std,
        color_strength=color_strength, blur_prob=blur_prob,
        distortion=distortion), autograph=False)


def center_view(image, size, *, crop_fraction, mean, std):
    """Evaluation view, [size, size, C] float32 of `image`: torchvision
    Resize(round(size / crop_fraction)) of the shorter side (bilinear,
    antialiased like PIL), then CenterCrop(size), then normalised by
    `mean`, `std`; `crop_fraction` in (0, 1], e.g. 0.875 for ImageNet, 1.0
    for CIFAR-10."""
    if not 0 < crop_fraction <= 1:
        raise ValueError(f'crop_fraction must be in (0, 1], got '
                         f'{crop_fraction}.')
    short = round(size / crop_fraction)
    height, width = tf.unstack(tf.shape(image)[:2])
    # torchvision: the longer side becomes int(short * long / shorter).
    resized_h = tf.where(height <= width, short, short * height // width)
    resized_w = tf.where(height <= width, short * width // height, short)
    image = image_ops.resize(tf.convert_to_tensor(image),
                             [resized_h, resized_w], antialias=True)
    # torchvision CenterCrop: int(round((H - size) / 2)).
    top = tf.cast(tf.round((resized_h - size) / 2), tf.int32)
    left = tf.cast(tf.round((resized_w - size) / 2), tf.int32)
    image = tf.image.crop_to_bounding_box(image, top, left, size, size)
    return image_ops.normalize(image, mean, std)


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
        mean, std: length-C normalisation constants, on the pixels' 0-1
            scale (ImageNet's `IMAGENET_MEAN`, `IMAGENET_STD`); None where
            `make_pretrain_dataset_fn`'s `normalization` gives them.
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
        checks.integer('MultiCropConfig.num_local', self.num_local,
                       minimum=0)
        for view in ['global'] + (['local'] if self.num_local else []):
            checks.integer(f'MultiCropConfig.{view}_size',
                           getattr(self, f'{view}_size'))
            scale = getattr(self, f'{view}_scale')
            if not (len(scale) == 2 and 0 < scale[0] <= scale[1] <= 1):
                raise checks.ConfigError(
                    f'MultiCropConfig.{view}_scale = {scale}: give (low, '
                    'high) area fractions with 0 < low <= high <= 1.')
        checks.number('MultiCropConfig.color_strength', self.color_strength,
                      low=0.0)
        if not 0 <= checks.number('MultiCropConfig.blur_prob',
                                  self.blur_prob) <= 1:
            raise checks.ConfigError(
                f'MultiCropConfig.blur_prob = {self.blur_prob}: give a '
                'probability in [0, 1].')

    def view_function(self, size, scale):
        """`view_function` of this config's colour, blur and normalisation
        settings, for views of side `size` cropped at `scale`."""
        return view_function(
            size=size, scale=scale, mean=self.mean, std=self.std,
            color_strength=self.color_strength, blur_prob=self.blur_prob,
            distortion=self.distortion)


# PAWS (arXiv 2104.13963) Sec. 5 and App. A: 224 px at (0.14, 1), 6 x 96 px
# at (0.05, 0.14); colour strength 1 (suncet configs/paws/imgnt_train.yaml).
IMAGENET_MULTICROP = MultiCropConfig(
    global_size=224, global_scale=(0.14, 1.0), local_size=96,
    local_scale=(0.05, 0.14), num_local=6, color_strength=1.0, blur_prob=0.5)
# PAWS App. C: 32 px at (0.75, 1), 6 x 18 px at (0.3, 0.75), no blur; colour
# strength 0.5 (suncet cifar10_train.yaml), followed by random solarize and
# equalize (p = 0.2 each) where SimCLR has grayscale (suncet
# src/data_manager.py).
CIFAR10_MULTICROP = MultiCropConfig(
    global_size=32, global_scale=(0.75, 1.0), local_size=18,
    local_scale=(0.3, 0.75), num_local=6, color_strength=0.5, blur_prob=0.0,
    distortion='cifar10')


@gin.configurable
def imagenet_multicrop(**overrides):
    """`IMAGENET_MULTICROP` with fields replaced by `overrides` (gin)."""
    return dataclasses.replace(IMAGENET_MULTICROP, **overrides)


@gin.configurable
def cifar10_multicrop(**overrides):
    """`CIFAR10_MULTICROP` with fields replaced by `overrides` (gin)."""
    return dataclasses.replace(CIFAR10_MULTICROP, **overrides)


def multicrop_views(image, seed, config):
    """`(global_views, local_views)` of `image` (as `make_view` takes
    it) by the `MultiCropConfig` `config`: tuples of 2 global and
    `num_local` local float32 views, each with its own sub-seed of `seed`.
    """
    seeds = image_ops.split_seed(seed, 2 + config.num_local)
    global_view = config.view_function(config.global_size, config.global_scale)
    local_view = config.view_function(config.local_size, config.local_scale)
    return (tuple(global_view(image, s) for s in seeds[:2]),
            tuple(local_view(image, s) for s in seeds[2:]))
