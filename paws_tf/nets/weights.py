"""Loading pretrained weights into a backbone, all or nothing."""

import collections
import functools
import os

import tensorflow as tf

from paws_tf import checkpoints

_MAX_NAMES_SHOWN = 20


def _unmatched_checkpoint_variables(root, prefix):
    """Names of the variables under `root` that have no value at `prefix`.

    Follows the breadth-first, first-path-wins naming that TF's object-based
    checkpoints use for their keys.
    """
    stored = {key for key, _ in tf.train.list_variables(prefix)}
    view = tf.train.TrackableView(root)
    seen = {id(root)}
    queue = collections.deque([(root, ())])
    missing = []
    while queue:
        parent, path = queue.popleft()
        for child_name, child in view.children(parent).items():
            if id(child) in seen:
                continue
            seen.add(id(child))
            child_path = path + (child_name,)
            if isinstance(child, tf.Variable):
                key = '/'.join(child_path + ('.ATTRIBUTES', 'VARIABLE_VALUE'))
                if key not in stored:
                    missing.append(child.name)
            else:
                queue.append((child, child_path))
    return missing


def _restore_checkpoint(backbone, prefix):
    root = tf.train.Checkpoint(backbone=backbone)
    missing = _unmatched_checkpoint_variables(root, prefix)
    if missing:
        shown = ', '.join(missing[:_MAX_NAMES_SHOWN])
        more = len(missing) - _MAX_NAMES_SHOWN
        raise ValueError(
            f'{len(missing)} of {len(backbone.variables)} variables have no '
            f'value under the "backbone" key of the checkpoint (written by '
            f'another architecture, or not with tf.train.Checkpoint('
            f'backbone=...)?): {shown}' + (f' and {more} more' if more > 0
                                          else ''))
    # Extra stored values (heads, optimizer slots) are fine.
    root.read(prefix).assert_existing_objects_matched()


def load_backbone_weights(backbone, path):
    """Loads pretrained weights into a backbone, all or nothing.

    Args:
        backbone: a built model from `build_backbone`.
        path: a weights file written by `backbone.save_weights` (`.h5`:
            matched by layer order; `.weights.h5`: matched by object
            structure), or a TF checkpoint prefix or directory written by
            `tf.train.Checkpoint(backbone=backbone)` (matched by the object
            graph under the `backbone` key).

    Raises:
        FileNotFoundError: `path` does not exist or holds no checkpoint.
        ValueError: the stored weights do not fit the backbone (a variable
            without a stored value, a shape or layer-count mismatch). The
            message names the unrestored variables as far as the loader
            reports them; the backbone is left unchanged.
    """
    path = os.fspath(path)
    if path.endswith('.h5'):
        if not tf.io.gfile.exists(path):
            raise FileNotFoundError(f'weights file {path!r} does not exist')
        load = functools.partial(backbone.load_weights, path)
    else:
        load = functools.partial(_restore_checkpoint, backbone,
                                 checkpoints.resolve_prefix(path))
    snapshot = [variable.numpy() for variable in backbone.variables]
    try:
        load()
    except (AssertionError, KeyError, ValueError,
            tf.errors.OpError) as error:
        for variable, value in zip(backbone.variables, snapshot):
            variable.assign(value)
        raise ValueError(
            f'could not load {path!r} into backbone {backbone.name!r} '
            f'({len(snapshot)} variables); none were restored, the backbone '
            f'is unchanged. Architecture mismatch? Cause: '
            f'{type(error).__name__}: {error}') from error
