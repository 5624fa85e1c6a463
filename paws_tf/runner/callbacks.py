"""Training callbacks: checkpoints, non-finite loss guard, progress, images."""

import math
import os
import re
import shutil
import signal
import threading
import time

from absl import logging
import numpy as np
import tensorflow as tf
import tf_keras

from paws_tf import checkpoints
from paws_tf.data import pipeline
from paws_tf import dist
from paws_tf.evaluation import evaluate


def global_step(model):
    """Optimizer updates applied so far, as a Python int."""
    return int(model.optimizer.iterations.numpy())


def _non_finite_error(what, model, checkpoint_dir):
    path, step = checkpoints.latest(checkpoint_dir)
    return FloatingPointError(
        f'{what} at step {global_step(model)}. Training stopped without '
        'saving this state; the last good checkpoint is '
        f'{path or "none yet"}' + (f' (step {step})' if path else '') +
        '. Lower the learning rate or check the inputs, then run again: the '
        'run resumes from its last backup.')


def check_finite(model, checkpoint_dir):
    """Raises `FloatingPointError` if a weight of `model` is NaN or infinite.

    Called before every save: an update can break the weights while the
    step's loss, computed before it, is still finite.
    """
    for variable in model.variables:
        if not np.all(np.isfinite(variable.numpy())):
            raise _non_finite_error(
                f'The weight {variable.name} became NaN or infinite', model,
                checkpoint_dir)


class StopOnNonFiniteLoss(tf_keras.callbacks.Callback):
    """Stops training with a clear error when the loss is NaN or infinite.

    Listed before every callback that saves, so the non-finite state is never
    written over a good checkpoint or backup.
    """

    def __init__(self, checkpoint_dir):
        super().__init__()
        self._checkpoint_dir = checkpoint_dir

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get('loss')
        if loss is not None and not math.isfinite(float(loss)):
            raise _non_finite_error(
                f'The loss became {float(loss)} (batch {batch} of this '
                'epoch)', self.model, self._checkpoint_dir)


def _save_failed(what, directory, error, *, step, checkpoint_dir,
                 backup_dir):
    """The error that stops training at global `step` when a save cannot
    be written: a `dist.ClusterFailed` when a collective of the save
    failed (the disk is not the cause), else a `checkpoints.SaveFailed`."""
    path, saved_step = checkpoints.latest(checkpoint_dir)
    kept = (f'the checkpoint {path} (step {saved_step})' if path
            else 'no checkpoint')
    if backup_dir is not None:
        kept += (f' and the backup in {backup_dir} (step '
                 f'{backup_step(backup_dir) or "none yet"})')
    failure = dist.cluster_failure(
        tf.distribute.get_strategy(), error, what=f'the {what}', step=step,
        resume=f'the newest of {kept}')
    if failure is not None:
        return failure
    cause = error.message if isinstance(error, tf.errors.OpError) else error
    return checkpoints.SaveFailed(
        f'Could not write the {what} in {directory}: {cause}. Training '
        f'stopped; what was saved before is unchanged: {kept}. Free space '
        f'or restore write access to {directory}, then run the same command '
        'again: it resumes from there.')


class BackupAndRestore(tf_keras.callbacks.BackupAndRestore):
    """tf_keras' BackupAndRestore that also backs up when told to stop, and
    can start from a checkpoint's step mid-epoch.

    On SIGTERM (what Slurm and most schedulers send before killing a job) a
    single-process run backs up at the end of the current step, stops, and
    keeps its backup; `preempted_at` then holds the step. Rerunning the same
    command resumes there. Under MultiWorkerMirroredStrategy one worker
    cannot save alone (saves are collective), so there SIGTERM keeps its
    default effect and the run resumes from the last periodic backup.

    Args:
        backup_dir: the backup's directory.
        save_freq: back up every this many steps.
        on_sigterm: back up and stop on SIGTERM.
        checkpoint_dir: the run's checkpoints, named in errors.
        start_step: with no backup to restore, the global step the model
            was restored to from a checkpoint: fit then starts at that step
            of its epoch instead of at the epoch's start.
        steps_per_epoch: steps of an epoch, for `start_step`.
        owner_check: called before every backup; raises when this run no
            longer owns its directory (`run_lock.RunLock.check`).
    """

    def __init__(self, backup_dir, *, save_freq, on_sigterm, checkpoint_dir,
                 start_step=0, steps_per_epoch=1, owner_check=None):
        super().__init__(backup_dir, save_freq=save_freq)
        self._owner_check = owner_check
        self._on_sigterm = on_sigterm
        self._checkpoint_dir = checkpoint_dir
        self._start_step = start_step
        self._steps_per_epoch = steps_per_epoch
        self._stop_requested = False
        self._previous_handler = None
        self.preempted_at = None

    def _request_stop(self, signum, frame):
        del signum, frame  # Unused.
        self._stop_requested = True

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        state = self._training_state
        if self._start_step and int(state._ckpt_saved_epoch.numpy()) < 0:
            # Nothing restored from a backup: fit reads where to start from
            # these (after on_train_begin), as after restoring one. The
            # last batch done is the one before `start_step`.
            epoch, batch = divmod(self._start_step - 1,
                                  self._steps_per_epoch)
            state._ckpt_saved_epoch.assign(epoch)
            state._ckpt_saved_batch.assign(batch)
        if (self._on_sigterm and
                threading.current_thread() is threading.main_thread()):
            self._previous_handler = signal.signal(signal.SIGTERM,
                                                   self._request_stop)

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        if self._stop_requested and self.preempted_at is None:
            self._backup(epoch=self._current_epoch, batch=batch)
            self.preempted_at = global_step(self.model)
            self.model.stop_training = True

    def _backup(self, epoch, batch=0):
        if self._owner_check is not None:
            self._owner_check()
        check_finite(self.model, self._checkpoint_dir)
        try:
            super()._backup(epoch, batch)
        except (OSError, tf.errors.OpError) as error:
            raise _save_failed(
                'backup', self.backup_dir, error,
                step=global_step(self.model),
                checkpoint_dir=self._checkpoint_dir,
                backup_dir=self.backup_dir) from error

    def on_train_end(self, logs=None):
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
        if self.preempted_at is not None:
            self.delete_checkpoint = False  # Keep it to resume from.
        super().on_train_end(logs)


class Checkpointer(tf_keras.callbacks.Callback):
    """Keeps the last checkpoints of model and optimizer, every N steps and
    at epoch ends, as `ckpt-<global step>`.

    Under MultiWorkerMirroredStrategy every worker saves (reading mirrored
    variables needs collectives); only the chief's files are kept.
    `owner_check`, when given, is called before every save and raises when
    this run no longer owns its directory (`run_lock.RunLock.check`).
    """

    def __init__(self, directory, strategy, *, every_steps, keep,
                 backup_dir=None, owner_check=None):
        super().__init__()
        self._owner_check = owner_check
        self._directory = directory
        self._backup_dir = backup_dir
        self._strategy = strategy
        self._every_steps = every_steps
        self._keep = keep
        self._manager = None
        self._last_saved = None

    def on_train_begin(self, logs=None):
        checkpoint = tf.train.Checkpoint(model=self.model,
                                         optimizer=self.model.optimizer)
        self._write_dir = dist.write_dir(self._strategy, self._directory)
        self._manager = tf.train.CheckpointManager(
            checkpoint, self._write_dir, max_to_keep=self._keep,
            checkpoint_name=checkpoints.CHECKPOINT_PREFIX)

    def _save(self):
        step = global_step(self.model)
        if step == self._last_saved:
            return
        if self._owner_check is not None:
            self._owner_check()
        check_finite(self.model, self._directory)
        try:
            self._manager.save(checkpoint_number=step)
        except (OSError, tf.errors.OpError) as error:
            raise _save_failed(
                f'checkpoint {checkpoints.CHECKPOINT_PREFIX}-{step}',
                self._write_dir, error, step=step,
                checkpoint_dir=self._directory,
                backup_dir=self._backup_dir) from error
        self._last_saved = step
        if self._write_dir != self._directory:  # Not the chief.
            shutil.rmtree(self._write_dir, ignore_errors=True)

    def on_train_batch_end(self, batch, logs=None):
        if self._every_steps and global_step(self.model) % self._every_steps \
                == 0:
            self._save()

    def on_epoch_end(self, epoch, logs=None):
        self._save()


class ProgressLog(tf_keras.callbacks.Callback):
    """Throughput to TensorBoard every N steps and per epoch, one log line
    per epoch.

    Throughput counts every view forwarded (unlabeled views and support
    views), as the benchmarks do.
    """

    def __init__(self, log_dir, *, views_per_step, every_steps, num_epochs,
                 is_chief):
        super().__init__()
        self._writer = (tf.summary.create_file_writer(log_dir) if is_chief
                        else tf.summary.create_noop_writer())
        self._views_per_step = views_per_step
        self._every_steps = every_steps
        self._num_epochs = num_epochs

    def _mark(self):
        return time.perf_counter(), global_step(self.model)

    def on_train_begin(self, logs=None):
        self._interval_start = self._mark()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self._mark()

    def _rate(self, start, end=None):
        """(views per second, seconds per step, seconds) from `start` to
        `end` (default now), both `_mark()`s."""
        end = end or self._mark()
        seconds = end[0] - start[0]
        steps = max(end[1] - start[1], 1)
        return steps * self._views_per_step / seconds, seconds / steps, seconds

    def on_train_batch_end(self, batch, logs=None):
        # Epoch throughput ends at the last step, not after the epoch-end
        # evaluation and saves.
        self._last_batch_end = self._mark()
        step = global_step(self.model)
        if not self._every_steps or step % self._every_steps:
            return
        views_per_second, seconds_per_step, _ = self._rate(
            self._interval_start)
        with self._writer.as_default(step=step):
            tf.summary.scalar('throughput/views_per_second', views_per_second)
            tf.summary.scalar('throughput/seconds_per_step', seconds_per_step)
        self._interval_start = self._mark()

    def on_epoch_end(self, epoch, logs=None):
        views_per_second, _, seconds = self._rate(self._epoch_start,
                                                  self._last_batch_end)
        logs = logs or {}
        shown = ' '.join(f'{k}={float(logs[k]):.4g}' for k in (
            'loss', 'cross_entropy', 'me_max', 'target_confidence',
            'in_domain', 'learning_rate', 'trust_ratio_mean',
            'trust_ratio_min', 'trust_ratio_max', 'nt_xent', 'suncet',
            'paws_nn_top1')
            if k in logs)
        logging.info('epoch %d/%d: %s | %.0f views/s, %.1f s', epoch + 1,
                     self._num_epochs, shown, views_per_second, seconds)
        # Also for runs shorter than `every_steps` (the demo's figure);
        # recorded whatever the TensorBoard callback's `record_if` says at
        # this step.
        with self._writer.as_default(step=global_step(self.model)), \
                tf.summary.record_if(True):
            tf.summary.scalar('throughput/epoch_views_per_second',
                              views_per_second)
        self._writer.flush()


class ViewImages(tf_keras.callbacks.Callback):
    """Writes a few augmented views of the first step to TensorBoard."""

    def __init__(self, log_dir, dataset_fn, *, mean, std, count=4):
        super().__init__()
        self._log_dir, self._dataset_fn = log_dir, dataset_fn
        self._mean, self._std, self._count = mean, std, count

    def on_train_begin(self, logs=None):
        element = next(iter(self._dataset_fn(None)))
        mean = np.reshape(self._mean, [1, 1, 1, -1])
        std = np.reshape(self._std, [1, 1, 1, -1])
        with tf.summary.create_file_writer(self._log_dir).as_default(step=0):
            for key in ('global_views', 'local_views', 'support_views'):
                if key in element:
                    images = element[key][:self._count].numpy() * std + mean
                    tf.summary.image(f'views/{key}', np.clip(images, 0, 1),
                                     max_outputs=self._count)


_ITERATIONS = re.compile(
    r'^model/optimizer/(.+/)?_iterations/\.ATTRIBUTES/VARIABLE_VALUE$')


class PawsNNEvaluation(tf_keras.callbacks.Callback):
    """PAWS-NN top-1/top-5 on the held-out split at epoch ends.

    The support is the whole labeled set; the queries are the first
    `max_queries` test images (all of them when None), so the curve is
    cheap enough to follow during training.

    Every worker of a cluster runs it: each reads the model's weights at
    the same epoch end (`dist.read_weights`, collectives under
    MultiWorkerMirroredStrategy), and the chief alone evaluates them on
    `local_model`, a copy with plain variables, and writes the scalars.

    Args:
        log_dir: TensorBoard directory of the scalars (chief).
        local_model: the chief's copy of the model, from
            `train.build_local_model`; None on the other workers, which
            only take part in reading the weights.
        labeled, test: the support and query sources.
        preprocessing: `pipeline.make_eval_dataset` keyword arguments.
        tau: similarity temperature.
        every_epochs: evaluate every this many epochs.
        max_queries: test images used (None: all).
        batch_size: images per embedding batch.
    """

    def __init__(self, log_dir, local_model, *, labeled, test, preprocessing,
                 tau, every_epochs=1, max_queries=None, batch_size=256):
        super().__init__()
        self._local_model = local_model
        self._every_epochs = every_epochs
        if local_model is None:
            return
        self._writer = tf.summary.create_file_writer(log_dir)
        self._tau = tau
        self._num_classes = len(labeled.class_names)
        self._support = pipeline.make_eval_dataset(
            labeled, batch_size=batch_size, **preprocessing)
        queries = pipeline.make_eval_dataset(test, batch_size=batch_size,
                                             **preprocessing)
        if max_queries is not None:
            queries = queries.unbatch().take(max_queries).batch(batch_size)
        self._queries = queries
        self._embed_fn = evaluate.embedder_from_model(local_model)

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self._every_epochs or self.model.stop_training:
            return  # Not due, or stopping (a preemption's grace period).
        weights = dist.read_weights(self.model)
        if self._local_model is None:
            return
        self._local_model.set_weights(weights)
        results = evaluate.paws_nn(
            self._embed_fn, self._support,
            self._queries, num_classes=self._num_classes, tau=self._tau)
        # During fit, Keras' TensorBoard callback records summaries only on
        # steps that are multiples of its update_freq; an epoch end is not.
        with self._writer.as_default(step=global_step(self.model)), \
                tf.summary.record_if(True):
            for key in ('top1', 'top5'):
                if key in results:
                    tf.summary.scalar(f'paws_nn/{key}', results[key])
        self._writer.flush()
        if logs is not None:
            logs['paws_nn_top1'] = results['top1']
        logging.info('epoch %d: PAWS-NN top-1 %.2f%% (%d queries, %d '
                     'supports)', epoch + 1, 100 * results['top1'],
                     results['num_queries'], results['num_support'])


def backup_step(backup_dir):
    """The global step (optimizer updates) saved in a BackupAndRestore
    backup, 0 if there is none.

    The input pipeline is built before BackupAndRestore restores the model,
    and BackupAndRestore does not restore the tf.data position; the stream is
    a stateless function of (seed, step), so the trainer starts the input at
    this step and continues the exact stream.
    """
    path = tf.train.latest_checkpoint(os.path.join(backup_dir, 'chief'))
    if path is None:
        return 0
    names = [name for name, _ in tf.train.list_variables(path)
             if _ITERATIONS.match(name)]
    if not names:
        raise ValueError(f'The backup {path} holds no optimizer step counter: '
                         'was it written by this trainer?')
    return int(tf.train.load_variable(path, min(names, key=len)))
