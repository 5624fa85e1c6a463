"""PAWS-NN of a run: the checks of its labeled split and export, the
evaluation, and its results under `model_dir/eval`."""

import functools
import json
import os

from absl import logging
import gin
import numpy as np
import tensorflow as tf

from paws_tf import checkpoints
from paws_tf.data import pipeline
from paws_tf.data import splits
from paws_tf.evaluation import evaluate
from paws_tf.evaluation import export

SOURCES = ('saved_model', 'checkpoint')
EVAL_SUBDIR = 'eval'
# The run's TensorBoard directory (`runner.train.TENSORBOARD_DIR`) and the
# run of the evaluations in it.
TENSORBOARD_DIR = 'tensorboard'
TENSORBOARD_EVAL = os.path.join(TENSORBOARD_DIR, 'eval')
RESULTS_FILENAME = 'paws_nn.json'


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
    """The JSON file under `model_dir/eval`, and TensorBoard scalars in
    `model_dir/tensorboard/eval` beside the training's PAWS-NN curve (which
    may use fewer test images): `paws_nn_test/top1`, `.../top5`."""
    eval_dir = os.path.join(model_dir, EVAL_SUBDIR)
    tf.io.gfile.makedirs(eval_dir)
    writer = tf.summary.create_file_writer(
        os.path.join(model_dir, TENSORBOARD_EVAL))
    with writer.as_default():
        for key, value in results.items():
            if key.startswith('top'):
                tf.summary.scalar(f'paws_nn_test/{key}', value, step=step)
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
                query_chunk=evaluate.DEFAULT_QUERY_CHUNK, step=0):
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
        The `evaluate.paws_nn` dict, plus `source`, `source_path`, `embedding`,
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
        embed_fn = evaluate.embedder_from_saved_model(path)
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
        model(tf.zeros([1, image_size, image_size, labeled.channels]),
              training=False)
        path = checkpoints.load(checkpoint_path, model)
        embedding = model.nn_embedding
        embed_fn = evaluate.embedder_from_model(model)
    else:
        raise ValueError(f'Unknown source {source!r}; choose one of '
                         f'{", ".join(SOURCES)}.')
    make_dataset = functools.partial(
        pipeline.make_eval_dataset, batch_size=batch_size,
        image_size=image_size, crop_fraction=crop_fraction, mean=mean,
        std=std)
    num_classes = (len(labeled.class_names) or
                   int(np.max(labeled.labels)) + 1)
    results = evaluate.paws_nn(embed_fn, make_dataset(labeled),
                               make_dataset(test), num_classes=num_classes,
                               tau=tau, query_chunk=query_chunk)
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
