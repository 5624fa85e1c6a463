"""Every gin configurable of paws_tf registered (gin files need no
`import` lines), and gin configs found and parsed."""

import difflib
import inspect
import os
import re

import gin

from paws_tf import bindings
from paws_tf import checks
# The modules that define gin configurables, imported to register them.
# pylint: disable=unused-import
from paws_tf import adamw, cluster, lars, model  # noqa: F401
from paws_tf import progress, schedules  # noqa: F401
from paws_tf.data import augment, folders, pipeline  # noqa: F401
from paws_tf.data import sources, splits, tfds_sources  # noqa: F401
from paws_tf.demo import fashion_mnist, supervised  # noqa: F401
from paws_tf.evaluation import evaluate_nn, fine_tune  # noqa: F401
from paws_tf.nets import backbones, heads  # noqa: F401
from paws_tf.runner import experiment, train  # noqa: F401
# pylint: enable=unused-import


# The denylisted parameters that a run passes itself: what sets them
# (besides `backbones.SET_BY_BUILD_MODEL`, `build_model`'s).
_PREPROCESSING = {'image_size': 'eval_preprocessing.image_size',
                  'crop_fraction': 'eval_preprocessing.crop_fraction',
                  'mean': 'load_data.normalization',
                  'std': 'load_data.normalization'}
_SET_BY_THE_RUN = {
    'PredictionHead.output_dim': 'ProjectionHead.output_dim (the heads '
                                 'share their width)',
    'make_pretrain_dataset_fn.seed': 'train.seed',
    'make_strategy.kind': "run.py's --strategy flag",
    'build_backbone.input_channels': "the data's channels (CHANNELS in the "
                                     'folder configs)',
    'LARS.learning_rate': 'WarmupCosineDecay.* (fine-tuning: '
                          'fine_tune_suncet.learning_rate)',
    'AdamW.learning_rate': 'WarmupCosineDecay.*',
    'make_eval_dataset.batch_size': 'PawsNN.batch_size',
    **{f'{bindings.gin_name(configurable)}.{parameter}': source
       for configurable in (fine_tune.fine_tune, pipeline.make_eval_dataset,
                            evaluate_nn.evaluate_nn)
       for parameter, source in _PREPROCESSING.items()}}


def _closest(message):
    """' Did you mean NAME?' for gin's message of an unknown parameter or
    configurable, with the closest name gin knows; for a parameter a run
    passes itself, what sets it; else ''."""
    denylisted = re.match(r"Configurable '([\w.]+)' has denylisted kwarg "
                          r"'(\w+)'", message)
    if denylisted:
        name, parameter = '.'.join(denylisted.groups()), denylisted[2]
        source = (f'build_model.{parameter}'
                  if parameter in backbones.SET_BY_BUILD_MODEL
                  else _SET_BY_THE_RUN.get(name))
        return f' The run sets {name} itself' + (
            f': set {source} instead.' if source else
            '; remove the binding.')
    parameter = re.match(r"Configurable '([\w.]+)' doesn't have a "
                         r"parameter named '(\w+)'", message)
    if parameter:
        known = inspect.signature(
            gin.config.get_configurable(parameter.group(1))).parameters
        typo, prefix = parameter.group(2), f'{parameter.group(1)}.'
    else:
        configurable = re.match(r"No configurable matching '([\w.]+)'",
                                message)
        if configurable is None:
            return ''
        # gin has no public list of its configurables: its registry's
        # selectors end in their names.
        registry = gin.config._REGISTRY  # pylint: disable=protected-access
        known = {selector.rsplit('.', 1)[-1]
                 for selector, _ in registry.items()}
        typo, prefix = configurable.group(1), ''
    close = difflib.get_close_matches(typo, sorted(known), n=1)
    return f' Did you mean {prefix}{close[0]}?' if close else ''


def _named_parameters(fn_or_cls):
    """The names `fn_or_cls` takes as parameters, following the
    `**kwargs` that a class passes on to its bases' constructors
    (`PAWSModel`'s to `tf_keras.Model`'s), or None where any name may be
    taken (a function with `**kwargs`, as `cifar10_multicrop`). gin
    accepts any name for a configurable with `**kwargs`, which then fails
    at run time."""
    functions = ([vars(c)['__init__'] for c in fn_or_cls.__mro__[:-1]
                  if '__init__' in vars(c)] if inspect.isclass(fn_or_cls)
                 else [fn_or_cls])
    names = set()
    for function in functions:
        parameters = inspect.signature(function).parameters.values()
        names |= {p.name for p in parameters if p.kind in (
            p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if all(p.kind != p.VAR_KEYWORD for p in parameters):
            return names
    # The last constructor of a class checks its **kwargs itself (Keras'
    # do); a function passes them on to what it does not name.
    return names if inspect.isclass(fn_or_cls) else None


@gin.config.register_finalize_hook
def _refuse_unknown_parameters(config):
    """Raises ConfigError naming a binding of a parameter that its
    configurable does not have (`PAWSModel.sharpen_temprature`), with the
    closest name it has: gin lets it through to a class with `**kwargs`,
    and the run fails at that class's construction, after the data."""
    for (scope, selector), values in config.items():
        known = (None if selector == 'gin.macro' else
                 _named_parameters(gin.config.get_configurable(selector)))
        unknown = sorted(set(values) - (known or set(values)))
        if unknown:
            # As the user spells it: [scope/]Name.parameter.
            name = (f'{scope}/' if scope else '') + selector.split('.')[-1]
            close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
            hint = f' Did you mean {name}.{close[0]}?' if close else ''
            raise checks.ConfigError(
                f'{name}.{unknown[0]} is bound, but {name} has no parameter '
                f'{unknown[0]!r}.{hint}')
    return None


@gin.config.register_finalize_hook
def _refuse_unused_macros(config):
    """Raises ConfigError naming a macro that the config binds but no
    `%NAME` reads (`CHANNEL = 1` beside `%CHANNELS`). A finalize hook is
    gin's public view of the bindings (a macro's: `(NAME, 'gin.macro')`)."""
    macro = gin.config.get_configurable(gin.config.macro)
    read = {ref.config_key[0]
            for ref in gin.config.iterate_references(config, to=macro)}
    name = next((scope for scope, selector in config
                 if selector == 'gin.macro' and scope not in read), None)
    if name is None:
        return None
    close = difflib.get_close_matches(name, sorted(read), n=1)
    hint = (f'did you mean {close[0]}? ' if close else '') + (
        f'The config reads {", ".join(sorted(read))}.' if read else
        'The config reads no macro.')
    raise checks.ConfigError(
        f'{name} is bound but nothing in the config reads %{name}: {hint} '
        f'Correct the name or remove the binding of {name}.')


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# The shipped configs include each other as 'gin_configs/NAME.gin', so gin
# searches the directory that holds gin_configs/: the installed package
# (pyproject.toml maps gin_configs/ into it), else the checkout.
CONFIG_ROOT = next(
    (root for root in (_PACKAGE_DIR, os.path.dirname(_PACKAGE_DIR))
     if os.path.isdir(os.path.join(root, 'gin_configs'))), _PACKAGE_DIR)
CONFIG_DIR = os.path.join(CONFIG_ROOT, 'gin_configs')


def shipped_configs():
    """The sorted file names of the shipped gin configs ('debug.gin', ...)."""
    if not os.path.isdir(CONFIG_DIR):
        return []
    return sorted(name for name in os.listdir(CONFIG_DIR)
                  if name.endswith('.gin'))


def resolve_gin_file(name):
    """The path of the file a --gin_file `name` names: a path that exists,
    else a shipped config, by file name ('debug.gin') or as the repository
    spells it ('gin_configs/debug.gin'); `checks.ConfigError` when neither."""
    for path in (name, os.path.join(CONFIG_DIR, name),
                 os.path.join(CONFIG_ROOT, name)):
        if os.path.isfile(path):
            return path
    raise checks.ConfigError(
        f'--gin_file={name}: no such file, and no shipped config of that '
        f'name. Shipped configs (in {CONFIG_DIR}): '
        f'{", ".join(shipped_configs()) or "none"}.')


def parse(gin_files, bindings):
    """Parses the gin files (paths or shipped configs' names), then each
    binding, and finalizes the config.

    Raises:
        checks.ConfigError: a file that is neither a path nor a shipped
            config, a binding that is not valid gin (named, with the
            closest known name: gin's message names neither), a parameter
            its configurable does not have (gin lets any name through to
            a class with `**kwargs`), a macro the config uses but nothing
            binds (gin's message prints the whole config after it), or one
            bound that nothing uses.
    """
    gin.add_config_file_search_path(CONFIG_ROOT)
    gin.parse_config_files_and_bindings(
        [resolve_gin_file(name) for name in gin_files], None,
        finalize_config=False)
    for binding in bindings:
        try:
            gin.parse_config(binding)
        except (SyntaxError, ValueError) as error:
            raise checks.ConfigError(
                f'--gin_bindings={binding!r} is not valid gin: '
                f'{str(error).splitlines()[0]}{_closest(str(error))}') \
                from error
    try:
        gin.finalize()
    except ValueError as error:
        macro = re.match(r"No bindings specified for '(\w+)/gin\.macro'",
                         str(error))
        if macro is None:
            raise
        name = macro.group(1)
        raise checks.ConfigError(
            f'{name} is not bound: the config uses %{name}. Bind it, e.g. '
            f'--gin_bindings="{name} = ..."') from None
