"""The normalisation a run uses: a preset, a (mean, std) pair, or computed
from the images (`FROM_DATA`), checked against the channels."""

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
