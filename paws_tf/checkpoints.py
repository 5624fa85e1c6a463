"""A run's checkpoints, written, found and restored one way: `ckpt-<global
step>` holds the model and its optimizer, in the backup (the newest only:
what an interrupted run resumes from) and in `checkpoints/`. Nothing else
is saved: the input is a stateless function of (seed, step)."""

import os
import shutil
import time

from absl import logging
import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from paws_tf import checks
from paws_tf import cluster
from paws_tf import run_dir as run_dir_lib

CHECKPOINT_PREFIX = 'ckpt'
# The two kinds of saves, as messages name them.
BACKUP, CHECKPOINT = 'the backup', 'the checkpoint'
# What `load` reads of a checkpoint.
WHOLE, MODEL = 'model and optimizer', 'model'
MAX_NAMES_SHOWN = 20


class SaveFailed(RuntimeError):
    """A checkpoint or backup could not be written (no space, no permission,
    a read-only filesystem); what was saved before is unchanged."""
    EXIT_CODE = os.EX_IOERR  # run.py's exit code.


class Mismatch(ValueError):
    """A checkpoint does not hold the variables of the model it is read
    into: `unmatched` names them (with both shapes where they differ)."""

    def __init__(self, message, unmatched):
        super().__init__(message)
        self.unmatched = unmatched


class NoneRestorable(RuntimeError):
    """Checkpoints exist but none can be restored (damaged files)."""
    EXIT_CODE = os.EX_DATAERR  # run.py's exit code.


def global_step(model):
    """Optimizer updates applied so far, as a Python int."""
    return int(model.optimizer.iterations.numpy())


def step_of(path):
    """The global step a `ckpt-<step>` prefix names."""
    return int(os.fspath(path).rsplit('-', 1)[1])


def latest(directory):
    """(path, step) of the checkpoint `directory`'s state file names, or
    (None, 0)."""
    path = tf.train.latest_checkpoint(directory)
    return (path, step_of(path)) if path else (None, 0)


def at_step(run, step):
    """The prefix of `run`'s checkpoint of global `step`."""
    return os.path.join(run.checkpoints, f'{CHECKPOINT_PREFIX}-{step}')


def resolve_prefix(path):
    """A checkpoint prefix, or a directory's latest checkpoint, as a prefix;
    FileNotFoundError naming `path` when no checkpoint is there."""
    path = os.fspath(path)
    prefix = (tf.train.latest_checkpoint(path) if tf.io.gfile.isdir(path)
              else path)
    if prefix is None or not tf.io.gfile.exists(prefix + '.index'):
        raise FileNotFoundError(
            f'No TF checkpoint at {path!r}: expected a checkpoint prefix '
            'with a .index file, or a directory holding a "checkpoint" state '
            'file (tf.train.CheckpointManager writes one).')
    return prefix


def all_checkpoints(directory):
    """(path, step) of every `ckpt-<step>` with an index file in `directory`,
    newest first, whatever the `checkpoint` state file says."""
    pattern = os.path.join(directory, f'{CHECKPOINT_PREFIX}-*.index')
    prefixes = [index[:-len('.index')] for index in tf.io.gfile.glob(pattern)]
    return sorted(((prefix, step_of(prefix)) for prefix in prefixes
                   if prefix.rsplit('-', 1)[1].isdigit()),
                  key=lambda found: -found[1])


def damage(prefix):
    """Why the checkpoint at `prefix` cannot be restored, or None if it can:
    reading every tensor checks its length and CRC32C, so a truncated or
    corrupted file fails here rather than mid-restore."""
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


def backup_step(run):
    """The step of the newest backup of the `RunDir` `run`, 0 if none."""
    backups = all_checkpoints(run.chief_backup)
    return backups[0][1] if backups else 0


def has_progress(run):
    """Whether the `RunDir` `run` holds a backup or checkpoint."""
    return bool(_saved(run))


def _saved(run):
    """`(path, step, kind)` of every backup and checkpoint of the `RunDir`
    `run`, newest first; at one step the backup (written first) first."""
    found = [(path, step, kind) for kind, directory in (
        (BACKUP, run.chief_backup), (CHECKPOINT, run.checkpoints))
        for path, step in all_checkpoints(directory)]
    return sorted(found, key=lambda found: -found[1])


def newest_restorable(run, *, backups=True, chief=True):
    """`(path, step)` of the newest backup (with `backups`: resuming) or
    checkpoint (what evaluation and export read: it outlives the run) of
    the `RunDir` `run` that can be restored, `(None, 0)` when nothing is
    saved. One that cannot is skipped with a warning; when no backup
    restores, the `chief` (the process of a cluster that may move files)
    moves the backup directory into `damaged/`, so that it is not tried
    again. Raises NoneRestorable when things were saved and none
    restores."""
    tried = []  # 'the backup <path>: <why it cannot be restored>', ...
    for path, step, kind in _saved(run):
        if kind == BACKUP and not backups:
            continue
        why = damage(path)
        if why is None:
            break
        tried.append(f'{describe(path)}: {why}')
    else:
        path, step, kind = None, 0, None
    if path is None and tried:
        raise NoneRestorable(
            f'No {"backup or " if backups else ""}checkpoint of {run} '
            'can be restored; tried:\n  ' + '\n  '.join(tried) +
            '\nRestore those files from a copy, move them away to start '
            'again, or use another --model_dir.')
    if chief and kind != BACKUP and any(
            line.startswith(BACKUP) for line in tried):
        aside = os.path.join(run.damaged, time.strftime(
            f'{os.path.basename(run.backup)}-%Y%m%dT%H%M%S', time.gmtime()))
        os.makedirs(run.damaged, exist_ok=True)
        os.rename(run.backup, aside)
        tried.append(f'{BACKUP} {run.backup} (moved to {aside})')
    if tried:
        logging.warning('Skipping what cannot be restored:\n  %s\n'
                        '%s %s (step %d).', '\n  '.join(tried),
                        'Resuming from' if backups else 'Reading', path,
                        step)
    return path, step


def describe(path):
    """'the backup <path>' or 'the checkpoint <path>'."""
    backup = (os.path.basename(os.path.dirname(path)) ==
              run_dir_lib.RunDir.CHIEF)
    return f'{BACKUP if backup else CHECKPOINT} {path}'


def load(path, model, part=MODEL):
    """Restores `part` of the checkpoint at `path` (a prefix, or a
    directory whose latest checkpoint is read) into `model`, built from
    the run's gin config, every variable created (for `WHOLE`, compiled,
    its optimizer built); returns the prefix restored. `part`: `WHOLE`
    (the model and its optimizer, at the step the name gives: resuming)
    or `MODEL`.

    Raises:
        FileNotFoundError: no checkpoint at `path`.
        Mismatch: the checkpoint does not hold `part` of this model.
        ValueError: its optimizer step is not the one its name gives.
    """
    prefix = resolve_prefix(path)
    objects = dict(model=model if part == WHOLE else _model_only(model))
    if part == WHOLE:
        objects['optimizer'] = model.optimizer
    root = tf.train.Checkpoint(**objects)
    # Checked before reading: a read that fails part way leaves TF's
    # restore behind, which logs every stored value at garbage collection.
    unmatched = unmatched_variables(root, prefix)
    if unmatched:
        raise Mismatch(
            f'{prefix} does not hold this run\'s {part} ({len(unmatched)} '
            'variables missing or of other shapes: '
            f'{checks.listing(unmatched, MAX_NAMES_SHOWN)}): it was written '
            'with another config or by another program. Run with the config '
            'it was written with, or move it away to start again.',
            unmatched)
    root.read(prefix).expect_partial().assert_existing_objects_matched()
    if part == WHOLE and global_step(model) != step_of(prefix):
        raise ValueError(
            f'{prefix} holds the optimizer step {global_step(model)}, not '
            f'{step_of(prefix)} as its name says: was it written by this '
            'trainer?')
    logging.info('Restored the %s from %s.', part, prefix)
    return prefix


def _model_only(model):
    """The checkpoint dependencies of `model` but its optimizer, which a
    compiled tf_keras model tracks: what `MODEL` restores."""
    children = tf.train.TrackableView(model).children(model)
    return tf.train.Checkpoint(**{name: child for name, child in
                                  children.items() if name != 'optimizer'})


def load_newest(run, model):
    """Restores `run`'s newest restorable checkpoint's model; its step."""
    path, step = newest_restorable(run, backups=False)
    load(path or run.checkpoints, model)
    return step


def unmatched_variables(root, prefix):
    """The variables under `root` that a read of `prefix` would leave
    unset or give another shape (names, and shapes where they differ).
    The checkpoint's object graph is followed by its edges' names, as TF's
    restore matches objects."""
    reader = tf.train.load_checkpoint(prefix)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor('_CHECKPOINTABLE_OBJECT_GRAPH'))
    shapes = reader.get_variable_to_shape_map()
    view = tf.train.TrackableView(root)
    stored = {}  # id(variable): its stored shape
    queue, seen = [(root, 0)], {id(root)}
    for parent, node in queue:  # Read while it grows: breadth first.
        children = view.children(parent)
        for edge in graph.nodes[node].children:
            child = children.get(edge.local_name)
            if child is None or id(child) in seen:
                continue
            seen.add(id(child))
            if not isinstance(child, tf.Variable):
                queue.append((child, edge.node_id))
            for attribute in graph.nodes[edge.node_id].attributes:
                stored[id(child)] = shapes.get(attribute.checkpoint_key)
    unmatched = []
    for variable in view.descendants():
        if not isinstance(variable, tf.Variable):
            continue
        shape = stored.get(id(variable))
        if shape is None:
            unmatched.append(variable.name)
        elif list(shape) != variable.shape.as_list():
            unmatched.append(f'{variable.name} of shape '
                             f'{variable.shape.as_list()}, stored {shape}')
    return unmatched


def non_finite_error(what, step, checkpoint_dir):
    """The error that stops training when `what` became NaN or infinite."""
    path, saved_step = latest(checkpoint_dir)
    return FloatingPointError(
        f'{what} at step {step}. Training stopped without saving this state; '
        f'the last good checkpoint is {path or "none yet"}' +
        (f' (step {saved_step})' if path else '') + '. Lower the learning '
        'rate or check the inputs, then run again: the run resumes from its '
        'last backup.')


class RunState:
    """Saves the compiled, built `model` and its optimizer into the
    `RunDir` `run` (on every worker of a cluster, `cluster.save_dir`;
    `strategy` the running one), keeping `keep_checkpoints` checkpoints.
    `before_save` is called before every save; it raises when this run no
    longer owns `run` (`run_lock.RunLock.check`)."""

    def __init__(self, run, model, strategy, *, keep_checkpoints,
                 before_save=None):
        self._run = run
        self.model = model
        self.checkpoint_dir = run.checkpoints
        self.backup_dir = run.backup
        self._strategy = strategy
        self._before_save = before_save or (lambda: None)
        checkpoint = tf.train.Checkpoint(model=model,
                                         optimizer=model.optimizer)
        self._directories = {BACKUP: run.chief_backup,
                             CHECKPOINT: run.checkpoints}
        self._managers = {
            kind: tf.train.CheckpointManager(
                checkpoint, cluster.write_dir(strategy, directory),
                max_to_keep=1 if kind == BACKUP else keep_checkpoints,
                checkpoint_name=CHECKPOINT_PREFIX)
            for kind, directory in self._directories.items()}
        self._saved_at = {BACKUP: None, CHECKPOINT: None}

    def save(self, kind):
        """Writes a backup or a checkpoint of the current step, once.

        Raises:
            FloatingPointError: a weight is NaN or infinite (nothing is
                written).
            SaveFailed: the files could not be written.
            cluster.ClusterFailed: a collective of the save failed.
        """
        step = global_step(self.model)
        if self._saved_at[kind] == step:
            return
        self._before_save()
        # An update can break the weights while the step's loss, computed
        # before it, is still finite.
        for variable in self.model.variables:
            if not np.all(np.isfinite(variable.numpy())):
                raise non_finite_error(
                    f'The weight {variable.name} became NaN or infinite',
                    step, self.checkpoint_dir)
        with cluster.save_dir(self._strategy, self._directories[kind]):
            try:
                self._managers[kind].save(checkpoint_number=step)
            except (OSError, tf.errors.OpError) as error:
                raise self._save_failed(kind, step, error) from error
        self._saved_at[kind] = step

    def delete_backup(self):
        """Deletes the backup of a finished run (its checkpoints stay)."""
        if cluster.is_chief(self._strategy):
            shutil.rmtree(self.backup_dir, ignore_errors=True)

    def saved(self):
        """What is saved, for messages: `(kept, resume)`, the newest
        checkpoint and the backup, and where a rerun resumes (the newer of
        the two)."""
        path, step = latest(self.checkpoint_dir)
        backup = backup_step(self._run)
        checkpoint = path and f'the checkpoint {path} (step {step})'
        kept = (f'{checkpoint or "no checkpoint"} and the backup in '
                f'{self.backup_dir} (step {backup or "none yet"})')
        if backup and (path is None or backup > step):
            return kept, f'the backup in {self.backup_dir} (step {backup})'
        return kept, checkpoint or 'step 0: nothing is saved yet'

    def _save_failed(self, kind, step, error):
        """The `cluster.ClusterFailed` or `SaveFailed` of a failed save."""
        what = (f'{CHECKPOINT} {CHECKPOINT_PREFIX}-{step}'
                if kind == CHECKPOINT else BACKUP)
        directory = (self._managers[kind].directory if kind == CHECKPOINT
                     else self.backup_dir)
        kept, resume = self.saved()
        return cluster.cluster_failure(
            self._strategy, error, what=what, step=step,
            resume=resume) or SaveFailed(
                f'Could not write {what} in {directory}: '
                f'{getattr(error, "message", error)}. Training stopped; what '
                f'was saved before is unchanged: {kept}. Free space or '
                f'restore write access to {directory}, then run the same '
                'command again: it resumes from there.')


def assign_weights(model, weights):
    """Gives `model` (a built model or layer) the arrays `weights`, in
    `get_weights()`'s order: the one place weights are copied in memory."""
    model.set_weights(weights)

