"""The normalisation a run uses: a preset, a (mean, std) pair, or computed
from the images (`FROM_DATA`), checked against the channels and against
the run's record of it (`RunDir.read_normalization`)."""

import dataclasses
import math

from absl import logging
import numpy as np
import tensorflow as tf

from paws_tf.data import augment
# `load_data.normalization` (the folder recipes bind it through this macro):
# the per-channel mean and std computed from the labeled images.
FROM_DATA = 'data'
NORMALIZATION_MACRO = 'NORMALIZATION'
_NORMALIZATION_CHOICES = (
    f"'{FROM_DATA}', one of {sorted(augment.NORMALIZATIONS)} or a (mean, std) "
    'pair such as ((0.5,), (0.25,))')


def _normalization_values(binding, mean, std, channels):
    """`(mean, std)` as float tuples; raises naming `binding` unless they
    are non-empty sequences of numbers of equal length (`channels` when
    given) with positive stds."""
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
    """Checks a `load_data.normalization` value (the `NORMALIZATION` macro).

    Args:
        spec: None, `FROM_DATA`, a preset name of `augment.NORMALIZATIONS`
            or a `(mean, std)` pair.
        channels: the images' channel count, if known.

    Returns:
        `spec` for None and `FROM_DATA`, else the `(mean, std)` tuples.

    Raises:
        ValueError: naming the binding and the valid values.
    """
    if spec is None or spec == FROM_DATA:
        return spec
    binding = f'{NORMALIZATION_MACRO} (load_data.normalization) = {spec!r}'
    if isinstance(spec, str):
        if spec not in augment.NORMALIZATIONS:
            raise ValueError(f'{binding} is unknown: use '
                             f'{_NORMALIZATION_CHOICES}.')
        spec = augment.NORMALIZATIONS[spec]
    if isinstance(spec, (list, tuple)) and len(spec) == 2:
        return _normalization_values(binding, *spec, channels)
    raise ValueError(f'{binding} is not a normalisation: use '
                     f'{_NORMALIZATION_CHOICES}.')


def one_normalization(where, mean, std, normalization_, channels=None):
    """The one normalisation a consumer of images uses, or a clear error.

    Args:
        where: the configurable whose `mean` and `std` were bound
            (`'MultiCropConfig'`, `'eval_preprocessing'`).
        mean, std: its own values, None when unbound.
        normalization_: the run's normalisation (`load_data.normalization`
            resolved to `(mean, std)`), `FROM_DATA` when it is not computed
            yet, or None.
        channels: the images' channel count, if known.

    Returns:
        `(mean, std)` float tuples, or None while `normalization_` is
        `FROM_DATA`.

    Raises:
        ValueError: a normalisation given twice or not at all, or values
            that do not match `channels`.
    """
    own = mean is not None or std is not None
    if normalization_ is not None and own:
        raise ValueError(
            f'The normalisation is given twice: {NORMALIZATION_MACRO} '
            f'(load_data.normalization) and {where}.mean / {where}.std. '
            f'Remove the {where} bindings (the folder recipes normalise '
            f'through {NORMALIZATION_MACRO} alone) or unbind '
            f'{NORMALIZATION_MACRO}.')
    if normalization_ is None:
        if mean is None or std is None:
            raise ValueError(
                f'No normalisation: bind {NORMALIZATION_MACRO} = '
                f"'{FROM_DATA}' (load_data.normalization; mean and std "
                f'computed from the labeled images), or both {where}.mean '
                f'and {where}.std.')
        return _normalization_values(f'{where}.mean / {where}.std', mean,
                                     std, channels)
    if normalization_ == FROM_DATA:
        return None
    return _normalization_values(
        f'{NORMALIZATION_MACRO} (load_data.normalization)', *normalization_,
        channels)


def channel_statistics(source, max_images=None, seed=0):
    """Per-channel mean and std of a source's pixels, scaled to [0, 1].

    Every pixel of every image counts once (images of different sizes
    weigh by their pixel count). The sums are exact integers, so every
    machine, in any order, computes the same numbers, rounded once.

    Args:
        source: `sources.ImageSource` (uint8 images).
        max_images: use a seeded random subset of this many images; None
            uses them all.
        seed: seed of that subset.

    Returns:
        `(mean, std)`: two tuples of `source.channels` floats.
    """
    positions = np.arange(source.num_examples)
    if max_images is not None and max_images < source.num_examples:
        positions = np.sort(np.random.default_rng(seed).choice(
            source.num_examples, max_images, replace=False))

    def moments(position):
        pixels = tf.reshape(tf.cast(source.read(position), tf.int64),
                            [-1, source.channels])
        return (tf.reduce_sum(pixels, 0), tf.reduce_sum(pixels ** 2, 0),
                tf.shape(pixels, out_type=tf.int64)[0])

    first = [0] * source.channels
    second = [0] * source.channels
    count = 0
    for image_first, image_second, pixels in (
            tf.data.Dataset.from_tensor_slices(positions)
            .map(moments, num_parallel_calls=tf.data.AUTOTUNE)
            .as_numpy_iterator()):
        # Python integers: no overflow, however many images.
        first = [a + int(b) for a, b in zip(first, image_first)]
        second = [a + int(b) for a, b in zip(second, image_second)]
        count += int(pixels)
    mean = tuple(total / (255 * count) for total in first)
    # count^2 * 255^2 * variance = count * sum(x^2) - sum(x)^2, exactly.
    std = tuple(math.sqrt(count * squares - total * total) / (255 * count)
                for total, squares in zip(first, second))
    return mean, std


def _check_record(recorded, where, spec, fixed, channels):
    """The values of the record `recorded` (read from `where`), checked
    against `spec` (its values `fixed`, None for `FROM_DATA`) and, when
    given, the `channels`."""
    values = tuple(recorded['mean']), tuple(recorded['std'])
    if channels is not None and recorded.get('channels') != channels:
        raise ValueError(
            f'{where} holds the normalisation of {recorded.get("channels")}'
            f'-channel images but the images are now decoded to '
            f'{channels} channels: delete it to compute it again '
            '(or start the run again with --overwrite).')
    if (fixed or FROM_DATA) != (
            values if recorded.get('spec') != FROM_DATA else FROM_DATA):
        # A run normalised one way must be exported and evaluated the
        # same way.
        raise ValueError(
            f'{where} records the normalisation this run was trained '
            f'with, {NORMALIZATION_MACRO} = '
            f'{recorded.get("spec")!r} (mean {values[0]}, std '
            f'{values[1]}), not {spec!r}: bind it back.')
    logging.info('Normalisation read from %s: mean %s, std %s', where,
                 *values)
    return values


def recorded_normalization(spec, recorded, where):
    """The `(mean, std)` that `spec` stands for in a run, without its
    images: the run's record `recorded` (read from `where`), or the values
    of a preset or pair.

    Raises:
        ValueError: `spec` is `FROM_DATA` and there is no record (the run
            never started training), or the record disagrees with `spec`.
    """
    fixed = None if spec == FROM_DATA else normalization(spec)
    if recorded is not None:
        return _check_record(recorded, where, spec, fixed, None)
    if fixed is None:
        raise ValueError(
            f"{NORMALIZATION_MACRO} = '{FROM_DATA}' is recorded in {where} "
            'when training starts, and there is no such file: train the '
            'run first (or bind the values the run was trained with).')
    return fixed


def resolve_normalization(spec, *, source, recorded=None, where=None,
                          max_images=5000, seed=0, description='labeled'):
    """The `(mean, std)` that `spec` stands for, and the record of it.

    Args:
        spec: `'data'` (`FROM_DATA`): the per-channel mean and std of the
            images of `source` (`channel_statistics`, at most `max_images`
            of them), computed once: a run that has a record reads it, so
            that resumed training, export and evaluation use the same
            values. A preset name of `augment.NORMALIZATIONS` or a
            `(mean, std)` pair: those values.
        source: the `sources.ImageSource` of the statistics.
        recorded: the run's record (`RunDir.read_normalization`), or None.
        where: where that record is, for the messages.
        max_images: images the statistics are computed from.
        seed: seed of that subset.
        description: what the images of `source` are, for the record and
            the messages.

    Returns:
        `((mean, std), record)`: two tuples of `source.channels` floats,
        and the dict the run records (`RunDir.write_normalization`), None
        when the values come from `recorded`.

    Raises:
        ValueError: a bad `spec`, values that do not match the channels,
            a record for another channel count, or one recording another
            normalisation than `spec` (a run trained one way is exported
            and evaluated the same way).
    """
    fixed = None
    if spec != FROM_DATA:
        fixed = normalization(spec, channels=source.channels)
    if recorded is not None:
        return _check_record(recorded, where, spec, fixed,
                             source.channels), None
    if fixed is not None:
        return fixed, dict(mean=fixed[0], std=fixed[1],
                           channels=source.channels, spec=spec)
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
        mean=mean, std=std, channels=source.channels, spec=spec,
        images=images, of=source.num_examples, source=description)


def normalized_multicrop(multicrop, normalization, channels):
    """`multicrop` with the run's normalisation filled in.

    Args:
        multicrop: `augment.MultiCropConfig`, whose mean and std are None
            when `normalization` gives them.
        normalization: the run's `(mean, std)` (`load_data.normalization`)
            or None.
        channels: the images' channel count.

    Returns:
        A `MultiCropConfig` with float mean and std tuples.

    Raises:
        ValueError: a normalisation given twice or not at all, or one of
            another channel count.
    """
    mean, std = one_normalization('MultiCropConfig', multicrop.mean,
                                  multicrop.std, normalization, channels)
    return dataclasses.replace(multicrop, mean=mean, std=std)
