"""Progress shows what a user watches: on a terminal one line redrawn,
fitted to its width, in a log whole lines at most every interval and at
epoch ends."""

import io
import re

from absl import logging
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from paws_tf.runner import callbacks
from paws_tf import progress
from paws_tf.runner import train
from tests.helpers import debug_gin
from tests.helpers import tiny_model

SHOWN = ('loss', 'ce', 'me-max', 'conf', 'lr')
HIDDEN = ('trust', 'nt_xent', 'suncet', 'cross_entropy')


class _Terminal(io.StringIO):
    """A stream that says it is a terminal, as `sys.stdout` on one does."""

    def isatty(self):
        return True


class _Clock:
    """A clock the test moves: `ProgressBar`'s seconds."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


LOGS = {'loss': 0.25, 'cross_entropy': 1.5, 'me_max': -1.25,
        'target_confidence': 0.75, 'learning_rate': 5e-4,
        'trust_ratio_mean': 0.5, 'nt_xent': 4.0, 'suncet': 1.0}
WATCHED = 'loss 0.25  ce 1.5  me-max -1.25  conf 0.75  lr 0.0005'


def _lines(text):
    """Every line as a terminal shows it: redraws start at a carriage
    return, and the clearing spaces at the end do not count."""
    return [part.rstrip() for line in text.split('\n')
            for part in line.split('\r') if part.strip()]


@pytest.mark.slow
def test_a_debug_run_logs_lines_with_the_watched_values(tmp_path, capsys):
    # Output captured, not a terminal: whole lines, here one per step.
    with debug_gin.parsed(['train.num_epochs = 1', 'train.verbose = 1',
                           'train.checkpoint_every_steps = 0',
                           'train.view_images = False',
                           'train.eval_max_queries = 32',
                           'ProgressBar.log_every_seconds = 0']):
        train.train(str(tmp_path), tf.distribute.get_strategy())
    out = capsys.readouterr().out
    assert '\r' not in out
    steps = [line for line in out.splitlines()
             if line.startswith('epoch 1/1  step ')]
    assert [line.split()[3] for line in steps] == [
        f'{step}/16' for step in range(1, 17)]
    for line in steps:
        assert not any(word in line for word in HIDDEN), line
        assert all(f'  {label} ' in line for label in SHOWN), line
    assert all(re.search(r'  ETA \d+ s$', line) for line in steps[:-1])
    # The epoch's last line: PAWS-NN joins, and the time it took.
    assert re.search(r'  paws-nn (0(\.\d+)?|1)  \d+ s$', steps[-1]), steps[-1]


def test_a_terminal_gets_one_line_redrawn_in_80_columns(monkeypatch):
    monkeypatch.setenv('COLUMNS', '80')
    terminal = _Terminal()
    bar = progress.ProgressBar(stream=terminal)
    bar.set_params({'verbose': 1, 'epochs': 2, 'steps': 3})
    bar.on_train_begin()
    bar.on_epoch_begin(0)
    bar.on_train_batch_end(0, LOGS)
    bar.on_train_batch_end(1, LOGS)
    drawn = terminal.getvalue()
    assert drawn.startswith('Epoch 1/2\n\r1/3  ' + WATCHED + '  ETA ')
    assert drawn.count('\r') == 2 and drawn.count('\n') == 1
    assert _lines(drawn)[-1].startswith('2/3  ' + WATCHED), drawn
    assert all(len(line) <= 79 for line in _lines(drawn))
    bar.on_epoch_end(0, dict(LOGS, paws_nn_top1=0.875))
    end = _lines(terminal.getvalue()[len(drawn):])
    # The final line wraps between values instead of being cut.
    assert end[0].startswith('3/3  loss 0.25  ce 1.5'), end
    assert 'paws-nn 0.875' in '  '.join(end)
    assert all(len(line) <= 79 for line in end)
    assert not any(word in '  '.join(end) for word in HIDDEN)


def test_a_log_gets_a_line_every_interval_and_at_the_epoch_end():
    log, clock = io.StringIO(), _Clock()
    bar = progress.ProgressBar(log_every_seconds=30, stream=log, clock=clock)
    bar.set_params({'verbose': 1, 'epochs': 2, 'steps': 10})
    bar.on_train_begin()
    for epoch in range(2):
        bar.on_epoch_begin(epoch)
        for step in range(10):
            clock.now += 10  # Ten seconds a step.
            bar.on_train_batch_end(step, LOGS)
        bar.on_epoch_end(epoch, dict(LOGS, paws_nn_top1=0.875))
    # Each epoch starts its clock at 100 s per epoch; a line once 30 s have
    # passed since the last: after steps 3, 6 and 9 (the ETA is the time
    # per step times the steps left), then the epoch's end (its seconds).
    expected = []
    for epoch in (1, 2):
        expected += [f'epoch {epoch}/2  step {step}/10  {WATCHED}  ETA '
                     f'{10 * (10 - step)} s' for step in (3, 6, 9)]
        expected.append(f'epoch {epoch}/2  step 10/10  {WATCHED}  '
                        'paws-nn 0.875  100 s')
    assert log.getvalue() == ''.join(line + '\n' for line in expected)


def test_log_interval_is_checked():
    with pytest.raises(ValueError, match='ProgressBar.log_every_seconds'):
        progress.ProgressBar(log_every_seconds=-1)


@pytest.mark.parametrize('verbose', [0, 2])
def test_verbosity(verbose, capsys):
    model = tf_keras.Sequential([tf_keras.layers.Dense(1)])
    model.compile(loss='mse')
    model.fit(np.ones([8, 2]), np.ones([8, 1]), batch_size=4, epochs=2,
              verbose=verbose, callbacks=[progress.ProgressBar()])
    out = capsys.readouterr().out
    if verbose == 0:
        assert not out
    else:  # One line per epoch, written to sys.stdout when fit runs.
        assert '\r' not in out
        assert [line.split()[:4] for line in out.splitlines()] == [
            ['epoch', '1/2', 'step', '2/2'], ['epoch', '2/2', 'step', '2/2']]


def _epoch_line(model, logs, num_epochs, tmp_path, caplog):
    """The line `callbacks.ProgressLog` logs at the end of a first epoch of
    `num_epochs` whose values are `logs`."""
    log = callbacks.ProgressLog(str(tmp_path), views_per_step=10,
                                every_steps=0, num_epochs=num_epochs,
                                is_chief=True)
    log.set_model(model)
    log.on_train_begin()
    log.on_epoch_begin(0)
    log.on_train_batch_end(0)
    # caplog's handler on absl's own logger, at INFO: what an earlier test
    # in this process did to absl's verbosity or propagation must not hide
    # the line.
    absl_logger = logging.get_absl_logger()
    absl_logger.addHandler(caplog.handler)
    try:
        with caplog.at_level('INFO', logger='absl'):
            log.on_epoch_end(0, logs)
    finally:
        absl_logger.removeHandler(caplog.handler)
    return caplog.messages[-1]


def test_the_epoch_log_line_keeps_every_value(tmp_path, caplog):
    model = tf_keras.Sequential([tf_keras.layers.Dense(1)])
    model.compile(optimizer='sgd', loss='mse')
    logs = {'loss': 0.25, 'cross_entropy': 1.5, 'me_max': -1.25,
            'target_confidence': 0.75, 'learning_rate': 5e-4,
            'trust_ratio_mean': 0.5, 'trust_ratio_min': 0.125,
            'trust_ratio_max': 2.0, 'nt_xent': 4.0, 'suncet': 1.0,
            'paws_nn_top1': 0.875}
    line = _epoch_line(model, logs, 3, tmp_path, caplog)
    assert line.startswith('epoch 1/3: ' + ' '.join(
        f'{key}={value:.4g}' for key, value in logs.items()) + ' | '), line


@pytest.mark.parametrize('every', [0, 4])
def test_diagnostics_not_computed_in_this_process_are_not_shown(tmp_path,
                                                                 caplog,
                                                                 every):
    """A run resumed at step 5 with `diagnostics_every` 4 has not computed
    NT-Xent and SuNCEt yet (next at step index 8): its step reports NaN and
    its epoch log line leaves them out; with `diagnostics_every` 0 the step
    does not report them. Fails if they start at 0 (tried: the line of a
    resumed run read `nt_xent=0 suncet=0`)."""
    model = tiny_model.make(diagnostics_every=every)
    tiny_model.compile_and_build(model)
    model.optimizer.iterations.assign(5)
    logs = model.train_step(tiny_model.random_step(
        np.random.default_rng(0), 2, 2, 2, 1, 0))
    logs = {key: float(value) for key, value in logs.items()}
    if every:
        assert np.isnan(logs['nt_xent']) and np.isnan(logs['suncet'])
    else:
        assert 'nt_xent' not in logs and 'suncet' not in logs
    line = _epoch_line(model, logs, 1, tmp_path, caplog)
    assert line.startswith('epoch 1/1: loss='), line
    assert 'nt_xent' not in line and 'suncet' not in line, line


def test_a_narrow_terminal_gets_whole_values_and_the_eta(monkeypatch):
    """In 48 columns the redrawn line keeps the step, the ETA and the
    values that fit before it, each whole, in order. Fails if the line is
    cut at the width (tried: `conf 0.7`, and no ETA)."""
    monkeypatch.setenv('COLUMNS', '48')
    terminal = _Terminal()
    bar = progress.ProgressBar(stream=terminal, clock=_Clock())
    bar.set_params({'verbose': 1, 'epochs': 1, 'steps': 3})
    bar.on_train_begin()
    bar.on_epoch_begin(0)
    bar.on_train_batch_end(0, LOGS)
    line, = _lines(terminal.getvalue())
    # 47 characters at most: the step (3), loss (2 + 9), ce (2 + 6),
    # me-max (2 + 12) and the ETA (2 + 7) take 45; conf would make 56.
    assert line == '1/3  loss 0.25  ce 1.5  me-max -1.25  ETA 0 s', line
