"""Faults survived: a killed run resumes to the uninterrupted result; a
non-finite loss stops before anything bad is saved."""

import os
import re
import signal

import gin
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
import tensorflow as tf
import tf_keras

from paws_tf import checkpoints
from paws_tf.demo import run_demo
from paws_tf import run_dir
from paws_tf.runner import train
from tests.helpers import debug_gin
from tests.helpers import once
from tests.helpers import run_py

# Besides run_py.BINDINGS (backups every 4 steps, checkpoints every 8): 12
# epochs of 16 steps, determinism on. Without `determinism.enable`'s Grappler
# setting, two processes of this run differed after 9 to 95 steps in one
# pair in two; 48 steps hid it.
BINDINGS = ['train.num_epochs = 12', 'train.deterministic_ops = True']
TOTAL_STEPS = 192


def start_run(model_dir):
    return run_py.start(model_dir, BINDINGS)


def final_state(model_dir, total_steps=TOTAL_STEPS):
    """Every variable of the run's last checkpoint (of step `total_steps`),
    by name."""
    path, step = checkpoints.latest(
        os.path.join(model_dir, 'checkpoints'))
    assert step == total_steps
    reader = tf.train.load_checkpoint(path)
    # All of the model and optimizer; not the count of saves this process
    # made (bookkeeping that differs after a restart).
    return {name: reader.get_tensor(name)
            for name in reader.get_variable_to_shape_map()
            if not name.startswith(('_CHECKPOINTABLE_OBJECT_GRAPH',
                                    'save_counter'))}


def run_uninterrupted(model_dir):
    code, output = run_py.finish(start_run(model_dir))
    assert code == 0, output[-3000:]


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
    model_dir, _ = once.made(tmp_path_factory, 'preemption_uninterrupted',
                             run_uninterrupted)
    return final_state(model_dir)


def assert_bit_identical(state, reference):
    """Every variable equal, bit for bit; else the ones that differ, with
    by how much."""
    assert state.keys() == reference.keys()
    differing = {name: np.max(np.abs(np.subtract(state[name], value,
                                                 dtype=np.float64)))
                 for name, value in reference.items()
                 if not np.array_equal(state[name], value)}
    assert not differing, (f'{len(differing)} of {len(reference)} variables '
                           f'differ: {differing}')


@pytest.mark.slow
@pytest.mark.long
def test_two_runs_of_one_command_are_bit_identical(tmp_path, uninterrupted):
    run_uninterrupted(tmp_path)
    assert_bit_identical(final_state(tmp_path), uninterrupted)


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGKILL],
                         ids=['SIGTERM', 'SIGKILL'])
def test_killed_run_resumes_to_the_uninterrupted_weights(tmp_path, sig,
                                                         uninterrupted):
    proc = start_run(tmp_path)
    # Mid-epoch: a backup of step 100 or later lies inside epoch 7 (96..111).
    run_py.wait_for_backup(tmp_path, proc, 100)
    proc.send_signal(sig)
    code, output = run_py.finish(proc)
    stopped_at = run_py.backup_step(tmp_path)
    lock = run_dir.RunDir(tmp_path).lock
    if sig == signal.SIGTERM:
        # Backed up at the end of the step running when the signal came.
        assert code == 143, output[-3000:]
        assert f'after step {stopped_at} of {TOTAL_STEPS}' in output
        assert 'Final weights fingerprint' not in output  # Not final.
        assert not os.path.exists(lock)  # Released.
    else:
        assert code == -signal.SIGKILL
        assert os.path.exists(lock)  # Left behind...
    assert 100 <= stopped_at < TOTAL_STEPS

    code, output = run_py.finish(start_run(tmp_path))
    assert code == 0, output[-3000:]
    epoch, batch = divmod(stopped_at, 16)
    resumed = (f'resumed at step {stopped_at} of {TOTAL_STEPS} (epoch '
               f'{epoch + 1} of 12, step {batch} of it) from the backup '
               f'{tmp_path}/backup/chief/ckpt-')
    assert f'Run {resumed}' in output
    assert f'Training steps {stopped_at}..{TOTAL_STEPS}' in output
    if sig == signal.SIGKILL:  # ...and taken over, its process being gone.
        assert f'process {proc.pid} is not running on this host' in output
    # The run's history: one line per start, stop and end, with times.
    history = (tmp_path / 'run_history.txt').read_text().splitlines()
    events = [line.split(': ', 1)[1] for line in history]
    stopped = ([f'stopped by SIGTERM at step {stopped_at}, backed up in '
                f'{tmp_path}/backup'] if sig == signal.SIGTERM else [])
    assert events[0] == f'started a new run of {TOTAL_STEPS} steps'
    assert events[1:-2] == stopped
    assert events[-2].startswith(resumed)
    assert events[-1].startswith(f'finished at step {TOTAL_STEPS}; weights '
                                 'SHA-256 ')
    assert all(line[:2] == '20' and line[19] == 'Z' for line in history)
    assert_bit_identical(final_state(tmp_path), uninterrupted)


# debug.gin's run with a ViT, GELU heads and AdamW with its cosine weight
# decay (`debug_gin.VIT`): 3 epochs of 16 steps, determinism on, the first
# epoch a warm-up.
VIT_BINDINGS = ['train.num_epochs = 3', 'train.deterministic_ops = True',
                'WarmupCosineDecay.warmup_fraction = None',
                'WarmupCosineDecay.warmup_epochs = 1']
VIT_STEPS = 48


def vit_runs(root):
    """The ViT run uninterrupted, and side by side the same run stopped by
    SIGTERM in its second epoch and run again, under `root`: `(stopped_at,
    outputs of the uninterrupted run and of the resumed one)`."""
    config = debug_gin.write_vit_config(root / 'vit.gin')
    runs = {name: run_py.start(root / name, VIT_BINDINGS, gin_file=config)
            for name in ('uninterrupted', 'interrupted')}
    run_py.wait_for_backup(root / 'interrupted', runs['interrupted'], 20)
    runs['interrupted'].send_signal(signal.SIGTERM)
    code, output = run_py.finish(runs['interrupted'])
    assert code == 143, output[-3000:]
    stopped_at = run_py.backup_step(root / 'interrupted')
    code, resumed = run_py.finish(run_py.start(
        root / 'interrupted', VIT_BINDINGS, gin_file=config))
    assert code == 0, resumed[-3000:]
    code, uninterrupted = run_py.finish(runs['uninterrupted'])
    assert code == 0, uninterrupted[-3000:]
    return stopped_at, {'uninterrupted': uninterrupted, 'resumed': resumed}


def _check_resumed_vit_run(root, stopped_at, outputs):
    """Stopped in its second epoch and run again, the ViT run ends with
    every variable of the uninterrupted run, bit for bit.

    Fails if the resumed epoch reads its data from the epoch's first step
    (tried in `callbacks.fit_from`: 88 of 90 variables differ), or if the
    backup restores AdamW's step count without its moments (`restore`
    refuses the backup).
    """
    assert 20 <= stopped_at < 32  # In the second epoch.
    assert (f'resumed at step {stopped_at} of {VIT_STEPS} (epoch 2 of 3'
            in outputs['resumed'])
    assert_bit_identical(final_state(root / 'interrupted', VIT_STEPS),
                         final_state(root / 'uninterrupted', VIT_STEPS))


def _check_adamw_logs(root, outputs):
    """The uninterrupted run logs to TensorBoard, every 4 steps, the
    learning rate and the weight decay of that step's update (closed
    forms: 1e-4 -> 1e-3 over the first epoch, then a cosine to 1e-5;
    DINO's cosine 0.04 -> 0.4 over the 48 updates), and no LARS trust
    ratios; nor does its epoch log line.

    Fails if the tags or the log line are LARS's whatever the optimizer
    (`lars/learning_rate`, trust ratios of 0).
    """
    log_dir = root / 'uninterrupted' / 'tensorboard' / 'train'
    steps, learning_rates = run_demo.read_scalars(log_dir,
                                                  'optimizer/learning_rate')
    np.testing.assert_array_equal(steps, np.arange(4, VIT_STEPS + 1, 4))
    updates = steps - 1  # Before each logged step's update.
    cosine = 1e-5 + (1e-3 - 1e-5) * 0.5 * (
        1 + np.cos(np.pi * (updates - 16) / 32))
    np.testing.assert_allclose(
        learning_rates,
        np.where(updates < 16, 1e-4 + 9e-4 * updates / 16, cosine),
        rtol=1e-5)
    decay_steps, decays = run_demo.read_scalars(log_dir, 'adamw/weight_decay')
    np.testing.assert_array_equal(decay_steps, steps)
    np.testing.assert_allclose(decays, 0.4 + 0.5 * (0.04 - 0.4) * (
        1 + np.cos(np.pi * updates / VIT_STEPS)), rtol=1e-5)
    events = event_accumulator.EventAccumulator(str(next(
        log_dir.glob('events.out.tfevents.*'))))
    events.Reload()
    assert not [tag for tag in events.Tags()['tensors']
                if tag.startswith('lars/')]
    epoch_lines = re.findall(r'epoch \d/3: .*', outputs['uninterrupted'])
    assert len(epoch_lines) == 3
    assert all('weight_decay=' in line and 'trust_ratio' not in line
               for line in epoch_lines)


@pytest.mark.slow
@pytest.mark.long
def test_a_killed_adamw_vit_run_resumes_bit_identical_and_logs_adamw(
        tmp_path):
    """The ViT runs (`vit_runs`), one set for both checks, each failing
    under its own bug: the resumed run's weights
    (`_check_resumed_vit_run`) and AdamW's logged rate and weight decay
    (`_check_adamw_logs`). One test, so that parallel test processes never
    run them twice (as two tests of a module fixture, both processes of one
    `make test-long` built it: 74 and 47 s)."""
    stopped_at, outputs = vit_runs(tmp_path)
    _check_resumed_vit_run(tmp_path, stopped_at, outputs)
    _check_adamw_logs(tmp_path, outputs)


class ExplodingSchedule(tf_keras.optimizers.schedules.LearningRateSchedule):
    """Learning rate 0.1, then 1e30 from step `explode_at` on."""

    def __init__(self, steps_per_epoch, num_epochs, explode_at=12):
        super().__init__()
        del steps_per_epoch, num_epochs  # Unused.
        self._explode_at = explode_at

    def __call__(self, step):
        return tf.where(step < self._explode_at, 0.1, 1e30)

    def get_config(self):
        return {'explode_at': self._explode_at}


@pytest.mark.slow
def test_non_finite_training_stops_before_saving_it(tmp_path):
    """Fails if StopOnNonFiniteLoss reports the batch index as the step
    (`at step 13`, which a match of 'at step 1' let through)."""
    with debug_gin.parsed(
            ['train.num_epochs = 2', 'train.backup_every_steps = 4',
             'train.checkpoint_every_steps = 8', 'train.eval_every_epochs = 0',
             'train.view_images = False', 'train.verbose = 0']):
        with gin.unlock_config():
            gin.bind_parameter('train.schedule_cls', ExplodingSchedule)
        with pytest.raises(FloatingPointError) as error:
            train.train(str(tmp_path), tf.distribute.get_strategy())
    message = str(error.value)
    # The update of step 13 (schedule step 12, learning rate 1e30) breaks
    # the weights; step 14's loss, batch 13 of the first 16-step epoch, is
    # the first computed with them.
    assert re.match(r'The loss became (nan|-?inf) \(batch 13 of this '
                    r'epoch\) at step 14\. ', message), message
    assert f'{tmp_path}/checkpoints/ckpt-8 (step 8). ' in message
    # Nothing non-finite was written: checkpoints and the backup are finite
    # and none is newer than the breakdown.
    for directory in ('checkpoints', os.path.join('backup',
                                                         'chief')):
        path = tf.train.latest_checkpoint(str(tmp_path / directory))
        reader = tf.train.load_checkpoint(path)
        for name in reader.get_variable_to_shape_map():
            value = reader.get_tensor(name)
            if np.issubdtype(np.asarray(value).dtype, np.floating):
                assert np.all(np.isfinite(value)), (path, name)
    assert checkpoints.latest(
        str(tmp_path / 'checkpoints'))[1] == 8
    assert checkpoints.backup_step(run_dir.RunDir(tmp_path)) <= 12
