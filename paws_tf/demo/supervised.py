"""The demo's supervised-only baseline: the backbone on the labels alone."""

import math
import os
import time

from absl import logging
import gin
import tf_keras

from paws_tf.data import normalization as normalization_lib
from paws_tf.data import pipeline
from paws_tf.evaluation import tuning
from paws_tf.nets import backbones

# Stream tag of the baseline's own shuffling and views (see sampling).
_SUPERVISED = 100
# The baseline's steps are cut in this many epochs, or the most of 5, 2, 1
# that divide them.
_EPOCHS = 10


def _training_dataset(labeled, multicrop, batch_size, seed):
    """Endless shuffled batches of augmented labeled views and labels."""
    return tuning.views_dataset_fn(
        labeled, batch_size, 1, seed, (_SUPERVISED, _SUPERVISED + 1),
        size=multicrop.global_size, scale=multicrop.global_scale,
        color_strength=multicrop.color_strength,
        blur_prob=multicrop.blur_prob, mean=multicrop.mean,
        std=multicrop.std, distortion=multicrop.distortion)()


@gin.configurable(denylist=['run', 'labeled', 'test', 'preprocessing'])
def train_supervised(run, *, labeled, test, preprocessing,
                     multicrop=gin.REQUIRED, steps=2000, batch_size=128,
                     learning_rate=0.1, weight_decay=5e-4, seed=0):
    """Trains and evaluates the supervised-only baseline: the configured
    backbone and a linear layer, softmax cross-entropy, Nesterov SGD of
    momentum 0.9, views like PAWS' global views (`multicrop.global_*`,
    colour, blur); tested with the centre crop of PAWS-NN.

    Args:
        run: the `RunDir` (`supervised_results`, `supervised_logs`).
        labeled, test: the labeled and test `sources.ImageSource`s.
        preprocessing: the `experiment.eval_preprocessing` dict.
        multicrop: the PAWS run's `augment.MultiCropConfig`; the views
            take the run's normalisation, which `preprocessing` holds.
        steps, batch_size: optimizer steps, labeled images per step.
        learning_rate, weight_decay: peak rate of the cosine decay over
            `steps`, decoupled weight decay.
        seed: seed of initialisation, order and views.

    Returns:
        dict with `top1`, `wall_seconds`, `images_per_second`, `steps`.
    """
    multicrop = normalization_lib.normalized_multicrop(
        multicrop, (preprocessing['mean'], preprocessing['std']),
        labeled.channels)
    tf_keras.utils.set_random_seed(seed)
    backbone = backbones.build_backbone(input_channels=labeled.channels)
    inputs = tf_keras.Input([None, None, labeled.channels])
    logits = tf_keras.layers.Dense(len(labeled.class_names),
                                   name='classifier')(backbone(inputs))
    model = tf_keras.Model(inputs, logits, name='supervised_classifier')
    model.compile(
        optimizer=tf_keras.optimizers.SGD(
            tf_keras.optimizers.schedules.CosineDecay(learning_rate, steps),
            momentum=0.9, nesterov=True, weight_decay=weight_decay),
        loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=['accuracy'])
    start = time.perf_counter()
    # Up to `_EPOCHS` Keras epochs of equal length: TensorBoard's
    # `epoch_loss` and `epoch_accuracy` get a point each (the epoch's
    # mean), a curve rather than one dot.
    epochs = math.gcd(steps, _EPOCHS)
    model.fit(_training_dataset(labeled, multicrop, batch_size, seed),
              epochs=epochs, steps_per_epoch=steps // epochs,
              callbacks=tuning.callbacks(run.supervised_logs))
    train_seconds = time.perf_counter() - start
    top1 = model.evaluate(pipeline.make_eval_dataset(  # As PAWS-NN's.
        test, batch_size=256, **preprocessing), verbose=0)[1]
    results = dict(top1=top1, num_test=test.num_examples,
                   num_labeled=labeled.num_examples, steps=steps,
                   wall_seconds=time.perf_counter() - start,
                   images_per_second=steps * batch_size / train_seconds)
    os.makedirs(run.supervised, exist_ok=True)
    run.write_json(run.supervised_results, results)
    logging.info('Supervised baseline: top-1 %.2f%% on %d test images, '
                 'trained on %d labeled images in %.0f s.',
                 100 * top1, test.num_examples, labeled.num_examples,
                 train_seconds)
    return results

