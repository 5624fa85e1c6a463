"""What a run writes for TensorBoard, read back from its event files: one
`model_dir/tensorboard/` with a run per stage (pre-training, evaluation,
fine-tuning, the demo's supervised baseline), grouped tags, and per-step
points that are the step's values, not means since the epoch start."""

import json
import pathlib

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from paws_tf.demo import run_demo
from tests.helpers import run_py

STEPS_PER_EPOCH = 16  # debug.gin
EPOCHS = 2
DIAGNOSTICS_EVERY = 8
BINDINGS = (f'train.num_epochs = {EPOCHS}', 'train.log_every_steps = 1',
            f'PAWSModel.diagnostics_every = {DIAGNOSTICS_EVERY}',
            'train.eval_every_epochs = 1', 'train.backup_every_steps = 16',
            'train.verbose = 0', 'train_supervised.steps = 20')
TRAIN_TAGS = {
    'loss/total', 'loss/cross_entropy', 'loss/me_max',
    'paws/target_confidence', 'lars/learning_rate', 'lars/trust_ratio_mean',
    'lars/trust_ratio_min', 'lars/trust_ratio_max', 'diagnostics/nt_xent',
    'diagnostics/suncet', 'throughput/views_per_second',
    'throughput/seconds_per_step', 'throughput/epoch_views_per_second',
    'epoch/loss', 'epoch/cross_entropy', 'epoch/me_max',
    'epoch/target_confidence', 'views/global_views', 'views/local_views',
    'views/support_views'}


def tags(log_dir):
    """Every tag of the event files in `log_dir`."""
    found = set()
    for path in pathlib.Path(log_dir).glob('events.out.tfevents.*'):
        events = event_accumulator.EventAccumulator(str(path))
        events.Reload()
        found.update(events.Tags()['tensors'])
    return found


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp('run')
    proc = run_py.start(model_dir, mode='demo', base_bindings=BINDINGS)
    returncode, output = run_py.finish(proc, timeout=900)
    assert returncode == 0, output[-3000:]
    return model_dir


@pytest.mark.slow
@pytest.mark.long
def test_one_tensorboard_directory_with_a_run_per_stage(trained):
    """Fails if evaluate_nn writes its scalars to model_dir/eval instead of
    tensorboard/eval, fine-tuning its logs to model_dir/fine_tune, or a
    tag comes without its group (`batch_loss`)."""
    board = pathlib.Path(trained) / 'tensorboard'
    assert sorted(p.name for p in board.iterdir()) == [
        'eval', 'fine_tune', 'supervised', 'train']
    # tf_keras' epoch values only: its per-step values are running means.
    for stage, expected in (('fine_tune', {'epoch_loss'}),
                            ('supervised', {'epoch_loss', 'epoch_accuracy'})):
        stage_tags = tags(board / stage / 'train')
        assert expected <= stage_tags, stage_tags
        assert not any(tag.startswith('batch_') for tag in stage_tags)
    assert not list((pathlib.Path(trained) / 'fine_tune').rglob('events.*'))
    assert tags(board / 'train') == TRAIN_TAGS
    # debug.gin has 4 classes: no top-5.
    assert tags(board / 'eval') == {'paws_nn/top1', 'paws_nn_test/top1'}
    assert not list((pathlib.Path(trained) / 'eval').glob('events.*'))
    last = EPOCHS * STEPS_PER_EPOCH
    steps, top1 = run_demo.read_scalars(board / 'eval', 'paws_nn_test/top1')
    results = json.loads((pathlib.Path(trained) / 'eval' /
                          'paws_nn.json').read_text())
    assert list(steps) == [last]
    assert top1[0] == pytest.approx(results['top1'])
    steps, _ = run_demo.read_scalars(board / 'eval', 'paws_nn/top1')
    assert list(steps) == [STEPS_PER_EPOCH * (e + 1) for e in range(EPOCHS)]
    # The diagnostics at the steps that compute them: the 1st, 9th, ...
    steps, _ = run_demo.read_scalars(board / 'train', 'diagnostics/nt_xent')
    assert list(steps) == list(range(1, last + 1, DIAGNOSTICS_EVERY))


@pytest.mark.slow
@pytest.mark.long
def test_a_step_point_is_that_steps_loss_not_the_running_mean(trained):
    """The points of `loss/total` over an epoch average to the epoch's mean
    (`epoch/loss`, Keras' mean of the steps' losses); running means since
    the epoch start would not: their average weighs the first steps most.

    Fails if the per-step points are the running means of `fit`'s logs
    (ProgressLog writing `logs['loss']` instead of `logs['step_loss']`)."""
    train = pathlib.Path(trained) / 'tensorboard' / 'train'
    steps, losses = run_demo.read_scalars(train, 'loss/total')
    last = EPOCHS * STEPS_PER_EPOCH
    assert list(steps) == list(range(1, last + 1))
    ends, epoch_means = run_demo.read_scalars(train, 'epoch/loss')
    assert list(ends) == [STEPS_PER_EPOCH * (e + 1) for e in range(EPOCHS)]
    by_epoch = losses.reshape(EPOCHS, STEPS_PER_EPOCH)
    np.testing.assert_allclose(by_epoch.mean(axis=1), epoch_means,
                               rtol=1e-5)
    running = np.cumsum(by_epoch, axis=1) / np.arange(
        1, STEPS_PER_EPOCH + 1)
    # Distinguishable from running means: at the second step of an epoch
    # the running mean is the mean of the first two steps.
    assert np.all(np.abs(running[:, 1] - by_epoch[:, 1]) > 1e-6)
    assert np.all(np.abs(running.mean(axis=1) - epoch_means) > 1e-6)
