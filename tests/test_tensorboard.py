"""What a run writes for TensorBoard, read back from its event files: one
`model_dir/tensorboard/` with a run per stage (pre-training, evaluation,
fine-tuning, the demo's supervised baseline), grouped tags, and per-step
points that are the step's values, not means since the epoch start."""

import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

from paws_tf.demo import run_demo
from paws_tf.evaluation import pictures
from tests.helpers import run_py
from tests.helpers import tensorboard_server

STEPS_PER_EPOCH = run_py.DEMO_STEPS_PER_EPOCH
EPOCHS = run_py.DEMO_EPOCHS
DIAGNOSTICS_EVERY = run_py.DEMO_DIAGNOSTICS_EVERY
TRAIN_TAGS = {
    'loss/total', 'loss/cross_entropy', 'loss/me_max',
    'paws/target_confidence', 'optimizer/learning_rate',
    'lars/trust_ratio_mean', 'lars/trust_ratio_min', 'lars/trust_ratio_max',
    'diagnostics/nt_xent',
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
    return run_py.demo(tmp_path_factory)[0]


@pytest.mark.slow
@pytest.mark.long
def test_one_tensorboard_directory_with_a_run_per_stage(trained):
    """Fails if evaluate_nn writes its scalars to model_dir/eval instead of
    tensorboard/eval, fine-tuning its logs to model_dir/fine_tune, a tag
    comes without its group (`batch_loss`), or the baseline trains in one
    epoch (its `epoch_accuracy` one dot)."""
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
    # The baseline's 20 steps in 10 epochs: a curve, not one dot.
    steps, _ = run_demo.read_scalars(board / 'supervised' / 'train',
                                     'epoch_accuracy')
    assert list(steps) == list(range(10))
    assert tags(board / 'train') == TRAIN_TAGS
    # debug.gin has 4 classes: no top-5.
    assert tags(board / 'eval') == {
        'paws_nn/top1', 'paws_nn_test/top1',
        'paws_nn_pictures/confusion_and_neighbours'}
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


@pytest.mark.slow
@pytest.mark.long
def test_tensorboard_serves_paws_nn_projector_and_pictures(trained):
    """The real TensorBoard server, over its HTTP endpoints: the eval run's
    projector has a row per labeled and test image, whose metadata
    predictions are PAWS-NN's rule computed here in NumPy on the vectors
    the server returns; the confusion matrix's diagonal is the top-1.

    Fails if the projector is written outside the eval run's directory,
    the rows of the tensor and of the metadata differ in order, the
    confusion matrix's rows are not the true classes, or `paws_nn.png` is
    not the image TensorBoard shows (a second rendering of the figure)."""
    results = json.loads((pathlib.Path(trained) / 'eval' /
                          'paws_nn.json').read_text())
    matrix = np.array(results['confusion_matrix'])
    assert matrix.sum() == results['num_queries']
    assert np.trace(matrix) / matrix.sum() == pytest.approx(results['top1'])
    np.testing.assert_allclose(np.diag(matrix) / matrix.sum(axis=1),
                               results['per_class_accuracy'])
    assert (pathlib.Path(trained) / 'eval' / 'paws_nn.png').stat().st_size
    name = 'paws_nn_embeddings'
    with tensorboard_server.serve(pathlib.Path(trained) /
                                  'tensorboard') as get:
        assert 'eval' in get.json('/data/plugin/projector/runs')
        embedding, = get.json(
            '/data/plugin/projector/info?run=eval')['embeddings']
        rows, dims = embedding['tensorShape']
        vectors = np.frombuffer(get(
            f'/data/plugin/projector/tensor?run=eval&name={name}'),
            np.float32).reshape(rows, dims)
        metadata = [line.split('\t') for line in get(
            f'/data/plugin/projector/metadata?run=eval&name={name}'
        ).decode().splitlines()]
        sprite = tf.io.decode_png(get(
            f'/data/plugin/projector/sprite_image?run=eval&name={name}'))
        images = get.json('/data/plugin/images/tags')['eval']
        shown, = get.json('/data/plugin/images/images?run=eval&tag='
                          'paws_nn_pictures%2Fconfusion_and_neighbours')
        served = tf.io.decode_png(get(
            '/data/plugin/images/individualImage?' + shown['query']))
    assert metadata[0] == list(pictures.METADATA_COLUMNS)
    label, predicted, confidence, split = map(np.array, zip(*metadata[1:]))
    labeled, test = split == 'labeled', split == 'test'
    assert labeled.sum() == results['num_support']  # debug.gin: < 1000.
    assert test.sum() == min(1000, results['num_queries'])
    # PAWS-NN by hand: the test rows against every labeled row.
    names = sorted(set(label))
    one_hot = np.eye(len(names))[[names.index(n) for n in label[labeled]]]
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    logits = unit[test] @ unit[labeled].T / results['tau']
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs = weights / weights.sum(axis=1, keepdims=True) @ one_hot
    assert list(predicted[test]) == [names[k] for k in probs.argmax(1)]
    np.testing.assert_allclose(confidence[test].astype(float),
                               probs.max(axis=1), atol=2e-3)
    grid = int(np.ceil(np.sqrt(rows)))
    side = embedding['sprite']['singleImageDim']
    assert sprite.shape == (grid * side[0], grid * side[1], 3)
    assert images['paws_nn_pictures/confusion_and_neighbours']['samples'] == 1
    # The file is the picture TensorBoard shows, not a second rendering
    # (constrained layout can place the second one otherwise).
    np.testing.assert_array_equal(served, tf.io.decode_png(tf.io.read_file(
        str(pathlib.Path(trained) / 'eval' / 'paws_nn.png'))))
