"""PAWS-NN of a model in hand on a run's data: the checks of its labeled
split and export, the evaluation, its results under the run's `eval` and
its classifier export."""

import os
import typing

from absl import logging
import gin
import numpy as np
import tensorflow as tf

from paws_tf import bindings
from paws_tf import checks
from paws_tf.data import pipeline
from paws_tf.data import splits
from paws_tf.evaluation import evaluate
from paws_tf.evaluation import export
from paws_tf import run_dir


class Embedder(typing.NamedTuple):
    """A model in hand for PAWS-NN: `model` (preprocessed images -> dict
    with `embeddings`; a `PAWSModel` with plain variables or an
    `export.LoadedEmbedder`), held on disk as `source` `'saved_model'` (the
    embedder export `path`, whose `preprocessing.json` is `exported`) or
    `'checkpoint'` (the checkpoint prefix `path`)."""
    model: typing.Any
    source: str
    path: str
    exported: typing.Optional[dict] = None


def of_export(export_dir):
    """The `Embedder` of the embedder export `export_dir`."""
    return Embedder(export.LoadedEmbedder(export_dir), 'saved_model',
                    export_dir, export.read_preprocessing(export_dir))


@gin.configurable(
    denylist=['run', 'embedder', 'labeled', 'test', 'classifier', 'image_size',
              'crop_fraction', 'mean', 'std', 'step'])
def evaluate_nn(run, embedder=None, *, labeled, test, image_size,
                crop_fraction, mean, std, tau=0.1, embedding=None, step=0,
                pictures=True, classifier=False, from_model=None):
    """PAWS-NN of `embedder` (`evaluate.PawsNN`) on the chief alone, the
    support exactly the labeled set the run records: TensorBoard's
    `paws_nn_test/*` in `tensorboard/eval`, `eval/paws_nn.json` and a
    printed summary; with `pictures`, `pictures.Pictures`' projector and
    image there and `eval/paws_nn.png`; with `classifier`, the PAWS-NN
    classifier of the same support embeddings (`export_classifier`).

    Args:
        run: the run's `RunDir`.
        embedder: the `Embedder` evaluated; None: `from_model`'s.
        labeled, test: the support and the queries, as for `PawsNN`.
        image_size, crop_fraction, mean, std: the preprocessing.
        embedding: 'projection' or 'prediction' (`PAWSModel.nn_embedding`)
            or None (the embedder's); another one is refused.
        tau, step: as for `PawsNN` and its call (its batch size is
            `PawsNN.batch_size`, at epoch ends too).
        pictures: draw the pictures (`pictures.Pictures`, its defaults).
        from_model: an existing model (an embedder export, or a run
            directory holding one), evaluated when `embedder` is None.

    Returns:
        The `evaluate.paws_nn` dict, plus `source`, `source_path`,
        `embedding`, `tau`, `step`, `split_file` (None if unchecked),
        `results_file`, `figure_file` and with `pictures` `confusion_matrix`.

    Raises:
        checks.DataError: a labeled set other than the split file's
            (`splits.mismatch`).
        ValueError: neither `embedder` nor `from_model`, other class names,
            or another preprocessing or embedding than the export's.
        RuntimeError: as for `PawsNN`'s call.
    """
    embedder = _given(embedder, from_model)
    preprocessing = dict(image_size=image_size, crop_fraction=crop_fraction,
                         mean=mean, std=std)
    split_file = _checked_split(run, labeled)
    embedding = _checked_embedding(
        embedder, embedding, dict(preprocessing, channels=labeled.channels))
    embed_fn = evaluate.embedder_from_model(embedder.model)
    paws_nn = evaluate.PawsNN(
        labeled, test, preprocessing=preprocessing, tau=tau,
        log_dir=run.eval_logs, tag='paws_nn_test',
        pictures=run.nn_figure if pictures else None)
    supports = embed_labeled(embed_fn, labeled, preprocessing,
                             paws_nn.batch_size)
    if classifier:
        export_classifier(run, embedder.model, labeled, preprocessing,
                          channels=labeled.channels, tau=tau,
                          supports=supports)
    os.makedirs(run.eval, exist_ok=True)
    results = paws_nn(embed_fn, step, supports)
    results.update(source=embedder.source, source_path=embedder.path,
                   embedding=embedding, tau=tau, step=step,
                   split_file=split_file,
                   figure_file=run.nn_figure if pictures else None)
    return _recorded(run, results)


def _given(embedder, from_model):
    """`embedder`, else the `Embedder` of `from_model` (`embedder_of`)."""
    if embedder is not None:
        return embedder
    if from_model is None:
        raise ValueError('evaluate_nn needs an embedder, or an existing '
                         'model bound to evaluate_nn.from_model.')
    return of_export(embedder_of(from_model))


def embed_labeled(embed_fn, labeled, preprocessing, batch_size):
    """`evaluate.embed_dataset` of the `labeled` images preprocessed for
    evaluation: PAWS-NN's supports, and the classifier export's."""
    return evaluate.embed_dataset(
        embed_fn, pipeline.make_eval_dataset(labeled, batch_size=batch_size,
                                             **preprocessing),
        description='support images')


def export_classifier(run, model, labeled, preprocessing, *, channels, tau,
                      supports=None):
    """The PAWS-NN classifier of `model` in `run.classifier`, its supports
    the `embed_labeled` `supports` of `labeled` (None: embedded here, in
    batches of `PawsNN.batch_size`)."""
    if supports is None:
        supports = embed_labeled(
            evaluate.embedder_from_model(model), labeled, preprocessing,
            bindings.arguments(evaluate.PawsNN)['batch_size'][0])
    export.export_classifier(
        model, run.classifier, support_embeddings=supports[0],
        support_labels=supports[1], class_names=labeled.class_names,
        tau=tau, channels=channels, **preprocessing)


def _recorded(run, results):
    """`evaluate_nn`'s `results`, written to `run.nn_results` (their
    `results_file`), summed up on stdout (the mode's result; not logged
    too, which would show it twice)."""
    run.write_json(run.nn_results, results)
    results['results_file'] = run.nn_results
    top5 = (f', top-5 {100 * results["top5"]:.2f}%' if 'top5' in results
            else '')
    print(f'PAWS-NN ({results["source"]} {results["source_path"]}, '
          f'{results["embedding"]} embedding): top-1 '
          f'{100 * results["top1"]:.2f}%{top5}; support = the '
          f'{results["num_support"]} labeled images, '
          f'{results["num_queries"]} queries')
    return results


def embedder_of(path, name='evaluate_nn.from_model'):
    """The embedder export of the existing model `path`: `path` itself, or
    the `RunDir.embedder` of the run directory `path`; `checks.ConfigError`
    naming the binding `name` (the user's, such as a macro) and the fix if
    neither holds one."""
    embedder = run_dir.RunDir(path).embedder
    for candidate in (path, embedder):
        if tf.io.gfile.exists(
                os.path.join(candidate, export.PREPROCESSING_FILENAME)):
            return candidate
    raise checks.ConfigError(
        f'{name} = {path!r} is neither an embedder export nor a run '
        f'directory with one ({embedder}): export it first (run.py '
        f'--mode=export --model_dir={path} with its config).')


def _checked_embedding(embedder, embedding, expected):
    """The embedding `embedder` compares; ValueError if it is not
    `embedding` (when not None), or its export's preprocessing is not
    `expected`."""
    model_embedding = embedder.model.nn_embedding
    if embedder.exported is None:
        if embedding not in (None, model_embedding):
            raise ValueError(
                f'evaluate_nn.embedding = {embedding!r} but the model '
                f'compares {model_embedding!r} (PAWSModel.nn_embedding): '
                'bind one of them to the other.')
        return model_embedding
    if embedding is not None:
        expected['embedding'] = embedding
    stored = embedder.exported
    differences = [
        f'{key}: export {stored.get(key)}, evaluation {value}'
        for key, value in expected.items()
        if (stored.get(key) != value if isinstance(value, str) else
            not np.allclose(stored[key], value, rtol=1e-6, atol=0))]
    if differences:
        raise ValueError(
            f'The SavedModel {embedder.path} was exported for another '
            f'preprocessing or embedding than this evaluation: '
            f'{"; ".join(differences)}. Export the run again '
            '(run.py --mode=export).')
    return stored.get('embedding')


def _checked_split(run, labeled):
    """The run's split file, whose images `labeled` must hold exactly, or
    None when there is none; raises `checks.DataError` if it differs."""
    if not tf.io.gfile.exists(run.split):
        logging.warning('PAWS-NN: no split file to check the labeled set '
                        'against (%s does not exist).', run.split)
        return None
    detail = splits.mismatch(run.split, labeled)
    if detail is not None:
        raise checks.DataError(
            f'The labeled set is not the one {run.split} records: '
            f'{detail}. PAWS-NN\'s support is exactly the run\'s labeled '
            'images: give it those.')
    logging.info('PAWS-NN: the labeled set matches %s', run.split)
    return run.split
