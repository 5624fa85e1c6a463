"""Progress a person reads: one bar line per step with what a user watches
(loss, its two terms, target confidence, learning rate), PAWS-NN at the end
of an epoch."""

import shutil
import sys
import time

import tf_keras

# What the progress bar shows, with its labels: the values a user watches
# while training. The other logged values (trust ratios, NT-Xent, SuNCEt)
# go to TensorBoard and the epoch's log line (`callbacks.ProgressLog`) only,
# so that the bar stays on one terminal line.
BAR_VALUES = (('loss', 'loss'), ('cross_entropy', 'ce'), ('me_max', 'me-max'),
              ('target_confidence', 'conf'), ('learning_rate', 'lr'),
              ('paws_nn_top1', 'paws-nn'))


class _Bar:
    """What `ProgbarLogger` drives (`tf_keras.utils.Progbar`'s `update`):
    one line of `step/target` and the `BAR_VALUES`, cut to the terminal
    width while it is redrawn in place; the final line of an epoch wraps
    between values instead."""

    def __init__(self, target, verbose):
        self.target = target
        self.verbose = verbose
        self._start = time.monotonic()
        self._drawn = 0  # Characters of the line being redrawn.

    def update(self, current, values=None, finalize=None):
        if finalize is None:
            finalize = self.target is not None and current >= self.target
        if not self.verbose or (self.verbose != 1 and not finalize):
            return
        logged = dict(values or ())
        fields = [f'{current}/{self.target or "?"}']
        fields += [f'{label} {float(logged[key]):.4g}'
                   for key, label in BAR_VALUES if key in logged]
        seconds = time.monotonic() - self._start
        if finalize:
            fields.append(f'{seconds:.0f} s')
        elif self.target and current:
            fields.append(
                f'ETA {seconds / current * (self.target - current):.0f} s')
        width = shutil.get_terminal_size().columns - 1
        if not finalize:
            line = '  '.join(fields)[:width]
            sys.stdout.write('\r' + line.ljust(self._drawn))
            self._drawn = len(line)
        else:
            lines = [fields[0]]
            for field in fields[1:]:
                if len(lines[-1]) + 2 + len(field) > width:
                    lines.append(field)
                else:
                    lines[-1] += '  ' + field
            start = '\r' + ' ' * self._drawn + '\r' if self._drawn else ''
            sys.stdout.write(start + '\n'.join(lines) + '\n')
            self._drawn = 0
        sys.stdout.flush()


class ProgressBar(tf_keras.callbacks.ProgbarLogger):
    """Keras' progress bar, showing `BAR_VALUES` only (PAWS-NN at the end
    of an epoch when `callbacks.PawsNNEvaluation` runs before it) on one
    line.

    Pass it in `fit`'s callbacks, after `callbacks.PawsNNEvaluation`; `fit`
    then adds no bar of its own, and its `verbose` still applies (0: silent,
    1: a line redrawn every step, 2: one line per epoch).
    """

    def __init__(self):
        super().__init__(count_mode='steps')

    def _maybe_init_progbar(self):
        # tf_keras' ProgbarLogger builds its Progbar here; the rest of its
        # logic (targets, verbosity, epoch headers) is kept.
        if self.progbar is None:
            self.progbar = _Bar(self.target, self.verbose)
