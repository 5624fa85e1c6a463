"""PAWS-NN's pictures against NumPy: the weights of the labeled images in a
prediction, the confusion matrix, the projector's sprite and rows, its
images over `max_points`, the neighbours' thumbnails.

Bugs tried, each caught here: a labeled image's own weight kept; the
lightest labeled images as neighbours; the confusion matrix without its
colour scale; the first `max_points` images in the projector instead of
evenly spaced ones; a neighbour's thumbnail read at another position than
its image.
"""

import csv
import re

from matplotlib import figure as mpl_figure
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

from paws_tf import checks
from paws_tf.data import sources
from paws_tf.evaluation import pictures

CLASSES = ('a', 'b', 'c')


def _softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _cosine(a, b):
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return a @ b.T


def test_weights_and_predictions_are_the_soft_nearest_neighbour_rule():
    """Fails if the embeddings are not L2-normalised, tau is not applied,
    or the class probability is not the sum of its supports' weights."""
    rng = np.random.default_rng(0)
    queries = rng.normal(size=(7, 5)).astype(np.float32) * 3
    supports = rng.normal(size=(9, 5)).astype(np.float32)
    labels = rng.integers(0, 3, 9)
    weights = pictures.support_weights(queries, supports, 0.2)
    expected = _softmax(_cosine(queries, supports) / 0.2)
    np.testing.assert_allclose(weights, expected, rtol=1e-5)
    predictions, confidences = pictures.predict(weights, labels, 3)
    probabilities = np.stack([expected[:, labels == k].sum(axis=1)
                              for k in range(3)], axis=1)
    np.testing.assert_array_equal(predictions, probabilities.argmax(axis=1))
    np.testing.assert_allclose(confidences, probabilities.max(axis=1),
                               rtol=1e-5)


def test_confusion_matrix_rows_are_true_classes():
    """Fails if rows and columns are swapped."""
    labels = np.array([0, 0, 1, 2, 2, 2])
    predictions = np.array([0, 1, 1, 2, 0, 0])
    matrix = pictures.confusion_matrix(labels, predictions, 3)
    expected = np.zeros((3, 3), int)
    for label, predicted in zip(labels, predictions):
        expected[label, predicted] += 1
    np.testing.assert_array_equal(matrix, expected)


def test_sprite_lays_thumbnails_row_by_row():
    """Fails if the thumbnails go column by column, or the grid is not the
    smallest square holding them (the projector finds thumbnail i at row
    i // g, column i % g)."""
    images = np.stack([np.full((2, 2, 1), i / 10) for i in range(5)])
    sheet = pictures.sprite(images)
    assert sheet.shape == (6, 6, 3) and sheet.dtype == np.uint8
    for i in range(9):
        row, column = divmod(i, 3)
        tile = sheet[2 * row:2 * row + 2, 2 * column:2 * column + 2]
        assert np.all(tile == (round(255 * i / 10) if i < 5 else 0)), i


@pytest.mark.parametrize('binding,message', [
    ('Pictures.num_examples = 0',
     'Pictures.num_examples must be a positive integer, got 0'),
    ('Pictures.num_neighbours = 0',
     'Pictures.num_neighbours must be a positive integer, got 0'),
    ('Pictures.max_points = None',
     'Pictures.max_points must be a positive integer, got None'),
    # 2000 thumbnails: a 45 x 45 grid of 184 px, 8280 px.
    ('Pictures.thumbnail_side = 184',
     'Pictures.max_points = 1000 labeled and as many test thumbnails of '
     'Pictures.thumbnail_side = 184 px make a sprite 8280 px wide; '
     "TensorBoard's projector reads up to 8192: fewer points or smaller "
     'thumbnails.')])
def test_pictures_out_of_range_are_refused_before_any_data(
        run_main, tmp_path, binding, message):
    """Fails if a setting of the pictures goes unchecked until they are
    drawn, after training and the evaluation (tried: no
    `Pictures.check_arguments`: `num_examples = 0` ended `--mode=
    evaluate_nn` in NumPy's 'need at least one array to concatenate', no
    paws_nn.json written)."""
    with pytest.raises(checks.ConfigError, match=re.escape(message)):
        run_main('--gin_file=debug.gin', f'--model_dir={tmp_path / "run"}',
                 '--mode=train_and_evaluate', f'--gin_bindings={binding}')
    assert not (tmp_path / 'run').exists()


def _rows(path):
    with open(path) as f:
        return list(csv.reader(f, delimiter='\t'))


def test_pictures_of_an_evaluation(tmp_path):
    """The projector's rows: the labeled images predicted by the others
    (a labeled image alone would predict itself at 100%), the test images
    by all; the neighbours are the heaviest labeled images.

    Fails if a labeled image's own weight is kept, or the neighbours are
    the lightest ones."""
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (12, 10, 10, 1), np.uint8)
    labels = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2])
    labeled = sources.from_arrays(images[:6], labels[:6], CLASSES)
    test = sources.from_arrays(images[6:], labels[6:], CLASSES)
    embeddings = rng.normal(size=(12, 4)).astype(np.float32)
    drawer = pictures.Pictures(
        labeled, test, preprocessing=dict(image_size=8, crop_fraction=1.0),
        num_examples=2, num_neighbours=3)
    weights = _softmax(_cosine(embeddings[6:], embeddings[:6]) / 0.1)
    test_probs = weights @ np.eye(3)[labels[:6]]
    matrix, encoded = drawer(
        str(tmp_path), 5, supports=embeddings[:6], support_labels=labels[:6],
        queries=embeddings[6:], query_labels=labels[6:],
        predictions=test_probs.argmax(axis=1), tau=0.1)

    own = np.exp(_cosine(embeddings[:6], embeddings[:6]) / 0.1)
    np.fill_diagonal(own, 0)
    labeled_probs = (own / own.sum(axis=1, keepdims=True)) @ np.eye(3)[
        labels[:6]]
    rows = _rows(tmp_path / pictures.METADATA)
    assert rows[0] == list(pictures.METADATA_COLUMNS)
    for row, split, label, probs in zip(
            rows[1:], ['labeled'] * 6 + ['test'] * 6, labels,
            np.concatenate([labeled_probs, test_probs])):
        assert row[:2] + row[3:] == [CLASSES[label], CLASSES[probs.argmax()],
                                     split]
        assert float(row[2]) == pytest.approx(probs.max(), abs=1e-3)
    np.testing.assert_allclose(
        np.loadtxt(tmp_path / pictures.TENSORS), embeddings, rtol=1e-5)
    expected = np.zeros((3, 3), int)
    for label, probs in zip(labels[6:], test_probs):
        expected[label, probs.argmax()] += 1
    np.testing.assert_array_equal(matrix, expected)
    examples = drawer._examples(
        weights, labels[6:], test_probs.argmax(axis=1),
        test_probs.max(axis=1), labels[:6], np.zeros((6, 32, 32, 1)),
        labeled)
    wrong = np.flatnonzero(test_probs.argmax(axis=1) != labels[6:])
    first = wrong[0] if len(wrong) else 0
    np.testing.assert_allclose(examples[0]['neighbour_weights'],
                               np.sort(weights[first])[::-1][:3], rtol=1e-5)
    # Drawn as the picture draws them: 1 + 3 panels per row, one row per
    # example, and the matrix with its colour scale, fractions from 0 to 1.
    figure = mpl_figure.Figure()
    left, right = figure.subfigures(1, 2)
    pictures.draw_confusion_matrix(left.subplots(), matrix, CLASSES)
    pictures.draw_neighbours(right, examples, CLASSES)
    assert len(figure.get_axes()) == 2 * 4 + 1
    matrix_axes, = [axes for axes in figure.get_axes()
                    if axes.get_title().startswith('confusion matrix')]
    scale, = matrix_axes.child_axes
    assert scale.get_ylabel() == "fraction of the true class's queries"
    assert scale.get_ylim() == (0, 1)
    events = event_accumulator.EventAccumulator(str(tmp_path))
    events.Reload()
    image, = events.Tensors('paws_nn_pictures/confusion_and_neighbours')
    assert image.step == 5
    # An image summary: width, height, then the PNG, of the pixels of the
    # one returned.
    width, height, summary = image.tensor_proto.string_val
    np.testing.assert_array_equal(tf.io.decode_png(summary),
                                  tf.io.decode_png(encoded))
    assert tf.io.decode_png(encoded).shape[:2] == (int(height), int(width))


def _flat_images(count, step=12):
    """`count` uint8 images, image i of the one value `step * i + 10` (a
    resized or cropped thumbnail keeps it)."""
    values = step * np.arange(count) + 10
    return np.broadcast_to(values[:, None, None, None].astype(np.uint8),
                           (count, 10, 10, 1)).copy(), values


def _tiles(sheet, side, count):
    """The value of each of the first `count` tiles of a sprite."""
    grid = sheet.shape[0] // side
    return np.array([sheet[r * side:(r + 1) * side,
                           c * side:(c + 1) * side, 0].mean()
                     for r, c in (divmod(i, grid) for i in range(count))])


def test_the_projector_shows_evenly_spaced_images_over_max_points(tmp_path):
    """10 labeled and 7 test images, `max_points` 4: the projector holds
    labeled images 0, 3, 6, 9 and test images 0, 2, 4, 6 (evenly spaced,
    NumPy's linspace rounded), each row its own embedding, label and
    thumbnail. Fails if the first `max_points` are taken (tried: positions
    0..3), or the rows' embeddings or thumbnails are not those images'."""
    images, values = _flat_images(17)
    labels = np.arange(17) % 3
    labeled = sources.from_arrays(images[:10], labels[:10], CLASSES)
    test = sources.from_arrays(images[10:], labels[10:], CLASSES)
    rng = np.random.default_rng(2)
    embeddings = rng.normal(size=(17, 4)).astype(np.float32)
    drawer = pictures.Pictures(
        labeled, test, preprocessing=dict(image_size=8, crop_fraction=1.0),
        max_points=4, num_examples=2, num_neighbours=2, thumbnail_side=4)
    drawer(str(tmp_path), 1, supports=embeddings[:10],
           support_labels=labels[:10], queries=embeddings[10:],
           query_labels=labels[10:], predictions=labels[10:], tau=0.1)
    shown = np.array([0, 3, 6, 9, 10 + 0, 10 + 2, 10 + 4, 10 + 6])
    np.testing.assert_allclose(np.loadtxt(tmp_path / pictures.TENSORS),
                               embeddings[shown], rtol=1e-5)
    rows = _rows(tmp_path / pictures.METADATA)[1:]
    assert [row[0] for row in rows] == [CLASSES[k] for k in labels[shown]]
    assert [row[3] for row in rows] == ['labeled'] * 4 + ['test'] * 4
    sheet = tf.io.decode_png(tf.io.read_file(
        str(tmp_path / pictures.SPRITE))).numpy()
    assert sheet.shape == (12, 12, 3)  # 8 thumbnails of 4 px: a 3 x 3 grid.
    np.testing.assert_allclose(_tiles(sheet, 4, 8), values[shown], atol=1)


def test_neighbours_are_the_heaviest_labeled_images_with_their_pictures():
    """Each row of the neighbours picture: the labeled images of the
    largest weights, heaviest first (NumPy's argsort), each thumbnail that
    image's, with its label and weight. Fails if a thumbnail is read at
    another position than its image (tried: the i-th of the images the
    rows need, not the one at the row's index)."""
    images, values = _flat_images(8)
    labels = np.array([0, 1, 2, 0, 1, 2, 0, 1])
    labeled = sources.from_arrays(images, labels, CLASSES)
    drawer = pictures.Pictures(
        labeled, labeled, preprocessing=dict(image_size=8, crop_fraction=1.0),
        num_examples=3, num_neighbours=3, thumbnail_side=4)
    rng = np.random.default_rng(3)
    weights = _softmax(rng.normal(size=(4, 8)) * 3)
    predictions, confidences = pictures.predict(weights, labels, 3)
    query_labels = np.array([0, 1, 2, 0])
    examples = drawer._examples(weights, query_labels, predictions,
                                confidences, labels,
                                np.zeros((4, 4, 4, 1)), labeled)
    wrong = np.flatnonzero(predictions != query_labels)[:1]
    right = np.flatnonzero(predictions == query_labels)
    chosen = np.concatenate([wrong, right])[:3]
    assert len(examples) == len(chosen)
    for example, query in zip(examples, chosen):
        heaviest = np.argsort(-weights[query])[:3]
        np.testing.assert_array_equal(example['neighbour_labels'],
                                      labels[heaviest])
        np.testing.assert_allclose(example['neighbour_weights'],
                                   weights[query, heaviest])
        np.testing.assert_allclose(
            [image.mean() * 255 for image in example['neighbours']],
            values[heaviest], atol=1)
        assert example['label'] == query_labels[query]
