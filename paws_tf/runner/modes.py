"""What each run.py mode does after training: restore, export, evaluate."""

import os

from absl import logging

from paws_tf import checkpoints
from paws_tf.data import pipeline
from paws_tf import dist
from paws_tf.evaluation import evaluate
from paws_tf.evaluation import export
from paws_tf.evaluation import fine_tune
from paws_tf.runner import experiment
from paws_tf.runner import train

MODES = ('train', 'evaluate_nn', 'fine_tune', 'export', 'train_and_evaluate')
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
    pretrain = pipeline.make_pretrain_dataset_fn(
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
        pipeline.make_eval_dataset(bundle.labeled, batch_size=EMBED_BATCH_SIZE,
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


def run(model_dir, strategy, mode, *, overwrite=False, owner_check=None):
    """Runs one of run.py's modes (`MODES`, see run.py).

    `overwrite` (run.py's --overwrite) and `owner_check` (the run lock's
    check before every save) are passed to `train.train`.

    Returns:
        The PAWS-NN results for modes that evaluate, else None.
    """
    if mode not in MODES:
        raise ValueError(f'Unknown mode {mode!r}; choose one of {MODES}.')
    if mode in ('train', 'train_and_evaluate'):
        train.train(model_dir, strategy, overwrite=overwrite,
                    owner_check=owner_check)
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
