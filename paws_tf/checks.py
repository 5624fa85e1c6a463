"""Argument checks that name the bad value (gin does not check types),
and the checks of a whole gin config made before any data is read."""

import numbers
import os

import gin

from paws_tf import augment
from paws_tf import backbones


def integer(name, value, minimum=1):
    """Returns `value` as an int, or raises if it is not an integer >=
    `minimum` (`'ten'`, 32.5, True and 0 for a positive size all fail)."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
            or value < minimum):
        kind = ('a positive integer' if minimum == 1 else
                'a non-negative integer' if minimum == 0 else
                f'an integer >= {minimum}')
        raise ValueError(f'{name} must be {kind}, got {value!r}.')
    return int(value)


def number(name, value, *, positive=False, low=None, high=None):
    """Returns `value` as a float, or raises if it is not a real number in
    range: > 0 with `positive`, >= `low`, < `high`."""
    bad = (isinstance(value, bool) or not isinstance(value, numbers.Real) or
           (positive and not value > 0) or
           (low is not None and not value >= low) or
           (high is not None and not value < high))
    if bad:
        if positive:
            kind = 'positive'
        else:
            kind = 'a number' + (f' >= {low}' if low is not None else '') + (
                f' and < {high}' if high is not None else '')
        raise ValueError(f'{name} must be {kind}, got {value!r}.')
    return float(value)


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


def binding(selector, default=None):
    """A gin parameter's value with macros followed, and what to bind.

    Args:
        selector: `'configurable.parameter'`, optionally scoped.
        default: the value when `selector` is unbound.

    Returns:
        `(value, name)`: `name` is the last macro the value came through
        (what a user rebinds), else `selector`.
    """
    name = selector
    try:
        value = gin.query_parameter(selector)
    except ValueError:
        return default, name
    # `%NAME` is a reference to a macro or a gin constant; calling it gives
    # its value.
    while (isinstance(value, gin.config.ConfigurableReference)
           and str(value).startswith('%')):
        name = str(value)[1:]
        value = value.scoped_configurable_fn()
    return value, name


def bound(selector, default=None):
    """The value gin binds to `selector` with macros resolved, else
    `default`."""
    return binding(selector, default)[0]


def _reference(selector):
    """The gin reference bound to `selector` (`@name` or `@name()`), or
    None."""
    value = bound(selector)
    return value if isinstance(value, gin.config.ConfigurableReference) \
        else None


def _bound_constants():
    """Names of gin constants that a binding tried to rebind as macros."""
    rebound = []
    for name in augment.GIN_CONSTANTS:
        try:
            gin.query_parameter(f'{name}/macro.value')
        except ValueError:
            continue
        rebound.append(name)
    return rebound


def _folder_source():
    """`(selector prefix, labeled-root parameter)` of a folder training
    source bound to `load_data.train`, or None for other sources."""
    train = _reference('load_data.train')
    if train is None:
        return None
    name = train.configurable.name
    if name == 'image_folders':
        return train.scoped_selector, 'labeled_root'
    if name == 'image_folder':
        return train.scoped_selector, 'root'
    return None


def _check_warmup():
    schedule = bound('train.schedule_cls')
    if schedule is not None and getattr(
            getattr(schedule, 'configurable', None), 'name',
            None) != 'WarmupCosineDecay':
        return
    num_epochs, epochs_name = binding('train.num_epochs')
    warmup, warmup_name = binding('WarmupCosineDecay.warmup_epochs', 10)
    fraction, fraction_name = binding('WarmupCosineDecay.warmup_fraction')
    if fraction is not None:
        if warmup is not None:
            raise ValueError(
                f'{warmup_name} = {warmup!r} and {fraction_name} = '
                f'{fraction!r} both set the warm-up: bind {warmup_name} = '
                'None to use the fraction.')
        if (isinstance(fraction, bool) or
                not isinstance(fraction, numbers.Real) or
                not 0 <= fraction <= 1):
            raise ValueError(f'{fraction_name} must be a number in [0, 1] '
                             f'(a share of the run), got {fraction!r}.')
        return
    if (isinstance(num_epochs, numbers.Integral) and
            isinstance(warmup, numbers.Real) and warmup > num_epochs):
        raise ValueError(
            f'The warm-up is longer than the run: {warmup_name} = {warmup!r} '
            f'> {epochs_name} = {num_epochs}. Bind {warmup_name} = '
            f'{num_epochs / 10:g} (a tenth of the run), or '
            f'{warmup_name} = None with {fraction_name} = 0.1 so that it '
            'follows the epochs.')


def _check_support(folder):
    prefix, parameter = folder
    root, root_name = binding(f'{prefix}.{parameter}')
    if not isinstance(root, str) or not bound(f'{prefix}.labeled', True):
        return
    if not os.path.isdir(root):
        raise ValueError(f'{root_name} = {root!r} is not a folder: bind it '
                         'to the folder of labeled class subfolders.')
    classes = sum(entry.is_dir() for entry in os.scandir(root))
    wanted, wanted_name = binding('make_pretrain_dataset_fn.classes_per_step')
    if (isinstance(wanted, numbers.Integral) and classes
            and wanted > classes):
        raise ValueError(
            f'{wanted_name} = {wanted} support classes per step, but '
            f'{root_name} = {root!r} holds {classes} class folder(s): bind '
            f'{wanted_name} = {classes}.')


def _check_size(size, size_name, minimum, backbone, backbone_name):
    if (isinstance(size, bool) or not isinstance(size, numbers.Integral)
            or size < 1):
        raise ValueError(f'{size_name} must be a positive integer (pixels), '
                         f'got {size!r}.')
    if size < minimum:
        other = ("fewer build_backbone.stage_strides" if backbone ==
                 'small_resnet' else "a backbone for small images "
                 "(build_backbone.name = 'small_resnet', as the recipe "
                 "gin_configs/image_folders_small.gin)")
        raise ValueError(
            f'{size_name} = {size} is smaller than {minimum} px, the '
            f'downsampling of {backbone_name} = {backbone!r}: its last '
            'stages would see a single pixel padded with zeros. Bind '
            f'{size_name} = {minimum} or more, or {other}.')


def check_config():
    """Checks the parsed gin config before any data is read.

    Catches, in the first seconds and naming the binding to change with a
    valid value: rebound gin constants (`IMAGENET_MEAN = ...` changes
    nothing), a normalisation given twice, not at all or with the wrong
    number of channels, a warm-up longer than the run, a support of more
    classes than the labeled folder holds (its class folders are listed,
    no image is read), and image sizes below the backbone's downsampling.
    Only what the config determines is checked: the channels of sources
    other than folders are known once they are read, where
    `data.make_pretrain_dataset_fn` and `experiment.eval_preprocessing`
    check them again.

    Raises:
        ValueError: on the first problem found.
    """
    rebound = _bound_constants()
    if rebound:
        one = len(rebound) == 1
        raise ValueError(
            f'{" and ".join(rebound)} '
            f'{"is a constant" if one else "are constants"} of paws_tf '
            '(values fixed in paws_tf.augment): binding '
            f'{"it" if one else "them"} changes nothing. Bind '
            f"{NORMALIZATION_MACRO} = (mean, std), 'data' or a preset "
            f'({sorted(augment.NORMALIZATIONS)}) in the folder recipes, or '
            'the mean and std of MultiCropConfig and eval_preprocessing.')
    folder = _folder_source()
    channels = None
    if folder is not None:
        channels, channels_name = binding(f'{folder[0]}.channels', 3)
        if channels not in (1, 3) or isinstance(channels, bool):
            raise ValueError(
                f'{channels_name} = {channels!r}: images are decoded to 1 '
                '(grayscale) or 3 (RGB) channels.')
    spec = normalization(bound('load_data.normalization'), channels)
    multicrop = _reference('make_pretrain_dataset_fn.multicrop')
    if multicrop is not None and multicrop.evaluate:
        config = multicrop.scoped_configurable_fn()
        selector = multicrop.scoped_selector
        one_normalization(selector, config.mean, config.std, spec, channels)
    else:
        config = selector = None
    one_normalization('eval_preprocessing',
                      bound('eval_preprocessing.mean'),
                      bound('eval_preprocessing.std'), spec, channels)
    _check_warmup()
    if folder is not None:
        _check_support(folder)
    backbone, backbone_name = binding('build_backbone.name')
    if not isinstance(backbone, str):
        return
    strides = {}
    for key in ('stem_stride', 'stage_strides'):
        value = bound(f'build_backbone.{key}')
        if value is not None:
            strides[key] = value
    minimum = backbones.downsampling(backbone, **strides)
    sizes = [binding('eval_preprocessing.image_size')[::-1]]
    if config is not None:
        sizes.append((binding(f'{selector}.global_size')[1],
                      config.global_size))
        if config.num_local:
            sizes.append((binding(f'{selector}.local_size')[1],
                          config.local_size))
        support_size = binding('make_pretrain_dataset_fn.support_view_size')
        if support_size[0] is not None:
            sizes.append(support_size[::-1])
    for size_name, size in sizes:
        _check_size(size, size_name, minimum, backbone, backbone_name)
