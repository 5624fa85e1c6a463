"""The supervised-only baseline and the demo report."""

import json

import gin
from matplotlib import figure as mpl_figure
import numpy as np
import pytest
import tensorflow as tf

from paws_tf.data import augment
from paws_tf.demo import run_demo
from paws_tf.demo import supervised
from paws_tf import run_dir
from paws_tf.runner import experiment

TINY = ["build_backbone.name = 'small_resnet'",
        'small_resnet.widths = (8, 16)',
        'small_resnet.blocks_per_stage = (1, 1)',
        'small_resnet.stage_strides = (2, 2)']


@pytest.fixture
def tiny_backbone():
    gin.clear_config()
    gin.parse_config(TINY)
    yield
    gin.clear_config()


def test_baseline_learns_the_labeled_classes(tiny_backbone, tmp_path):
    labeled = experiment.synthetic_source(num_images=64, seed=0)
    test = experiment.synthetic_source(num_images=64, seed=1)
    multicrop = augment.cifar10_multicrop(global_size=16, local_size=8)
    results = supervised.train_supervised(
        run_dir.RunDir(tmp_path), labeled=labeled, test=test,
        preprocessing=experiment.eval_preprocessing(
            normalization=((0.5,) * 3, (0.25,) * 3), image_size=16),
        multicrop=multicrop, steps=60, batch_size=16, learning_rate=0.05)
    assert results['top1'] > 0.6  # 4 classes: chance is 0.25.
    assert results['num_test'] == 64 and results['num_labeled'] == 64
    written = json.loads((tmp_path / 'supervised' / 'results.json')
                         .read_text())
    assert written['top1'] == results['top1']


def test_augmented_training_views_are_deterministic(tiny_backbone):
    labeled = experiment.synthetic_source(num_images=8)
    multicrop = augment.cifar10_multicrop(global_size=16, mean=(0.5,) * 3,
                                          std=(0.25,) * 3)
    first = [b[0].numpy() for b in supervised._training_dataset(
        labeled, multicrop, 4, seed=3).take(3)]
    again = [b[0].numpy() for b in supervised._training_dataset(
        labeled, multicrop, 4, seed=3).take(3)]
    other = next(iter(supervised._training_dataset(labeled, multicrop, 4,
                                                   seed=4)))[0].numpy()
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.allclose(first[0], other)
    assert first[0].shape == (4, 16, 16, 3)


def test_project_2d_is_the_top_principal_components():
    rng = np.random.default_rng(0)
    # Variance 9 along e0, 4 along e1, tiny elsewhere.
    points = rng.normal(size=(500, 5)) * [3.0, 2.0, 0.01, 0.01, 0.01]
    projected = run_demo.project_2d(points)
    np.testing.assert_allclose(np.var(projected, axis=0),
                               np.var(points[:, :2], axis=0), rtol=0.02)
    np.testing.assert_allclose(np.abs(np.corrcoef(projected[:, 0],
                                                  points[:, 0])[0, 1]), 1.0,
                               atol=1e-3)


def test_table():
    text = run_demo.table([{'method': 'PAWS-NN', 'top-1': '84.00%'},
                         {'method': 'supervised only', 'top-1': '80.10%'}])
    lines = text.splitlines()
    assert lines[0].split() == ['method', 'top-1']
    assert lines[2].startswith('PAWS-NN ') and lines[3].endswith('80.10%')


def _logged_run(root, evaluated_epochs):
    """A run directory whose TensorBoard logs hold 4 epochs of 10 steps
    and PAWS-NN after `evaluated_epochs`."""
    run = run_dir.RunDir(root)
    with tf.summary.create_file_writer(run.train_logs).as_default():
        for epoch in range(1, 5):
            for tag in ('epoch/loss', 'epoch/cross_entropy', 'epoch/me_max'):
                tf.summary.scalar(tag, 1.0 / epoch, step=10 * epoch)
    with tf.summary.create_file_writer(run.eval_logs).as_default():
        for epoch in evaluated_epochs:
            tf.summary.scalar('paws_nn/top1', 0.2 * epoch, step=10 * epoch)
    return run


@pytest.mark.parametrize('evaluated_epochs', [(2, 4), ()],
                         ids=['every_2_epochs', 'none'])
def test_the_curves_put_paws_nn_at_the_epochs_that_evaluated(
        tmp_path, evaluated_epochs):
    """4 epochs of 10 steps, PAWS-NN after epochs 2 and 4
    (`train.eval_every_epochs = 2`), or after none (0): the PAWS-NN curve's
    points lie at epochs 2 and 4, and a run that evaluated none still
    draws its figure. Fails if the points are numbered 1, 2 (tried:
    `np.arange(1, len(top1) + 1)`), or on the empty panel's infinite data
    limits (tried: `set_xlim` of them: "Axis limits cannot be NaN or
    Inf", after the whole demo had run)."""
    run = _logged_run(tmp_path, evaluated_epochs)
    figure = mpl_figure.Figure()
    axes = figure.subplots(1, 3)
    run_demo._plot_curves(axes, run, 50.0, [{'epoch': 0, 'top1': 0.6},
                                            {'epoch': 1, 'top1': 0.7}])
    [curve] = axes[1].get_lines()[:1]
    np.testing.assert_array_equal(curve.get_xdata(), evaluated_epochs)
    np.testing.assert_allclose(curve.get_ydata(),
                               [20.0 * e for e in evaluated_epochs])


@pytest.mark.parametrize('pictures', [True, False])
def test_the_figure_holds_paws_nn_pictures_when_drawn(tmp_path, pictures):
    """The demo's figure: the curves and the PCA above PAWS-NN's pictures
    (here a 20 x 30 px PNG), or, with `evaluate_nn.pictures = False`, the
    top row alone (5.3 inches at 110 dpi). Fails if it reads the pictures'
    file whatever (tried: the demo ended in FileNotFoundError of
    eval/paws_nn.png after its whole run)."""
    run = _logged_run(tmp_path, (2, 4))
    nn_figure = None
    if pictures:
        nn_figure = str(tmp_path / 'nn.png')
        tf.io.write_file(nn_figure, tf.io.encode_png(
            tf.zeros([20, 30, 3], tf.uint8)))
    results = dict(paws_nn_top1=0.8, paws_finetune_top1=0.82,
                   supervised_top1=0.7, num_labeled=8)
    rng = np.random.default_rng(0)
    run_demo._write_figure(run, results, rng.normal(size=(12, 4)),
                           np.arange(12) % 2, ('a', 'b'),
                           [{'epoch': 0, 'top1': 0.8}], nn_figure)
    height = tf.io.decode_png(tf.io.read_file(run.results_figure)).shape[0]
    assert height == (14 * 110 if pictures else round(5.3 * 110))
