"""A crash while saving never leaves a checkpoint that restores half-written
state; the previous good checkpoint stays."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from paws_tf import checkpoints
from paws_tf.runner import train
from tests.helpers import debug_gin

REPO = pathlib.Path(__file__).resolve().parents[1]


def checkpoint_values(path):
    reader = tf.train.load_checkpoint(path)
    values = {}
    for name in reader.get_variable_to_shape_map():
        # Bookkeeping and the (constant) learning rate are not per-save.
        if name.startswith(('_CHECKPOINTABLE', 'save_counter')) or (
                'learning_rate' in name):
            continue
        value = np.asarray(reader.get_tensor(name))
        if np.issubdtype(value.dtype, np.floating) or 'iter' in name:
            values[name] = value
    return values


def _shard_bytes(temp_dir):
    """Bytes written so far to the data shards of an unfinished save, or
    None while its temporary directory does not exist."""
    try:
        return sum(entry.stat().st_size for entry in os.scandir(temp_dir)
                   if '.data-' in entry.name)
    except FileNotFoundError:
        return None


@pytest.mark.slow
@pytest.mark.parametrize('written', [0.0, 0.5])
def test_killed_during_a_save_the_latest_checkpoint_is_whole(tmp_path,
                                                            written):
    """SIGKILL inside the fourth save, once its temporary directory exists
    and once half of its 64 MB are written (watched on disk, so the kill
    lands inside the save); the kept checkpoint is the third, whole.

    Fails if RunState.save names ckpt-N in the `checkpoint` state file
    before writing it (tf.train.update_checkpoint_state first).
    """
    checkpoint_dir = tmp_path / 'checkpoints'
    proc = subprocess.Popen(
        [sys.executable, str(REPO / 'tests' / 'helpers' / 'save_loop.py'),
         str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        saved = 0
        while saved < 3:  # Wait until three saves are done...
            line = proc.stdout.readline()
            assert line, 'the saving process died'
            saved = int(line.split()[1])
        # ...then kill inside the fourth, the next the loop writes.
        temp_dir = checkpoint_dir / 'ckpt-4_temp'
        size = checkpoint_dir / 'ckpt-3.data-00000-of-00001'
        target = written * size.stat().st_size
        while True:
            done = _shard_bytes(temp_dir)
            if done is not None and done >= target:
                break
            assert proc.poll() is None, 'the saving process died'
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
    # The kill landed inside the fourth save: it left its temporary
    # directory, and the checkpoint state did not name it.
    assert temp_dir.is_dir()
    assert not (checkpoint_dir / 'ckpt-4.index').exists()
    path, step = checkpoints.latest(str(checkpoint_dir))
    assert step == 3
    values = checkpoint_values(path)
    assert len(values) >= 5  # Kernels, biases, momenta, iterations.
    for name, value in values.items():
        assert np.all(value == step), (path, name)  # One save, whole.


def test_leftovers_of_a_crashed_save_do_not_break_resuming(tmp_path):
    """Files a crash can leave mid-save (a data shard with no index, a
    temporary directory) are ignored: the run resumes from the last whole
    checkpoint and saves over them."""
    bindings = ['train.num_epochs = 1', 'train.checkpoint_every_steps = 8',
                'train.backup_every_steps = 4', 'train.eval_every_epochs = 0',
                'train.view_images = False', 'train.verbose = 0']
    with debug_gin.parsed(bindings):
        train.train(str(tmp_path), tf.distribute.get_strategy())
    checkpoint_dir = tmp_path / 'checkpoints'
    assert checkpoints.latest(str(checkpoint_dir))[1] == 16
    # What a crash while writing ckpt-24 can leave behind.
    (checkpoint_dir / 'ckpt-24.data-00000-of-00001').write_bytes(b'\0' * 99)
    (checkpoint_dir / 'ckpt-24_temp').mkdir()
    (checkpoint_dir / 'ckpt-24_temp' / 'part-00000-of-00001.index'
     ).write_bytes(b'partial')
    assert checkpoints.latest(str(checkpoint_dir))[1] == 16
    with debug_gin.parsed(bindings[1:] + ['train.num_epochs = 2']):
        model = train.train(str(tmp_path), tf.distribute.get_strategy())
    assert int(model.optimizer.iterations.numpy()) == 32
    path, step = checkpoints.latest(str(checkpoint_dir))
    assert step == 32
    tf.train.Checkpoint(model=model).read(path).expect_partial() \
        .assert_existing_objects_matched()
