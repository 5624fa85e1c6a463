"""The ImageNet fine-tuning protocol of PAWS App. A: a classifier on the
pre-trained network, trained on the labeled images, tested centre-cropped.

`selection='best_epoch'` (the official `fine_tune.py`, `imgnt_fine_tune.yaml`):
one setting, scored on a validation set after each epoch; its best epoch is
tested. `selection='sweep'` (the paper's text): each (learning rate, epochs)
pair is scored on a held-out split of the labeled images; the best is
retrained on them all and tested. Ties go to the first.
"""

import functools
import math
import os

from absl import logging
import gin
import numpy as np
import tensorflow as tf
import tf_keras

from paws_tf import checkpoints
from paws_tf import checks
from paws_tf import cluster
from paws_tf.data import pipeline
from paws_tf.evaluation import tuning
from paws_tf import schedules

HOLDOUT_FILENAME = 'holdout.txt'
SELECTIONS = ('best_epoch', 'sweep')
# tf_keras weight prefix in the output directory; load it into
# `build_classifier(model, num_classes)`.
CLASSIFIER_WEIGHTS = 'classifier'
# `sampling.derive_seed` tags of the input's order and views, not sampling's.
_TRAIN_TAGS = (101, 102)


def build_classifier(model, num_classes):
    """Backbone -> fc1 -> bn1 -> the head's activation -> linear layer
    initialised to zero, images -> float32 `[B, num_classes]` logits, of
    copies of `model`'s layers made in the current strategy scope (all but
    BN statistics trainable).

    PAWS App. A follows SimCLRv2: fine-tune from the first layer of the
    projection head. An imported backbone (`tuning.headless`), which has
    no head, is fine-tuned from its features. ValueError if the projection
    head has no hidden layer.
    """
    if tuning.headless(model):
        return _linear_classifier(
            *tuning.copy_layers([model.backbone]), num_classes)  # [B, F]
    head = model.projection_head
    first = head.mlp_layers[:3]
    activation = f'{head.activation}1'
    if [layer.name for layer in first] != ['fc1', 'bn1', activation]:
        raise ValueError(f'The projection head has no fc1 -> bn1 -> '
                         f'{activation} layer to fine-tune from (num_layers '
                         '>= 2).')
    return _linear_classifier(
        *tuning.copy_layers([model.backbone] + first), num_classes)  # [B, H]


def _linear_classifier(inputs, hidden, num_classes):
    """`inputs` -> `hidden` -> a linear layer initialised to zero."""
    logits = tf_keras.layers.Dense(
        num_classes, kernel_initializer='zeros', bias_initializer='zeros',
        dtype='float32', name='classifier')(hidden)
    return cluster.report_results_once(
        tf_keras.Model(inputs, logits, name='fine_tune_classifier'))


def _optimizer(learning_rate, total_steps, *, momentum):
    """Nesterov SGD without weight decay, the rate cosine-decayed to 0.

    SimCLR(v2) fine-tuning decays with a cosine and no warm-up (google-
    research/simclr `--optimizer=momentum --warmup_epochs=0`: Nesterov SGD
    with `WarmUpAndCosineDecay`), as does the official PAWS `fine_tune.py`.
    tf_keras' Nesterov update: `v = mu v - lr g; w += mu v - lr g`.
    """
    schedule = schedules.cosine_decay(total_steps, 1, learning_rate, 0.0)
    return tf_keras.optimizers.SGD(schedule, momentum=momentum, nesterov=True)


def split_holdout(labels, holdout, seed):
    """`(train, held_out)`, disjoint sorted int64 positions covering the
    int [N] `labels`: a class-stratified draw (`seed`) of `holdout` images
    (a count, or a float fraction of N), every class giving its share
    rounded by largest remainder. ValueError for a count outside [1, N) or
    a class left without training images."""
    labels = np.asarray(labels)
    count = (round(holdout * labels.size) if isinstance(holdout, float)
             else int(holdout))
    if not 0 < count < labels.size:
        raise ValueError(f'holdout={holdout!r} gives {count} held-out images '
                         f'of {labels.size} labeled: need 1 to N - 1.')
    class_ids, sizes = np.unique(labels, return_counts=True)
    share = count * sizes / labels.size
    quota = np.floor(share).astype(np.int64)
    quota[np.argsort(quota - share, kind='stable')[:count - quota.sum()]] += 1
    if np.any(quota >= sizes):
        raise ValueError(
            f'holdout={holdout!r} leaves class(es) '
            f'{class_ids[quota >= sizes][:5].tolist()} without training '
            'images: hold out fewer images.')
    rng = np.random.default_rng(seed)
    held = np.sort(np.concatenate([
        rng.choice(np.flatnonzero(labels == c), q, replace=False)
        for c, q in zip(class_ids, quota)]))
    return np.setdiff1d(np.arange(labels.size), held), held


def _train_classifier(model, source, *, strategy, num_classes,
                      learning_rate, epochs, global_batch_size, image_size,
                      mean, std, crop_scale, momentum, seed, log_dir=None,
                      callbacks=()):
    """A fresh `build_classifier` network trained on `source` (App. A):
    softmax cross-entropy on random resized crops (torchvision's default
    scale, as the official code and SimCLR) flipped at random, an epoch
    ceil(N / global_batch_size) steps of a stream reshuffled every pass."""
    steps_per_epoch = math.ceil(source.num_examples / global_batch_size)
    with strategy.scope():
        classifier = build_classifier(model, num_classes)
        classifier.compile(
            optimizer=_optimizer(learning_rate, steps_per_epoch * epochs,
                                 momentum=momentum),
            loss=tf_keras.losses.SparseCategoricalCrossentropy(
                from_logits=True),
            metrics=[tf_keras.metrics.SparseCategoricalAccuracy(name='top1'),
                     tf_keras.metrics.SparseTopKCategoricalAccuracy(
                         k=5, name='top5')])
        # Slots made now spare `fit` a second trace of its step.
        classifier.optimizer.build(classifier.trainable_variables)
    dataset = strategy.distribute_datasets_from_function(
        tuning.views_dataset_fn(
            source, global_batch_size, strategy.num_replicas_in_sync, seed,
            _TRAIN_TAGS, size=image_size, scale=crop_scale,
            color_strength=0.0, blur_prob=0.0, mean=mean, std=std))
    classifier.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch,
                   callbacks=list(callbacks) + tuning.callbacks(log_dir))
    return classifier


class _BestEpoch(tf_keras.callbacks.Callback):
    """Leaves the classifier with the weights of its first epoch of best
    validation top-1 (suncet `fine_tune.py` saves a checkpoint whenever
    top-1 beats the best)."""

    def __init__(self, dataset):
        super().__init__()
        self.dataset, self.top1_by_epoch = dataset, []
        self.best_epoch = self._best_weights = None

    def on_epoch_end(self, epoch, logs=None):
        top1 = _scores(self.model, self.dataset)['top1']
        logging.info('Fine-tuning epoch %d: validation top-1 %.4f', epoch + 1,
                     top1)
        if top1 > max(self.top1_by_epoch, default=-1):
            self.best_epoch = epoch + 1
            self._best_weights = self.model.get_weights()
        self.top1_by_epoch.append(top1)

    def on_train_end(self, logs=None):
        checkpoints.assign_weights(self.model, self._best_weights)


def _scores(classifier, dataset):
    scores = classifier.evaluate(dataset, return_dict=True, verbose=0)
    return {name: float(value) for name, value in scores.items()}


@gin.configurable(denylist=tuning.PASSED)
def fine_tune_linear(model, labeled, test, *, output_dir, image_size,
                     crop_fraction, mean, std, strategy=None, seed=0,
                     log_dir=None, selection='sweep', validation=None,
                     learning_rates=(0.01, 0.02, 0.05, 0.1, 0.2),
                     epochs=(30, 50), holdout=12000, global_batch_size=1024,
                     crop_scale=(0.08, 1.0), momentum=0.9,
                     eval_batch_size=256):
    """PAWS App. A (the module's docstring): `(classifier, results)`, the
    held-out names (sweep), weights and results JSON in `output_dir`, the
    TensorBoard logs of each training (`sweep/*`, `final`) in `log_dir`.
    Bad arguments raise ValueError before any training.

    Args:
        model, labeled, test, image_size, crop_fraction, mean, std,
            strategy, seed: as in `fine_tune.fine_tune`; `crop_fraction` is
            for evaluation (training takes random crops).
        selection: one of `SELECTIONS`.
        validation: for 'best_epoch': a callable returning the labeled
            validation source (`tfds_sources.imagenet_validation`).
        learning_rates, epochs: the sweep (BYOL's protocol); one of each
            for 'best_epoch'.
        holdout: for 'sweep': held-out images, a count (paper: 12000) or a
            fraction.
        global_batch_size, crop_scale, momentum: images per step over all
            replicas, area range of the training crops, Nesterov momentum.
        eval_batch_size: batch of the held-out and test passes.
    """
    strategy = strategy or tf.distribute.get_strategy()
    num_classes = _checked_classes(labeled, strategy, global_batch_size,
                                   learning_rates, epochs, selection,
                                   validation)
    train = dict(strategy=strategy, num_classes=num_classes,
                 global_batch_size=global_batch_size, image_size=image_size,
                 mean=mean, std=std, crop_scale=crop_scale, momentum=momentum,
                 seed=seed)
    evaluation = dict(batch_size=eval_batch_size, image_size=image_size,
                      crop_fraction=crop_fraction, mean=mean, std=std)
    test_dataset = pipeline.make_eval_dataset(test, **evaluation)
    os.makedirs(output_dir, exist_ok=True)
    select = dict(best_epoch=functools.partial(_best_epoch, validation),
                  sweep=functools.partial(_sweep, holdout, output_dir))
    classifier, entries = select[selection](
        model, labeled, log_dir=log_dir, learning_rates=learning_rates,
        epochs=epochs, train=train, evaluation=evaluation)
    results = _tested(classifier, test_dataset, selection, entries)
    tuning.write_outputs(strategy, output_dir, classifier, CLASSIFIER_WEIGHTS,
                         results)
    return classifier, results


def _tested(classifier, test_dataset, selection, entries):
    """The chosen `classifier`'s test scores and its `selection`'s
    `entries`."""
    scores = _scores(classifier, test_dataset)
    chosen = entries.get('best') or {
        key: entries[key] for key in ('learning_rate', 'epochs', 'best_epoch')}
    logging.info('Fine-tuned by %s, %s: test %s', selection, chosen, scores)
    return dict(protocol='imagenet', selection=selection,
                top1=scores['top1'], top5=scores.get('top5'), test=scores,
                **entries, weights=CLASSIFIER_WEIGHTS)


def _checked_classes(labeled, strategy, global_batch_size, learning_rates,
                     epochs, selection, validation):
    """The class count; ValueError for a bad `fine_tune_linear` argument."""
    num_classes = tuning.num_classes(labeled)
    checks.per_replica('fine_tune_linear.global_batch_size',
                       global_batch_size, strategy.num_replicas_in_sync)
    if not learning_rates or not epochs:
        raise ValueError('Give at least one learning rate and epoch count.')
    checks.one_of('fine_tune_linear.selection', selection, SELECTIONS)
    if selection == 'best_epoch' and validation is None:
        raise ValueError(
            "fine_tune_linear.selection = 'best_epoch' needs a validation "
            'set: bind fine_tune_linear.validation (ImageNet: '
            "@imagenet_validation), or fine_tune_linear.selection = 'sweep'.")
    if selection == 'best_epoch' and (len(learning_rates) != 1
                                      or len(epochs) != 1):
        raise ValueError(
            "fine_tune_linear.selection = 'best_epoch' trains one setting: "
            f'give one learning rate and one epoch count, not '
            f'{tuple(learning_rates)} x {tuple(epochs)}.')
    return num_classes


def _sweep(holdout, output_dir, model, labeled, *, log_dir, learning_rates,
           epochs, train, evaluation):
    """`fine_tune_linear`'s network and results by sweep."""
    seed = train['seed']
    train_positions, held = split_holdout(labeled.labels, holdout, seed)
    train_source = labeled.subset(train_positions)
    held_dataset = pipeline.make_eval_dataset(labeled.subset(held),
                                              **evaluation)
    holdout_file = os.path.join(output_dir, HOLDOUT_FILENAME)
    if cluster.is_chief(train['strategy']):
        with open(holdout_file, 'w') as f:
            f.writelines(f'{labeled.names[p]}\n' for p in held)
    sweep = []
    for learning_rate in learning_rates:
        for num_epochs in epochs:
            classifier = _train_classifier(
                model, train_source, learning_rate=learning_rate,
                epochs=num_epochs,
                log_dir=log_dir and os.path.join(
                    log_dir, 'sweep', f'lr{learning_rate:g}_ep{num_epochs}'),
                **train)
            sweep.append(dict(learning_rate=learning_rate, epochs=num_epochs,
                              **_scores(classifier, held_dataset)))
            logging.info('Fine-tuning sweep, held-out: %s', sweep[-1])
    best = max(sweep, key=lambda entry: entry['top1'])
    best = {'learning_rate': best['learning_rate'], 'epochs': best['epochs']}
    classifier = _train_classifier(
        model, labeled, log_dir=log_dir and os.path.join(log_dir, 'final'),
        **best, **train)
    return classifier, {
        'best': best, 'sweep': sweep, 'num_train': len(train_positions),
        'holdout': {'count': len(held), 'seed': seed, 'file': holdout_file,
                    'per_class': np.bincount(
                        labeled.labels[held],
                        minlength=train['num_classes'])}}


def _best_epoch(validation, model, labeled, *, log_dir, learning_rates,
                epochs, train, evaluation):
    """`fine_tune_linear`'s network and results by best epoch."""
    validation_source = validation()
    if tuple(validation_source.class_names) != tuple(labeled.class_names):
        raise ValueError('The validation set names its classes differently '
                         'from the labeled set.')
    best = _BestEpoch(pipeline.make_eval_dataset(validation_source,
                                                 **evaluation))
    classifier = _train_classifier(
        model, labeled, learning_rate=learning_rates[0], epochs=epochs[0],
        log_dir=log_dir and os.path.join(log_dir, 'final'), callbacks=[best],
        **train)
    return classifier, {
        'learning_rate': learning_rates[0], 'epochs': epochs[0],
        'best_epoch': best.best_epoch,
        'validation_top1_by_epoch': best.top1_by_epoch,
        'num_train': labeled.num_examples,
        'num_validation': validation_source.num_examples}
