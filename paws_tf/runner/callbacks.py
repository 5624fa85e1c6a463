"""Training callbacks, and `fit` from the step a run resumes at."""

import contextlib
import signal
import threading
import time

from absl import logging
import gin
import numpy as np
import tensorflow as tf
import tf_keras

from paws_tf import checkpoints
from paws_tf.evaluation import evaluate
from paws_tf import model as model_lib
from paws_tf.runner import building
from paws_tf.runner import experiment


class StopOnNonFiniteLoss(tf_keras.callbacks.Callback):
    """Stops training with a clear error when the loss is NaN or infinite,
    before the `Saver` writes that state over a good one."""

    def __init__(self, checkpoint_dir):
        super().__init__()
        self._checkpoint_dir = checkpoint_dir

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get('loss')
        if loss is not None and not np.isfinite(loss):
            raise checkpoints.non_finite_error(
                f'The loss became {float(loss)} (batch {batch} of this '
                'epoch)', checkpoints.global_step(self.model),
                self._checkpoint_dir)


# TensorBoard's tag of each value `PAWSModel.train_step` returns, grouped;
# the step returns the trust ratios with LARS only, the weight decay with
# AdamW only.
TRAIN_TAGS = {
    'loss': 'loss/total', 'cross_entropy': 'loss/cross_entropy',
    'me_max': 'loss/me_max', 'target_confidence': 'paws/target_confidence',
    'in_domain': 'paws/in_domain',
    'learning_rate': 'optimizer/learning_rate',
    'trust_ratio_mean': 'lars/trust_ratio_mean',
    'trust_ratio_min': 'lars/trust_ratio_min',
    'trust_ratio_max': 'lars/trust_ratio_max',
    'weight_decay': 'adamw/weight_decay',
    'nt_xent': 'diagnostics/nt_xent', 'suncet': 'diagnostics/suncet'}
# Means over the epoch in `fit`'s logs: each step's value is under
# `model.STEP_PREFIX + name`, the epoch's goes to TensorBoard's `epoch/`.
EPOCH_MEANS = ('loss', 'cross_entropy', 'me_max', 'target_confidence',
               'in_domain')


class ProgressLog(tf_keras.callbacks.Callback):
    """The training scalars to TensorBoard and one log line per epoch:
    every `every_steps` steps (at the first step past each multiple),
    that step's values (`TRAIN_TAGS`), the diagnostics at the newest step
    that computed them, and the throughput since the last point or the
    epoch's start; at epoch ends, the epoch's means and throughput (of
    every view forwarded, unlabeled and support)."""

    def __init__(self, log_dir, *, views_per_step, every_steps, num_epochs,
                 is_chief):
        super().__init__()
        self._writer = (tf.summary.create_file_writer(log_dir) if is_chief
                        else tf.summary.create_noop_writer())
        self._views_per_step = views_per_step
        self._every_steps = every_steps
        self._logged_step = None  # Of the last point.
        self._num_epochs = num_epochs

    def _mark(self):
        return time.perf_counter(), checkpoints.global_step(self.model)

    def on_train_begin(self, logs=None):
        self._interval_start = self._mark()
        if self._logged_step is None:  # Else a resumed epoch's second fit.
            self._logged_step = self._interval_start[1]

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self._mark()
        # The next point's throughput leaves out the epoch-end evaluation
        # and saves.
        self._interval_start = self._epoch_start

    def _rate(self, start, end):
        """(views per second, seconds per step, seconds) from `start` to
        `end`, both `_mark()`s."""
        seconds = end[0] - start[0]
        steps = max(end[1] - start[1], 1)
        return steps * self._views_per_step / seconds, seconds / steps, seconds

    def on_train_batch_end(self, batch, logs=None):
        # Epoch throughput ends at the last step, not after the epoch-end
        # evaluation and saves.
        self._last_batch_end = self._mark()
        step = self._last_batch_end[1]
        # At the first step that reaches or passes a multiple: with
        # `train.steps_per_execution` a call's last step may lie past it.
        if not self._every_steps or (step // self._every_steps <=
                                     self._logged_step // self._every_steps):
            return
        views_per_second, seconds_per_step, _ = self._rate(
            self._interval_start, self._last_batch_end)
        logs = logs or {}
        every = getattr(self.model, 'diagnostics_every', 0)
        # The newest step that computed the diagnostics (1, every + 1,
        # ...), whose values `logs` holds: written at that step once, by
        # the first point after it (points and diagnostics rarely share a
        # step: every 50 and every 100 never do).
        computed = (step - 1) // every * every + 1 if every else 0
        with self._writer.as_default(step=step):
            for key, tag in TRAIN_TAGS.items():
                name = (model_lib.STEP_PREFIX + key if key in EPOCH_MEANS
                        else key)
                if name not in logs:
                    continue
                if key not in model_lib.DIAGNOSTICS:
                    tf.summary.scalar(tag, float(logs[name]))
                elif computed > self._logged_step:
                    tf.summary.scalar(tag, float(logs[name]), step=computed)
            tf.summary.scalar('throughput/views_per_second', views_per_second)
            tf.summary.scalar('throughput/seconds_per_step', seconds_per_step)
        # On disk before the saver (after this callback) backs the step up:
        # a run killed then and resumed from it has logged every step.
        self._writer.flush()
        self._interval_start = self._mark()
        self._logged_step = step

    def on_epoch_end(self, epoch, logs=None):
        if self.model.stop_training:
            return  # Preempted mid-epoch: the resumed run ends it.
        views_per_second, _, seconds = self._rate(self._epoch_start,
                                                  self._last_batch_end)
        logs = logs or {}
        # A diagnostic not computed yet in this process (NaN) is left out.
        shown = ' '.join(
            f'{k}={float(logs[k]):.4g}' for k in (*TRAIN_TAGS, 'paws_nn_top1')
            if k in logs and not (k in model_lib.DIAGNOSTICS and
                                  np.isnan(logs[k])))
        logging.info('epoch %d/%d: %s | %.0f views/s, %.1f s', epoch + 1,
                     self._num_epochs, shown, views_per_second, seconds)
        # Also for runs shorter than `every_steps` (the demo's figure).
        with self._writer.as_default(step=checkpoints.global_step(self.model)):
            for key in EPOCH_MEANS:
                if key in logs:
                    tf.summary.scalar(f'epoch/{key}', float(logs[key]))
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
        with tf.summary.create_file_writer(self._log_dir).as_default(step=0):
            for key in ('global_views', 'local_views', 'support_views'):
                if key in element:
                    images = (element[key][:self._count].numpy() * self._std
                              + self._mean)  # Per channel: [C] each.
                    tf.summary.image(f'views/{key}', np.clip(images, 0, 1),
                                     max_outputs=self._count)


class OperativeConfig(tf_keras.callbacks.Callback):
    """Writes gin's operative config to `run.operative_config` once the
    first step has run: gin lists a configurable only once it has been
    called, and by then training has called all of its own."""

    def __init__(self, run):
        super().__init__()
        self._run = run  # None once written.

    def on_train_batch_end(self, batch, logs=None):
        if self._run is not None:
            self._run.write(self._run.operative_config,
                            gin.operative_config_str())
            self._run = None


def epoch_end_evaluation(evaluator_classes, bundle, *, log_dir, tau, chief,
                         every_epochs, max_queries):
    """The `evaluate.EpochEndEvaluation` callback of `train`'s
    `evaluators` (`evaluator_classes`), `eval_every_epochs` and
    `eval_max_queries`, on the test split of the run's data `bundle`, with
    the similarity temperature `tau`, its points in `log_dir`.

    Every worker of a cluster runs it: each reads the model's weights at
    the same epoch end (reading a sync-on-read variable, a batch-norm
    moving statistic, is a collective of all workers), and the `chief`
    alone evaluates them on a copy with plain variables.
    """
    local_model, built = None, []
    if chief:
        local_model = building.build_local_model(
            input_channels=bundle.labeled.channels)
        embed_fn = evaluate.embedder_from_model(local_model)
        built = [cls(bundle.labeled, bundle.test, tau=tau, log_dir=log_dir,
                     preprocessing=experiment.eval_preprocessing(bundle),
                     max_queries=max_queries) for cls in evaluator_classes]

    def embedder(model):
        weights = model.get_weights()
        if local_model is None:
            return None
        checkpoints.assign_weights(local_model, weights)
        return embed_fn

    return evaluate.EpochEndEvaluation(built, embedder,
                                       every_epochs=every_epochs)


class Saver(tf_keras.callbacks.Callback):
    """Backs up (every `backup_every` steps) and checkpoints (every
    `checkpoint_every` steps, 0: epoch ends only) a `checkpoints.RunState`,
    the backup first, when the global step reaches or passes a multiple.
    On SIGTERM (what Slurm and most schedulers send before killing a job),
    inside `handling_sigterm()`, the run backs up at the end of the step
    and stops; `preempted_at` then holds the step."""

    def __init__(self, state, *, backup_every, checkpoint_every):
        super().__init__()
        self.state = state
        self._every = {checkpoints.BACKUP: backup_every,
                       checkpoints.CHECKPOINT: checkpoint_every}
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

        def request_stop(*_):  # (signum, frame)
            self._stop_requested = True

        previous = signal.signal(signal.SIGTERM, request_stop)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    def on_train_begin(self, logs=None):
        self._last_step = checkpoints.global_step(self.model)

    def on_train_batch_end(self, batch, logs=None):
        step = checkpoints.global_step(self.model)
        for kind, every in self._every.items():
            if every and step // every > self._last_step // every:
                self.state.save(kind)
        self._last_step = step
        if self._stop_requested and self.preempted_at is None:
            self.state.save(checkpoints.BACKUP)
            self.preempted_at = step
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        # A preempted epoch ended mid-way: its step is in the backup.
        if self.preempted_at is None:
            self.state.save(checkpoints.CHECKPOINT)


class _FinishEpoch(tf_keras.callbacks.Callback):
    """Ends `fit` at the end of its first epoch; `finished` says whether
    that epoch ran to its end (no other callback stopped it)."""

    finished = False

    def on_epoch_end(self, epoch, logs=None):
        self.finished = not self.model.stop_training
        self.model.stop_training = True


def fit_from(model, input_at, start_step, *, epochs, steps_per_epoch,
             callbacks, **fit_kwargs):
    """`model.fit` from global `start_step` to the end of epoch `epochs`.

    `fit` starts at an epoch's first step (`initial_epoch`): a run resumed
    mid-epoch first finishes that epoch in a `fit` of its remaining steps.
    The callbacks see the epochs of an uninterrupted run (their `batch`
    counts from the first step of each `fit`). `model` is compiled and
    restored at `start_step`; `input_at(step)` is the `x` of `fit` (a
    `DatasetCreator`) that starts at global `step`; the other arguments
    are every `fit`'s.
    """
    epoch, done = divmod(start_step, steps_per_epoch)
    if done:
        finish = _FinishEpoch()
        model.fit(input_at(start_step), initial_epoch=epoch, epochs=epochs,
                  steps_per_epoch=steps_per_epoch - done,
                  callbacks=callbacks + [finish], **fit_kwargs)
        if not finish.finished:
            return
        epoch += 1
    if epoch < epochs:
        model.fit(input_at(epoch * steps_per_epoch), initial_epoch=epoch,
                  epochs=epochs, steps_per_epoch=steps_per_epoch,
                  callbacks=callbacks, **fit_kwargs)
