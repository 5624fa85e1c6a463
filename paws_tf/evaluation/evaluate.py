"""PAWS-NN: soft nearest-neighbour classification, the labeled set as
support, and the evaluators that run it.

An evaluator is a class built as `Evaluator(labeled, test, *,
preprocessing, tau, log_dir, max_queries)`, with a `name` (its top-1's key
in `fit`'s logs) and a `title`; called with `embed_fn` and the global step,
it returns its results and writes its TensorBoard points. A new one (a
linear probe) is a class and a binding: `train.evaluators = [@PawsNN, @X]`.
"""

import time

from absl import logging
import gin
import numpy as np
import tensorflow as tf
import tf_keras

from paws_tf.data import pipeline
from paws_tf.evaluation import export
from paws_tf.evaluation import pictures as pictures_lib
from paws_tf import losses

# Queries classified together. Each chunk materialises a few [chunk, M]
# float32 tensors: 512 MB each for ImageNet's 10% support (M = 128k).
DEFAULT_QUERY_CHUNK = 1024
_LOG_SECONDS = 30


def embedder_from_model(model):
    """`embed_fn`: float32 `[b, S, S, C]` preprocessed images -> `[b, D]`
    embeddings of `model` (a `PAWSModel`, or a network that returns the
    embeddings: a fine-tuning trunk) in inference mode."""
    @tf.function(autograph=False)
    def embed(images):
        outputs = model(images, training=False)
        return (outputs['embeddings'] if isinstance(outputs, dict)
                else outputs)

    def embed_fn(images):
        images = tf.convert_to_tensor(images)
        if not images.dtype.is_floating:
            raise ValueError(
                f'embed_fn takes preprocessed float images, got '
                f'{images.dtype.name}: preprocess them '
                '(make_eval_dataset), or embed raw images with the '
                'embedder export.')
        # Traced once per image size for any batch: the last batch of a
        # dataset is smaller, and a trace for each size makes TensorFlow
        # warn of retracing once a few embedders have run.
        return embed.get_concrete_function(tf.TensorSpec(
            [None, *images.shape[1:]], images.dtype))(images)

    return embed_fn


def embedder_from_saved_model(export_dir):
    """`embed_fn` of an `export.export_embedder` SavedModel."""
    return embedder_from_model(export.LoadedEmbedder(export_dir))


def embed_dataset(embed_fn, dataset, *, description='images'):
    """`(embeddings, labels)`, float32 `[N, D]` tensor and int32 `[N]`
    array, of every image of `dataset`'s `(images, labels)` batches
    (`pipeline.make_eval_dataset`) by `embed_fn` (`embedder_from_model`'s),
    in order; `description` names the images in the logs. ValueError if
    the dataset is empty."""
    embeddings, labels = [], []
    count, start = 0, time.monotonic()
    for images, batch_labels in dataset:
        embeddings.append(tf.cast(embed_fn(images), tf.float32))  # [b, D]
        labels.append(np.asarray(batch_labels, np.int32))
        count += len(labels[-1])
        logging.log_every_n_seconds(
            logging.INFO, 'PAWS-NN: embedded %d %s (%.0f images/s)',
            _LOG_SECONDS, count, description,
            count / (time.monotonic() - start))
    if not embeddings:
        raise ValueError(f'The {description} dataset is empty.')
    logging.info('PAWS-NN: embedded %d %s in %.1f s', count, description,
                 time.monotonic() - start)
    return tf.concat(embeddings, 0), np.concatenate(labels)


def classify(query_embeddings, support_embeddings, support_labels, *,
             num_classes, tau=0.1, query_chunk=DEFAULT_QUERY_CHUNK):
    """Top-5 classes of every query under the soft nearest-neighbour rule.

    PAWS Appendix A: `argmax softmax(q Sᵀ / tau) Y` over L2-normalised
    embeddings, Y the one-hot support labels (no smoothing).

    Args:
        query_embeddings, support_embeddings: `[N, D]`, `[M, D]`.
        support_labels: int `[M]` class ids in `[0, num_classes)`.
        num_classes, tau: K, the similarity temperature.
        query_chunk: queries classified at once, so that only
            `[query_chunk, M]` similarities exist at a time.

    Returns:
        int32 `[N, min(5, K)]` NumPy class ids, most probable first (ties:
        lower class id first).

    Raises:
        ValueError: support labels that are not integers in
            `[0, num_classes)`.
    """
    support_labels = export.checked_labels('Support', support_labels,
                                           num_classes)
    label_matrix = tf.one_hot(support_labels, num_classes)  # [M, K]
    num_queries = int(query_embeddings.shape[0])
    k = min(5, num_classes)
    top_ids, start = [], time.monotonic()
    for first in range(0, num_queries, query_chunk):
        probabilities = losses.snn(
            query_embeddings[first:first + query_chunk], support_embeddings,
            label_matrix, tau)  # [chunk, K]
        top_ids.append(tf.math.top_k(probabilities, k).indices.numpy())
        done = min(first + query_chunk, num_queries)
        logging.log_every_n_seconds(
            logging.INFO, 'PAWS-NN: classified %d / %d queries '
            '(%.0f queries/s)', _LOG_SECONDS, done, num_queries,
            done / (time.monotonic() - start))
    return np.concatenate(top_ids).astype(np.int32)


def paws_nn(embed_fn, support_dataset, query_dataset, *, num_classes,
            tau=0.1, query_chunk=DEFAULT_QUERY_CHUNK, keep=False,
            supports=None):
    """PAWS-NN accuracy: every query classified with all supports.

    Args:
        embed_fn, support_dataset, query_dataset: as for `embed_dataset`:
            the datasets of every labeled image and of the test images.
        num_classes, tau, query_chunk: as for `classify`.
        supports: `embed_dataset(embed_fn, support_dataset)` when the
            caller has it (None: embedded here).
        keep: add `embedded`, `pictures.Pictures`' keyword arguments.

    Returns:
        dict: `top1` and (K >= 5) `top5` accuracies, `num_support`,
        `num_queries`, and `per_class_accuracy`: top-1 accuracy of the
        queries of each class (None for a class without queries).

    Raises:
        ValueError: labels outside `[0, num_classes)`, an empty dataset.
    """
    if supports is None:
        supports = embed_dataset(embed_fn, support_dataset,
                                 description='support images')
    supports, support_labels = supports
    queries, query_labels = embed_dataset(embed_fn, query_dataset,
                                          description='queries')
    for what, labels in ('Support', support_labels), ('Query', query_labels):
        export.checked_labels(what, labels, num_classes)
    missing = num_classes - len(np.unique(support_labels))
    if missing:
        logging.warning('PAWS-NN: %d of %d classes have no support image: '
                        'they get no probability.', missing, num_classes)
    top_ids = classify(queries, supports, support_labels,
                       num_classes=num_classes, tau=tau,
                       query_chunk=query_chunk)  # [N, min(5, K)]
    hits = top_ids == query_labels[:, None]  # [N, min(5, K)]
    per_class_hits = np.bincount(query_labels, weights=hits[:, 0],
                                 minlength=num_classes)
    per_class_count = np.bincount(query_labels, minlength=num_classes)
    results = {f'top{k}': float(hits[:, :k].any(axis=1).mean())
               for k in (1, 5) if k <= num_classes}
    results.update(
        num_support=len(support_labels), num_queries=len(query_labels),
        per_class_accuracy=[
            float(h / n) if n else None
            for h, n in zip(per_class_hits, per_class_count)])
    if keep:
        results['embedded'] = dict(
            supports=supports, support_labels=support_labels,
            queries=queries, query_labels=query_labels,
            predictions=top_ids[:, 0])
    return results


@gin.configurable(allowlist=['batch_size', 'query_chunk'])
class PawsNN:
    """`paws_nn` of the labeled and test sources, both embedded with the
    evaluation preprocessing; the embedded counts are checked against the
    sources' sizes (the official code once reported 1% figures computed
    with the 10% support).

    Args:
        labeled: `sources.ImageSource`, the support.
        test: `sources.ImageSource` or `sources.StreamSource`, the queries.
        preprocessing, tau: `pipeline.make_eval_dataset`'s `image_size`,
            `crop_fraction`, `mean` and `std`; the similarity temperature.
        log_dir, tag: TensorBoard directory (None: none) and group of the
            points `{tag}/top1`, `{tag}/top5`.
        max_queries: the first this many test images are the queries
            (None: all), so that a curve during training is cheap.
        batch_size, query_chunk: images per embedding batch; as for `classify`.
        pictures: None, or the PNG file of `pictures.Pictures`' figure,
            drawn with its projector in `log_dir` (needs one); its `[K, K]`
            confusion matrix is added to the results (`confusion_matrix`).
    """
    name, title = 'paws_nn', 'PAWS-NN'

    def __init__(self, labeled, test, *, preprocessing, tau, log_dir=None,
                 max_queries=None, tag=name, batch_size=256,
                 query_chunk=DEFAULT_QUERY_CHUNK, pictures=None):
        if pictures is not None and log_dir is None:
            raise ValueError('PawsNN draws its pictures in log_dir: give '
                             'one.')
        if test.class_names and test.class_names != labeled.class_names:
            raise ValueError('The labeled and test sets name their classes '
                             'differently.')
        self._support = pipeline.make_eval_dataset(
            labeled, batch_size=batch_size, **preprocessing)
        self._queries = pipeline.make_eval_dataset(
            test, batch_size=batch_size, **preprocessing)
        num_queries = test.num_examples
        if max_queries is not None:
            self._queries = self._queries.unbatch().take(max_queries).batch(
                batch_size)
            num_queries = min(num_queries, max_queries)
        self._sizes = labeled.num_examples, num_queries
        self.num_classes = (len(labeled.class_names) or
                            int(np.max(labeled.labels)) + 1)
        self.batch_size = batch_size
        self._tau, self._tag, self._query_chunk = tau, tag, query_chunk
        self._writer = log_dir and tf.summary.create_file_writer(log_dir)
        self._log_dir, self._pictures = log_dir, pictures and (
            pictures, pictures_lib.Pictures(labeled, test,
                                            preprocessing=preprocessing))

    def __call__(self, embed_fn, step=0, supports=None):
        """`paws_nn` of `embed_fn` (`supports` as for `paws_nn`);
        RuntimeError if a count differs from the sources'."""
        results = paws_nn(
            embed_fn, self._support, self._queries,
            num_classes=self.num_classes, tau=self._tau,
            query_chunk=self._query_chunk, keep=self._pictures is not None,
            supports=supports)
        embedded = results['num_support'], results['num_queries']
        if embedded != self._sizes:
            raise RuntimeError(f'Embedded {embedded} (support, query) '
                               f'images, but the sources hold {self._sizes}.')
        if self._writer:
            with self._writer.as_default(step=step):
                for key in sorted({'top1', 'top5'} & results.keys()):
                    tf.summary.scalar(f'{self._tag}/{key}', results[key])
            self._writer.flush()
        if self._pictures is not None:
            path, drawer = self._pictures
            matrix, encoded = drawer(self._log_dir, step, tau=self._tau,
                                        **results.pop('embedded'))
            tf.io.write_file(path, encoded)
            results['confusion_matrix'] = matrix.tolist()
        return results


class EpochEndEvaluation(tf_keras.callbacks.Callback):
    """Runs `evaluators` every `every_epochs` epochs of `fit` (and at the
    last of `num_epochs`, if given) and logs each one's top-1 after
    `prefix`; `history` holds `dict(epoch=..., **results)` of each run.

    `embedder(model)`, called with `fit`'s model on every process, is the
    `embed_fn` to evaluate, or None where this process only takes part in
    reading the weights (a cluster's workers but the chief). `to_logs`
    puts each top-1 in `fit`'s logs as `{name}_top1`, for the progress bar.
    """

    def __init__(self, evaluators, embedder, *, every_epochs=1,
                 num_epochs=None, prefix='', to_logs=True):
        super().__init__()
        self._evaluators, self._embedder = list(evaluators), embedder
        self._every, self._last = every_epochs, num_epochs
        self._prefix, self._to_logs = prefix, to_logs
        self.history = []

    def on_epoch_end(self, epoch, logs=None):
        done = epoch + 1
        if (done % self._every and done != self._last or
                self.model.stop_training):
            return  # Not due, or stopping (a preemption's grace period).
        embed_fn = self._embedder(self.model)
        if embed_fn is None:
            return
        step = int(self.model.optimizer.iterations.numpy())
        of = f'/{self._last}' if self._last else ''
        for evaluator in self._evaluators:
            results = evaluator(embed_fn, step)
            self.history.append(dict(epoch=done, **results))
            if 'top1' not in results:
                continue
            logging.info('%sepoch %d%s: %s top-1 %.2f%%', self._prefix, done,
                         of, evaluator.title, 100 * results['top1'])
            if self._to_logs and logs is not None:
                logs[f'{evaluator.name}_top1'] = results['top1']
