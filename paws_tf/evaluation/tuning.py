"""What the fine-tuning protocols and the demo's baseline share."""

import os

import numpy as np
import tensorflow as tf
import tf_keras

from paws_tf import checkpoints
from paws_tf import cluster
from paws_tf.data import augment
from paws_tf.data import pipeline
from paws_tf.data import sampling
from paws_tf import files
from paws_tf.nets import sync_batch_norm
from paws_tf import progress
from paws_tf import run_dir

# tf_keras weight prefix of the fine-tuned trunk: load it into
# `build_trunk(model)`.
TRUNK_WEIGHTS = 'trunk'
# Arguments `fine_tune.fine_tune` passes to the protocols (not gin's).
PASSED = ['model', 'labeled', 'test', 'output_dir', 'log_dir', 'strategy',
          'image_size', 'crop_fraction', 'mean', 'std', 'seed']


def _clone_layer(layer):
    return layer.__class__.from_config(sync_batch_norm.layer_config(layer))


def copy_layers(originals):
    """`(inputs, outputs)` of fresh copies of `originals`, with their
    weights, applied in turn to the first one's input."""
    inputs = x = tf_keras.Input(originals[0].input_shape[1:])
    for original in originals:
        copy = (tf_keras.models.clone_model(original,
                                            clone_function=_clone_layer)
                if isinstance(original, tf_keras.Model)
                else _clone_layer(original))
        x = copy(x)
        checkpoints.assign_weights(copy, original.get_weights())
    return inputs, x


def headless(model):
    """Whether `model` is a backbone alone, without heads: an imported
    backbone (`vit_import.BackboneEmbedder`), whose PAWS-NN compares its
    'features' (`nn_embedding`)."""
    return model.nn_embedding == 'features'


def build_trunk(model):
    """Trainable functional copy of the encoder of `model` (a built
    `PAWSModel` or `BackboneEmbedder`) whose output PAWS-NN compares (App.
    C), images -> `[B, D]`: the backbone and projection head, and the
    prediction head when `model.nn_embedding` is 'prediction' (suncet
    `snn_fine_tune.py` with `use_pred_head`); the backbone alone when
    `headless`."""
    if headless(model):
        return tf_keras.Model(*copy_layers([model.backbone]),
                              name='fine_tune_trunk')
    layers = [model.backbone, model.projection_head]
    if model.nn_embedding == 'prediction':
        layers.append(model.prediction_head)
    return tf_keras.Model(*copy_layers(layers), name='fine_tune_trunk')


def views_dataset_fn(source, global_batch_size, num_replicas, seed, tags,
                     *, size, scale, mean, std, color_strength, blur_prob,
                     distortion='simclr'):
    """`dataset_fn` of per-replica `(view, label)` batches of `source`
    reshuffled every epoch, the order and the views seeded with the two
    `sampling.derive_seed` `tags`, the views `augment.view_function`'s of
    the keyword arguments."""
    make_view = augment.view_function(
        size=size, scale=scale, mean=mean, std=std,
        color_strength=color_strength, blur_prob=blur_prob,
        distortion=distortion)
    n, batch = source.num_examples, global_batch_size // num_replicas
    order_tag, views_tag = tags

    def dataset_fn(context=None):
        first, local = pipeline.pipeline_replicas(context, num_replicas)
        label_table = tf.constant(source.labels, tf.int32)
        rows = slice(first * batch, (first + local) * batch)

        def epoch_items(epoch):
            order = sampling.permutation(
                n, sampling.derive_seed(seed, order_tag, epoch))
            return tf.data.Dataset.from_tensor_slices(
                (tf.fill([n], epoch), order))

        def view(epoch, position):
            key = sampling.derive_seed(seed, views_tag, epoch, position)
            return (make_view(source.read(position), key),
                    tf.gather(label_table, position))

        # Every pipeline walks the same stream of reshuffled epochs and
        # keeps its replicas' rows of each global batch.
        return pipeline.finish(
            tf.data.Dataset.counter().flat_map(epoch_items)
            .batch(global_batch_size).map(lambda e, p: (e[rows], p[rows]))
            .unbatch().map(view, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(batch, drop_remainder=True))

    return dataset_fn


def callbacks(log_dir):
    """A progress bar, and TensorBoard's epoch values in `log_dir` (if
    any): Keras' per-step values are running means since the epoch
    began, not the step's."""
    return [progress.ProgressBar()] + ([tf_keras.callbacks.TensorBoard(
        log_dir, update_freq='epoch', write_graph=False, profile_batch=0)]
        if log_dir else [])


def num_classes(labeled):
    """Class count of a labeled set; raises ValueError when it is empty."""
    if labeled.labels is None or labeled.num_examples == 0:
        raise ValueError('The labeled set is empty (or has no labels): '
                         'fine-tuning needs labeled images.')
    return len(labeled.class_names) or int(labeled.labels.max()) + 1


def write_outputs(strategy, output_dir, network, weights_name, results):
    """Saves the weights (every worker takes part) and the chief's JSON."""
    with cluster.save_dir(strategy, output_dir) as directory:
        network.save_weights(os.path.join(directory, weights_name))
    if cluster.is_chief(strategy):
        files.write_json(os.path.join(output_dir, run_dir.RESULTS_FILE),
                         results, indent=2,
                         default=lambda x: np.asarray(x).tolist())
