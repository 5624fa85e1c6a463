"""PAWS-NN of a run: the checks of its labeled split and export, the
evaluation, and its results under `model_dir/eval`."""

import os

from absl import logging
import gin
import numpy as np
import tensorflow as tf

from paws_tf import checks
from paws_tf.data import splits
from paws_tf.evaluation import evaluate
from paws_tf.evaluation import export
from paws_tf import run_dir


@gin.configurable(denylist=['labeled', 'test', 'model'])
def evaluate_nn(model_dir, *, labeled, test, image_size, crop_fraction, mean,
                std, source='saved_model', model=None, saved_model_dir=None,
                checkpoint_path=None, tau=0.1, embedding=None, batch_size=256,
                step=0, pictures=True, from_model=None):
    """PAWS-NN of a run (`evaluate.PawsNN`), the support exactly the
    labeled set checked against the run's split file (if any): TensorBoard's
    `paws_nn_test/*` in `tensorboard/eval`, `eval/paws_nn.json` and a
    printed summary; with `pictures`, `pictures.Pictures`' projector and
    image there and `eval/paws_nn.png`. Single-process (the chief alone).

    Args:
        model_dir: the run's directory.
        labeled, test: the support and the queries, as for `PawsNN`.
        image_size, crop_fraction, mean, std: the preprocessing.
        source: `'saved_model'` (the `export_embedder` output in
            `saved_model_dir`, default `RunDir.embedder`) or `'checkpoint'`
            (`model`, the `model.PAWSModel` restored from the checkpoint
            prefix `checkpoint_path`, which is recorded).
        embedding: 'projection' or 'prediction' (`PAWSModel.nn_embedding`)
            or None (the export's or `model`'s); another one is refused.
        tau, batch_size, step: as for `PawsNN` and its call.
        pictures: draw the pictures (`pictures.Pictures`, its defaults).
        from_model: an existing model evaluated instead of the run's (an
            embedder export or a run directory, `embedder_of`): what
            `--mode=evaluate_nn` runs on the config's data.

    Returns:
        The `evaluate.paws_nn` dict, plus `source`, `source_path`,
        `embedding`, `tau`, `split_file` (None if unchecked), `results_file`,
        `figure_file` and with `pictures` `confusion_matrix`.

    Raises:
        ValueError: unknown source, checkpoint source without `model` or
            `checkpoint_path`, another preprocessing or embedding, other
            class names, or a labeled set not the split file's.
        FileNotFoundError: no export where expected.
        RuntimeError: as for `PawsNN`'s call.
    """
    run = run_dir.RunDir(model_dir)
    if from_model is not None:
        source, saved_model_dir = 'saved_model', embedder_of(from_model)
    preprocessing = dict(image_size=image_size, crop_fraction=crop_fraction,
                         mean=mean, std=std)
    split_file = _checked_split(run, labeled)
    path, embedding, embed_fn = _embedder(
        source, embedding, dict(preprocessing, channels=labeled.channels),
        saved_model_dir=saved_model_dir or run.embedder, model=model,
        checkpoint_path=checkpoint_path)
    os.makedirs(run.eval, exist_ok=True)
    results = evaluate.PawsNN(
        labeled, test, preprocessing=preprocessing, tau=tau,
        log_dir=run.eval_logs, tag='paws_nn_test', batch_size=batch_size,
        pictures=pictures and run.nn_figure)(embed_fn, step)
    results.update(source=source, source_path=path, embedding=embedding,
                   tau=tau, split_file=split_file,
                   figure_file=pictures and run.nn_figure or None)
    run.write_json(run.nn_results, results)
    results['results_file'] = run.nn_results
    _summary(results)
    return results


def _summary(results):
    """Prints the line that sums `evaluate_nn`'s `results` up (the mode's
    result, on stdout; not logged too, which would show it twice)."""
    top5 = (f', top-5 {100 * results["top5"]:.2f}%' if 'top5' in results
            else '')
    summary = (f'PAWS-NN ({results["source"]} {results["source_path"]}, '
               f'{results["embedding"]} embedding): top-1 '
               f'{100 * results["top1"]:.2f}%{top5}; support = the '
               f'{results["num_support"]} labeled images, '
               f'{results["num_queries"]} queries')
    print(summary)


def embedder_of(path, name='evaluate_nn.from_model'):
    """The embedder export of the existing model `path`: `path` itself, or
    the `RunDir.embedder` of the run directory `path`.

    Raises:
        checks.ConfigError: neither holds an export, naming the binding
            `name` (the user's, such as a macro) and the fix.
    """
    for candidate in (path, run_dir.RunDir(path).embedder):
        if tf.io.gfile.exists(
                os.path.join(candidate, export.PREPROCESSING_FILENAME)):
            return candidate
    raise checks.ConfigError(
        f'{name} = {path!r} is neither an embedder export nor a run '
        f'directory with one ({run_dir.RunDir(path).embedder}): export it '
        f'first (run.py --mode=export --model_dir={path} with its config).')


def _embedder(source, embedding, expected, *, saved_model_dir, model,
              checkpoint_path):
    """`(path, embedding, embed_fn)` of `evaluate_nn`'s `source`; raises
    ValueError if its preprocessing or embedding (when not None) differs
    from the `expected` one."""
    checks.one_of('evaluate_nn.source', source, ('saved_model', 'checkpoint'))
    if source == 'saved_model':
        stored = export.read_preprocessing(saved_model_dir)
        if embedding is not None:
            expected['embedding'] = embedding
        differences = [
            f'{key}: export {stored.get(key)}, evaluation {value}'
            for key, value in expected.items()
            if (stored.get(key) != value if isinstance(value, str) else
                not np.allclose(stored[key], value, rtol=1e-6, atol=0))]
        if differences:
            raise ValueError(
                f'The SavedModel {saved_model_dir} was exported for another '
                f'preprocessing or embedding than this evaluation: '
                f'{"; ".join(differences)}. Export the run again '
                '(run.py --mode=export).')
        return (saved_model_dir, stored.get('embedding'),
                evaluate.embedder_from_saved_model(saved_model_dir))
    if model is None or checkpoint_path is None:
        raise ValueError('source="checkpoint" needs `model`, restored from '
                         'the run\'s checkpoint, and `checkpoint_path`.')
    if embedding not in (None, model.nn_embedding):
        raise ValueError(
            f'evaluate_nn.embedding = {embedding!r} but the model '
            f'compares {model.nn_embedding!r} (PAWSModel.nn_embedding): '
            'bind one of them to the other.')
    return (checkpoint_path, model.nn_embedding,
            evaluate.embedder_from_model(model))


def _checked_split(run, labeled):
    """The run's split file, whose images `labeled` must hold exactly, or
    None when there is none; raises ValueError if it differs."""
    if not tf.io.gfile.exists(run.split):
        logging.warning('PAWS-NN: no split file to check the labeled set '
                        'against (%s does not exist).', run.split)
        return None
    names = splits.read_split_file(run.split)
    if sorted(names) != sorted(labeled.names):
        raise ValueError(
            f'The labeled set has {labeled.num_examples} images but the '
            f'split file {run.split} lists {len(names)} others: PAWS-NN '
            f'must use exactly the run\'s labeled images as support.')
    logging.info('PAWS-NN: the labeled set matches %s', run.split)
    return run.split
