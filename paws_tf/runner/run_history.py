"""A training run's records in its directory: its history, one line per
start, resume and end, so that its interruptions can be read afterwards, and
its operative gin config."""

import datetime
import os
import socket

import gin
import tf_keras

from paws_tf import files

HISTORY_FILENAME = 'run_history.txt'
OPERATIVE_CONFIG_FILE = 'operative_config.gin'


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime(
        '%Y-%m-%dT%H:%M:%SZ')


def record(model_dir, event):
    """Appends `<UTC time> <host> pid <pid>: <event>` to the history.

    A line is appended with one write, so a kill leaves the lines before it
    whole; a run that was killed shows as a start or resume line followed by
    the next resume line, with no end line between them.

    Args:
        model_dir: the run directory.
        event: what happened, one line.

    Returns:
        `event`.
    """
    line = f'{_now()} {socket.gethostname()} pid {os.getpid()}: {event}\n'
    with open(os.path.join(model_dir, HISTORY_FILENAME), 'a') as f:
        f.write(line)
    return event


def resumed(step, total_steps, steps_per_epoch, source):
    """The event of a run resuming at global step `step` from `source`
    (the backup or checkpoint file, as a phrase), with its epoch."""
    epoch, batch = divmod(step, steps_per_epoch)
    return (f'resumed at step {step} of {total_steps} (epoch {epoch + 1} of '
            f'{total_steps // steps_per_epoch}, step {batch} of it) from '
            f'{source}')



class OperativeConfig(tf_keras.callbacks.Callback):
    """Writes gin's operative config (every value the configurables that
    the run called received, defaults included) to
    `model_dir/OPERATIVE_CONFIG_FILE` once the first step has run: gin
    lists a configurable only once it has been called, and by then training
    has called all of its own. The chief's alone."""

    def __init__(self, model_dir):
        super().__init__()
        self._path = os.path.join(model_dir, OPERATIVE_CONFIG_FILE)
        self._written = False

    def on_train_batch_end(self, batch, logs=None):
        if not self._written:
            files.write_text(self._path, gin.operative_config_str())
            self._written = True
