"""The run's normalisation (`load_data.normalization`, its one source):
a preset, a (mean, std) pair, or computed from the images and recorded."""

import dataclasses
import math

from absl import logging
import numpy as np
import tensorflow as tf

from paws_tf import checks
from paws_tf.data import augment

# `load_data.normalization` (the folder recipes bind it through this macro):
# the per-channel mean and std computed from the labeled images.
FROM_DATA = 'data'
NORMALIZATION_MACRO = 'NORMALIZATION'
_CHOICES = (
    f"'{FROM_DATA}', one of {sorted(augment.NORMALIZATIONS)} or a (mean, std) "
    f"pair such as ((0.5,), (0.25,)) ('{FROM_DATA}': from the images)")


def checked_values(binding, mean, std, channels):
    """`(mean, std)` as float tuples, checked: numbers on the 0-1 scale,
    positive stds, `channels` of each if not None; ValueError naming
    `binding` otherwise."""
    try:
        mean = tuple(float(m) for m in mean)
        std = tuple(float(s) for s in std)
    except (TypeError, ValueError):
        raise ValueError(
            f'{binding} must hold sequences of numbers, got mean {mean!r} and '
            f'std {std!r}.') from None
    if not mean or len(mean) != len(std) or min(std) <= 0:
        raise ValueError(
            f'{binding}: mean {mean} and std {std} must have one value per '
            'channel each, and positive stds.')
    # Pixels in [0, 1] have means there and stds of at most 0.5.
    if min(mean) < 0 or max(mean) > 1 or max(std) > 1:
        raise ValueError(
            f'{binding}: mean {mean} and std {std} are not on the pixels\' '
            '0-1 scale, the one images are normalised on: divide 0-255 '
            f'values by 255 (ImageNet\'s: {augment.IMAGENET_MEAN}, '
            f'{augment.IMAGENET_STD}).')
    if channels is not None and len(mean) != channels:
        example = (augment.IMAGENET_MEAN, augment.IMAGENET_STD) if (
            channels == 3) else ((0.5,) * channels, (0.25,) * channels)
        raise ValueError(
            f'{binding} gives {len(mean)} channel(s) (mean {mean}, std {std}) '
            f'but the images are decoded to {channels}: bind {channels} '
            f'value(s) each, e.g. {example}, or (folder recipes) '
            f"{NORMALIZATION_MACRO} = '{FROM_DATA}', computed from the "
            'images.')
    return mean, std


def normalization(spec, channels=None):
    """The checked `load_data.normalization` value `spec` (None,
    `FROM_DATA`, a preset of `augment.NORMALIZATIONS` or a `(mean, std)`
    pair), for images of `channels` if known: `spec` for None and
    `FROM_DATA`, else the `(mean, std)` tuples. ValueError naming the
    binding and the valid values."""
    if spec is None or spec == FROM_DATA:
        return spec
    binding = f'{NORMALIZATION_MACRO} (load_data.normalization) = {spec!r}'
    if isinstance(spec, str):
        if spec not in augment.NORMALIZATIONS:
            raise ValueError(f'{binding} is unknown: use {_CHOICES}.')
        spec = augment.NORMALIZATIONS[spec]
    if isinstance(spec, (list, tuple)) and len(spec) == 2:
        return checked_values(binding, *spec, channels)
    raise ValueError(f'{binding} is not a normalisation: use {_CHOICES}.')


def refuse_own(where, mean, std):
    """Raises `checks.ConfigError` if `where`'s own `mean` or `std` is
    bound, naming the binding to make instead."""
    if mean is None and std is None:
        return
    raise checks.ConfigError(
        f'{where}.mean / {where}.std are bound (mean {mean}, std {std}): the '
        'normalisation has one source, load_data.normalization (in Python, '
        "make_pretrain_dataset_fn's normalization), which the "
        f'augmentations and the evaluation take. Remove the {where} '
        f'bindings and bind load_data.normalization = {_CHOICES}.')


def required(normalization_):
    """`normalization_`; a `checks.ConfigError` naming the binding if None."""
    if normalization_ is None:
        raise checks.ConfigError(
            f'No normalisation: bind load_data.normalization = {_CHOICES}.')
    return normalization_


def channel_statistics(source, max_images=None, seed=0):
    """`(mean, std)`, tuples of `source.channels` floats: the per-channel
    statistics in [0, 1] of the pixels of the uint8 `sources.ImageSource`
    (each counts once), or of a random subset (`seed`) of `max_images`
    images. The sums are exact integers, so every machine, in any order,
    computes the same numbers."""
    positions = np.arange(source.num_examples)
    if max_images is not None and max_images < source.num_examples:
        positions = np.sort(np.random.default_rng(seed).choice(
            source.num_examples, max_images, replace=False))

    def moments(position):
        pixels = tf.reshape(tf.cast(source.read(position), tf.int64),
                            [-1, source.channels])
        return (tf.reduce_sum(pixels, 0), tf.reduce_sum(pixels ** 2, 0),
                tf.shape(pixels, out_type=tf.int64)[0])

    # Python integers: no overflow, however many images.
    first, second, count = [0] * source.channels, [0] * source.channels, 0
    for image_first, image_second, pixels in (
            tf.data.Dataset.from_tensor_slices(positions)
            .map(moments, num_parallel_calls=tf.data.AUTOTUNE)
            .as_numpy_iterator()):
        first = [a + int(b) for a, b in zip(first, image_first)]
        second = [a + int(b) for a, b in zip(second, image_second)]
        count += int(pixels)
    mean = tuple(total / (255 * count) for total in first)
    # count^2 * 255^2 * variance = count * sum(x^2) - sum(x)^2, exactly.
    std = tuple(math.sqrt(count * squares - total * total) / (255 * count)
                for total, squares in zip(first, second))
    return mean, std


def _check_record(recorded, where, spec, fixed, channels):
    """`recorded`'s values (read from `where`), checked against `spec`
    (`fixed`: its values, None for `FROM_DATA`) and `channels`."""
    values = tuple(recorded['mean']), tuple(recorded['std'])
    if channels is not None and recorded.get('channels') != channels:
        raise checks.DataError(
            f'{where} holds the normalisation of {recorded.get("channels")}'
            f'-channel images but the images are now decoded to '
            f'{channels} channels: delete it to compute it again '
            '(or start the run again with --overwrite).')
    if (fixed or FROM_DATA) != (
            values if recorded.get('spec') != FROM_DATA else FROM_DATA):
        # A run normalised one way must be exported and evaluated the
        # same way.
        raise checks.DataError(
            f'{where} (written by training) records the normalisation this '
            f'run was trained with, {NORMALIZATION_MACRO} = '
            f'{recorded.get("spec")!r} (mean {values[0]}, std {values[1]}), '
            f'not {spec!r} (load_data.normalization): bind it back, or '
            'train a new run in another --model_dir.')
    if fixed is None:  # Else the config holds the same values.
        logging.info('Normalisation read from %s: mean %s, std %s', where,
                     *values)
    return values


def resolve_normalization(spec, *, source=None, recorded=None, where=None,
                          max_images=5000, seed=0, description='labeled'):
    """`((mean, std), record)`: the float tuples `spec` stands for, and
    the dict the run records (None when the values come from `recorded`,
    or there is no `source`).

    `FROM_DATA` is the `channel_statistics` (`max_images`, `seed`) of the
    `sources.ImageSource` `source` (None for a trained run), computed
    once: a run with a record (`recorded`, read from `where`) reads it, so
    that resumed training, export and evaluation use the same values. A
    preset or a `(mean, std)` pair stands for its values. `description`
    names the images of `source` in the record and the messages.

    Raises:
        ValueError: a bad `spec`; `FROM_DATA` with neither a record nor a
            `source`.
        checks.DataError: `recorded` is of other channels or another
            normalisation than `spec`.
    """
    channels = None if source is None else source.channels
    fixed = None if spec == FROM_DATA else normalization(spec, channels)
    if recorded is not None:
        return _check_record(recorded, where, spec, fixed, channels), None
    if fixed is not None:
        return fixed, None if source is None else dict(
            mean=fixed[0], std=fixed[1], channels=channels, spec=spec)
    if source is None:
        raise ValueError(
            f"{NORMALIZATION_MACRO} = '{FROM_DATA}' is recorded in {where} "
            'when training starts, and there is no such file: train the '
            'run first (or bind the values the run was trained with).')
    mean, std = channel_statistics(source, max_images, seed)
    images = min(source.num_examples, max_images or source.num_examples)
    if min(std) <= 0:
        raise ValueError(
            f'The {images} {description} images have a channel of constant '
            f'value (std {std}): normalisation from the data is impossible; '
            f"bind {NORMALIZATION_MACRO} = 'imagenet' or a (mean, std) pair.")
    logging.info('Normalisation computed from %d %s images: mean %s, std '
                 '%s', images, description, mean, std)
    return (mean, std), dict(
        mean=mean, std=std, channels=channels, spec=spec,
        images=images, of=source.num_examples, source=description)


def normalized_multicrop(multicrop, normalization_, channels):
    """The `augment.MultiCropConfig` `multicrop` with the run's
    `(mean, std)` `normalization_` for `channels` filled in (None: its
    own mean and std); `checks.ConfigError` for both or neither, ValueError
    for a normalisation of other channels."""
    where = f'{NORMALIZATION_MACRO} (load_data.normalization)'
    if normalization_ is None and (multicrop.mean is not None or
                                   multicrop.std is not None):
        where = 'MultiCropConfig.mean / MultiCropConfig.std'
        normalization_ = multicrop.mean, multicrop.std
    else:
        refuse_own('MultiCropConfig', multicrop.mean, multicrop.std)
    mean, std = checked_values(where, *required(normalization_), channels)
    return dataclasses.replace(multicrop, mean=mean, std=std)
