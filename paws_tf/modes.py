"""What each run.py mode does after training: restore, export, evaluate."""

import os
import time

from absl import logging
import numpy as np

from paws_tf import checkpoints
from paws_tf import checks
from paws_tf import data
from paws_tf import dist
from paws_tf import evaluate
from paws_tf import experiment
from paws_tf import export
from paws_tf import fine_tune
from paws_tf import report
from paws_tf import supervised
from paws_tf import train

MODES = ('train', 'evaluate_nn', 'fine_tune', 'export', 'train_and_evaluate',
         'demo')
EMBED_BATCH_SIZE = 256


def load_trained_model(model_dir, strategy):
    """The run's data and its model restored from the newest checkpoint
    that can be restored (damaged newer ones are skipped with a warning).

    Returns:
        `(model, bundle, step)`: the `PAWSModel` built from the gin config,
        the `experiment.DataBundle`, and the checkpoint's global step.

    Raises:
        FileNotFoundError: the run has no checkpoint yet.
        checkpoints.NoneRestorable: none of its checkpoints restores.
    """
    bundle = experiment.load_data(model_dir)
    pretrain = data.make_pretrain_dataset_fn(
        bundle.unlabeled, bundle.labeled,
        num_replicas=strategy.num_replicas_in_sync,
        normalization=bundle.normalization)
    preprocessing = experiment.eval_preprocessing(bundle)
    size = preprocessing['image_size']
    # Float32 whatever the training precision: portable exports.
    train.set_precision('float32')
    model = train.build_model(strategy, pretrain,
                              input_channels=bundle.labeled.channels)
    checkpoint_dir = os.path.join(model_dir, train.CHECKPOINT_DIR)
    path, step, skipped = checkpoints.newest_restorable(checkpoint_dir)
    if skipped and path is None:
        raise checkpoints.NoneRestorable(
            f'No checkpoint of {model_dir} can be restored; tried:\n  ' +
            '\n  '.join(skipped))
    if skipped:
        logging.warning('Skipping checkpoints that cannot be restored:\n  '
                        '%s\nReading %s (step %d).', '\n  '.join(skipped),
                        path, step)
    with strategy.scope():
        # No checkpoint at all: restore_model names what it expected.
        evaluate.restore_model(model, path or checkpoint_dir, input_shape=(
            size, size, bundle.labeled.channels))
    return model, bundle, step


def export_run(model_dir, strategy, model, bundle):
    """Writes the embedder and the PAWS-NN classifier SavedModels.

    Every worker calls it (non-chiefs write to deleted temporary
    directories); the classifier bundles the embeddings of exactly the
    run's labeled images.
    """
    preprocessing = experiment.eval_preprocessing(bundle)
    channels = bundle.labeled.channels
    export.export_embedder(model, os.path.join(model_dir, export.EMBEDDER_DIR),
                           channels=channels, strategy=strategy,
                           **preprocessing)
    supports, labels = evaluate.embed_dataset(
        evaluate.embedder_from_model(model),
        data.make_eval_dataset(bundle.labeled, batch_size=EMBED_BATCH_SIZE,
                               **preprocessing),
        description='labeled images')
    export.export_classifier(
        model, os.path.join(model_dir, export.CLASSIFIER_DIR),
        support_embeddings=supports, support_labels=labels,
        class_names=bundle.labeled.class_names, tau=model.tau,
        channels=channels, strategy=strategy, **preprocessing)
    logging.info('Exported the embedder and the classifier under %s/export.',
                 model_dir)


def evaluate_run(model_dir, strategy, bundle, *, model, step=0):
    """PAWS-NN of the run on its test split (chief only).

    Reads the exported embedder when there is one, else the checkpoint.
    """
    if not dist.is_chief(strategy):
        return None
    if bundle.test is None:
        raise ValueError('No test split is configured (load_data.test): '
                         'nothing to evaluate PAWS-NN on.')
    embedder_dir = os.path.join(model_dir, export.EMBEDDER_DIR)
    if os.path.isdir(embedder_dir):
        kwargs = dict(source='saved_model', saved_model_dir=embedder_dir)
    else:
        kwargs = dict(source='checkpoint', model=model, checkpoint_path=(
            os.path.join(model_dir, train.CHECKPOINT_DIR)))
    return evaluate.evaluate_nn(
        model_dir, labeled=bundle.labeled, test=bundle.test, tau=model.tau,
        embedding=model.nn_embedding, step=step, **kwargs,
        **experiment.eval_preprocessing(bundle))


def demo(model_dir, strategy, *, overwrite=False):
    """The paper's pipeline against a supervised-only baseline on the same
    labels.

    PAWS pre-training, export and PAWS-NN; then the configured fine-tuning
    protocol (`fine_tune.fine_tune`; the demo configs bind the CIFAR-10
    one: SuNCEt fine-tuning on the labeled images, then PAWS-NN of the
    final model); then the baseline (`supervised.train_supervised`, same
    backbone and augmentations, only the labeled images). Writes
    `results.json`, `results.png` and prints a table.

    Args:
        model_dir: the run directory.
        strategy: the `tf.distribute.Strategy`.
        overwrite: passed to `train.train`.

    Returns:
        The results dict (also in `model_dir/results.json`).
    """
    start = time.perf_counter()
    train.train(model_dir, strategy, overwrite=overwrite)
    paws_seconds = time.perf_counter() - start
    model, bundle, step = load_trained_model(model_dir, strategy)
    export_run(model_dir, strategy, model, bundle)
    paws = evaluate_run(model_dir, strategy, bundle, model=model, step=step)
    preprocessing = experiment.eval_preprocessing(bundle)
    tune_start = time.perf_counter()
    tuned = fine_tune.fine_tune(model_dir, model, labeled=bundle.labeled,
                                test=bundle.test, strategy=strategy,
                                **preprocessing)
    tune_seconds = time.perf_counter() - tune_start
    if not dist.is_chief(strategy):
        return None
    baseline = supervised.train_supervised(
        model_dir, labeled=bundle.labeled, test=bundle.test,
        preprocessing=preprocessing)
    embeddings, labels = evaluate.embed_dataset(
        evaluate.embedder_from_saved_model(
            os.path.join(model_dir, export.EMBEDDER_DIR)),
        data.make_eval_dataset(bundle.test, batch_size=EMBED_BATCH_SIZE,
                               **preprocessing), description='test images')
    log_dir = os.path.join(model_dir, train.TENSORBOARD_DIR)
    _, views_per_second = report.read_scalars(
        os.path.join(log_dir, 'train'), 'throughput/views_per_second')
    per_class = np.bincount(bundle.labeled.labels)
    results = dict(
        paws_nn_top1=paws['top1'], paws_nn_top5=paws.get('top5'),
        paws_finetune_top1=tuned['top1'], finetune_protocol=tuned['protocol'],
        supervised_top1=baseline['top1'],
        labels_per_class=(int(per_class[0]) if np.all(per_class ==
                                                      per_class[0])
                          else per_class.tolist()),
        num_labeled=bundle.labeled.num_examples,
        num_unlabeled=bundle.unlabeled.num_examples,
        num_test=paws['num_queries'], seed=checks.bound('train.seed', 0),
        paws_train_seconds=paws_seconds, finetune_seconds=tune_seconds,
        supervised_seconds=baseline['wall_seconds'],
        images_per_second=float(np.median(views_per_second))
        if len(views_per_second) else None,
        wall_seconds=time.perf_counter() - start)
    results_path = report.write_results(model_dir, results)
    report.write_figure(
        os.path.join(model_dir, report.FIGURE_FILENAME), log_dir=log_dir,
        embeddings=embeddings.numpy(), labels=labels,
        class_names=bundle.labeled.class_names,
        fine_tune_by_epoch=tuned.get('paws_nn_by_epoch'),
        supervised_top1=baseline['top1'],
        title=f'PAWS-NN {100 * results["paws_nn_top1"]:.1f}%, fine-tuned '
        f'{100 * results["paws_finetune_top1"]:.1f}% vs supervised '
        f'{100 * results["supervised_top1"]:.1f}% top-1 '
        f'({results["num_labeled"]} labels)')
    print(report.table([
        {'method': 'PAWS-NN', 'top-1': f'{100 * paws["top1"]:.2f}%',
         'wall time': f'{paws_seconds:.0f} s (pre-training)',
         'images/s': f'{results["images_per_second"] or 0:.0f} views/s'},
        {'method': 'PAWS-NN, fine-tuned',
         'top-1': f'{100 * tuned["top1"]:.2f}%',
         'wall time': f'{tune_seconds:.0f} s (fine-tuning)', 'images/s': ''},
        {'method': 'supervised only',
         'top-1': f'{100 * baseline["top1"]:.2f}%',
         'wall time': f'{baseline["wall_seconds"]:.0f} s',
         'images/s': f'{baseline["images_per_second"]:.0f} images/s'},
    ]))
    print(f'total wall time {results["wall_seconds"]:.0f} s; results in '
          f'{results_path}, figure in '
          f'{os.path.join(model_dir, report.FIGURE_FILENAME)}')
    return results


def run(model_dir, strategy, mode, *, overwrite=False):
    """Runs one of run.py's modes (`MODES`, see run.py).

    `overwrite` (run.py's --overwrite) is passed to `train.train`.

    Returns:
        The PAWS-NN results for modes that evaluate, else None.
    """
    if mode not in MODES:
        raise ValueError(f'Unknown mode {mode!r}; choose one of {MODES}.')
    if mode == 'demo':
        return demo(model_dir, strategy, overwrite=overwrite)
    if mode in ('train', 'train_and_evaluate'):
        train.train(model_dir, strategy, overwrite=overwrite)
        if mode == 'train':
            return None
    model, bundle, step = load_trained_model(model_dir, strategy)
    if mode == 'fine_tune':
        return fine_tune.fine_tune(model_dir, model, labeled=bundle.labeled,
                                   test=bundle.test, strategy=strategy,
                                   **experiment.eval_preprocessing(bundle))
    if mode in ('export', 'train_and_evaluate'):
        export_run(model_dir, strategy, model, bundle)
    if mode in ('evaluate_nn', 'train_and_evaluate'):
        return evaluate_run(model_dir, strategy, bundle, model=model,
                            step=step)
    return None
