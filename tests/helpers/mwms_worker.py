"""One worker of a two-process MultiWorkerMirroredStrategy fit (TF_CONFIG).

Run by tests/test_multiworker.py: trains the tiny PAWS model for a few steps
on worker-specific synthetic views, saves weights the multi-worker way, and
dumps this worker's final weights to OUT/<task_index>.npz for comparison,
with what `fit` logged of it and of a fine-tuning classifier in
OUT/<task_index>.json.
"""

import json
import os
import sys

import numpy as np

import paws_tf  # noqa: F401  (selects tf_keras)
import tensorflow as tf
import tf_keras

from paws_tf import cluster
from paws_tf.evaluation import linear_fine_tune
from paws_tf import lars
from tests.helpers import tiny_model

BATCH, CLASSES, IMAGES, LOCAL = 2, 2, 2, 2


def dataset_fn(ctx):
    """Different views on every worker: the all-reduce must reconcile them.
    Each worker's replica samples its own classes (columns r*K..)."""
    rows = tiny_model.support_rows(
        CLASSES, IMAGES, 1, ctx.input_pipeline_id * CLASSES,
        ctx.num_replicas_in_sync * CLASSES)

    def element(step):
        seed = tf.stack([tf.cast(ctx.input_pipeline_id, tf.int64), step])
        normal = lambda shape, k: tf.random.stateless_normal(  # noqa: E731
            shape, seed + [0, 1000 * k])
        return {'global_views': normal([2 * BATCH, 8, 8, 3], 1),
                'local_views': normal([LOCAL * BATCH, 4, 4, 3], 2),
                'support_views': normal([CLASSES * IMAGES, 8, 8, 3], 3),
                **{key: tf.constant(value) for key, value in rows.items()}}
    return tf.data.Dataset.range(1_000_000).map(element)


def labels_dataset_fn(ctx):
    """Images labeled 0, a batch of 2 per replica."""
    del ctx
    return tf.data.Dataset.from_tensors(
        (tf.ones([2, 8, 8, 3]), tf.zeros([2], tf.int32))).repeat()


def classifier_logs(strategy, model):
    """What `fit` logs at the last step of `linear_fine_tune.
    build_classifier(model, CLASSES)` (its classifier zero-initialised:
    every logit 0, class 0 predicted) trained at learning rate 0 on images
    labeled 0."""
    with strategy.scope():
        classifier = linear_fine_tune.build_classifier(model, CLASSES)
        classifier.compile(
            optimizer=tf_keras.optimizers.SGD(0.0),
            loss=tf_keras.losses.SparseCategoricalCrossentropy(
                from_logits=True),
            metrics=[tf_keras.metrics.SparseCategoricalAccuracy(
                name='top1')])
    # Each step's logs (the progress bar's); the epoch's come from the
    # metrics themselves.
    logged = []
    classifier.fit(
        strategy.distribute_datasets_from_function(labels_dataset_fn),
        epochs=1, steps_per_epoch=2, verbose=0,
        callbacks=[tf_keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda _, logs: logged.append(logs))])
    return {key: float(value) for key, value in logged[-1].items()}


def main(model_dir, out_dir):
    strategy = cluster.make_strategy('multi_worker')
    task = json.loads(os.environ['TF_CONFIG'])['task']
    tf_keras.utils.set_random_seed(0)  # Same initial weights on every worker.
    with strategy.scope():
        model = tiny_model.make(sync_bn=True, prediction_head=False,
                                diagnostics_every=10)
        model.compile(optimizer=lars.LARS(learning_rate=0.5))
    history = model.fit(
        tf_keras.utils.experimental.DatasetCreator(dataset_fn), epochs=2,
        steps_per_epoch=2, verbose=2)
    with cluster.save_dir(strategy, model_dir) as directory:
        os.makedirs(directory, exist_ok=True)
        model.save_weights(os.path.join(directory, 'weights.h5'))
    np.savez(os.path.join(out_dir, f'{task["index"]}.npz'),
             *model.get_weights())
    scores = classifier_logs(strategy, model)
    with open(os.path.join(out_dir, f'{task["index"]}.json'), 'w') as f:
        json.dump(dict(
            logged={key: [float(v) for v in values]
                    for key, values in history.history.items()},
            scores={key: float(value) for key, value in scores.items()}),
            f)
    print('chief' if cluster.is_chief(strategy) else 'worker', 'done',
          int(model.optimizer.iterations.numpy()))


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2])
