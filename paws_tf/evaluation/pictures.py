"""What PAWS-NN learned, in pictures: TensorBoard's embedding projector of
the labeled and test images, the labeled images that weigh most in a few
test predictions, and the confusion matrix."""

import io
import os

import gin
import numpy as np
import tensorflow as tf
from tensorboard.plugins import projector

from paws_tf import checks
from paws_tf.data import pipeline

# Files of the projector, beside the event files of its TensorBoard run.
TENSORS, METADATA, SPRITE = 'embeddings.tsv', 'metadata.tsv', 'sprite.png'
# The first column labels the points in the projector.
METADATA_COLUMNS = ('label', 'prediction', 'confidence', 'split')
# TensorBoard's projector reads sprites up to 8192 px a side.
_MAX_SPRITE_SIDE = 8192


def support_weights(queries, supports, tau):
    """`[N, M]` weight of each support in each query's PAWS-NN prediction:
    the softmax over supports of the cosine similarities over `tau`, whose
    sums by class are the class probabilities (PAWS eq. (1))."""
    queries = tf.math.l2_normalize(queries, axis=1)
    supports = tf.math.l2_normalize(supports, axis=1)
    return tf.nn.softmax(
        tf.matmul(queries, supports, transpose_b=True) / tau, axis=1).numpy()


def predict(weights, support_labels, num_classes):
    """`(class ids, confidences)` of the queries of `weights`: the most
    probable class and its probability."""
    probabilities = weights @ np.eye(num_classes)[support_labels]  # [N, K]
    return probabilities.argmax(axis=1), probabilities.max(axis=1)


def confusion_matrix(labels, predictions, num_classes):
    """`[K, K]` counts: row the true class, column the predicted one."""
    return np.bincount(labels * num_classes + predictions,
                       minlength=num_classes ** 2).reshape(
                           num_classes, num_classes)


def thumbnails(source, count, *, image_size, crop_fraction, side):
    """The first `count` images of `source` as PAWS-NN sees them (its
    centre view), `[n, side, side, C]` floats in [0, 1]."""
    channels = source.channels
    dataset = pipeline.make_eval_dataset(
        source, batch_size=256, image_size=image_size,
        crop_fraction=crop_fraction, mean=[0.0] * channels,
        std=[1.0] * channels)
    images = np.concatenate([batch.numpy() for batch, _ in
                             dataset.unbatch().take(count).batch(256)])
    return tf.image.resize(images, [side, side], antialias=True).numpy()


def sprite(images):
    """A square grid of `[n, s, s, C]` images in [0, 1], row by row, as
    uint8 RGB `[g * s, g * s, 3]` (the projector's sprite, at most
    `_MAX_SPRITE_SIDE` wide: `Pictures.check_arguments`)."""
    count, side = len(images), images.shape[1]
    grid = int(np.ceil(np.sqrt(count)))
    canvas = np.zeros([grid * grid, side, side, 3], np.uint8)
    canvas[:count] = np.round(255 * np.clip(images, 0, 1))
    return canvas.reshape(grid, grid, side, side, 3).swapaxes(1, 2).reshape(
        grid * side, grid * side, 3)


def write_projector(log_dir, embeddings, metadata, images):
    """The projector of `embeddings` (`[N, D]`), one `metadata` row (a
    tuple of `METADATA_COLUMNS`) and one thumbnail per point, in
    `log_dir` (TensorBoard's run)."""
    os.makedirs(log_dir, exist_ok=True)
    np.savetxt(os.path.join(log_dir, TENSORS), embeddings, delimiter='\t',
               fmt='%.6g')
    with open(os.path.join(log_dir, METADATA), 'w') as f:
        for row in [METADATA_COLUMNS] + list(metadata):
            f.write('\t'.join(str(cell) for cell in row) + '\n')
    tf.io.write_file(os.path.join(log_dir, SPRITE), tf.io.encode_png(
        sprite(images)))
    config = projector.ProjectorConfig()
    embedding = config.embeddings.add()
    embedding.tensor_name = 'paws_nn_embeddings'
    embedding.tensor_path = TENSORS
    embedding.metadata_path = METADATA
    embedding.sprite.image_path = SPRITE
    embedding.sprite.single_image_dim.extend(images.shape[1:3])
    projector.visualize_embeddings(log_dir, config)


def draw_confusion_matrix(axes, matrix, class_names):
    """The confusion matrix on `axes`, each row normalised to its
    class's queries."""
    totals = np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    image = axes.imshow(matrix / totals, cmap='Blues', vmin=0, vmax=1)
    # Beside the matrix, of its height.
    axes.figure.colorbar(image, cax=axes.inset_axes([1.04, 0, 0.05, 1]),
                         label="fraction of the true class's queries")
    ticks = np.arange(len(class_names))
    if len(class_names) <= 20:  # Names stay readable.
        axes.set_xticks(ticks, class_names, rotation=90, fontsize=7)
        axes.set_yticks(ticks, class_names, fontsize=7)
    axes.set(xlabel='PAWS-NN prediction', ylabel='true class',
             title='confusion matrix (fraction of each class)')


def draw_neighbours(figure, examples, class_names):
    """A row per test image of `examples` (`Pictures._examples`' dicts):
    the image, then the labeled images that weigh most in its prediction,
    with their classes and weights."""
    columns = 1 + max(len(e['neighbours']) for e in examples)
    grid = figure.subplots(len(examples), columns, squeeze=False)
    for row, example in zip(grid, examples):
        _show(row[0], example['image'])
        row[0].set_title(
            f'test: {class_names[example["label"]]}\nPAWS-NN: '
            f'{class_names[example["prediction"]]} '
            f'{100 * example["confidence"]:.0f}%', fontsize=7,
            color='black' if example['label'] == example['prediction']
            else 'red')
        for axes, image, label, weight in zip(
                row[1:], example['neighbours'], example['neighbour_labels'],
                example['neighbour_weights']):
            _show(axes, image)
            axes.set_title(f'{class_names[label]}\nweight {weight:.2f}',
                           fontsize=7)
        for axes in row:
            # No ticks: a hidden axis still makes them and lays them out,
            # a large share of the drawing time, for the same pixels.
            axes.set(xticks=[], yticks=[])
            axes.set_axis_off()


def _show(axes, image):
    if image.shape[-1] == 1:
        axes.imshow(image[..., 0], cmap='gray', vmin=0, vmax=1)
    else:
        axes.imshow(image)


def png(figure):
    """The PNG bytes of a matplotlib `figure`."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format='png', dpi=100)
    return buffer.getvalue()


@gin.configurable(denylist=['labeled', 'test', 'preprocessing'])
class Pictures:
    """The pictures of one PAWS-NN evaluation (`evaluate.PawsNN(...,
    pictures=...)`) of the `labeled` supports and `test` queries, the
    thumbnails their centre views (`preprocessing`).

    Args:
        max_points: labeled and test images each in the projector.
        num_examples, num_neighbours: test images in the neighbours
            picture (up to half misclassified), labeled images beside each.
        thumbnail_side: the thumbnails' side in pixels.
    """

    def __init__(self, labeled, test, *, preprocessing, max_points=1000,
                 num_examples=6, num_neighbours=5, thumbnail_side=32):
        self.check_arguments(max_points=max_points,
                             num_examples=num_examples,
                             num_neighbours=num_neighbours,
                             thumbnail_side=thumbnail_side)
        self._sources = labeled, test
        self._preprocessing = dict(
            image_size=preprocessing['image_size'],
            crop_fraction=preprocessing['crop_fraction'])
        self._max_points = max_points
        self._num_examples, self._num_neighbours = (num_examples,
                                                    num_neighbours)
        self._side = thumbnail_side
        self.class_names = labeled.class_names or tuple(
            str(k) for k in range(int(np.max(labeled.labels)) + 1))

    @staticmethod
    def check_arguments(*, max_points, num_examples, num_neighbours,
                        thumbnail_side, names=None):
        """As `lars.LARS.check_arguments` (default `Pictures.<argument>`)."""
        name = checks.namer(names, 'Pictures.')
        for key, value in (('max_points', max_points),
                           ('num_examples', num_examples),
                           ('num_neighbours', num_neighbours),
                           ('thumbnail_side', thumbnail_side)):
            checks.integer(name(key), value)
        # Labeled and test points, each class's thumbnails at most.
        grid = int(np.ceil(np.sqrt(2 * max_points)))
        if grid * thumbnail_side > _MAX_SPRITE_SIDE:
            raise checks.ConfigError(
                f'{name("max_points")} = {max_points} labeled and as many '
                f'test thumbnails of {name("thumbnail_side")} = '
                f'{thumbnail_side} px make a sprite {grid * thumbnail_side} '
                f'px wide; TensorBoard\'s projector reads up to '
                f'{_MAX_SPRITE_SIDE}: fewer points or smaller thumbnails.')

    def __call__(self, log_dir, step, *, supports, support_labels, queries,
                 query_labels, predictions, tau):
        """Writes the projector in `log_dir`, and the confusion matrix and
        neighbours images at `step` as TensorBoard images
        `paws_nn_pictures/*` there; returns `(confusion matrix, png)`: the
        `[K, K]` counts over every query and the PNG bytes of both
        pictures, the image TensorBoard shows (one rendering: a second one
        can lay the figure out otherwise).

        The keywords are `evaluate.paws_nn`'s `embedded` (the embeddings
        in source order, their class ids, `evaluate.classify`'s top-1 of
        each query) and PAWS-NN's `tau`.
        """
        num_classes = len(self.class_names)
        matrix = confusion_matrix(query_labels, predictions, num_classes)
        labeled, test = self._sources
        shown, labeled_images = self._points(labeled)
        # A labeled image is predicted by the other labeled images.
        own = support_weights(tf.gather(supports, shown), supports, tau)
        own[np.arange(len(shown)), shown] = 0
        own_predictions, own_confidences = predict(
            own / own.sum(axis=1, keepdims=True), support_labels,
            num_classes)
        queried, test_images = self._points(test)
        # The projector's test images only: every query's weights would be
        # [N, M] at once (ImageNet: 50,000 x 128,000), which classify
        # computes in chunks.
        weights = support_weights(tf.gather(queries, queried), supports, tau)
        predictions, confidences = predict(weights, support_labels,
                                           num_classes)
        names = np.array(self.class_names)
        write_projector(
            log_dir,
            np.concatenate([tf.gather(supports, shown),
                            tf.gather(queries, queried)]),
            zip(names[np.concatenate([support_labels[shown],
                                      query_labels[queried]])],
                names[np.concatenate([own_predictions, predictions])],
                [f'{c:.3f}' for c in np.concatenate(
                    [own_confidences, confidences])],
                ['labeled'] * len(shown) + ['test'] * len(queried)),
            np.concatenate([labeled_images, test_images]))
        # Loaded when pictures are drawn: matplotlib's import takes half a
        # second of every process of run.py, most of which draw none.
        # pylint: disable-next=import-outside-toplevel
        from matplotlib import figure as mpl_figure
        figure = mpl_figure.Figure(
            figsize=(14, max(6, 1.5 * self._num_examples)),
            layout='constrained')
        left, right = figure.subfigures(1, 2, width_ratios=[1, 1.3])
        draw_confusion_matrix(left.subplots(), matrix, self.class_names)
        draw_neighbours(right, self._examples(
            weights, query_labels[queried], predictions, confidences,
            support_labels, test_images, labeled), self.class_names)
        encoded = png(figure)
        with tf.summary.create_file_writer(log_dir).as_default(step=step):
            tf.summary.image('paws_nn_pictures/confusion_and_neighbours',
                             tf.io.decode_png(encoded)[None])
        return matrix, encoded

    def _points(self, source):
        """`(positions, thumbnails)` of the projector's images of `source`:
        evenly spaced over an addressable source (folders list classes in
        turn), the first ones of a stream."""
        count = min(self._max_points, source.num_examples)
        if hasattr(source, 'subset'):
            positions = np.unique(np.linspace(
                0, source.num_examples - 1, count).round().astype(int))
            source = source.subset(positions)
        else:
            positions = np.arange(count)
        return positions, thumbnails(source, len(positions), side=self._side,
                                     **self._preprocessing)

    def _examples(self, weights, labels, predictions, confidences,
                  support_labels, images, labeled):
        """The neighbours picture's rows, of the projector's test images
        (`weights` etc. theirs): misclassified ones (at most half), then
        right ones."""
        wrong = np.flatnonzero(predictions != labels)[
            :self._num_examples // 2]
        right = np.flatnonzero(predictions == labels)
        chosen = np.concatenate([wrong, right])[:self._num_examples]
        nearest = np.argsort(-weights[chosen], axis=1)[
            :, :self._num_neighbours]
        # Every labeled image the rows show, read once.
        needed = np.unique(nearest)
        shown = thumbnails(labeled.subset(needed), len(needed),
                           side=self._side, **self._preprocessing)
        return [dict(image=images[i], label=labels[i],
                     prediction=predictions[i], confidence=confidences[i],
                     neighbours=shown[np.searchsorted(needed, row)],
                     neighbour_labels=support_labels[row],
                     neighbour_weights=weights[i, row])
                for i, row in zip(chosen, nearest)]
