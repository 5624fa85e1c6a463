"""Training's saves on schedule and on SIGTERM (`Saver`), and `fit` from
the global step a run resumes at (`fit_from`); the checkpoints themselves
are `checkpoints`'."""

import contextlib
import signal
import threading

import tf_keras

from paws_tf import checkpoints


class Saver(tf_keras.callbacks.Callback):
    """Backs up and checkpoints a `checkpoints.RunState` on schedule, and on
    SIGTERM.

    A step is saved when the global step reaches (or, with
    `steps_per_execution > 1`, passes) a multiple of an interval, the
    backup before the checkpoint. Place it after the callbacks that write
    summaries. On SIGTERM (what Slurm and most schedulers send before
    killing a job), inside `handling_sigterm()`, the run backs up at the
    end of the current step and stops; `preempted_at` then holds the step.

    Args:
        state: the `checkpoints.RunState`.
        backup_every: back up every this many steps.
        checkpoint_every: checkpoint every this many steps (0: epoch ends
            only).
    """

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

        def request_stop(signum, frame):
            del signum, frame  # Unused.
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
    counts from the first step of each `fit`).

    Args:
        model: the compiled model, restored at `start_step`.
        input_at: `step -> x` of `fit` (a `DatasetCreator`) that starts at
            global `step`.
        start_step: the global step to start at.
        epochs: the epochs of the whole run.
        steps_per_epoch: steps of one epoch.
        callbacks: `fit`'s callbacks, for every `fit`.
        **fit_kwargs: the other arguments of `fit`.
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
