"""The trainer: checkpoints, TensorBoard logs, finished runs, run.py checks."""

import glob
import os
import pathlib
import subprocess
import sys

import gin
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
import tf_keras

from paws_tf import checkpoints
from paws_tf import progress
from paws_tf import run_dir
from paws_tf.runner import callbacks
from paws_tf.runner import train
from tests.helpers import debug_gin
from tests.helpers import run_py

REPO = pathlib.Path(__file__).resolve().parents[1]
# debug.gin: 512 images / batch 32 = 16 steps per epoch.
TWO_EPOCHS = ['train.num_epochs = 2', 'train.verbose = 0',
              'train.checkpoint_every_steps = 8', 'train.keep_checkpoints = 2',
              'train.log_every_steps = 4']


@pytest.fixture
def debug_config():
    with debug_gin.parsed(TWO_EPOCHS):
        yield


def tags(log_dir, kind):
    found = set()
    for path in glob.glob(os.path.join(log_dir, 'events.out.tfevents.*')):
        acc = event_accumulator.EventAccumulator(
            path, size_guidance={event_accumulator.TENSORS: 0})
        acc.Reload()
        found |= set(acc.Tags()[kind])
    return found


@pytest.mark.slow
def test_train_checkpoints_logs_and_does_not_retrain(debug_config, tmp_path):
    model = train.train(str(tmp_path), tf.distribute.get_strategy())
    assert int(model.optimizer.iterations.numpy()) == 32

    # Checkpoints every 8 steps and at epoch ends, named by step, last 2 kept.
    steps = sorted(
        int(p.split('-')[-1].split('.')[0]) for p in
        glob.glob(str(tmp_path / 'checkpoints' / 'ckpt-*.index')))
    assert steps == [24, 32]
    assert checkpoints.latest(str(tmp_path / 'checkpoints'))[1] == 32
    # The backup is deleted once the run finished.
    assert not glob.glob(str(tmp_path / 'backup' / '**' / '*.index'),
                         recursive=True)
    # The labeled split is recorded: 16 images of each of 4 classes.
    assert len((tmp_path / 'labeled_split.txt').read_text().split('\n')) >= 64

    train_logs = str(tmp_path / 'tensorboard' / 'train')
    scalars = tags(train_logs, 'tensors')
    assert {'throughput/views_per_second', 'epoch/loss',
            'epoch/cross_entropy', 'epoch/me_max', 'optimizer/learning_rate',
            'lars/trust_ratio_mean', 'epoch/target_confidence',
            'loss/total'} <= scalars
    assert all('/' in tag for tag in scalars), scalars  # Grouped.
    assert {'views/global_views', 'views/local_views',
            'views/support_views'} <= scalars
    # gin's operative config: the bound values and the defaults of what
    # training called.
    # Whole lines: 'train.num_epochs = 2' would also match 20.
    operative = (tmp_path / 'operative_config.gin').read_text().splitlines()
    assert 'train.num_epochs = 2' in operative
    assert 'PAWSModel.tau = 0.1' in operative
    assert 'train.seed = 0' in operative  # A default.

    # Running it again restores the finished run instead of training.
    weights = [w.copy() for w in model.get_weights()]
    again = train.train(str(tmp_path), tf.distribute.get_strategy())
    assert int(again.optimizer.iterations.numpy()) == 32
    for want, got in zip(weights, again.get_weights()):
        np.testing.assert_array_equal(want, got)
    assert len(glob.glob(str(tmp_path / 'checkpoints' / '*.index'))) == 2


def test_the_operative_config_is_written_once_the_first_step_ran(
        clean_gin, tmp_path):
    gin.parse_config('ProgressBar.log_every_seconds = 5')
    run = run_dir.RunDir(tmp_path)
    path = pathlib.Path(run.operative_config)
    seen = []
    probe = tf_keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: seen.append(path.exists()),
        on_train_batch_end=lambda batch, logs: seen.append(path.exists()))
    model = tf_keras.Sequential([tf_keras.layers.Dense(1)])
    model.compile(loss='mse')
    model.fit(np.ones([8, 2]), np.ones([8, 1]), batch_size=4, epochs=1,
              verbose=0, callbacks=[
                  progress.ProgressBar(),
                  callbacks.OperativeConfig(run), probe])
    assert seen == [False, True, True]
    assert 'ProgressBar.log_every_seconds = 5' in path.read_text()


def test_backups_must_be_at_least_as_frequent_as_checkpoints(debug_config,
                                                             tmp_path):
    with gin.unlock_config():
        gin.bind_parameter('train.checkpoint_every_steps', 4)
    with pytest.raises(ValueError, match='back up at least as often'):
        train.train(str(tmp_path), tf.distribute.get_strategy())
    assert not (tmp_path / 'checkpoints').exists()


# run.py's arguments but --model_dir: debug.gin shrunk to 4 steps of one
# epoch, with no PAWS-NN at its end (what the caller checks is the run's
# records).
SHORT_RUN = ('--gin_file=gin_configs/debug.gin',
             '--gin_bindings=train.num_epochs = 1',
             '--gin_bindings=train/synthetic_source.num_images = 128',
             '--gin_bindings=train.eval_every_epochs = 0',
             '--gin_bindings=train.view_images = False',
             '--gin_bindings=train.verbose = 0')


def run_short(model_dir, *extra):
    """run.py on `SHORT_RUN` in a process of its own."""
    return subprocess.run(
        [sys.executable, str(REPO / 'run.py'), f'--model_dir={model_dir}',
         *SHORT_RUN, *extra],
        cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.long
def test_run_py_refuses_another_config_unless_overwrite(tmp_path, run_main,
                                                        capsys, caplog):
    """Fails if a resume refused for a binding of a removed parameter does
    not say to delete its line from the run's config.gin.

    A run trained, then overwritten, by run.py; the starts between (two
    refused, one that finds the run finished) by `cli.main` in this
    process, which reads the run's records as run.py does."""
    first = run_short(tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    assert (tmp_path / 'operative_config.gin').exists()
    assert 'train.num_epochs = 1' in (
        tmp_path / 'config.gin').read_text().splitlines()
    assert '--mode=train' in (tmp_path / 'flags.txt').read_text()

    args = [f'--model_dir={tmp_path}', *SHORT_RUN]
    code, changed = run_py.in_process(
        run_main, capsys, args + ['--gin_bindings=PAWSModel.tau = 0.2'])
    assert code == os.EX_CONFIG, changed[-2000:]
    assert 'different gin config' in changed
    assert '+ PAWSModel.tau = 0.2' in changed
    assert (tmp_path / 'checkpoints').exists()  # Nothing was lost.

    # The run's record binds a parameter that no longer exists: resuming
    # says to delete the line, and resumes once it is deleted.
    config = tmp_path / 'config.gin'
    recorded = config.read_text()
    config.write_text(recorded + "build_backbone.padding_impl = 'custom'\n")
    code, stale = run_py.in_process(run_main, capsys, args)
    assert code == os.EX_CONFIG, stale[-2000:]
    assert "  - build_backbone.padding_impl = 'custom'" in stale
    assert f'delete its line from {config})' in stale
    config.write_text(recorded)

    # Same config: the finished run is kept (absl's INFO records, which
    # run.py prints, kept for `caplog`).
    code, same = run_py.in_process(run_main, capsys,
                                   args + ['--verbosity=0'])
    assert code == 0, same[-2000:]
    assert 'holds a finished run' in caplog.text

    overwritten = run_short(tmp_path, '--gin_bindings=PAWSModel.tau = 0.2',
                            '--overwrite')
    assert overwritten.returncode == 0, overwritten.stderr[-2000:]
    assert 'PAWSModel.tau = 0.2' in (
        tmp_path / 'config.gin').read_text().splitlines()


def test_xla_with_several_cpu_replicas_is_refused(debug_config, tmp_path,
                                                  two_replicas):
    with gin.unlock_config():
        gin.bind_parameter('train.jit_compile', True)
    with pytest.raises(ValueError, match='jit_compile=True with several '
                       'replicas on CPU devices'):
        train.train(str(tmp_path), two_replicas)
    assert not (tmp_path / 'checkpoints').exists()
