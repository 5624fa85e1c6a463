"""Progress a person reads, on a terminal or in a log (`ProgressBar`)."""

import shutil
import sys
import time

import gin
import tf_keras

from paws_tf import checks

# The values the bar shows, with their labels; the others (trust ratios,
# NT-Xent, SuNCEt) go to TensorBoard and the epoch's log line only, so that
# the bar stays on one terminal line.
BAR_VALUES = (('loss', 'loss'), ('cross_entropy', 'ce'), ('me_max', 'me-max'),
              ('target_confidence', 'conf'), ('accuracy', 'acc'),
              ('top1', 'top-1'), ('top5', 'top-5'), ('learning_rate', 'lr'),
              ('paws_nn_top1', 'paws-nn'))
# A log file's line at most this often (and one at each epoch end).
LOG_EVERY_SECONDS = 60


class _Bar:
    """What `ProgbarLogger` drives (`Progbar.update`): on a terminal
    (`live`) the line redrawn in place, fitted to its width (`_fit`), an
    epoch's final line wrapped instead; else whole lines, each readable
    alone."""

    def __init__(self, target, verbose, stream, *, live, epoch,
                 every_seconds, clock):
        self.target = target
        self.verbose = verbose
        self.stream = stream
        self.live = live
        self._epoch = epoch
        self._every_seconds = every_seconds
        self._clock = clock
        self._start = self._written = clock()
        self._drawn = 0  # Characters of the line being redrawn.

    def update(self, current, values=None, finalize=None):
        last = self.target is not None and current >= self.target
        finalize = last if finalize is None else finalize
        if not self.verbose or (self.verbose != 1 and not finalize):
            return
        now = self._clock()
        # A log's last step's line waits for the epoch end's (with PAWS-NN).
        if not (self.live or finalize) and (
                now - self._written < self._every_seconds or last):
            return
        self._written = now
        # step/target, the `BAR_VALUES` logged, then the time taken (at the
        # end) or the estimated time left.
        logged, seconds = dict(values or ()), now - self._start
        fields = [f'{current}/{self.target or "?"}']
        fields += [f'{label} {float(logged[key]):.4g}'
                   for key, label in BAR_VALUES if key in logged]
        if finalize:
            fields.append(f'{seconds:.0f} s')
        elif self.target and current:
            left = seconds / current * (self.target - current)
            fields.append(f'ETA {left:.0f} s')
        width = shutil.get_terminal_size().columns - 1
        if not self.live:
            fields[0] = f'step {fields[0]}'
            self.stream.write('  '.join(
                ([self._epoch] if self._epoch else []) + fields) + '\n')
        elif not finalize:
            # The ETA (when known) is last; it stays.
            eta = len(fields) > 1 and bool(self.target and current)
            line = _fit(fields, width, keep_last=eta)
            self.stream.write('\r' + line.ljust(self._drawn))
            self._drawn = len(line)
        else:
            lines = [fields[0]]
            for field in fields[1:]:
                if len(lines[-1]) + 2 + len(field) > width:
                    lines.append(field)
                else:
                    lines[-1] += '  ' + field
            start = '\r' + ' ' * self._drawn + '\r' if self._drawn else ''
            self.stream.write(start + '\n'.join(lines) + '\n')
            self._drawn = 0
        self.stream.flush()


def _fit(fields, width, keep_last):
    """`fields` joined on one line of at most `width` characters: the
    first (the step) and with `keep_last` the last always, then as many of
    the others as fit, in order (a value is shown whole or not at all)."""
    last = [fields[-1]] if keep_last else []
    line = fields[0]
    reserved = sum(2 + len(field) for field in last)
    for field in fields[1:len(fields) - len(last)]:
        if len(line) + 2 + len(field) + reserved <= width:
            line += '  ' + field
    return '  '.join([line] + last)[:width]


@gin.configurable
class ProgressBar(tf_keras.callbacks.ProgbarLogger):
    """Keras' progress bar, showing `BAR_VALUES` only: on a terminal one
    line redrawn every step, else a line at most every `log_every_seconds`
    and at each epoch end. Pass it in `fit`'s callbacks, after
    `evaluate.EpochEndEvaluation` (whose PAWS-NN it shows); `fit`'s
    `verbose` applies (0: silent, 1: within the epoch, 2: at its end).

    Args:
        log_every_seconds: the shortest time between two lines in a log
            (0: a line every step).
        stream: where to write; None: `sys.stdout` at the time of writing.
        clock: seconds of a monotonic clock.
    """

    def __init__(self, log_every_seconds=LOG_EVERY_SECONDS, stream=None,
                 clock=time.monotonic):
        super().__init__(count_mode='steps')
        self.log_every_seconds = checks.number(
            'ProgressBar.log_every_seconds', log_every_seconds, low=0)
        self._stream = stream
        self._clock = clock
        self._epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        # A terminal shows the epoch above its bar; each line of a log
        # names it.
        self._epoch = f'epoch {epoch + 1}/{self.epochs}'
        self._reset_progbar()
        self._maybe_init_progbar()
        if self.verbose and self.epochs > 1 and self.progbar.live:
            self.progbar.stream.write(f'Epoch {epoch + 1}/{self.epochs}\n')

    def _maybe_init_progbar(self):
        # tf_keras' ProgbarLogger builds its Progbar here; the rest of its
        # logic (targets, verbosity, epoch headers) is kept.
        if self.progbar is not None:
            return
        stream = self._stream or sys.stdout
        self.progbar = _Bar(
            self.target, self.verbose, stream,
            live=bool(getattr(stream, 'isatty', lambda: False)()),
            epoch=self._epoch, every_seconds=self.log_every_seconds,
            clock=self._clock)
