"""A training run's history in its directory: one line per start, resume and
end, so that its interruptions can be read afterwards."""

import datetime
import os
import socket

HISTORY_FILENAME = 'run_history.txt'


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

