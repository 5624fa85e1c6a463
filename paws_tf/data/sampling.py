"""Stateless seeds and permutations, and the class-balanced support sampler."""

import numpy as np
import tensorflow as tf

from paws_tf import checks
from paws_tf.data import sources

# Tags that keep the random streams derived from one user seed apart.
UNLABELED_ORDER = 1
UNLABELED_VIEWS = 2
SUPPORT_CLASSES = 3
SUPPORT_IMAGES = 4
SUPPORT_VIEWS = 5
STREAM_VIEWS = 6
_MAX_LISTED = 5  # Classes named in an error; longer lists are cut.


def derive_seed(seed, tag, *data):
    """An int64 [2] seed for `tf.random.stateless_*` from the user's int
    `seed`, a stream `tag` above and int scalars (tensors allowed): step,
    epoch, index, view..."""
    key = tf.constant([seed, tag], tf.int64)
    for value in data:
        key = tf.random.experimental.stateless_fold_in(
            key, tf.cast(value, tf.int64))
    return key


def permutation(n, key):
    """A uniform random permutation of range(n), int64 [n], drawn from the
    seed `key`."""
    # Argsort of uniform noise rather than `tf.random.experimental.
    # index_shuffle`: in TF 2.21 the latter yields only 256 distinct
    # permutations of 64 or 400 items, whatever the seed.
    noise = tf.random.stateless_uniform([n], key)
    return tf.cast(tf.argsort(noise, stable=True), tf.int64)


def _checked_classes(labels, *, classes_per_step, images_per_class,
                     num_replicas, unique, class_names, binding):
    """`(class_ids, counts, classes_per_replica)` of the labeled set
    `labels`, checked against the sizes (`SupportSampler`'s arguments;
    `unique`: `unique_classes_per_replica`) as `SupportSampler` documents."""
    if labels.size == 0:
        raise checks.DataError(
            'The labeled set is empty: PAWS needs labeled support images. '
            'Check labels_per_class / the split file of the labeled set.')
    if classes_per_step < 1 or images_per_class < 1:
        raise ValueError(f'{binding}.classes_per_step and '
                         f'{binding}.images_per_class must be >= 1, got '
                         f'{classes_per_step} and {images_per_class}.')
    class_ids, counts = np.unique(labels, return_counts=True)
    name = dict(enumerate(class_names))  # A class's name, else its id.
    if len(class_ids) < 2:
        raise checks.DataError(
            'The labeled set holds one class '
            f'({name.get(class_ids[0], int(class_ids[0]))!r}): PAWS '
            'needs labeled images of at least two classes (each view is '
            "classified among the support's classes).")
    if unique and classes_per_step % num_replicas:
        raise ValueError(
            f'{binding}.classes_per_step={classes_per_step} (global) '
            f'is not divisible by the {num_replicas} replicas: with '
            'unique_classes_per_replica=True each replica samples '
            'classes_per_step / num_replicas classes. Use a multiple '
            f'of {num_replicas} or unique_classes_per_replica=False.')
    per_replica = classes_per_step // (num_replicas if unique else 1)
    needed = images_per_class * (1 if unique else num_replicas)
    if classes_per_step > len(class_ids):
        raise checks.DataError(
            f'{binding}.classes_per_step={classes_per_step} (global'
            + (f' = {per_replica} per replica x {num_replicas} replicas'
               if unique else '')
            + f') exceeds the {len(class_ids)} classes of the labeled '
            f'set: use {binding}.classes_per_step <= {len(class_ids)}.')
    small = [(c, k) for c, k in zip(class_ids, counts) if k < needed]
    if small:
        names = ', '.join(f'{name.get(c, int(c))!r} (id {c}) has {k}'
                          for c, k in small[:_MAX_LISTED])
        raise checks.DataError(
            f'{len(small)} class(es) have fewer labeled images than a '
            f'step draws without replacement ({needed} = '
            f'images_per_class {images_per_class}'
            + ('' if unique else
               f' x {num_replicas} replicas sharing the classes')
            + f'): {names}. Lower {binding}.images_per_class, label '
            'more images' + ('' if unique else
                             ', or use unique_classes_per_replica=True')
            + '.')
    return class_ids, counts, per_replica


class SupportSampler:
    """Class-balanced support indices per (step, replica), PAWS Appendix A.

    Each step draws a permutation of the labeled classes from (seed, step),
    identical on every worker. With `unique_classes_per_replica`, global
    replica r takes classes perm[r*K:(r+1)*K] as its slots 0..K-1 (K =
    classes_per_step / R); otherwise every replica takes perm[0:K] (K =
    classes_per_step), so slot k is the same class everywhere. A class's n
    images come from a permutation of its images drawn from (seed, step,
    class): replica r takes entries [r*n:(r+1)*n] in the shared mode,
    [0:n] in the disjoint mode. Images are thus unique in the global
    support batch of a step, and drawn with replacement across steps.

    Attributes:
        classes_per_step, images_per_class (n), num_replicas (R),
            unique_classes_per_replica: the arguments.
        classes_per_replica: K, class slots per replica.
        num_labeled: labeled images.
        num_classes: classes present in the labeled set.
    """

    def __init__(self, labels, *, classes_per_step, images_per_class,
                 num_replicas, unique_classes_per_replica, seed,
                 class_names=(), binding='make_pretrain_dataset_fn'):
        """Checks the sizes (`make_pretrain_dataset_fn`'s) against the int
        [M] class id of each labeled image, `labels`; the messages name
        the classes by `class_names` and the sizes as `binding`'s.

        Raises:
            checks.DataError: empty labeled set; more classes per step
                than it holds; a class with too few images.
            ValueError: sizes that do not divide.
        """
        labels = np.asarray(labels, np.int64)
        class_ids, counts, per_replica = _checked_classes(
            labels, classes_per_step=classes_per_step,
            images_per_class=images_per_class, num_replicas=num_replicas,
            unique=unique_classes_per_replica, class_names=class_names,
            binding=binding)
        self.classes_per_step = classes_per_step
        self.classes_per_replica = per_replica
        self.images_per_class = images_per_class
        self.num_replicas = num_replicas
        self.unique_classes_per_replica = unique_classes_per_replica
        self.num_labeled = len(labels)
        self.num_classes = len(class_ids)
        self._seed = seed
        # Row c: positions of class_ids[c]'s images, padded with -1.
        table = np.full([len(class_ids), counts.max()], -1, np.int64)
        for row, class_id in enumerate(class_ids):
            members = np.flatnonzero(labels == class_id)
            table[row, :len(members)] = members
        self._arrays = (table, counts, class_ids.astype(np.int32))
        self._tensors = None

    def __call__(self, step, replica_id):
        """`(positions, class_ids, columns)` of global replica
        `replica_id` at global `step` (int scalars, tensors allowed): int64
        [K*n] positions in the labeled source, their int32 [K*n] class ids
        and columns, class-major (rows k*n:(k+1)*n belong to slot k)."""
        if self._tensors is None:
            self._tensors = tuple(map(sources.eager_constant, self._arrays))
        table, counts, class_ids = self._tensors
        k, n = self.classes_per_replica, self.images_per_class
        step = tf.cast(step, tf.int64)
        replica_id = tf.cast(replica_id, tf.int64)
        classes = permutation(self.num_classes, derive_seed(
            self._seed, SUPPORT_CLASSES, step))
        first_slot = replica_id * k if self.unique_classes_per_replica else 0
        slots = classes[first_slot:first_slot + k]  # [K] rows of the table
        # One draw over all classes from (seed, step): row c is class c's
        # permutation, identical on every replica.
        noise = tf.random.stateless_uniform(
            tf.shape(table), derive_seed(self._seed, SUPPORT_IMAGES, step))
        noise = tf.gather(noise, slots)  # [K, max_count]
        valid = (tf.range(tf.shape(table, out_type=tf.int64)[1])[None, :]
                 < tf.cast(tf.gather(counts, slots), tf.int64)[:, None])
        order = tf.argsort(tf.where(valid, noise, 2.0), axis=1, stable=True)
        first_image = 0 if self.unique_classes_per_replica else replica_id * n
        order = order[:, first_image:first_image + n]  # [K, n]
        positions = tf.gather(tf.gather(table, slots), order, batch_dims=1)
        columns = tf.cast(first_slot + tf.range(k, dtype=tf.int64), tf.int32)
        return (tf.reshape(positions, [k * n]),
                tf.repeat(tf.gather(class_ids, slots), n),
                tf.repeat(columns, n))

    def items(self, i, first_replica, local_replicas):
        """For `Dataset.flat_map`: element `i` of the support stream of a
        pipeline serving `local_replicas` replicas from `first_replica` in
        turn, a `Dataset` of `(step, position, class_id, column)` of step
        `i // local_replicas` of replica `first_replica + i %
        local_replicas`, class-major."""
        step = i // local_replicas
        positions, class_ids, columns = self(
            step, first_replica + i % local_replicas)
        return tf.data.Dataset.from_tensor_slices(
            (tf.fill(tf.shape(positions), step), positions, class_ids,
             columns))
