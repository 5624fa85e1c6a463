"""A training run's records in its directory: its history, one line per
start, resume and end (`RunDir.record_event`), so that its interruptions
can be read afterwards, and its operative gin config."""

import gin
import tf_keras


def resumed(step, total_steps, steps_per_epoch, source):
    """The event of a run resuming at global step `step` from `source`
    (the backup or checkpoint file, as a phrase), with its epoch."""
    epoch, batch = divmod(step, steps_per_epoch)
    return (f'resumed at step {step} of {total_steps} (epoch {epoch + 1} of '
            f'{total_steps // steps_per_epoch}, step {batch} of it) from '
            f'{source}')


class OperativeConfig(tf_keras.callbacks.Callback):
    """Writes gin's operative config (every value the configurables that
    the run called received, defaults included) to the run's
    `operative_config.gin` once the first step has run: gin lists a
    configurable only once it has been called, and by then training has
    called all of its own. The chief's alone.

    Args:
        run: the run's `RunDir`.
    """

    def __init__(self, run):
        super().__init__()
        self._run = run
        self._written = False

    def on_train_batch_end(self, batch, logs=None):
        if not self._written:
            self._run.write(self._run.operative_config,
                            gin.operative_config_str())
            self._written = True
