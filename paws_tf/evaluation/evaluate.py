"""PAWS-NN: soft nearest-neighbour evaluation, the labeled set as support."""

import functools
import json
import os
import time

from absl import logging
import gin
import numpy as np
import tensorflow as tf

from paws_tf import checkpoints
from paws_tf.data import pipeline
from paws_tf.data import splits
from paws_tf.evaluation import export
from paws_tf import losses

# Queries classified together. Each chunk materialises a few [chunk, M]
# float32 tensors: 512 MB each for ImageNet's 10% support (M = 128k).
DEFAULT_QUERY_CHUNK = 1024
SOURCES = ('saved_model', 'checkpoint')
EVAL_SUBDIR = 'eval'
RESULTS_FILENAME = 'paws_nn.json'
_LOG_SECONDS = 30


def embedder_from_model(model):
    """Returns `embed_fn` for an in-memory model, in inference mode.

    Args:
        model: `model.PAWSModel` (its call returns `embeddings`).

    Returns:
        `embed_fn(images)`: float32 `[b, S, S, C]` preprocessed images ->
        `[b, D]` float32 embeddings (projection output h).
    """
    @tf.function(reduce_retracing=True)
    def embed_fn(images):
        return model(images, training=False)['embeddings']

    return embed_fn


def embedder_from_saved_model(export_dir):
    """Returns `embed_fn` of an `export.export_embedder` SavedModel.

    Uses its `embed_preprocessed` signature, so the caller's preprocessing
    (`pipeline.make_eval_dataset`) is the only one applied.

    Args:
        export_dir: directory written by `export.export_embedder`.

    Returns:
        `embed_fn(images)`: float32 `[b, S, S, C]` -> `[b, D]` float32.

    Raises:
        ValueError: the SavedModel has no `embed_preprocessed` signature.
    """
    loaded = tf.saved_model.load(export_dir)
    if 'embed_preprocessed' not in loaded.signatures:
        raise ValueError(
            f'{export_dir} has signatures {sorted(loaded.signatures)}, not '
            f'embed_preprocessed: it was not written by export_embedder.')

    def embed_fn(images):
        # Looked up through `loaded`, which owns the variables it reads.
        signature = loaded.signatures['embed_preprocessed']
        return signature(images=images)['embeddings']

    return embed_fn


def restore_model(model, checkpoint_path, *, input_shape):
    """Restores a training checkpoint's model weights into `model`.

    The checkpoint must have been written by `tf.train.Checkpoint(model=...,
    ...)`; other entries (the optimizer state) are ignored.

    Args:
        model: the `model.PAWSModel` built from the run's gin config.
        checkpoint_path: checkpoint prefix, or a directory whose latest
            checkpoint is used.
        input_shape: `(S, S, C)` of an input image; the model is called
            once on zeros so that every variable exists before restoring.

    Returns:
        The checkpoint prefix restored.

    Raises:
        FileNotFoundError: no checkpoint at `checkpoint_path`.
        ValueError: the checkpoint lacks some of the model's variables
            (another architecture).
    """
    prefix = checkpoints.resolve_prefix(checkpoint_path)
    model(tf.zeros([1, *input_shape]), training=False)
    status = tf.train.Checkpoint(model=model).read(prefix).expect_partial()
    try:
        status.assert_existing_objects_matched()
    except AssertionError as error:
        # TF's message goes on to print the unmatched variables' values.
        raise ValueError(
            f'The checkpoint {prefix} does not hold this model\'s weights '
            f'under the "model" key (another architecture, or not written '
            f'by tf.train.Checkpoint(model=...)): '
            f'{str(error).split(".")[0]}.') from error
    logging.info('PAWS-NN: restored the model from %s', prefix)
    return prefix


def embed_dataset(embed_fn, dataset, *, description='images'):
    """Embeds every image of an `(images, labels)` dataset once, in order.

    Args:
        embed_fn: `[b, S, S, C]` images -> `[b, D]` embeddings.
        dataset: `tf.data.Dataset` of `(images, int labels)` batches, e.g.
            from `pipeline.make_eval_dataset`.
        description: what the images are, for progress logs.

    Returns:
        `(embeddings, labels)`: float32 `[N, D]` tensor and int32 `[N]`
        NumPy array.

    Raises:
        ValueError: if the dataset is empty.
    """
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
             num_classes, tau=0.1, k=5, query_chunk=DEFAULT_QUERY_CHUNK):
    """Top-k classes of every query under the soft nearest-neighbour rule.

    PAWS Appendix A: `argmax softmax(q Sᵀ / tau) Y` over L2-normalised
    embeddings, Y the one-hot support labels (no smoothing). Queries are
    processed `query_chunk` at a time, so only `[query_chunk, M]`
    similarities exist at once.

    Args:
        query_embeddings: `[N, D]` embeddings.
        support_embeddings: `[M, D]` embeddings of every labeled image.
        support_labels: int `[M]` class ids in `[0, num_classes)`.
        num_classes: K.
        tau: similarity temperature.
        k: how many classes to return per query (at most K).
        query_chunk: queries per chunk.

    Returns:
        int32 `[N, min(k, K)]` NumPy class ids, most probable first (ties:
        lower class id first).
    """
    label_matrix = tf.one_hot(support_labels, num_classes)  # [M, K]
    num_queries = int(query_embeddings.shape[0])
    k = min(k, num_classes)
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


def _check_labels(labels, num_classes, what):
    if labels.min() < 0 or labels.max() >= num_classes:
        raise ValueError(f'{what} labels must be in [0, {num_classes}), got '
                         f'[{labels.min()}, {labels.max()}].')


def paws_nn(embed_fn, support_dataset, query_dataset, *, num_classes,
            tau=0.1, top_k=(1, 5), query_chunk=DEFAULT_QUERY_CHUNK):
    """PAWS-NN accuracy: every query classified with all supports.

    Args:
        embed_fn: `[b, S, S, C]` preprocessed images -> `[b, D]` embeddings
            (`embedder_from_model` or `embedder_from_saved_model`).
        support_dataset: `(images, labels)` batches of every labeled image,
            each once (`pipeline.make_eval_dataset(labeled, ...)`).
        query_dataset: `(images, labels)` batches of the test images.
        num_classes: K.
        tau: similarity temperature (0.1 in the paper).
        top_k: accuracies to report; those with k > K are left out.
        query_chunk: queries classified at once (see `classify`).

    Returns:
        dict: `top{k}` accuracies (fractions in [0, 1]), `num_support`,
        `num_queries`, and `per_class_accuracy`: top-1 accuracy of the
        queries of each class (None for a class without queries).

    Raises:
        ValueError: labels outside `[0, num_classes)`, an empty dataset, or
            no `top_k` at most `num_classes`.
    """
    ks = [k for k in top_k if k <= num_classes]
    if not ks:
        raise ValueError(f'No top_k in {top_k} is at most the {num_classes} '
                         f'classes.')
    supports, support_labels = embed_dataset(embed_fn, support_dataset,
                                             description='support images')
    queries, query_labels = embed_dataset(embed_fn, query_dataset,
                                          description='queries')
    _check_labels(support_labels, num_classes, 'Support')
    _check_labels(query_labels, num_classes, 'Query')
    missing = num_classes - len(np.unique(support_labels))
    if missing:
        logging.warning('PAWS-NN: %d of %d classes have no support image: '
                        'they get no probability.', missing, num_classes)
    top_ids = classify(queries, supports, support_labels,
                       num_classes=num_classes, tau=tau, k=max(ks),
                       query_chunk=query_chunk)  # [N, max k]
    hits = top_ids == query_labels[:, None]  # [N, max k]
    per_class_hits = np.bincount(query_labels, weights=hits[:, 0],
                                 minlength=num_classes)
    per_class_count = np.bincount(query_labels, minlength=num_classes)
    results = {f'top{k}': float(hits[:, :k].any(axis=1).mean()) for k in ks}
    results.update(
        num_support=len(support_labels), num_queries=len(query_labels),
        per_class_accuracy=[
            float(h / n) if n else None
            for h, n in zip(per_class_hits, per_class_count)])
    return results


def _check_export_preprocessing(export_dir, expected):
    """Raises ValueError if an export's preprocessing differs from ours."""
    stored = export.read_preprocessing(export_dir)
    differences = [
        f'{key}: export {stored.get(key)}, evaluation {value}'
        for key, value in expected.items()
        if (stored.get(key) != value if isinstance(value, str) else
            not np.allclose(stored[key], value, rtol=1e-6, atol=0))]
    if differences:
        raise ValueError(
            f'The SavedModel {export_dir} was exported for another '
            f'preprocessing or embedding than this evaluation: '
            f'{"; ".join(differences)}. Export the run again '
            '(run.py --mode=export).')


def _check_split(labeled, split_file):
    """Raises ValueError unless `labeled` holds exactly the split's images."""
    names = splits.read_split_file(split_file)
    if sorted(names) != sorted(labeled.names):
        raise ValueError(
            f'The labeled set has {labeled.num_examples} images but the '
            f'split file {split_file} lists {len(names)} others: PAWS-NN '
            f'must use exactly the run\'s labeled images as support.')
    logging.info('PAWS-NN: the labeled set matches %s', split_file)


def _write_results(model_dir, results, step):
    """TensorBoard scalars and the JSON file under `model_dir/eval`."""
    eval_dir = os.path.join(model_dir, EVAL_SUBDIR)
    tf.io.gfile.makedirs(eval_dir)
    with tf.summary.create_file_writer(eval_dir).as_default():
        for key, value in results.items():
            if key.startswith('top'):
                tf.summary.scalar(f'paws_nn/{key}', value, step=step)
    path = os.path.join(eval_dir, RESULTS_FILENAME)
    with tf.io.gfile.GFile(path + '.tmp', 'w') as f:
        json.dump(results, f, indent=2)
    tf.io.gfile.rename(path + '.tmp', path, overwrite=True)
    return path


@gin.configurable(denylist=['labeled', 'test', 'model'])
def evaluate_nn(model_dir, *, labeled, test, image_size, crop_fraction, mean,
                std, source='saved_model', model=None, saved_model_dir=None,
                checkpoint_path=None, split_file=None, tau=0.1,
                embedding=None, batch_size=256,
                query_chunk=DEFAULT_QUERY_CHUNK, step=0):
    """Evaluates a run with PAWS-NN and records the result.

    The support is exactly the labeled set, each image embedded once with
    the evaluation preprocessing of `pipeline.make_eval_dataset`; the embedded
    count is checked against `labeled.num_examples` (the official code once
    reported 1% figures computed with the 10% support). Writes top-1/top-5
    as TensorBoard scalars and `model_dir/eval/paws_nn.json`, and prints
    them. Single-process: under a multi-worker strategy only the chief
    should call it.

    Args:
        model_dir: the run's directory.
        labeled: `sources.ImageSource`, the labeled images (the support).
        test: `sources.ImageSource` or `sources.StreamSource`, the queries.
        image_size: S, evaluation crop side.
        crop_fraction: centre crop fraction (0.875 ImageNet, 1 CIFAR-10).
        mean: per-channel normalisation mean.
        std: per-channel normalisation std.
        source: `'saved_model'` (the `export_embedder` output) or
            `'checkpoint'` (restore `model` from a training checkpoint).
        model: for `'checkpoint'`: the `model.PAWSModel` built from the
            run's gin config (`model.build_model`).
        saved_model_dir: default `model_dir/export.EMBEDDER_DIR`.
        checkpoint_path: for `'checkpoint'`: a checkpoint prefix, or a
            directory whose latest checkpoint is used.
        split_file: the run's recorded labeled split; default
            `model_dir/splits.SPLIT_FILENAME` when it exists. The labeled
            set must hold exactly its images.
        tau: similarity temperature.
        embedding: the representation compared, 'projection' or
            'prediction' (`model.PAWSModel.nn_embedding`); an export made
            with another is refused. None: what the export or `model`
            has.
        batch_size: images per embedding batch.
        query_chunk: queries classified at once.
        step: global step of the TensorBoard scalars.

    Returns:
        The `paws_nn` dict, plus `source`, `source_path`, `embedding`,
        `tau`, `split_file` (None if unchecked) and `results_file`.

    Raises:
        ValueError: unknown source, a checkpoint source without `model` or
            `checkpoint_path`,
            an export with another preprocessing, mismatching class names,
            or a labeled set that differs from the split file.
        FileNotFoundError: no export or checkpoint where expected.
        RuntimeError: embedded counts that differ from the sources' sizes.
    """
    if test.class_names and test.class_names != labeled.class_names:
        raise ValueError('The labeled and test sets name their classes '
                         'differently.')
    default_split = os.path.join(model_dir, splits.SPLIT_FILENAME)
    if split_file is None and tf.io.gfile.exists(default_split):
        split_file = default_split
    if split_file is None:
        logging.warning('PAWS-NN: no split file to check the labeled set '
                        'against (%s does not exist).', default_split)
    else:
        _check_split(labeled, split_file)
    if source == 'saved_model':
        path = saved_model_dir or os.path.join(model_dir, export.EMBEDDER_DIR)
        expected = dict(image_size=image_size, crop_fraction=crop_fraction,
                        mean=mean, std=std, channels=labeled.channels)
        if embedding is not None:
            expected['embedding'] = embedding
        _check_export_preprocessing(path, expected)
        embedding = export.read_preprocessing(path).get('embedding')
        embed_fn = embedder_from_saved_model(path)
    elif source == 'checkpoint':
        if model is None or checkpoint_path is None:
            raise ValueError('source="checkpoint" needs `model`, built from '
                             'the run\'s gin config (model.build_model), and '
                             '`checkpoint_path`.')
        if embedding not in (None, model.nn_embedding):
            raise ValueError(
                f'evaluate_nn.embedding = {embedding!r} but the model '
                f'compares {model.nn_embedding!r} (PAWSModel.nn_embedding): '
                'bind one of them to the other.')
        path = restore_model(
            model, checkpoint_path,
            input_shape=(image_size, image_size, labeled.channels))
        embedding = model.nn_embedding
        embed_fn = embedder_from_model(model)
    else:
        raise ValueError(f'Unknown source {source!r}; choose one of '
                         f'{", ".join(SOURCES)}.')
    make_dataset = functools.partial(
        pipeline.make_eval_dataset, batch_size=batch_size,
        image_size=image_size, crop_fraction=crop_fraction, mean=mean,
        std=std)
    num_classes = (len(labeled.class_names) or
                   int(np.max(labeled.labels)) + 1)
    results = paws_nn(embed_fn, make_dataset(labeled), make_dataset(test),
                      num_classes=num_classes, tau=tau,
                      query_chunk=query_chunk)
    for what, embedded, expected in (
            ('support', results['num_support'], labeled.num_examples),
            ('query', results['num_queries'], test.num_examples)):
        if embedded != expected:
            raise RuntimeError(f'Embedded {embedded} {what} images, but the '
                               f'source holds {expected}.')
    results.update(source=source, source_path=path, embedding=embedding,
                   tau=tau, split_file=split_file)
    results['results_file'] = _write_results(model_dir, results, step)
    summary = (f'PAWS-NN ({source} {path}, {embedding} embedding): top-1 '
               f'{100 * results["top1"]:.2f}%'
               + (f', top-5 {100 * results["top5"]:.2f}%'
                  if 'top5' in results else '') +
               f'; support = the {results["num_support"]} labeled images, '
               f'{results["num_queries"]} queries')
    logging.info(summary)
    print(summary)
    return results
