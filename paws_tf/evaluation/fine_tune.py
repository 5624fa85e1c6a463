"""Fine-tuning after PAWS pre-training: the ImageNet and CIFAR-10 protocols."""

import json
import math
import os

from absl import logging
import gin
import numpy as np
import tensorflow as tf
import tf_keras

from paws_tf import checks
from paws_tf.data import augment
from paws_tf.data import pipeline
from paws_tf.data import sampling
from paws_tf import dist
from paws_tf.evaluation import evaluate
from paws_tf import lars as lars_lib
from paws_tf import losses
from paws_tf import model as model_lib
from paws_tf.nets import sync_batch_norm
from paws_tf import schedules

RESULTS_FILENAME = 'results.json'
HOLDOUT_FILENAME = 'holdout.txt'
# tf_keras weight prefixes in the output directory; load them into
# `build_classifier(model, num_classes)` / `build_trunk(model)`.
CLASSIFIER_WEIGHTS = 'classifier'
TRUNK_WEIGHTS = 'trunk'
# `sampling.derive_seed` tags of the classifier input, apart from sampling's.
_TRAIN_ORDER = 101
_TRAIN_VIEWS = 102
_SUNCET_VIEWS = 103
# Arguments `fine_tune` passes to the protocols, so gin must not bind them.
_PASSED = ['model', 'labeled', 'test', 'output_dir', 'strategy',
           'image_size', 'crop_fraction', 'mean', 'std', 'seed']


def _clone_layer(layer):
    return layer.__class__.from_config(sync_batch_norm.layer_config(layer))


def _copy_into(inputs, originals):
    """Applies fresh copies of `originals` in turn, with their weights."""
    copies = [tf_keras.models.clone_model(layer, clone_function=_clone_layer)
              if isinstance(layer, tf_keras.Model) else _clone_layer(layer)
              for layer in originals]
    x = inputs
    for layer in copies:
        x = layer(x)
    for copy, original in zip(copies, originals):
        copy.set_weights(original.get_weights())
    return x


def build_classifier(model, num_classes):
    """Backbone -> fc1 -> bn1 -> ReLU -> linear layer initialised to zero.

    PAWS App. A follows SimCLRv2: fine-tune from the first layer of the
    projection head. Copies of the layers are made in the current strategy
    scope (`model` is not modified); all but BN statistics are trainable.

    Args:
        model: pre-trained, built `model.PAWSModel`.
        num_classes: classifier outputs.

    Returns:
        Functional `tf_keras.Model`: images -> float32 `[B, num_classes]`.

    Raises:
        ValueError: the projection head has no hidden layer.
    """
    first = model.projection_head.mlp_layers[:3]
    if [layer.name for layer in first] != ['fc1', 'bn1', 'relu1']:
        raise ValueError('The projection head has no fc1 -> bn1 -> relu1 '
                         'layer to fine-tune from (num_layers >= 2).')
    inputs = tf_keras.Input(model.backbone.input_shape[1:])
    hidden = _copy_into(inputs, [model.backbone] + first)  # [B, hidden_dim]
    logits = tf_keras.layers.Dense(
        num_classes, kernel_initializer='zeros', bias_initializer='zeros',
        dtype='float32', name='classifier')(hidden)
    return tf_keras.Model(inputs, logits, name='fine_tune_classifier')


def build_trunk(model):
    """Copy of the encoder whose output PAWS-NN compares (App. C).

    The backbone and projection head, and the prediction head when
    `model.nn_embedding` is 'prediction' (suncet `snn_fine_tune.py` with
    `use_pred_head`). Every layer stays trainable; the SuNCEt trainer runs
    the batch norms in inference mode.

    Args:
        model: pre-trained, built `model.PAWSModel`; not modified.

    Returns:
        Functional `tf_keras.Model`, images -> `[B, D]` embeddings.
    """
    layers = [model.backbone, model.projection_head]
    if model.nn_embedding == 'prediction':
        layers.append(model.prediction_head)
    inputs = tf_keras.Input(model.backbone.input_shape[1:])
    return tf_keras.Model(inputs, _copy_into(inputs, layers),
                          name='fine_tune_trunk')


def _optimizer(learning_rate, total_steps, *, momentum, cosine_decay=True):
    """Nesterov SGD without weight decay; the rate is cosine-decayed to 0 or
    constant.

    SimCLR(v2) fine-tuning decays with a cosine and no warm-up (google-
    research/simclr `--optimizer=momentum --warmup_epochs=0`: Nesterov SGD
    with `WarmUpAndCosineDecay`), as does the official PAWS `fine_tune.py`.
    tf_keras' Nesterov update: `v = mu v - lr g; w += mu v - lr g`.
    """
    if cosine_decay:
        learning_rate = schedules.WarmupCosineDecay(
            total_steps, 1, learning_rate, learning_rate, warmup_epochs=0)
    return tf_keras.optimizers.SGD(learning_rate, momentum=momentum,
                                   nesterov=True)


def split_holdout(labels, holdout, seed):
    """Class-stratified, seeded held-out part of the labeled set.

    Args:
        labels: int [N] class ids.
        holdout: int count, or float fraction of N; every class gives its
            share, rounded by largest remainder.
        seed: seed of the draw.

    Returns:
        `(train, held_out)`: disjoint sorted int64 positions covering N.

    Raises:
        ValueError: a count outside [1, N), or a class left without
            training images.
    """
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


def _pipeline(context, num_replicas):
    """(first global replica, local replicas) of an input pipeline."""
    context = context or tf.distribute.InputContext(
        num_replicas_in_sync=num_replicas)
    local = num_replicas // context.num_input_pipelines
    return context.input_pipeline_id * local, local


def _finish(dataset):
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.OFF)  # Sharded by hand.
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(options)


def _classifier_dataset_fn(source, global_batch_size, num_replicas, seed,
                           **view_args):
    """Per-replica `(views, labels)` batches: random crops and flips."""
    n, batch = source.num_examples, global_batch_size // num_replicas

    def dataset_fn(context=None):
        first, local = _pipeline(context, num_replicas)
        label_table = tf.constant(source.labels, tf.int32)
        rows = slice(first * batch, (first + local) * batch)

        def epoch_items(epoch):
            order = sampling.permutation(
                n, sampling.derive_seed(seed, _TRAIN_ORDER, epoch))
            return tf.data.Dataset.from_tensor_slices(
                (tf.fill([n], epoch), order))

        def view(epoch, position):
            key = sampling.derive_seed(seed, _TRAIN_VIEWS, epoch, position)
            return augment.make_view(
                source.read(position), key, color_strength=0.0,
                blur_prob=0.0, **view_args), tf.gather(label_table, position)

        # Every pipeline walks the same stream of reshuffled epochs and
        # keeps its replicas' rows of each global batch.
        return _finish(
            tf.data.Dataset.counter().flat_map(epoch_items)
            .batch(global_batch_size).map(lambda e, p: (e[rows], p[rows]))
            .unbatch().map(view, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(batch, drop_remainder=True))

    return dataset_fn


def _tensorboard(log_dir, update_freq='epoch'):
    return tf_keras.callbacks.TensorBoard(
        log_dir, update_freq=update_freq, write_graph=False, profile_batch=0)


def _num_classes(labeled):
    """Class count of a labeled set; raises ValueError when it is empty."""
    if labeled.labels is None or labeled.num_examples == 0:
        raise ValueError('The labeled set is empty (or has no labels): '
                         'fine-tuning needs labeled images.')
    return len(labeled.class_names) or int(labeled.labels.max()) + 1


def _train_classifier(model, source, *, strategy, num_classes,
                      learning_rate, epochs, global_batch_size, image_size,
                      mean, std, crop_scale, momentum, cosine_decay, seed,
                      log_dir=None):
    """Trains a fresh `build_classifier` network on `source` (App. A).

    Softmax cross-entropy on random resized crops (torchvision's default
    scale, as the official code and SimCLR) flipped at random. An epoch is
    ceil(N / global_batch_size) steps of a stream reshuffled every pass.
    """
    steps_per_epoch = math.ceil(source.num_examples / global_batch_size)
    with strategy.scope():
        classifier = build_classifier(model, num_classes)
        classifier.compile(
            optimizer=_optimizer(
                learning_rate, steps_per_epoch * epochs, momentum=momentum,
                cosine_decay=cosine_decay),
            loss=tf_keras.losses.SparseCategoricalCrossentropy(
                from_logits=True),
            metrics=[tf_keras.metrics.SparseCategoricalAccuracy(name='top1'),
                     tf_keras.metrics.SparseTopKCategoricalAccuracy(
                         k=5, name='top5')])
        # Slots made now spare `fit` a second trace of its step.
        classifier.optimizer.build(classifier.trainable_variables)
    dataset = strategy.distribute_datasets_from_function(
        _classifier_dataset_fn(
            source, global_batch_size, strategy.num_replicas_in_sync, seed,
            size=image_size, scale=crop_scale, mean=mean, std=std))
    classifier.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch,
                   callbacks=[_tensorboard(log_dir)] if log_dir else [])
    return classifier


def _scores(classifier, dataset):
    scores = classifier.evaluate(dataset, return_dict=True, verbose=0)
    return {name: float(value) for name, value in scores.items()}


def _write_outputs(strategy, output_dir, network, weights_name, results):
    """Saves the weights (every worker takes part) and the chief's JSON."""
    with dist.save_dir(strategy, output_dir) as directory:
        network.save_weights(os.path.join(directory, weights_name))
    if dist.is_chief(strategy):
        with open(os.path.join(output_dir, RESULTS_FILENAME), 'w') as f:
            json.dump(results, f, indent=2,
                      default=lambda x: np.asarray(x).tolist())


@gin.configurable(denylist=_PASSED)
def fine_tune_linear(model, labeled, test, *, output_dir, image_size,
                     crop_fraction, mean, std, strategy=None, seed=0,
                     learning_rates=(0.01, 0.02, 0.05, 0.1, 0.2),
                     epochs=(30, 50), holdout=12000, global_batch_size=1024,
                     crop_scale=(0.08, 1.0), momentum=0.9, cosine_decay=True,
                     eval_batch_size=256):
    """PAWS App. A: sweep on a held-out split, retrain, test (centre crop).

    Each (learning rate, epochs) pair trains a fresh classifier on the
    labeled images outside the held-out split and is scored on that split;
    the best top-1 (the first in sweep order on ties) is retrained on the
    whole labeled set and evaluated on `test`. `output_dir` receives the
    held-out names, TensorBoard logs (`sweep/*`, `final`), the weights and
    the results JSON.

    Args:
        model, labeled, test, image_size, crop_fraction, mean, std,
            strategy, seed: as in `fine_tune`; `crop_fraction` is for
            evaluation (training takes random crops).
        output_dir: where outputs go.
        learning_rates, epochs: the sweep (BYOL's protocol).
        holdout: held-out images, a count (paper: 12000) or a fraction.
        global_batch_size: images per step over all replicas.
        crop_scale: area range of the training crops.
        momentum: Nesterov momentum.
        cosine_decay: cosine decay to 0 without warm-up, else constant.
        eval_batch_size: batch of the held-out and test passes.

    Returns:
        `(classifier, results)`: the final network and the results dict.

    Raises:
        ValueError: empty labeled set or sweep, bad held-out size, batch not
            divisible by the replicas; raised before any training.
    """
    strategy = strategy or tf.distribute.get_strategy()
    num_classes = _num_classes(labeled)
    if global_batch_size % strategy.num_replicas_in_sync:
        raise ValueError(
            f'global_batch_size={global_batch_size} is not divisible by the '
            f'{strategy.num_replicas_in_sync} replicas.')
    if not learning_rates or not epochs:
        raise ValueError('Give at least one learning rate and epoch count.')
    train_positions, held = split_holdout(labeled.labels, holdout, seed)
    train_source = labeled.subset(train_positions)
    evaluation = dict(batch_size=eval_batch_size, image_size=image_size,
                      crop_fraction=crop_fraction, mean=mean, std=std)
    held_dataset = pipeline.make_eval_dataset(labeled.subset(held),
                                              **evaluation)
    test_dataset = pipeline.make_eval_dataset(test, **evaluation)
    os.makedirs(output_dir, exist_ok=True)
    holdout_file = os.path.join(output_dir, HOLDOUT_FILENAME)
    if dist.is_chief(strategy):
        with open(holdout_file, 'w') as f:
            f.writelines(f'{labeled.names[p]}\n' for p in held)
    train = dict(strategy=strategy, num_classes=num_classes,
                 global_batch_size=global_batch_size, image_size=image_size,
                 mean=mean, std=std, crop_scale=crop_scale, momentum=momentum,
                 cosine_decay=cosine_decay, seed=seed)
    sweep = []
    for learning_rate in learning_rates:
        for num_epochs in epochs:
            classifier = _train_classifier(
                model, train_source, learning_rate=learning_rate,
                epochs=num_epochs,
                log_dir=os.path.join(output_dir, 'sweep',
                                     f'lr{learning_rate:g}_ep{num_epochs}'),
                **train)
            sweep.append(dict(learning_rate=learning_rate, epochs=num_epochs,
                              **_scores(classifier, held_dataset)))
            logging.info('Fine-tuning sweep, held-out: %s', sweep[-1])
    best = max(sweep, key=lambda entry: entry['top1'])
    best = {'learning_rate': best['learning_rate'], 'epochs': best['epochs']}
    classifier = _train_classifier(
        model, labeled, log_dir=os.path.join(output_dir, 'final'),
        **best, **train)
    scores = _scores(classifier, test_dataset)
    logging.info('Fine-tuned with %s: test %s', best, scores)
    results = {
        'protocol': 'imagenet', 'top1': scores['top1'],
        'top5': scores.get('top5'), 'test': scores, 'best': best,
        'sweep': sweep,
        'num_train': len(train_positions), 'weights': CLASSIFIER_WEIGHTS,
        'holdout': {'count': len(held), 'seed': seed, 'file': holdout_file,
                    'per_class': np.bincount(labeled.labels[held],
                                             minlength=num_classes)}}
    _write_outputs(strategy, output_dir, classifier, CLASSIFIER_WEIGHTS,
                   results)
    return classifier, results


def _suncet_dataset_fn(labeled, *, num_steps, classes_per_step,
                       images_per_class, views, flip, num_replicas,
                       image_size, crop_fraction, mean, std, seed):
    """Per-replica `(images [V K n, S, S, C], labels [V K n])` of each step.

    A step has `classes_per_step` classes of `images_per_class` images over
    all replicas, each replica taking its share of every class: unique
    within the step, drawn with replacement across steps (the official
    ClassStratifiedSampler draws each step from a fresh permutation of a
    class's images, which is the same). Every image gives V views, view-
    major: the centre crop of evaluation, flipped at random (suncet
    `CenterCrop(32)` + `RandomHorizontalFlip`).
    """
    if images_per_class % num_replicas:
        raise ValueError(
            f'fine_tune_suncet.images_per_class={images_per_class} is not '
            f'divisible by the {num_replicas} replicas: use a multiple of '
            f'{num_replicas}.')
    sampler = sampling.SupportSampler(
        labeled.labels, classes_per_step=classes_per_step,
        images_per_class=images_per_class // num_replicas,
        num_replicas=num_replicas, unique_classes_per_replica=False,
        seed=seed, class_names=labeled.class_names,
        binding='fine_tune_suncet')
    rows = classes_per_step * images_per_class // num_replicas

    def dataset_fn(context=None):
        first, local = _pipeline(context, num_replicas)

        def step_items(i):
            step = i // local
            positions, class_ids = sampler(step, first + i % local)
            return tf.data.Dataset.from_tensor_slices(
                (tf.fill(tf.shape(positions), step), positions, class_ids))

        def image_views(step, position, class_id):
            view = augment.center_view(
                labeled.read(position), image_size,
                crop_fraction=crop_fraction, mean=mean, std=std)
            if flip:
                return tuple(augment.random_flip(view, sampling.derive_seed(
                    seed, _SUNCET_VIEWS, step, position, v))
                    for v in range(views)), class_id
            return (view,) * views, class_id

        def step_batch(batch_views, class_ids):
            return (tf.concat(batch_views, 0),  # [V K n, S, S, C]
                    tf.tile(class_ids, [views]))

        # Always in order: a batch is one step's rows of one replica.
        return _finish(
            tf.data.Dataset.range(num_steps * local).flat_map(step_items)
            .map(image_views, num_parallel_calls=tf.data.AUTOTUNE,
                 deterministic=True)
            .batch(rows, drop_remainder=True).map(step_batch))

    return dataset_fn


class _SuncetTrainer(tf_keras.Model):
    """Trains a trunk with the SuNCEt loss of the gathered batch, its batch
    norms in inference mode (PyTorch's `module.eval()`: running statistics
    used and kept, gamma and beta still trained)."""

    def __init__(self, trunk, num_classes, tau):
        super().__init__()
        self.trunk = trunk
        self.num_classes = num_classes
        self.tau = tau
        self._loss = model_lib.LastValue('loss')
        self._learning_rate = model_lib.LastValue('learning_rate')

    @property
    def metrics(self):
        return [self._loss, self._learning_rate]

    def train_step(self, batch):
        images, labels = batch  # [V K n, S, S, C], [V K n]
        with tf.GradientTape() as tape:
            # training=False: the batch norms' inference mode; the trunk
            # has no dropout.
            z = tf.cast(self.trunk(images, training=False), tf.float32)
            supports = dist.all_gather(z)  # [R V K n, D]
            targets = tf.stop_gradient(dist.all_gather(
                tf.one_hot(labels, self.num_classes)))  # [R V K n, C]
            loss = losses.suncet_loss(supports, targets, self.tau)
            # Each replica computes the global loss and all_gather's
            # backward sums their gradients: the optimizer's sum over
            # replicas needs 1/R.
            scaled_loss = loss / dist.num_replicas()
        self.optimizer.minimize(scaled_loss, self.trunk.trainable_variables,
                                tape=tape)
        # Read after the update: before it, tf_keras holds the previous
        # step's rate.
        self._learning_rate.update_state(self.optimizer.learning_rate)
        self._loss.update_state(loss)
        return {m.name: m.result() for m in self.metrics}


class _EpochPawsNN(tf_keras.callbacks.Callback):
    """PAWS-NN of the trunk after every `every` epochs (and the last)."""

    def __init__(self, evaluate_fn, every, num_epochs, record):
        super().__init__()
        self._evaluate_fn, self._every = evaluate_fn, every
        self._num_epochs, self._record = num_epochs, record

    def on_epoch_end(self, epoch, logs=None):
        done = epoch + 1
        if done % self._every and done != self._num_epochs:
            return
        self._record.append(dict(epoch=done, **self._evaluate_fn()))
        logging.info('Fine-tuning epoch %d/%d: PAWS-NN top-1 %.2f%%', done,
                     self._num_epochs, 100 * self._record[-1]['top1'])


def _suncet_optimizer(*, learning_rate, final_learning_rate,
                      steps_per_epoch, num_epochs, momentum, lars,
                      trust_coefficient):
    """suncet `snn_fine_tune.py`: its classical-momentum SGD without weight
    decay, wrapped in LARS (biases and batch norm excluded), the rate
    cosine-decayed from `learning_rate` to `final_learning_rate`."""
    # Every argument explicit: WarmupCosineDecay is gin-configurable, and
    # the pre-training's bindings (a warm-up fraction) must not reach it.
    schedule = schedules.WarmupCosineDecay(
        steps_per_epoch, num_epochs, learning_rate, learning_rate,
        final_lr=final_learning_rate, warmup_epochs=0, warmup_fraction=None)
    if lars:
        return lars_lib.LARS(schedule, momentum=momentum, weight_decay=0.0,
                             trust_coefficient=trust_coefficient)
    # tf_keras' momentum is classical: v = mu v - lr g; w += v.
    return tf_keras.optimizers.SGD(schedule, momentum=momentum)


@gin.configurable(denylist=_PASSED)
def fine_tune_suncet(model, labeled, test, *, output_dir, image_size,
                     crop_fraction, mean, std, strategy=None, seed=0,
                     num_epochs=30, steps_per_epoch=None,
                     classes_per_step=10, images_per_class=64, views=2,
                     flip=True, learning_rate=0.1, final_learning_rate=0.01,
                     momentum=0.9, lars=True, trust_coefficient=0.001,
                     tau=0.1, eval_every_epochs=1, eval_batch_size=256):
    """The official CIFAR-10 fine-tuning (PAWS App. C; suncet
    `configs/paws/cifar10_snn.yaml` run by `src/snn_fine_tune.py`).

    The encoder (backbone, projection head, and the prediction head when
    PAWS-NN compares its output) is fine-tuned with the SuNCEt loss (no
    label smoothing) on class-balanced batches of the labeled images, two
    flipped centre crops of each, its batch norms in inference mode but
    gamma and beta trained. PAWS-NN (labeled set as support, `test` as
    queries) is measured before, after every `eval_every_epochs` epochs and
    at the end. The paper's text describes 180 plain momentum-SGD steps on
    one view with frozen batch norm; the defaults are the official code's,
    which produced its 96.0. `output_dir` receives TensorBoard logs, the
    trunk weights and the results JSON.

    Args:
        model, labeled, test, image_size, crop_fraction, mean, std,
            strategy, seed: as in `fine_tune`.
        output_dir: where outputs go.
        num_epochs: epochs (official: 30).
        steps_per_epoch: steps per epoch; default the labeled images over
            the batch's distinct images (4000 // 640 = 6 for CIFAR-10:
            180 steps).
        classes_per_step, images_per_class: the global batch, 10 x 64.
        views: views of every batch image (official: 2).
        flip: flip each view at random (official: True).
        learning_rate: initial rate (0.1), cosine-decayed over the run to
            `final_learning_rate` (0.01).
        momentum: classical momentum (0.9).
        lars: wrap the SGD in LARS (official: True); False is the paper's
            plain momentum SGD.
        trust_coefficient: LARS eta (0.001).
        tau: SuNCEt and PAWS-NN temperature (0.1).
        eval_every_epochs: PAWS-NN every this many epochs (0: only before
            and after).
        eval_batch_size: batch of the PAWS-NN passes.

    Returns:
        `(trunk, results)`: the fine-tuned trunk and the results dict:
        `top1`/`top5` of the final model, `paws_nn_before`,
        `paws_nn_after`, `paws_nn_by_epoch` (epoch 0 is before), and
        `best_epoch_top1_selected_on_test` with its `best_epoch`: the best
        of the per-epoch test figures, which selects on the test set, as
        the official script's logged `best-val` does.

    Raises:
        ValueError: empty labeled set, sizes that do not divide or fit, a
            bad count; raised before any training.
    """
    strategy = strategy or tf.distribute.get_strategy()
    num_classes = _num_classes(labeled)
    for name, value in (('num_epochs', num_epochs), ('views', views),
                        ('classes_per_step', classes_per_step),
                        ('images_per_class', images_per_class)):
        checks.integer(f'fine_tune_suncet.{name}', value)
    checks.integer('fine_tune_suncet.eval_every_epochs', eval_every_epochs,
                   minimum=0)
    distinct = classes_per_step * images_per_class
    if steps_per_epoch is None:
        steps_per_epoch = max(1, labeled.num_examples // distinct)
    checks.integer('fine_tune_suncet.steps_per_epoch', steps_per_epoch)
    num_steps = num_epochs * steps_per_epoch
    dataset_fn = _suncet_dataset_fn(
        labeled, num_steps=num_steps, classes_per_step=classes_per_step,
        images_per_class=images_per_class, views=views, flip=flip,
        num_replicas=strategy.num_replicas_in_sync, image_size=image_size,
        crop_fraction=crop_fraction, mean=mean, std=std, seed=seed)
    evaluation = dict(batch_size=eval_batch_size, image_size=image_size,
                      crop_fraction=crop_fraction, mean=mean, std=std)
    support_data = pipeline.make_eval_dataset(labeled, **evaluation)
    query_data = pipeline.make_eval_dataset(test, **evaluation)

    def paws_nn(network):
        embed = tf.function(lambda x: tf.cast(network(x, training=False),
                                              tf.float32),
                            reduce_retracing=True)
        return evaluate.paws_nn(embed, support_data, query_data,
                                num_classes=num_classes, tau=tau)

    with strategy.scope():
        trunk = build_trunk(model)
        trainer = _SuncetTrainer(trunk, num_classes, tau)
        trainer.compile(optimizer=_suncet_optimizer(
            learning_rate=learning_rate,
            final_learning_rate=final_learning_rate,
            steps_per_epoch=steps_per_epoch, num_epochs=num_epochs,
            momentum=momentum, lars=lars,
            trust_coefficient=trust_coefficient))
        trainer.optimizer.build(trunk.trainable_variables)
    by_epoch = [dict(epoch=0, **paws_nn(trunk))]
    logging.info('PAWS-NN before fine-tuning: %s', by_epoch[0])
    steps = []
    step_log = tf_keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: steps.append(logs))
    epoch_eval = _EpochPawsNN(lambda: paws_nn(trunk),
                              eval_every_epochs or num_epochs, num_epochs,
                              by_epoch)
    trainer.fit(strategy.distribute_datasets_from_function(dataset_fn),
                epochs=num_epochs, steps_per_epoch=steps_per_epoch,
                callbacks=[step_log, epoch_eval,
                           _tensorboard(output_dir, 10)])
    after = by_epoch[-1]
    best = max(by_epoch, key=lambda entry: entry['top1'])
    results = {
        'protocol': 'cifar10', 'top1': after['top1'],
        'top5': after.get('top5'), 'paws_nn_before': by_epoch[0],
        'paws_nn_after': after,
        'paws_nn_by_epoch': [
            {key: entry[key] for key in ('epoch', 'top1', 'top5')
             if key in entry} for entry in by_epoch],
        'best_epoch_top1_selected_on_test': best['top1'],
        'best_epoch': best['epoch'],
        'epochs': num_epochs, 'steps_per_epoch': steps_per_epoch,
        'steps': int(trainer.optimizer.iterations.numpy()),
        'loss': [step['loss'] for step in steps],
        'learning_rate': [step['learning_rate'] for step in steps],
        'weights': TRUNK_WEIGHTS}
    logging.info('PAWS-NN after fine-tuning: top-1 %.2f%% (best epoch %d: '
                 '%.2f%%, selected on the test set)', 100 * after['top1'],
                 best['epoch'], 100 * best['top1'])
    _write_outputs(strategy, output_dir, trunk, TRUNK_WEIGHTS, results)
    return trunk, results


_PROTOCOLS = {'imagenet': fine_tune_linear, 'cifar10': fine_tune_suncet}


@gin.configurable(denylist=['model', 'labeled', 'test', 'strategy'])
def fine_tune(model_dir, model, *, labeled, test, protocol='imagenet',
              strategy=None, image_size=224, crop_fraction=0.875,
              mean=augment.IMAGENET_MEAN, std=augment.IMAGENET_STD, seed=0):
    """Fine-tunes a pre-trained PAWS model into `model_dir/fine_tune`.

    The protocol's hyper-parameters are gin bindings of `fine_tune_linear`
    ('imagenet', App. A) or `fine_tune_suncet` ('cifar10', App. C); their
    defaults are the paper's.

    Args:
        model_dir: run directory.
        model: restored pre-trained `model.PAWSModel` (not modified).
        labeled: labeled `sources.ImageSource`.
        test: labeled test source (`ImageSource` or `StreamSource`).
        protocol: 'imagenet' or 'cifar10'.
        strategy: `tf.distribute.Strategy`; default the current one.
        image_size, crop_fraction, mean, std: preprocessing, as in
            `pipeline.make_eval_dataset`.
        seed: seed of every random choice.

    Returns:
        The results dict, also written to `fine_tune/results.json`.

    Raises:
        ValueError: unknown protocol, or the protocol's errors.
    """
    if protocol not in _PROTOCOLS:
        raise ValueError(f'Unknown fine-tuning protocol {protocol!r}: use '
                         f'one of {sorted(_PROTOCOLS)}.')
    _, results = _PROTOCOLS[protocol](
        model, labeled, test, output_dir=os.path.join(model_dir, 'fine_tune'),
        strategy=strategy, image_size=image_size,
        crop_fraction=crop_fraction, mean=mean, std=std, seed=seed)
    return results
