"""Finding TF checkpoints on disk."""

import os

import tensorflow as tf

CHECKPOINT_PREFIX = 'ckpt'


def latest(directory):
    """(path, step) of the newest `ckpt-<step>` in `directory`, or
    (None, 0)."""
    path = tf.train.latest_checkpoint(directory) if directory else None
    if path is None:
        return None, 0
    return path, int(path.rsplit('-', 1)[1])


def resolve_prefix(path):
    """A checkpoint prefix, or a directory's latest checkpoint, as a prefix.

    Raises:
        FileNotFoundError: naming `path`, when no checkpoint is there.
    """
    path = os.fspath(path)
    prefix = (tf.train.latest_checkpoint(path) if tf.io.gfile.isdir(path)
              else path)
    if prefix is None or not tf.io.gfile.exists(prefix + '.index'):
        raise FileNotFoundError(
            f'No TF checkpoint at {path!r}: expected a checkpoint prefix '
            'with a .index file, or a directory holding a "checkpoint" state '
            'file (tf.train.CheckpointManager writes one).')
    return prefix
