"""The tiny PAWSModel every test builds, and synthetic steps for it."""

import numpy as np
import tensorflow as tf

from paws_tf import lars
from paws_tf import model as model_lib
from paws_tf import nets
from paws_tf.nets import backbones
from paws_tf.nets import heads

# The smallest small_resnet the tests use. Strided 1x1 convolutions need 8
# input channels under oneDNN (onednn.check_conv_safe), hence 8, 16.
TINY = dict(widths=(8, 16), blocks_per_stage=(1, 1), stage_strides=(2, 2))
# The smallest ViT (F = 192): one block, 4-px patches of 8-px views.
TINY_VIT = dict(patch_size=4, image_size=8, depth=1)
BACKBONES = {'small_resnet': TINY, 'vit_tiny': TINY_VIT}


def make(sync_bn=False, prediction_head=True, *, channels=3, hidden=8,
         width=6, prediction_hidden=4, activation='relu',
         backbone='small_resnet', sync_bn_impl=nets.KERAS, **kwargs):
    """An unbuilt tiny PAWSModel: the `TINY` backbone (F = 16), projection
    `hidden` -> `width`, prediction `prediction_hidden` -> `width`.

    Args:
        sync_bn: synchronised batch norm in the backbone and heads.
        sync_bn_impl: its implementation (`nets.IMPLEMENTATIONS`); the
            custom one traces a two-replica step on logical CPUs in about
            half the time (`sync_batch_norm._sum_over_replicas`).
        backbone: 'small_resnet' (`TINY`) or 'vit_tiny' (`TINY_VIT`).
        prediction_head: with a prediction head.
        channels: input channels.
        hidden, width, prediction_hidden: head widths.
        activation: the heads' (`heads.ACTIVATIONS`).
        **kwargs: other `PAWSModel` arguments; `diagnostics_every`
            defaults to 0.
    """
    trunk = backbones.build_backbone(
        backbone, input_channels=channels, sync_bn=sync_bn,
        sync_bn_impl=sync_bn_impl, **BACKBONES[backbone])
    projection = heads.ProjectionHead(hidden_dim=hidden, output_dim=width,
                                      activation=activation, sync_bn=sync_bn,
                                      sync_bn_impl=sync_bn_impl)
    prediction = (heads.PredictionHead(hidden_dim=prediction_hidden,
                                       output_dim=width,
                                       activation=activation,
                                       sync_bn=sync_bn,
                                       sync_bn_impl=sync_bn_impl)
                  if prediction_head else None)
    kwargs.setdefault('diagnostics_every', 0)
    return model_lib.PAWSModel(trunk, projection, prediction, **kwargs)


def build(channels=3, size=16, seed=0):
    """Returns a built PAWSModel (F = 16, D = 6) with random variables.

    Moving means and variances are random too, so inference-mode batch norm
    differs from training mode and from the initial identity.
    """
    model = make(channels=channels)
    model(np.zeros([1, size, size, channels], np.float32))
    rng = np.random.default_rng(seed)
    for variable in model.variables:
        value = rng.normal(scale=0.5, size=variable.shape)
        if 'variance' in variable.name:
            value = rng.uniform(0.5, 2.0, size=variable.shape)
        variable.assign(value.astype(np.float32))
    return model


def compile_and_build(model, size=8, optimizer=None, **lars_kwargs):
    """Builds every layer (the prediction head too) and compiles with
    `optimizer`, by default LARS (learning rate 0.1 unless given)."""
    lars_kwargs.setdefault('learning_rate', 0.1)
    model._encode(tf.zeros([2, size, size, 3]), training=False)
    model.compile(optimizer=optimizer or lars.LARS(**lars_kwargs))
    model.optimizer.build(model.trainable_variables)


def run_steps(model, batch, steps=1):
    """Steps of a compiled model on `batch` through `make_train_function`,
    as `fit` runs them; the last step's logs as NumPy values."""
    iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
    train_function = model.make_train_function()
    for _ in range(steps):
        logs = train_function(iterator)
    return {name: value.numpy() for name, value in logs.items()}


def support_rows(classes, images, views, first_column, num_columns):
    """`support_one_hot` and `support_view_index` of `views` blocks of
    `classes` x `images` rows, slot k in column `first_column + k` of
    `num_columns`, as the pipeline lays them out (class-major blocks per
    view)."""
    column = np.tile(np.repeat(first_column + np.arange(classes), images),
                     views)
    return {'support_one_hot': np.eye(num_columns, dtype=np.float32)[column],
            'support_view_index': np.repeat(
                np.arange(views, dtype=np.int32), classes * images)}


def random_step(rng, batch, classes, images, views, multicrop, size=8, *,
                replica=0, num_replicas=1, unique=False):
    """One replica's batch of random views (`PAWSModel.train_step`), with
    its support rows' columns: replica r's slot k is column r*K + k when
    the replicas sample disjoint classes (`unique`), else k."""
    f32 = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa
    data = {'global_views': f32(2 * batch, size, size, 3),
            'local_views': f32(multicrop * batch, size // 2, size // 2, 3),
            'support_views': f32(views * classes * images, size, size, 3)}
    if not multicrop:
        del data['local_views']  # As the pipeline: no local views.
    if unique:
        data.update(support_rows(classes, images, views, replica * classes,
                                 num_replicas * classes))
    else:
        data.update(support_rows(classes, images, views, 0, classes))
    return data


def single_device_batch(per_replica, views, classes, images, unique,
                        multicrop):
    """The global batch laid out as one replica would receive it."""
    def by_blocks(key, blocks):
        parts = [np.split(r[key], blocks) for r in per_replica]
        return np.concatenate([p[b] for b in range(blocks) for p in parts])

    supports = [r['support_views'].reshape(
        (views, classes, images) + r['support_views'].shape[1:])
        for r in per_replica]
    # Disjoint classes: replica r's slots become slots r*K..; shared classes:
    # the replicas' images of a class become one class block of 2n images.
    supports = np.concatenate(supports, axis=1 if unique else 2)
    data = {'global_views': by_blocks('global_views', 2),
            'support_views': supports.reshape((-1,) + supports.shape[3:])}
    if multicrop:
        data['local_views'] = by_blocks('local_views', multicrop)
    slots, rows = supports.shape[1], supports.shape[2]
    data.update(support_rows(slots, rows, views, 0, slots))
    return data
