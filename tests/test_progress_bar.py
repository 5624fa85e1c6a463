"""The progress bar shows what a user watches, on one 80-column line."""

import re

from absl import logging
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from paws_tf.runner import callbacks
from paws_tf.runner import progress
from paws_tf.runner import train
from tests.helpers import debug_gin

SHOWN = ('loss', 'ce', 'me-max', 'conf', 'lr')
HIDDEN = ('trust', 'nt_xent', 'suncet', 'cross_entropy')


def _lines(text):
    """Every line as a terminal shows it: redraws start at a carriage
    return, and the clearing spaces at the end do not count."""
    return [part.rstrip() for line in text.split('\n')
            for part in line.split('\r') if part.strip()]


def _train_one_epoch(tmp_path, verbose):
    with debug_gin.parsed(['train.num_epochs = 1',
                           f'train.verbose = {verbose}',
                           'train.checkpoint_every_steps = 0',
                           'train.view_images = False',
                           'train.eval_max_queries = 32']):
        train.train(str(tmp_path), tf.distribute.get_strategy())


@pytest.mark.slow
def test_a_debug_run_shows_the_watched_values_in_80_columns(
        tmp_path, capsys, monkeypatch):
    monkeypatch.setenv('COLUMNS', '80')
    _train_one_epoch(tmp_path, verbose=1)
    lines = _lines(capsys.readouterr().out)
    steps = [line for line in lines if re.match(r'\d+/16 ', line)]
    assert len(steps) >= 16  # One redraw per step of the epoch.
    assert all(len(line) <= 79 for line in lines), max(lines, key=len)
    for line in steps:
        assert not any(word in line for word in HIDDEN), line
    # A step line holds every watched value; the epoch's last one, which
    # PAWS-NN joins, wraps between values instead of being cut.
    assert all(f'{label} ' in steps[0] for label in SHOWN), steps[0]
    end = '  '.join(lines[lines.index(steps[-1]):])
    assert re.search(r'paws-nn (0(\.\d+)?|1)\b', end), end
    assert all(f'{label} ' in end for label in SHOWN), end


def test_values_are_those_logged(capsys, monkeypatch):
    monkeypatch.setenv('COLUMNS', '80')
    bar = progress.ProgressBar()
    bar.set_params({'verbose': 1, 'epochs': 1, 'steps': 3})
    bar.on_train_begin()
    bar.on_epoch_begin(0)
    logs = {'loss': 0.25, 'cross_entropy': 1.5, 'me_max': -1.25,
            'target_confidence': 0.75, 'learning_rate': 5e-4,
            'trust_ratio_mean': 0.5, 'nt_xent': 4.0, 'suncet': 1.0}
    bar.on_train_batch_end(0, logs)
    first = _lines(capsys.readouterr().out)[-1]
    assert first.startswith('1/3  loss 0.25  ce 1.5  me-max -1.25  conf 0.75'
                            '  lr 0.0005  ETA '), first
    bar.on_epoch_end(0, dict(logs, paws_nn_top1=0.875))
    end = _lines(capsys.readouterr().out)
    assert end[0].startswith('3/3  loss 0.25  ce 1.5'), end
    assert 'paws-nn 0.875' in '  '.join(end)
    assert all(len(line) <= 79 for line in end)


@pytest.mark.parametrize('verbose', [0, 2])
def test_verbosity(verbose, capsys):
    model = tf_keras.Sequential([tf_keras.layers.Dense(1)])
    model.compile(loss='mse')
    model.fit(np.ones([8, 2]), np.ones([8, 1]), batch_size=4, epochs=2,
              verbose=verbose, callbacks=[progress.ProgressBar()])
    lines = _lines(capsys.readouterr().out)
    if verbose == 0:
        assert not lines
    else:  # Per epoch: the header and the final line.
        assert [line.split()[0] for line in lines] == [
            'Epoch', '2/2', 'Epoch', '2/2']


def test_the_epoch_log_line_keeps_every_value(tmp_path, caplog):
    model = tf_keras.Sequential([tf_keras.layers.Dense(1)])
    model.compile(optimizer='sgd', loss='mse')
    log = callbacks.ProgressLog(str(tmp_path), views_per_step=10,
                                every_steps=0, num_epochs=3, is_chief=True)
    log.set_model(model)
    log.on_train_begin()
    log.on_epoch_begin(0)
    log.on_train_batch_end(0)
    logs = {'loss': 0.25, 'cross_entropy': 1.5, 'me_max': -1.25,
            'target_confidence': 0.75, 'learning_rate': 5e-4,
            'trust_ratio_mean': 0.5, 'trust_ratio_min': 0.125,
            'trust_ratio_max': 2.0, 'nt_xent': 4.0, 'suncet': 1.0,
            'paws_nn_top1': 0.875}
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
    line = caplog.messages[-1]
    assert line.startswith('epoch 1/3: ' + ' '.join(
        f'{key}={value:.4g}' for key, value in logs.items()) + ' | '), line
