"""Input pipelines: multi-crop unlabeled views, class-balanced supports, eval.

Every random choice is a stateless function of the seed and of positions in
the stream (step, epoch, image), so a pipeline rebuilt with `start_step`
continues exactly where an interrupted one stopped (a streamed unlabeled
source starts a fresh pass instead). Each worker builds its replicas' share
of every step from the seed and the replica indices (`AutoShardPolicy.OFF`).
"""

import dataclasses
import functools
import typing

import gin
import numpy as np
import tensorflow as tf

from paws_tf import checks
from paws_tf.data import augment
from paws_tf.data import normalization as normalization_lib
from paws_tf.data import sampling
from paws_tf.data import sources


@dataclasses.dataclass(frozen=True)
class PretrainInput:
    """What `make_pretrain_dataset_fn` returns: the validated global and
    per-replica sizes of one training step, and the `dataset_fn`.

    Each pipeline of `dataset_fn` yields, for every step, one element per
    local replica in local-replica order (tf.distribute hands them out
    round-robin):
      'global_views': float32 [2*B, Hg, Wg, C], view 1 of the B images
          then view 2 of the same images (B = global_batch_size / R).
      'local_views': float32 [m*B, Hl, Wl, C], local view 1 of the B
          images, ..., local view m; absent when m = 0.
      'support_views': float32 [V*K*n, Hs, Ws, C], V blocks of K*n rows;
          inside a block rows k*n:(k+1)*n are the n images of class slot k,
          the same image at the same row of every block.
      'support_labels': int32 [V*K*n], the true class ids of those rows.
      'support_one_hot': float32 [V*K*n, classes_per_step], each row's
          column (its class among the step's support classes).
      'support_view_index': int32 [V*K*n], each row's view (0..V-1).
    """

    num_replicas: int
    global_batch_size: int
    num_unlabeled: int
    steps_per_epoch: int
    multicrop: augment.MultiCropConfig
    sampler: sampling.SupportSampler
    support_views: int
    support_view_size: int
    dataset_fn: typing.Callable = None  # InputContext or None -> Dataset

    @property
    def batch_per_replica(self):
        return self.global_batch_size // self.num_replicas

    @property
    def views_per_step(self):
        """Images forwarded per step, over all replicas."""
        s = self.sampler
        return (self.global_batch_size * (2 + self.multicrop.num_local) +
                self.support_views * s.classes_per_replica *
                s.images_per_class * self.num_replicas)

    @property
    def summary_line(self):
        """The main sizes in one line, for the trainer's log."""
        s = self.sampler
        return (f'PAWS input: {self.num_unlabeled} unlabeled images, '
                f'{self.steps_per_epoch} steps/epoch of '
                f'{self.global_batch_size}; {s.num_labeled} labeled in '
                f'{s.num_classes} classes; {self.views_per_step} views '
                'per step')

    @property
    def summary(self):
        """The effective global and per-replica sizes, a few lines."""
        s, m, r = self.sampler, self.multicrop, self.num_replicas
        k, n, v = s.classes_per_replica, s.images_per_class, self.support_views
        unique = s.unique_classes_per_replica
        return '\n'.join([
            f'PAWS input on {r} replica(s), ' + (
                'disjoint classes per replica' if unique else
                'the same classes on every replica') + ':',
            f'  unlabeled: {self.num_unlabeled} images, global batch '
            f'{self.global_batch_size} = {r} x {self.batch_per_replica}, '
            f'{self.steps_per_epoch} steps/epoch '
            f'({self.num_unlabeled % self.global_batch_size} dropped)',
            f'  views per unlabeled image: 2 x {m.global_size}px + '
            f'{m.num_local} x {m.local_size}px',
            f'  labeled: {s.num_labeled} images in {s.num_classes} classes',
            f'  support per replica: {k} classes x {n} images x {v} view(s) '
            f'= {v * k * n} rows of {self.support_view_size}px',
            f'  support per step (global): classes_per_step='
            f'{s.classes_per_step} -> {k * r if unique else k} label columns, '
            f'{k * n * r} distinct images, {v * k * n * r} views',
            f'  views per step (global): {self.views_per_step}',
        ])


def _concat(views, size, channels):
    """Stacks per-view batches; pins the static shape the model relies on."""
    return tf.ensure_shape(tf.concat(views, axis=0),
                           [None, size, size, channels])


def _indexed_unlabeled(source, layout, seed, start_step, first_replica,
                       local_replicas):
    """Unlabeled views of this pipeline's replicas, step after step."""
    n, g = layout.num_unlabeled, layout.global_batch_size
    batch, steps_per_epoch = layout.batch_per_replica, layout.steps_per_epoch
    start_epoch = start_step // steps_per_epoch
    first_skip = (start_step % steps_per_epoch) * local_replicas * batch

    def epoch_items(epoch):
        order = sampling.permutation(
            n, sampling.derive_seed(seed, sampling.UNLABELED_ORDER, epoch))
        order = tf.reshape(order[:steps_per_epoch * g],
                           [steps_per_epoch, layout.num_replicas, batch])
        # Step-major, then local replica: the order tf.distribute hands out.
        order = tf.reshape(
            order[:, first_replica:first_replica + local_replicas], [-1])
        order = order[tf.where(epoch == start_epoch, first_skip, 0):]
        return tf.data.Dataset.from_tensor_slices(
            (tf.fill(tf.shape(order), epoch), order))

    def views(epoch, position):
        key = sampling.derive_seed(seed, sampling.UNLABELED_VIEWS, epoch,
                                   position)
        return augment.multicrop_views(source.read(position), key,
                                       layout.multicrop)

    return (tf.data.Dataset.counter(start_epoch).flat_map(epoch_items)
            .map(views, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(batch, drop_remainder=True))


def _streamed_unlabeled(source, layout, seed, start_step, input_context):
    """Unlabeled views from a `StreamSource`, batch after batch, to the
    local replicas in turn; a fresh pass shuffled by (seed, start_step)."""
    shuffle_seed = int(np.random.SeedSequence(
        [seed, start_step]).generate_state(1)[0])
    pipeline = input_context.input_pipeline_id if input_context else 0

    def views(count, item):
        key = sampling.derive_seed(seed, sampling.STREAM_VIEWS, start_step,
                                   pipeline, count)
        encoded, _ = item
        return augment.multicrop_views(source.decode(encoded), key,
                                       layout.multicrop)

    return (source.shuffled_dataset(shuffle_seed, input_context).enumerate()
            .map(views, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(layout.batch_per_replica, drop_remainder=True))


def _support(labeled, layout, seed, start_step, first_replica, local_replicas):
    """Support views and labels of this pipeline's replicas, per step."""
    sampler, mc = layout.sampler, layout.multicrop
    view = mc.view_function(layout.support_view_size, mc.global_scale)

    def views(step, position, class_id, column):
        image = labeled.read(position)
        return tuple(view(image, sampling.derive_seed(
            seed, sampling.SUPPORT_VIEWS, step, position, v))
            for v in range(layout.support_views)), class_id, column

    rows = sampler.classes_per_replica * sampler.images_per_class
    # Always in order, even for deterministic=False: a batch is one step's
    # rows of one replica.
    return (tf.data.Dataset.counter(start_step * local_replicas)
            .flat_map(
                lambda i: sampler.items(i, first_replica, local_replicas))
            .map(views, num_parallel_calls=tf.data.AUTOTUNE,
                 deterministic=True)
            .batch(rows, drop_remainder=True))


def _check_sizes(unlabeled, labeled, num_replicas, global_batch_size,
                 classes_per_step, images_per_class, support_views,
                 start_step):
    """Raises ValueError on sizes `make_pretrain_dataset_fn` cannot use."""
    name = 'make_pretrain_dataset_fn.'  # The binding a gin config writes.
    checks.integer(name + 'global_batch_size', global_batch_size)
    checks.integer(name + 'classes_per_step', classes_per_step)
    checks.integer(name + 'images_per_class', images_per_class)
    checks.integer(name + 'start_step', start_step, minimum=0)
    checks.per_replica(name + 'global_batch_size', global_batch_size,
                       num_replicas)
    if unlabeled.num_examples < global_batch_size:
        raise checks.DataError(
            f'The unlabeled set has {unlabeled.num_examples} images, fewer '
            f'than global_batch_size={global_batch_size}: lower the batch.')
    if support_views not in (1, 2):
        raise ValueError(f'support_views must be 1 or 2, got {support_views}.')
    if labeled.labels is None:
        raise ValueError('The labeled source has no labels.')
    if labeled.channels != unlabeled.channels:
        raise checks.DataError(
            f'The labeled images have {labeled.channels} channels, the '
            f'unlabeled ones {unlabeled.channels}: decode both to the same.')


def pipeline_replicas(input_context, num_replicas):
    """(first global replica, local replicas) of the input pipeline of
    `input_context` (None: the one pipeline of every replica) built for
    `num_replicas`; ValueError if the strategy has another replica count,
    or its workers hold different counts."""
    context = input_context or tf.distribute.InputContext(
        num_replicas_in_sync=num_replicas)
    if context.num_replicas_in_sync != num_replicas:
        raise ValueError(
            f'The input was built for num_replicas={num_replicas} but the '
            f'strategy has {context.num_replicas_in_sync} replicas.')
    if num_replicas % context.num_input_pipelines:
        raise ValueError(f'num_replicas={num_replicas} is not divisible by '
                         f'the {context.num_input_pipelines} input pipelines:'
                         ' every worker must hold as many replicas.')
    local_replicas = num_replicas // context.num_input_pipelines
    return context.input_pipeline_id * local_replicas, local_replicas


def _step_element(views, support, layout, channels):
    """One replica's element of a step (`make_pretrain_dataset_fn`)."""
    (global_views, local_views), (support_views, class_ids, columns) = (
        views, support)
    mc, sampler, v = layout.multicrop, layout.sampler, layout.support_views
    out = {
        'global_views': _concat(  # [2*B, Hg, Wg, C]
            global_views, mc.global_size, channels),
        'support_views': _concat(  # [V*K*n, Hs, Ws, C]
            support_views, layout.support_view_size, channels),
        'support_labels': tf.tile(class_ids, [v]),  # [V*K*n]
        'support_one_hot': tf.one_hot(  # [V*K*n, classes_per_step]
            tf.tile(columns, [v]), sampler.classes_per_step),
        'support_view_index': tf.constant(np.repeat(  # [V*K*n]
            np.arange(v, dtype=np.int32),
            sampler.classes_per_replica * sampler.images_per_class))}
    if local_views:
        out['local_views'] = _concat(  # [m*B, Hl, Wl, C]
            local_views, mc.local_size, channels)
    return out


# `train` passes the seed (`train.seed`) and the step a run starts at.
@gin.configurable(denylist=['unlabeled', 'labeled', 'num_replicas',
                            'normalization', 'seed', 'start_step'])
def make_pretrain_dataset_fn(
        unlabeled, labeled, *, num_replicas, global_batch_size,
        classes_per_step, images_per_class, multicrop, support_views=1,
        unique_classes_per_replica=False, support_view_size=None, seed=0,
        start_step=0, deterministic=True, normalization=None):
    """The PAWS pre-training input: a `PretrainInput`, whose `dataset_fn`
    (for `distribute_datasets_from_function`) yields its elements.

    Sizes are global (users of the official code were misled by per-GPU
    values); per-replica sizes are derived: each replica samples K =
    classes_per_step / R classes if `unique_classes_per_replica` (ImageNet:
    960 = 15 x 64 GPUs), else all replicas sample the same K =
    classes_per_step classes, each with its own images.

    Args:
        unlabeled: `sources.ImageSource` (exact resume) or
            `sources.StreamSource` (resume starts a fresh shuffled pass).
        labeled: `sources.ImageSource` with labels: the support set.
        num_replicas: R, `strategy.num_replicas_in_sync`.
        global_batch_size: unlabeled images per step over all replicas.
        classes_per_step: the support classes of a step, over all
            replicas with `unique_classes_per_replica` (True: each replica
            samples classes of its own), else on each.
        images_per_class: n, images per class slot on each replica.
        multicrop: `augment.MultiCropConfig`; its colour, blur and
            normalisation settings also apply to the supports.
        support_views: V, 1 (ImageNet) or 2 (CIFAR-10) views per support.
        support_view_size: default the global size (support views are
            cropped at the global views' scale).
        seed, start_step: seed of every random choice; first global step
            to produce (resume).
        deterministic: tf.data determinism of the unlabeled stream; False
            only for throughput runs (it breaks exact resume).
        normalization: the run's `(mean, std)`, or None (`multicrop`'s).

    Raises:
        ValueError: sizes that do not divide or do not fit the data
            (`sampling.SupportSampler`).
    """
    _check_sizes(unlabeled, labeled, num_replicas, global_batch_size,
                 classes_per_step, images_per_class, support_views,
                 start_step)
    multicrop = normalization_lib.normalized_multicrop(
        multicrop, normalization, labeled.channels)
    sampler = sampling.SupportSampler(
        labeled.labels,
        classes_per_step=classes_per_step, images_per_class=images_per_class,
        num_replicas=num_replicas,
        unique_classes_per_replica=unique_classes_per_replica, seed=seed,
        class_names=labeled.class_names)
    layout = PretrainInput(
        num_replicas=num_replicas, global_batch_size=global_batch_size,
        num_unlabeled=unlabeled.num_examples,
        steps_per_epoch=unlabeled.num_examples // global_batch_size,
        multicrop=multicrop, sampler=sampler, support_views=support_views,
        support_view_size=support_view_size or multicrop.global_size)
    return dataclasses.replace(layout, dataset_fn=functools.partial(
        _dataset, unlabeled=unlabeled, labeled=labeled, layout=layout,
        seed=seed, start_step=start_step, deterministic=deterministic))


def _dataset(input_context=None, *, unlabeled, labeled, layout, seed,
             start_step, deterministic):
    """`PretrainInput.dataset_fn` (`make_pretrain_dataset_fn`'s arguments)."""
    first_replica, local_replicas = pipeline_replicas(input_context,
                                                      layout.num_replicas)
    if isinstance(unlabeled, sources.StreamSource):
        views = _streamed_unlabeled(unlabeled, layout, seed, start_step,
                                    input_context)
    else:
        views = _indexed_unlabeled(unlabeled, layout, seed, start_step,
                                   first_replica, local_replicas)
    support = _support(labeled, layout, seed, start_step, first_replica,
                       local_replicas)
    return finish(tf.data.Dataset.zip((views, support)).map(
        lambda views, support: _step_element(
            views, support, layout, labeled.channels)), deterministic)


def finish(dataset, deterministic=None):
    """`dataset` prefetched, and not sharded by tf.distribute: each
    pipeline builds its replicas' share (`pipeline_replicas`)."""
    options = tf.data.Options()
    if deterministic is not None:
        options.deterministic = deterministic
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.OFF)
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(options)


# Configurable only so that a binding of its arguments, which every caller
# passes, is refused naming what sets them (`configurables`).
@gin.configurable(denylist=['source', 'batch_size', 'image_size',
                             'crop_fraction', 'mean', 'std'])
def make_eval_dataset(source, *, batch_size, image_size, crop_fraction, mean,
                      std):
    """`(float32 [b, S, S, C], int32 [b])` batches (the last one may be
    smaller) of every image of the labeled `source` once, in source order,
    as `augment.center_view` of `image_size` S, `crop_fraction`, `mean`
    and `std` (on the 0-1 scale, one per channel: ValueError else) gives
    it."""
    mean, std = normalization_lib.checked_values(
        'make_eval_dataset\'s mean and std', mean, std, source.channels)

    def view(image, label):
        return augment.center_view(image, image_size,
                                   crop_fraction=crop_fraction, mean=mean,
                                   std=std), tf.cast(label, tf.int32)

    return (source.ordered_dataset()
            .map(view, num_parallel_calls=tf.data.AUTOTUNE,
                 deterministic=True)
            .batch(batch_size).prefetch(tf.data.AUTOTUNE))
