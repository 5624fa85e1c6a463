"""The CIFAR-10 fine-tuning protocol of PAWS App. C, as the official code runs
it (suncet `configs/paws/cifar10_snn.yaml` run by `src/snn_fine_tune.py`):
the encoder fine-tuned with the SuNCEt loss on class-balanced batches of the
labeled images, PAWS-NN measured before, every few epochs and at the end.
The defaults are the official code's, which produced its 96.0; the paper's
text has 180 plain momentum-SGD steps on one view, frozen batch norm.
"""

from absl import logging
import gin
import tensorflow as tf
import tf_keras

from paws_tf import checks
from paws_tf import cluster
from paws_tf.data import augment
from paws_tf.data import image_ops
from paws_tf.data import pipeline
from paws_tf.data import sampling
from paws_tf import dist
from paws_tf.evaluation import evaluate
from paws_tf.evaluation import tuning
from paws_tf import lars as lars_lib
from paws_tf import losses
from paws_tf import schedules

# `sampling.derive_seed` tag of the views, apart from sampling's and the
# ImageNet protocol's.
_SUNCET_VIEWS = 103


def _suncet_dataset_fn(labeled, *, num_steps, classes_per_step,
                       images_per_class, views, flip, num_replicas,
                       image_size, crop_fraction, mean, std, seed):
    """Per-replica `(images [V K n, S, S, C], labels [V K n])` of each step.

    A step has `classes_per_step` classes of `images_per_class` images over
    all replicas, each replica taking its share of every class: unique
    within the step, drawn with replacement across steps (as the official
    ClassStratifiedSampler's fresh permutation per step). Every image gives
    V views, view-major: the evaluation's centre crop, flipped at random
    (suncet `CenterCrop(32)` + `RandomHorizontalFlip`).
    """
    sampler = sampling.SupportSampler(
        labeled.labels, classes_per_step=classes_per_step,
        images_per_class=checks.per_replica(
            'fine_tune_suncet.images_per_class', images_per_class,
            num_replicas),
        num_replicas=num_replicas, unique_classes_per_replica=False,
        seed=seed, class_names=labeled.class_names,
        binding='fine_tune_suncet')
    rows = classes_per_step * images_per_class // num_replicas

    def dataset_fn(context=None):
        first, local = pipeline.pipeline_replicas(context, num_replicas)

        def image_views(step, position, class_id, _):
            view = augment.center_view(
                labeled.read(position), image_size,
                crop_fraction=crop_fraction, mean=mean, std=std)
            if flip:
                return tuple(image_ops.random_flip(view, sampling.derive_seed(
                    seed, _SUNCET_VIEWS, step, position, v))
                    for v in range(views)), class_id
            return (view,) * views, class_id

        def step_batch(batch_views, class_ids):
            return (tf.concat(batch_views, 0),  # [V K n, S, S, C]
                    tf.tile(class_ids, [views]))

        # Always in order: a batch is one step's rows of one replica.
        return pipeline.finish(
            tf.data.Dataset.range(num_steps * local).flat_map(
                lambda i: sampler.items(i, first, local))
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
        self.trunk, self.num_classes, self.tau = trunk, num_classes, tau
        self._loss = dist.LastValue('loss')
        self._learning_rate = dist.LastValue('learning_rate')
        cluster.report_results_once(self)

    @property
    def metrics(self):
        return [self._loss, self._learning_rate]

    def train_step(self, batch):
        images, labels = batch  # [V K n, S, S, C], [V K n]
        with tf.GradientTape() as tape:
            # The batch norms' inference mode; the trunk has no dropout.
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


def _suncet_optimizer(*, learning_rate, final_learning_rate,
                      steps_per_epoch, num_epochs, momentum, lars,
                      trust_coefficient):
    """suncet `snn_fine_tune.py`: its classical-momentum SGD without weight
    decay, wrapped in LARS (biases and batch norm excluded), the rate
    cosine-decayed from `learning_rate` to `final_learning_rate`."""
    schedule = schedules.cosine_decay(steps_per_epoch, num_epochs,
                                      learning_rate, final_learning_rate)
    if lars:
        return lars_lib.LARS(schedule, momentum=momentum, weight_decay=0.0,
                             trust_coefficient=trust_coefficient)
    # tf_keras' momentum is classical: v = mu v - lr g; w += v.
    return tf_keras.optimizers.SGD(schedule, momentum=momentum)


def _checked_sizes(labeled, steps_per_epoch, **counts):
    """`(num_classes, steps_per_epoch)`, the steps by default the labeled
    images over the batch's distinct images; ValueError for an empty
    labeled set or a bad count of `counts`."""
    num_classes = tuning.num_classes(labeled)
    for name, value in counts.items():
        checks.integer(f'fine_tune_suncet.{name}', value,
                       minimum=0 if name == 'eval_every_epochs' else 1)
    if steps_per_epoch is None:
        steps_per_epoch = max(1, labeled.num_examples // (
            counts['classes_per_step'] * counts['images_per_class']))
    return num_classes, checks.integer('fine_tune_suncet.steps_per_epoch',
                                       steps_per_epoch)


def _fit(trainer, dataset_fn, paws_nn, *, num_epochs, steps_per_epoch,
         eval_every_epochs, log_dir, output_dir):
    """Trains `trainer`, with PAWS-NN of its trunk before, every
    `eval_every_epochs` epochs and at the end; writes and returns the
    results."""
    strategy = trainer.distribute_strategy
    embed_fn = evaluate.embedder_from_model(trainer.trunk)
    before = dict(epoch=0, **paws_nn(embed_fn))
    logging.info('PAWS-NN before fine-tuning: %s', before)
    steps = []
    step_log = tf_keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: steps.append(logs))
    epoch_eval = evaluate.EpochEndEvaluation(
        [paws_nn], lambda _: embed_fn, num_epochs=num_epochs,
        every_epochs=eval_every_epochs or num_epochs, prefix='Fine-tuning ',
        to_logs=False)
    trainer.fit(strategy.distribute_datasets_from_function(dataset_fn),
                epochs=num_epochs, steps_per_epoch=steps_per_epoch,
                callbacks=[step_log, epoch_eval] + tuning.callbacks(log_dir))
    # The best of the per-epoch figures selects on the test set, as the
    # official script's logged `best-val` does.
    by_epoch = [before] + epoch_eval.history
    best = max(by_epoch, key=lambda entry: entry['top1'])
    results = {
        'protocol': 'cifar10', 'top1': by_epoch[-1]['top1'],
        'top5': by_epoch[-1].get('top5'), 'paws_nn_before': before,
        'paws_nn_after': by_epoch[-1],
        'paws_nn_by_epoch': [
            {key: entry[key] for key in ('epoch', 'top1', 'top5')
             if key in entry} for entry in by_epoch],
        'best_epoch_top1_selected_on_test': best['top1'],
        'best_epoch': best['epoch'], 'epochs': num_epochs,
        'steps_per_epoch': steps_per_epoch,
        'steps': int(trainer.optimizer.iterations.numpy()),
        'loss': [step['loss'] for step in steps],
        'learning_rate': [step['learning_rate'] for step in steps],
        'weights': tuning.TRUNK_WEIGHTS}
    logging.info('PAWS-NN after fine-tuning: top-1 %.2f%% (best epoch %d: '
                 '%.2f%%, selected on the test set)', 100 * results['top1'],
                 results['best_epoch'],
                 100 * results['best_epoch_top1_selected_on_test'])
    tuning.write_outputs(strategy, output_dir, trainer.trunk,
                         tuning.TRUNK_WEIGHTS, results)
    return results


@gin.configurable(denylist=tuning.PASSED)
def fine_tune_suncet(model, labeled, test, *, output_dir, image_size,
                     crop_fraction, mean, std, strategy=None, seed=0,
                     log_dir=None, num_epochs=30, steps_per_epoch=None,
                     classes_per_step=10, images_per_class=64, views=2,
                     flip=True, learning_rate=0.1, final_learning_rate=0.01,
                     momentum=0.9, lars=True, trust_coefficient=0.001,
                     tau=0.1, eval_every_epochs=1):
    """PAWS App. C (the module's docstring): `(trunk, results)`, the trunk
    weights and results JSON in `output_dir`, the epochs' TensorBoard logs
    in `log_dir`. Bad sizes raise ValueError before any training.

    Args:
        model, labeled, test, image_size, crop_fraction, mean, std,
            strategy, seed: as in `fine_tune.fine_tune`.
        num_epochs, steps_per_epoch: 30 epochs (the official values in
            parentheses) of, by default, the labeled images over the batch's
            distinct images (4000 // 640 = 6 for CIFAR-10: 180 steps).
        classes_per_step, images_per_class, views, flip: the global batch
            (10 x 64) and the views of each image (2), flipped at random.
        learning_rate, final_learning_rate, momentum: classical momentum
            (0.9), the rate (0.1) cosine-decayed over the run to 0.01.
        lars, trust_coefficient: wrap the SGD in LARS of eta 0.001 (True);
            False is the paper's plain momentum SGD.
        tau: SuNCEt and PAWS-NN temperature (0.1).
        eval_every_epochs: PAWS-NN every this many epochs (0: only before
            and after); its batch is `PawsNN.batch_size`.
    """
    strategy = strategy or tf.distribute.get_strategy()
    num_classes, steps_per_epoch = _checked_sizes(
        labeled, steps_per_epoch, num_epochs=num_epochs, views=views,
        classes_per_step=classes_per_step, images_per_class=images_per_class,
        eval_every_epochs=eval_every_epochs)
    preprocessing = dict(image_size=image_size, crop_fraction=crop_fraction,
                         mean=mean, std=std)
    dataset_fn = _suncet_dataset_fn(
        labeled, num_steps=num_epochs * steps_per_epoch,
        classes_per_step=classes_per_step, images_per_class=images_per_class,
        views=views, flip=flip, num_replicas=strategy.num_replicas_in_sync,
        seed=seed, **preprocessing)
    paws_nn = evaluate.PawsNN(labeled, test, preprocessing=preprocessing,
                              tau=tau)
    with strategy.scope():
        trainer = _SuncetTrainer(tuning.build_trunk(model), num_classes, tau)
        trainer.compile(optimizer=_suncet_optimizer(
            learning_rate=learning_rate, steps_per_epoch=steps_per_epoch,
            final_learning_rate=final_learning_rate, num_epochs=num_epochs,
            lars=lars, trust_coefficient=trust_coefficient, momentum=momentum))
        trainer.optimizer.build(trainer.trunk.trainable_variables)
    results = _fit(
        trainer, dataset_fn, paws_nn, num_epochs=num_epochs,
        steps_per_epoch=steps_per_epoch, eval_every_epochs=eval_every_epochs,
        log_dir=log_dir, output_dir=output_dir)
    return trainer.trunk, results
