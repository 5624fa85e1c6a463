"""A training run's saved state, written and read one way.

One `tf.train.Checkpoint` of the model and its optimizer is written as
`ckpt-<global step>` into two directories of the run:

- `backup/chief/`: every `backup_every_steps` steps and on SIGTERM, only the
  newest kept; deleted when the run finishes. It is what an interrupted run
  resumes from.
- `checkpoints/`: every `checkpoint_every_steps` steps and at epoch ends, the
  last `keep` kept. They outlive the run (evaluation, export, fine-tuning).

Resuming restores the newest of them that is whole, whichever directory it
is in. The global step is in the file name, and it is also the optimizer's
step counter inside the file, so nothing else is saved: the input is a
stateless function of (seed, step) and is rebuilt at that step. The run
lock and the data fingerprint are checked around this layer (`train.train`):
a save calls the `before_save` hook it is given.
"""

import contextlib
import os
import shutil
import signal
import threading
import time

from absl import logging
import numpy as np
import tensorflow as tf
import tf_keras

from paws_tf import checkpoints
from paws_tf import cluster

CHECKPOINT_DIR = 'checkpoints'
BACKUP_DIR = 'backup'
# Where a backup that cannot be restored is moved, kept for inspection.
DAMAGED_DIR = 'damaged'
# The backup of the chief, the one kept; under MultiWorkerMirroredStrategy
# the other workers write theirs beside it and delete it (`cluster.write_dir`).
_CHIEF = 'chief'
BACKUP = 'backup'
CHECKPOINT = 'checkpoint'


def global_step(model):
    """Optimizer updates applied so far, as a Python int."""
    return int(model.optimizer.iterations.numpy())


def backup_step(backup_dir):
    """The global step of the newest backup in `backup_dir`, 0 if none."""
    found = checkpoints.all_checkpoints(os.path.join(backup_dir, _CHIEF))
    return found[0][1] if found else 0


def has_progress(model_dir):
    """Whether `model_dir` holds a run: a backup or a checkpoint to resume
    from. A start that failed before its first save (a bad value, an empty
    class folder, a corrupt image) leaves neither."""
    return bool(_saved(model_dir))


def _saved(model_dir):
    """`(path, step, kind)` of every backup and checkpoint of the run,
    newest first; at the same step the backup first (it is written
    first)."""
    found = [(path, step, kind) for kind, directory in (
        (BACKUP, os.path.join(model_dir, BACKUP_DIR, _CHIEF)),
        (CHECKPOINT, os.path.join(model_dir, CHECKPOINT_DIR)))
        for path, step in checkpoints.all_checkpoints(directory)]
    return sorted(found, key=lambda found: -found[1])


def newest_restorable(model_dir, *, backups=True, chief=True):
    """The newest backup or checkpoint of `model_dir` that can be restored.

    One that cannot (truncated, corrupted) is skipped with a warning naming
    it. When no backup can be restored, the chief moves the backup
    directory to `model_dir/DAMAGED_DIR`, so that it is not tried again.

    Args:
        model_dir: the run directory.
        backups: consider the backup too (resuming); else checkpoints only
            (evaluation and export read what outlives the run).
        chief: this process may move files (the chief of a cluster).

    Returns:
        `(path, step)`: `(None, 0)` when there is nothing saved.

    Raises:
        checkpoints.NoneRestorable: things were saved and none restores.
    """
    skipped = []
    path, step, kind = None, 0, None
    for path, step, kind in _saved(model_dir):
        if kind == BACKUP and not backups:
            continue
        why = checkpoints.damage(path)
        if why is None:
            break
        skipped.append((kind, f'{path}: {why}'))
    else:
        path, step, kind = None, 0, None
    tried = [f'the backup {why}' if what == BACKUP else why
             for what, why in skipped]
    if path is None and tried:
        raise checkpoints.NoneRestorable(
            f'No {"backup or " if backups else ""}checkpoint of {model_dir} '
            'can be restored; tried:\n  ' + '\n  '.join(tried) +
            '\nRestore those files from a copy, move them away to start '
            'again, or use another --model_dir.')
    damaged = [i for i, (what, _) in enumerate(skipped) if what == BACKUP]
    if chief and kind != BACKUP and damaged:
        aside = os.path.join(model_dir, DAMAGED_DIR, time.strftime(
            f'{BACKUP_DIR}-%Y%m%dT%H%M%S', time.gmtime()))
        os.makedirs(os.path.dirname(aside), exist_ok=True)
        os.rename(os.path.join(model_dir, BACKUP_DIR), aside)
        tried[damaged[0]] += f' (moved to {aside})'
    if tried:
        logging.warning('Skipping what cannot be restored:\n  %s\n'
                        '%s %s (step %d).', '\n  '.join(tried),
                        'Resuming from' if backups else 'Reading', path,
                        step)
    return path, step


def describe(path):
    """'the backup <path>' or 'the checkpoint <path>'."""
    backup = os.path.basename(os.path.dirname(path)) == _CHIEF
    return f'the {BACKUP if backup else CHECKPOINT} {path}'


def non_finite_error(what, step, checkpoint_dir):
    """The error that stops training when `what` became NaN or infinite."""
    path, saved_step = checkpoints.latest(checkpoint_dir)
    return FloatingPointError(
        f'{what} at step {step}. Training stopped without saving this state; '
        f'the last good checkpoint is {path or "none yet"}' +
        (f' (step {saved_step})' if path else '') + '. Lower the learning '
        'rate or check the inputs, then run again: the run resumes from its '
        'last backup.')


class RunState:
    """Saves and restores one run's model and optimizer.

    Under MultiWorkerMirroredStrategy every worker saves (reading mirrored
    variables needs collectives); only the chief's files are kept.

    Args:
        model_dir: the run directory.
        model: the compiled, built model; its optimizer is saved with it.
        strategy: the running `tf.distribute.Strategy`.
        keep_checkpoints: checkpoints kept in `model_dir/CHECKPOINT_DIR`.
        before_save: called before every save; raises when this run no
            longer owns `model_dir` (`run_lock.RunLock.check`).
    """

    def __init__(self, model_dir, model, strategy, *, keep_checkpoints,
                 before_save=None):
        self.model = model
        self.checkpoint_dir = os.path.join(model_dir, CHECKPOINT_DIR)
        self.backup_dir = os.path.join(model_dir, BACKUP_DIR)
        self._strategy = strategy
        self._before_save = before_save
        self._checkpoint = tf.train.Checkpoint(model=model,
                                               optimizer=model.optimizer)
        self._directories = {
            BACKUP: os.path.join(self.backup_dir, _CHIEF),
            CHECKPOINT: self.checkpoint_dir}
        self._managers = {
            kind: tf.train.CheckpointManager(
                self._checkpoint, cluster.write_dir(strategy, directory),
                max_to_keep=1 if kind == BACKUP else keep_checkpoints,
                checkpoint_name=checkpoints.CHECKPOINT_PREFIX)
            for kind, directory in self._directories.items()}
        self._saved_at = {BACKUP: None, CHECKPOINT: None}

    def restore(self, path):
        """Restores the model and optimizer saved at `path`.

        Raises:
            ValueError: `path` does not hold this model and optimizer at the
                step its name gives (another config, or not written here).
        """
        try:
            self._checkpoint.restore(path).assert_existing_objects_matched()
        # Missing variables (AssertionError) or other shapes (ValueError);
        # TF's message goes on to list the unmatched variables' values.
        except (AssertionError, ValueError) as error:
            raise ValueError(
                f'{path} does not hold this run\'s model and optimizer '
                f'({str(error).split(".")[0]}): it was written with another '
                'config or by another program. Run with the config it was '
                'written with, or move it away to start again.') from error
        step = int(path.rsplit('-', 1)[1])
        if global_step(self.model) != step:
            raise ValueError(
                f'{path} holds the optimizer step {global_step(self.model)}, '
                f'not {step} as its name says: was it written by this '
                'trainer?')

    def save(self, kind):
        """Writes a backup or a checkpoint of the current step, once.

        Raises:
            FloatingPointError: a weight is NaN or infinite (nothing is
                written).
            checkpoints.SaveFailed: the files could not be written; what
                was saved before is unchanged.
            cluster.ClusterFailed: a collective of the save failed.
        """
        step = global_step(self.model)
        if self._saved_at[kind] == step:
            return
        if self._before_save is not None:
            self._before_save()
        self._check_finite(step)
        manager = self._managers[kind]
        try:
            manager.save(checkpoint_number=step)
        except (OSError, tf.errors.OpError) as error:
            raise self._save_failed(kind, step, error) from error
        finally:
            if manager.directory != self._directories[kind]:  # Not chief.
                shutil.rmtree(manager.directory, ignore_errors=True)
        self._saved_at[kind] = step

    def delete_backup(self):
        """Deletes the backup: the run is finished, its checkpoints stay."""
        if cluster.is_chief(self._strategy):
            shutil.rmtree(self.backup_dir, ignore_errors=True)

    def _check_finite(self, step):
        # An update can break the weights while the step's loss, computed
        # before it, is still finite.
        for variable in self.model.variables:
            if not np.all(np.isfinite(variable.numpy())):
                raise non_finite_error(
                    f'The weight {variable.name} became NaN or infinite',
                    step, self.checkpoint_dir)

    def kept(self):
        """What is saved, for messages: a rerun resumes from the newest."""
        path, step = checkpoints.latest(self.checkpoint_dir)
        kept = (f'the checkpoint {path} (step {step})' if path
                else 'no checkpoint')
        return (f'{kept} and the backup in {self.backup_dir} (step '
                f'{backup_step(self.backup_dir) or "none yet"})')

    def _save_failed(self, kind, step, error):
        """A `cluster.ClusterFailed` when a collective of the save failed (the
        disk is not the cause), else a `checkpoints.SaveFailed`."""
        what = (f'checkpoint {checkpoints.CHECKPOINT_PREFIX}-{step}'
                if kind == CHECKPOINT else 'backup')
        directory = (self._managers[kind].directory if kind == CHECKPOINT
                     else self.backup_dir)
        kept = self.kept()
        failure = cluster.cluster_failure(
            self._strategy, error, what=f'the {what}', step=step,
            resume=f'the newest of {kept}')
        if failure is not None:
            return failure
        cause = (error.message if isinstance(error, tf.errors.OpError)
                 else error)
        return checkpoints.SaveFailed(
            f'Could not write the {what} in {directory}: {cause}. Training '
            f'stopped; what was saved before is unchanged: {kept}. Free '
            f'space or restore write access to {directory}, then run the '
            'same command again: it resumes from there.')


class Saver(tf_keras.callbacks.Callback):
    """Backs up and checkpoints a `RunState` on schedule, and on SIGTERM.

    A step is saved when the global step reaches a multiple of an interval
    (with `steps_per_execution > 1`, when it passes one); at the same step
    the backup is written before the checkpoint. Place it after the
    callbacks that write summaries.

    On SIGTERM (what Slurm and most schedulers send before killing a job),
    inside `handling_sigterm()`, the run backs up at the end of the current
    step and stops; `preempted_at` then holds the step. Under
    MultiWorkerMirroredStrategy one worker cannot save alone (saves are
    collective), so there SIGTERM keeps its default effect and the run
    resumes from the last periodic backup.

    Args:
        state: the `RunState`.
        backup_every: back up every this many steps.
        checkpoint_every: checkpoint every this many steps (0: epoch ends
            only).
    """

    def __init__(self, state, *, backup_every, checkpoint_every):
        super().__init__()
        self.state = state
        self._every = {BACKUP: backup_every, CHECKPOINT: checkpoint_every}
        self._last_step = None
        self._stop_requested = False
        self.preempted_at = None

    @contextlib.contextmanager
    def handling_sigterm(self, enabled=True):
        """Within it, SIGTERM backs up and stops instead of killing."""
        if not enabled or (threading.current_thread() is not
                           threading.main_thread()):
            yield
            return

        def request_stop(signum, frame):
            del signum, frame  # Unused.
            self._stop_requested = True

        previous = signal.signal(signal.SIGTERM, request_stop)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    def on_train_begin(self, logs=None):
        self._last_step = global_step(self.model)

    def on_train_batch_end(self, batch, logs=None):
        step = global_step(self.model)
        for kind in (BACKUP, CHECKPOINT):
            every = self._every[kind]
            if every and step // every > self._last_step // every:
                self.state.save(kind)
        self._last_step = step
        if self._stop_requested and self.preempted_at is None:
            self.state.save(BACKUP)
            self.preempted_at = step
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        self.state.save(CHECKPOINT)

    def on_train_end(self, logs=None):
        if self.preempted_at is None:
            self.state.delete_backup()


class _FitStart:
    """Answers `Model.fit`'s question of where to start.

    tf_keras has no public argument for starting mid-epoch: `fit` asks
    `model._training_state` (which its BackupAndRestore sets) for the first
    epoch and step, and only that. This answers from the global step, and
    sets the model's step counter, which `fit` has just reset to 0, to it.
    """

    def __init__(self, model, step):
        self._model = model
        self._step = step

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch,
                                              initial_epoch, mode):
        del initial_epoch, mode  # Unused: the step decides.
        # pylint: disable-next=protected-access
        self._model._train_counter.assign(self._step)
        return divmod(self._step, steps_per_epoch)


@contextlib.contextmanager
def fit_starting_at(model, step):
    """Within it, `model.fit` starts at global `step`: epoch
    `step // steps_per_epoch`, its step `step % steps_per_epoch`, and its
    step counter (the step of TensorBoard's per-step summaries) at
    `step`."""
    # pylint: disable-next=protected-access
    model._training_state = _FitStart(model, step)
    try:
        yield
    finally:
        model._training_state = None  # pylint: disable=protected-access
