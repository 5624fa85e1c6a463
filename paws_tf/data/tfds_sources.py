"""TFDS datasets as sources: small ones in memory, ImageNet streamed."""

import hashlib
import heapq
import os
import re

import gin
import numpy as np
import tensorflow as tf

from paws_tf import checks
from paws_tf import files
from paws_tf.data import sources
from paws_tf.data import splits

IMAGENET_SUBSETS = ('1pct', '10pct')
_MANIFEST = 'manifest.tsv'
_LOAD_CHUNK = 4096  # images per batch when loading a dataset into memory


def _tfds():
    """tensorflow_datasets, imported when a TFDS source is read: its import
    takes 0.4 s of CPU in every process of run.py, most of which read
    none."""
    import tensorflow_datasets  # pylint: disable=import-outside-toplevel
    return tensorflow_datasets


def _canonical_order(ids, split):
    """Order that sorts TFDS ids like 'train_00042' by their number, or None.

    TFDS stores CIFAR shuffled; its `id` feature keeps each image's index in
    the original binary files (torchvision's order), so after sorting, index
    i is the same image as in suncet's split files.
    """
    if ids is None:
        return None
    matches = [re.fullmatch(rf'{split}_(\d+)', item.decode()) for item in ids]
    if not all(matches):
        return None
    numbers = np.array([int(match.group(1)) for match in matches])
    if not np.array_equal(np.sort(numbers), np.arange(len(numbers))):
        return None
    return np.argsort(numbers)


@gin.configurable
def load_tfds(name, *, split='train', data_dir=None, download=True):
    """A small TFDS image dataset (cifar10, fashion_mnist) as an in-memory
    labeled `ImageSource`, CIFAR's in its original order
    (`_canonical_order`); names are indices.

    `name`, `split`, `data_dir` (None: TFDS' default) are TFDS'; TFDS
    downloads and prepares a missing dataset when `download`.
    """
    tfds = _tfds()
    dataset, info = tfds.load(name, split=split, data_dir=data_dir,
                              download=download, with_info=True)
    # Chunks rather than batch_size=-1, which aborts under tfds.testing.
    chunks = list(tfds.as_numpy(dataset.batch(_LOAD_CHUNK)))
    data = {key: np.concatenate([chunk[key] for chunk in chunks])
            for key in chunks[0]}
    images, labels = data['image'], data['label']
    order = _canonical_order(data.get('id'), split)
    if order is not None:
        images, labels = images[order], labels[order]
    return sources.from_arrays(images, labels, info.features['label'].names)


def _open_tfds(name, split, data_dir, shuffle_seed, input_context):
    """One pass over a TFDS split, images left encoded, as dicts."""
    tfds = _tfds()
    read_config = tfds.ReadConfig(
        shuffle_seed=shuffle_seed, input_context=input_context,
        shuffle_reshuffle_each_iteration=True)
    try:
        return tfds.load(name, split=split, data_dir=data_dir,
                         shuffle_files=shuffle_seed is not None,
                         read_config=read_config, download=False,
                         decoders={'image': tfds.decode.SkipDecoding()})
    except AssertionError:  # TFDS' "could not find data in ...".
        if tfds.builder(name, data_dir=data_dir).is_prepared():
            raise
        where = (data_dir if data_dir is not None else
                 "TFDS' default data_dir (~/tensorflow_datasets)")
        raise checks.DataError(
            f'TFDS {name} is not prepared in {where}: prepare it '
            '(docs/experiments.md, "ImageNet"), or bind DATA_DIR, which the '
            'ImageNet configs pass to every TFDS source, to the data_dir it '
            'was prepared in.') from None


@gin.configurable
def tfds_stream(name, *, split='train', data_dir=None, channels=3,
                shuffle_buffer=10_000, exclude_file_names=()):
    """A large TFDS split (e.g. `imagenet2012`) as a `StreamSource`, decoded
    on use; a resumed pipeline starts a fresh seeded pass (TFDS skips only
    by reading).

    Args:
        name, split, data_dir: as `load_tfds` takes them.
        shuffle_buffer: encoded items in the seeded shuffle buffer.
        exclude_file_names: `file_name`s to leave out (the labeled subset,
            when it must not appear in the unlabeled stream).
    """
    tfds = _tfds()
    info = tfds.builder(name, data_dir=data_dir).info
    num_examples = int(_open_tfds(name, split, data_dir, None,
                                  None).cardinality())
    excluded = None
    if exclude_file_names:
        keys = tf.constant(sorted(set(exclude_file_names)))
        excluded = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                keys, tf.ones_like(keys, tf.int32)),
            default_value=0)
        num_examples -= len(set(exclude_file_names))

    def open_fn(shuffle_seed, input_context):
        dataset = _open_tfds(name, split, data_dir, shuffle_seed,
                             input_context)
        if excluded is not None:
            dataset = dataset.filter(
                lambda ex: excluded.lookup(ex['file_name']) == 0)
        return dataset.map(
            lambda ex: (ex['image'], tf.cast(ex['label'], tf.int32)))

    return sources.StreamSource(
        open_fn, num_examples=num_examples, channels=channels,
        class_names=tuple(info.features['label'].names),
        shuffle_buffer=shuffle_buffer)


def _cached(folder, examples_fn, data_dir):
    """The labeled `ImageSource` of the ImageNet JPEGs cached in `folder`,
    written once from `examples_fn()`'s `(encoded, label, file_name)`
    triples; its names are the file names."""
    manifest = os.path.join(folder, _MANIFEST)
    if not os.path.exists(manifest):
        os.makedirs(os.path.join(folder, 'images'), exist_ok=True)
        rows = []
        for i, (encoded, label, file_name) in enumerate(examples_fn()):
            # decode_image sniffs the format; the extension is a label only.
            path = os.path.join('images', f'{i:07d}.jpeg')
            with open(os.path.join(folder, path), 'wb') as f:
                f.write(encoded)
            rows.append(f'{path}\t{label}\t{file_name}\n')
        # Written last and renamed, so a complete manifest means a complete
        # cache; concurrent writers produce identical files.
        files.write_text(manifest, ''.join(rows))
    with open(manifest) as f:
        rows = [line.rstrip('\n').split('\t') for line in f]
    tfds = _tfds()
    info = tfds.builder('imagenet2012', data_dir=data_dir).info
    return sources.from_files(
        [os.path.join(folder, row[0]) for row in rows],
        [row[2] for row in rows], labels=[int(row[1]) for row in rows],
        class_names=info.features['label'].names, channels=3)


def _examples(name, data_dir):
    """`(encoded, label, file_name)` of a TFDS ImageNet split, in order."""
    tfds = _tfds()
    for example in tfds.as_numpy(_open_tfds(name, 'train', data_dir, None,
                                            None)):
        yield (example['image'], int(example['label']),
               example['file_name'].decode())


def _validation_examples(data_dir, per_class, seed, names):
    """The ImageNet training images named `names`, or per class the
    `per_class` ones outside both labeled subsets with the smallest SHA-256
    of (seed, file name): a draw independent of TFDS's reading order."""
    if names is None:
        excluded = {file_name for subset in IMAGENET_SUBSETS
                    for _, _, file_name in _examples(
                        f'imagenet2012_subset/{subset}', data_dir)}
    chosen = {}  # label -> heap of (-key, file_name, encoded)
    for encoded, label, file_name in _examples('imagenet2012', data_dir):
        if names is not None:
            if file_name in names:
                chosen.setdefault(label, []).append((0, file_name, encoded))
            continue
        if file_name in excluded:
            continue
        key = hashlib.sha256(f'{seed}:{file_name}'.encode()).digest()
        heap = chosen.setdefault(label, [])
        item = (-int.from_bytes(key[:8], 'big'), file_name, encoded)
        if len(heap) < per_class:
            heapq.heappush(heap, item)
        elif item > heap[0]:
            heapq.heapreplace(heap, item)
    found = sum(len(heap) for heap in chosen.values())
    if names is not None and found != len(names):
        raise ValueError(f'{len(names) - found} of the {len(names)} names of '
                         'names_file are not ImageNet training images.')
    for label in sorted(chosen):
        for _, file_name, encoded in sorted(chosen[label],
                                            key=lambda item: item[1]):
            yield encoded, label, file_name


@gin.configurable
def imagenet_validation(*, cache_dir=gin.REQUIRED, data_dir=None,
                        per_class=12, seed=0, names_file=None):
    """The validation set of the official ImageNet fine-tuning, a labeled
    `ImageSource` in class order.

    suncet `fine_tune.py` keeps the epoch of best top-1 on
    `imagenet_subsets/val.txt`: 12 training images per class, in neither
    labeled subset. This draws such a set with `seed` (or reads the
    names of `names_file`) and caches its JPEGs in `cache_dir` (one pass
    over the training set the first time).

    Args:
        per_class: images per class (official: 12).
        names_file: a split file of training file names (the official
            `val.txt`), used instead of a draw.
    """
    checks.integer('per_class', per_class)
    names = None
    if names_file is not None:
        names = set(splits.read_split_file(names_file))
        tag = 'names_' + hashlib.sha256(
            '\n'.join(sorted(names)).encode()).hexdigest()[:12]
    else:
        tag = f'{per_class}_per_class_seed_{seed}'
    folder = os.path.join(cache_dir, f'imagenet2012_validation_{tag}')
    return _cached(folder, lambda: _validation_examples(
        data_dir, per_class, seed, names), data_dir)


@gin.configurable
def imagenet_sources(*, labeled_subset='10pct', cache_dir=gin.REQUIRED,
                     data_dir=None, include_labeled_in_unlabeled=True,
                     shuffle_buffer=10_000):
    """ImageNet: `(labeled, unlabeled)`, a SimCLR labeled subset (an
    `ImageSource`) and the streamed training set (a `StreamSource`).

    The labeled subset must be random-access for class-balanced support
    sampling, but 10pct is 128k JPEGs (~14 GB): too much to keep in memory
    on every worker. Its encoded bytes are written once into `cache_dir`
    as files and read by path (the OS page cache keeps the hot files in
    memory). The 1.28M unlabeled images are streamed from TFDS.

    Args:
        labeled_subset: `'1pct'` or `'10pct'` (`imagenet2012_subset`).
        include_labeled_in_unlabeled: keep the labeled images in the
            unlabeled stream (paper footnote 1).
        shuffle_buffer: encoded images in the unlabeled shuffle buffer.
    """
    checks.one_of('labeled_subset', labeled_subset, IMAGENET_SUBSETS)
    name = f'imagenet2012_subset/{labeled_subset}'
    labeled = _cached(
        os.path.join(cache_dir, f'imagenet2012_subset_{labeled_subset}'),
        lambda: _examples(name, data_dir), data_dir)
    unlabeled = tfds_stream(
        'imagenet2012', split='train', data_dir=data_dir, channels=3,
        shuffle_buffer=shuffle_buffer, exclude_file_names=(
            () if include_labeled_in_unlabeled else labeled.names))
    return labeled, unlabeled
