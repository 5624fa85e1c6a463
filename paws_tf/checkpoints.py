"""Finding, checking and failing to write TF checkpoints."""

import os

import tensorflow as tf

CHECKPOINT_PREFIX = 'ckpt'


class SaveFailed(RuntimeError):
    """A checkpoint or backup could not be written (no space, no permission,
    a read-only filesystem); what was saved before is unchanged."""
    EXIT_CODE = os.EX_IOERR  # run.py's exit code.


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


class NoneRestorable(RuntimeError):
    """Checkpoints exist but none can be restored (truncated or corrupted
    files)."""
    EXIT_CODE = os.EX_DATAERR  # run.py's exit code.


def all_checkpoints(directory):
    """(path, step) of every `ckpt-<step>` with an index file in `directory`,
    newest first, whatever the `checkpoint` state file says."""
    found = []
    pattern = os.path.join(directory, f'{CHECKPOINT_PREFIX}-*.index')
    for index in tf.io.gfile.glob(pattern):
        prefix = index[:-len('.index')]
        step = prefix.rsplit('-', 1)[1]
        if step.isdigit():
            found.append((prefix, int(step)))
    return sorted(found, key=lambda found: -found[1])


def damage(prefix):
    """Why the checkpoint at `prefix` cannot be restored, or None if it can.

    Reads every tensor: TensorFlow checks each one's length and CRC32C, so a
    truncated or corrupted file fails here rather than mid-restore.
    """
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    # The reader fails in many ways on damaged files (OpErrors, IndexError
    # for a short read, ValueError): any of them means it cannot restore.
    except Exception as error:  # pylint: disable=broad-except
        message = getattr(error, 'message', None) or str(error)
        return message.strip().splitlines()[0]
    return None


def assign_weights(model, weights):
    """Gives `model` the values `weights`: the one place a model's weights
    are copied in memory (an evaluation's copy, the best epoch of a
    fine-tuning, a trunk cut from a pre-trained model).

    Args:
        model: a built `tf_keras` model or layer.
        weights: NumPy arrays in the order of `model.get_weights()`.
    """
    model.set_weights(weights)


def copy_weights(source, target):
    """Gives `target` the weights of `source`, a model or layer of the
    same architecture."""
    assign_weights(target, source.get_weights())
