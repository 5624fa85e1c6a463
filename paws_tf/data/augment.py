"""Stateless SimCLR image augmentations and PAWS multi-crop views."""

import dataclasses

import gin
import tensorflow as tf

from paws_tf.data import color
from paws_tf.data import image_ops

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


def make_view(image, seed, *, size, scale, mean, std, color_strength=1.0,
              blur_prob=0.0, distortion='simclr'):
    """One view: crop, flip, colour distortion, blur, normalise.

    The official PAWS order (suncet `src/data_manager.py`).

    Args:
        image: [H, W, C] uint8 or float in [0, 1].
        seed: [2] int32/int64 stateless seed.
        size: int or (height, width) of the view.
        scale: (min, max) area fraction of the random resized crop.
        mean, std: length-C channel means and standard deviations.
        color_strength: colour distortion strength; 0 skips it.
        blur_prob: Gaussian blur probability; 0 skips it.
        distortion: colour distortion kind, one of `color.DISTORTIONS`.

    Returns:
        [size, size, C] float32, normalised.
    """
    crop_seed, flip_seed, color_seed, blur_seed = image_ops.split_seed(seed, 4)
    view = image_ops.random_resized_crop(image, crop_seed, size, scale)
    view = image_ops.random_flip(view, flip_seed)
    if color_strength:
        view = color.color_distortion(view, color_seed, color_strength,
                                      kind=distortion)
    if blur_prob:
        view = image_ops.gaussian_blur(view, blur_seed, blur_prob)
    return image_ops.normalize(view, mean, std)


def center_view(image, size, *, crop_fraction, mean, std):
    """Evaluation view: torchvision Resize(size / crop_fraction), CenterCrop.

    The shorter side is resized (bilinear, antialiased like PIL) to
    round(size / crop_fraction); with crop_fraction 1 and a size x size
    input the result is the normalised input, uncropped.

    Args:
        image: [H, W, C] uint8 or float in [0, 1].
        size: int, output height and width.
        crop_fraction: in (0, 1], e.g. 0.875 for ImageNet, 1.0 for CIFAR-10.
        mean, std: length-C channel means and standard deviations.

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
        mean, std: length-C normalisation constants: None in a run, which
            fills them in from `load_data.normalization`; Python code may
            give them here instead of `make_pretrain_dataset_fn`'s
            `normalization`.
        distortion: colour distortion kind, one of `color.DISTORTIONS`.
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
        color.check_distortion(self.distortion)


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
    """Multi-crop views of one image, each with its own sub-seed.

    Args:
        image: [H, W, C] uint8 or float in [0, 1].
        seed: [2] int32/int64 stateless seed.
        config: a `MultiCropConfig`.

    Returns:
        (global_views, local_views): tuples of 2 [global_size, global_size,
        C] and `num_local` [local_size, local_size, C] float32 views.
    """
    seeds = image_ops.split_seed(seed, 2 + config.num_local)
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
