"""Pretrained weights a new model starts from: a backbone's, from a weights
file or a checkpoint, and the checkpoint of an existing model."""

import collections
import os

import tensorflow as tf

from paws_tf import checkpoints
from paws_tf import checks
from paws_tf import run_dir


def model_checkpoint(path):
    """The checkpoint of the existing model `path` (a `RunDir` or a path):
    the newest checkpoint that restores of the run directory `path` (a
    paws_tf run or an import), else `checkpoints.resolve_prefix(path)`."""
    run = path if isinstance(path, run_dir.RunDir) else run_dir.RunDir(path)
    if tf.io.gfile.isdir(run.checkpoints):
        prefix, _ = checkpoints.newest_restorable(run, backups=False,
                                                  chief=False)
        if prefix:
            return prefix
    return checkpoints.resolve_prefix(path)


def _restore_backbone(backbone, prefix):
    """Restores all of `backbone` from the checkpoint `prefix` (its own or
    a run's model's), or raises."""
    roots = {key.split('/')[0] for key, _ in tf.train.list_variables(prefix)}
    root = tf.train.Checkpoint(backbone=backbone)
    if 'backbone' not in roots and 'model' in roots:
        root = tf.train.Checkpoint(model=root)
    missing = checkpoints.unmatched_variables(root, prefix)
    if missing:
        raise checkpoints.Mismatch(
            f'{len(missing)} of {len(backbone.variables)} variables have no '
            'value of their shape under the "backbone" key of the '
            'checkpoint (written by another architecture, or not with '
            'tf.train.Checkpoint(backbone=...)?): '
            f'{checks.listing(missing, checkpoints.MAX_NAMES_SHOWN)}',
            missing)
    _refuse_unused_values(backbone, prefix, 'backbone/' if 'backbone' in roots
                          else 'model/backbone/')
    # Extra stored values of a run's model (heads, optimizer slots) are
    # fine.
    root.read(prefix).expect_partial().assert_existing_objects_matched()


def _refuse_unused_values(backbone, prefix, stored_under):
    """Raises Mismatch when the checkpoint `prefix` holds backbone values
    (keys starting with `stored_under`) that `backbone` has no variable
    for (a ViT with LayerScale or register tokens read into one built
    without them), by the variables' own names. Its `unmatched` is empty:
    every variable of `backbone` has a value."""
    stored = collections.Counter(
        key.split('/.ATTRIBUTES')[0].rsplit('/', 1)[-1]
        for key, _ in tf.train.list_variables(prefix)
        if key.startswith(stored_under) and '/.ATTRIBUTES' in key)
    built = collections.Counter(variable.name.rsplit('/', 1)[-1].split(':')[0]
                                for variable in backbone.variables)
    unused = stored - built
    if unused:
        names = [f'{name} x{count}' if count > 1 else name
                 for name, count in sorted(unused.items())]
        raise checkpoints.Mismatch(
            f'{sum(unused.values())} stored backbone value(s) have no '
            f'variable in the configured backbone ({", ".join(names)}): '
            'it is built with another architecture than the one stored '
            "(an import's imported.json lists the bindings that build it).",
            [])


def load_backbone_weights(backbone, path):
    """Loads pretrained weights into `backbone` (built by
    `build_backbone`), all or nothing.

    Args:
        path: a weights file written by `backbone.save_weights` (`.h5`,
            `.weights.h5`), a TF checkpoint prefix or directory written by
            `tf.train.Checkpoint(backbone=backbone)`, or a paws_tf run's
            checkpoint or directory, or its `RunDir` (its model's backbone;
            an imported backbone's, `vit_import`).

    Raises:
        FileNotFoundError: `path` does not exist or holds no checkpoint.
        checkpoints.Mismatch: the stored weights do not fit, naming the
            variables as far as the loader can; the backbone is unchanged.
    """
    name = os.fspath(path)
    if name.endswith('.h5') and not tf.io.gfile.exists(name):
        raise FileNotFoundError(f'weights file {name!r} does not exist')
    snapshot = backbone.get_weights()
    try:
        if name.endswith('.h5'):
            backbone.load_weights(name)
        else:
            _restore_backbone(backbone, model_checkpoint(path))
    except (AssertionError, KeyError, ValueError,
            tf.errors.OpError) as error:
        checkpoints.assign_weights(backbone, snapshot)
        raise checkpoints.Mismatch(
            f'could not load {name!r} into backbone {backbone.name!r} '
            f'({len(snapshot)} variables); none were restored, the backbone '
            f'is unchanged. Architecture mismatch? Cause: '
            f'{type(error).__name__}: {error}',
            getattr(error, 'unmatched', None)) from error
