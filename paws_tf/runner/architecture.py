"""What a pretrained run or import was built as, against what this config
builds: refused before any weights are read where they differ."""

import os

import gin

from paws_tf import bindings
from paws_tf import checks
from paws_tf import model as model_lib
from paws_tf import run_dir
from paws_tf.nets import backbones
from paws_tf.nets import heads
from paws_tf.runner import official_import
from paws_tf.runner import vit_import

# What a pretrained file gives a new run.
BACKBONE, MODEL = 'backbone', 'model'


def owner(path):
    """The `RunDir` of the run or import that `path` (its directory, its
    checkpoint directory or a checkpoint prefix there) belongs to: the
    first of `path`, its parent and grandparent that holds a gin config or
    an import record; None when none does. A relative `path` is made
    absolute first (the `dirname` of '..' is '', the working directory,
    not its parent)."""
    path = os.path.abspath(path)
    candidates = map(run_dir.RunDir, (
        path, os.path.dirname(path), os.path.dirname(os.path.dirname(path))))
    return next((candidate for candidate in candidates
                 if os.path.isfile(candidate.config)
                 or os.path.isfile(candidate.imported)), None)


def refuse_another(path, name, part):
    """Refuses, before any weights are read, a config that builds the
    backbone otherwise than the run or import `path` belongs to: the
    import record's bindings, or the architecture bindings of the source
    run's saved config (`_differences`; a binding that changes no
    variable, such as `vit.position_interpolation`, fails no read).
    Refuses an imported backbone as the `part` 'model', and an imported
    fine-tuned classifier (a SavedModel alone) as either."""
    source = owner(path)
    if source is None:
        return
    record = source.read_json(source.imported)
    if record is None:
        recorded, configured = _differences(source, part)
    elif record['kind'] == official_import.FINE_TUNED:
        raise checks.ConfigError(official_import.fine_tuned_only(
            source, record, f'{name} = {path!r}', backbone=part == BACKBONE))
    elif record['kind'] != official_import.BACKBONE:
        return
    elif part == MODEL:
        raise checks.ConfigError(official_import.backbone_only(
            source, record, name))
    else:
        recorded, configured = vit_import.unconfigured(record)
    if not (recorded or configured):
        return
    raise checks.ConfigError(
        f'{name} = {path!r} does not fit the configured {part}: {source} '
        f'was built with {"; ".join(recorded) or "the defaults"}; this '
        f'config builds {"; ".join(configured) or "the defaults"}. Start '
        f'from a {part} of this architecture, or bind its architecture: '
        f'{_edits(recorded, configured)}.')


def _differences(source, part):
    """`(recorded, configured)` binding lines where the run `source` was
    built otherwise than this config builds, compared by value:
    `build_backbone.name`, then, for a source family with batch norms
    (`nets.Family.batch_norm`), `bn_epsilon` (it changes every batch norm's
    output and makes no variable), and the architecture arguments of the
    source's family (`nets.Family.architecture`) against this config's,
    used or not: where the names differ, every edit that builds the
    source's backbone; for the `part` 'model', the sizes, activation and
    `bn_epsilon` of the heads this config builds (the last two make no
    variable either).
    The source's values are read from its operative_config.gin (every value
    its training used, defaults included) when it has one, else from its
    config.gin (its bindings; a parameter it leaves out is read at this
    code's default)."""
    saved = (source.operative_config if os.path.isfile(
        source.operative_config) else source.config)
    with open(saved) as f:
        text = f.read()
    compared = [(backbones.build_backbone, ['name'])]
    name = bindings.saved_arguments(text, backbones.build_backbone).get('name')
    if name in backbones.FAMILIES:
        family = backbones.FAMILIES[name]
        compared += [
            (backbones.build_backbone, ['bn_epsilon'] * family.batch_norm),
            (family.configurable, family.architecture())]
    if part == MODEL:
        built = [heads.ProjectionHead] + [heads.PredictionHead] * bool(
            bindings.arguments(model_lib.build_model)['prediction_head'][0])
        compared += [(head, [*head.SIZES, 'activation', 'bn_epsilon'])
                     for head in built]
    recorded, configured = [], []
    for configurable, keys in compared:
        theirs = bindings.saved_arguments(text, configurable)
        ours = bindings.arguments(configurable)
        prefix = bindings.gin_name(configurable)
        for key in keys:
            if key in theirs and (_comparable(theirs[key])
                                  != _comparable(ours[key][0])):
                recorded.append(f'{prefix}.{key} = {theirs[key]!r}')
                configured.append(f'{prefix}.{key} = {ours[key][0]!r}')
    return recorded, configured


def _comparable(value):
    """`value` with its lists as tuples (gin keeps what a config wrote)."""
    return (tuple(map(_comparable, value))
            if isinstance(value, (list, tuple)) else value)


def _edits(recorded, configured):
    """'replace <config line> -> <source line>; remove ...; add ...': the
    edits of this config that make its `configured` binding lines the
    source's `recorded` ones (a source line whose parameter this config
    leaves at its default is added)."""
    selector = lambda line: line.split(' = ')[0]  # noqa: E731
    bound = {selector(line) for line in gin.config_str().splitlines()}
    theirs = {selector(line): line for line in recorded}
    ours = {selector(line) for line in configured if selector(line) in bound}
    return '; '.join(
        [f'replace {line} -> {theirs[selector(line)]}' for line in configured
         if selector(line) in theirs and selector(line) in bound] +
        [f'remove {line}' for line in configured
         if selector(line) not in theirs and selector(line) in bound] +
        [f'add {line}' for line in recorded if selector(line) not in ours])


def channel_difference(path, channels):
    """'<source> takes N-channel images, this config ...' when the run
    `path` belongs to (`owner`) recorded a normalisation of other than
    `channels` channels; else None."""
    source = owner(path)
    recorded = None if source is None else source.read_json(
        source.normalization)
    if recorded is None or len(recorded['mean']) in channels:
        return None
    return (f'{source} takes {len(recorded["mean"])}-channel images, this '
            f'config {" or ".join(map(str, channels))}')
