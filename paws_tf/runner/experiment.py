"""An experiment's data: labeled, unlabeled and test sources, their
normalisation (fixed, or computed from the images and recorded in the
run's directory), and the evaluation preprocessing shared by PAWS-NN,
export and fine-tuning."""

import collections
import json
import os

from absl import logging
import gin
import numpy as np
import tensorflow as tf

from paws_tf.data import folders
from paws_tf.data import normalization as normalization_lib
from paws_tf.data import sources

# The file in `record_dir` that records the normalisation a run uses.
NORMALIZATION_FILENAME = 'normalization.json'
# Which images `load_data.normalization = 'data'` is computed from.
NORMALIZATION_IMAGES = ('labeled', 'unlabeled')

DataBundle = collections.namedtuple(
    'DataBundle', ['labeled', 'unlabeled', 'test', 'normalization'],
    defaults=[None])


def channel_statistics(source, max_images=None, seed=0):
    """Per-channel mean and std of a source's pixels, scaled to [0, 1].

    Every pixel of every image counts once (images of different sizes
    weigh by their pixel count); sums are taken in float64.

    Args:
        source: `sources.ImageSource`.
        max_images: use a seeded random subset of this many images; None
            uses them all.
        seed: seed of that subset.

    Returns:
        `(mean, std)`: two tuples of `source.channels` floats.
    """
    positions = np.arange(source.num_examples)
    if max_images is not None and max_images < source.num_examples:
        positions = np.sort(np.random.default_rng(seed).choice(
            source.num_examples, max_images, replace=False))

    def moments(position):
        pixels = tf.reshape(tf.cast(source.read(position), tf.float64),
                            [-1, source.channels]) / 255.0
        return (tf.reduce_sum(pixels, 0), tf.reduce_sum(pixels ** 2, 0),
                tf.cast(tf.shape(pixels)[0], tf.float64))

    totals = np.zeros([2, source.channels])
    count = 0.0
    for first, second, pixels in (
            tf.data.Dataset.from_tensor_slices(positions)
            .map(moments, num_parallel_calls=tf.data.AUTOTUNE)
            .as_numpy_iterator()):
        totals += (first, second)
        count += pixels
    mean = totals[0] / count
    std = np.sqrt(np.maximum(totals[1] / count - mean ** 2, 0.0))
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


def _record_normalization(record_dir, info):
    path = os.path.join(record_dir, NORMALIZATION_FILENAME)
    os.makedirs(record_dir, exist_ok=True)
    tmp = f'{path}.tmp{os.getpid()}'
    with open(tmp, 'w') as f:
        json.dump(info, f, indent=2)
    os.replace(tmp, path)


def resolve_normalization(spec, *, source, record_dir, max_images=5000,
                          seed=0, description='labeled'):
    """The `(mean, std)` that `spec` stands for, recorded in `record_dir`.

    Args:
        spec: `'data'` (`normalization_lib.FROM_DATA`): the per-channel
            mean and std of the images of `source` (`channel_statistics`,
            at most `max_images` of them), computed once: a run that finds
            `record_dir/NORMALIZATION_FILENAME` reads it, so that resumed
            training, export and evaluation use the same values. A preset
            name of `augment.NORMALIZATIONS` or a `(mean, std)` pair: those
            values.
        source: the `sources.ImageSource` of the statistics.
        record_dir: where the values are recorded (the run's `model_dir`).
        max_images: images the statistics are computed from.
        seed: seed of that subset.
        description: what the images of `source` are, for the record and
            the messages.

    Returns:
        `(mean, std)`, two tuples of `source.channels` floats.

    Raises:
        ValueError: a bad `spec`, values that do not match the channels,
            a recorded file for another channel count, or one recording
            another normalisation than `spec` (a run trained one way is
            exported and evaluated the same way).
    """
    path = os.path.join(record_dir, NORMALIZATION_FILENAME)
    fixed = None
    if spec != normalization_lib.FROM_DATA:
        fixed = normalization_lib.normalization(spec, channels=source.channels)
    if os.path.exists(path):
        with open(path) as f:
            recorded = json.load(f)
        values = tuple(recorded['mean']), tuple(recorded['std'])
        if recorded.get('channels') != source.channels:
            raise ValueError(
                f'{path} holds the normalisation of {recorded.get("channels")}'
                f'-channel images but the images are now decoded to '
                f'{source.channels} channels: delete it to compute it again '
                '(or start the run again with --overwrite).')
        if (fixed or normalization_lib.FROM_DATA) != (
                values if recorded.get('spec') != normalization_lib.FROM_DATA
                else normalization_lib.FROM_DATA):
            # A run normalised one way must be exported and evaluated the
            # same way.
            raise ValueError(
                f'{path} records the normalisation this run was trained '
                f'with, {normalization_lib.NORMALIZATION_MACRO} = '
                f'{recorded.get("spec")!r} (mean {values[0]}, std '
                f'{values[1]}), not {spec!r}: bind it back.')
        logging.info('Normalisation read from %s: mean %s, std %s', path,
                     *values)
        return values
    if fixed is not None:
        _record_normalization(record_dir, dict(
            mean=fixed[0], std=fixed[1], channels=source.channels,
            spec=spec))
        return fixed
    mean, std = channel_statistics(source, max_images, seed)
    images = min(source.num_examples, max_images or source.num_examples)
    if min(std) <= 0:
        raise ValueError(
            f'The {images} {description} images have a channel of constant '
            f'value '
            f'(std {std}): normalisation from the data is impossible; bind '
            f"{normalization_lib.NORMALIZATION_MACRO} = 'imagenet' or a "
            '(mean, std) pair.')
    _record_normalization(record_dir, dict(
        mean=mean, std=std, channels=source.channels, spec=spec,
        images=images, of=source.num_examples, source=description))
    logging.info('Normalisation computed from %d %s images and recorded in '
                 '%s: mean %s, std %s', images, description, path, mean, std)
    return mean, std


@gin.configurable(denylist=['record_dir'])
def load_data(record_dir, *, train=gin.REQUIRED, test=None,
              max_unlabeled=None, seed=0, normalization=None,
              normalization_images=5000, normalization_from='labeled'):
    """Loads the sources of an experiment.

    Args:
        record_dir: where `sources.select_labeled` records the labeled
            split (the run's `model_dir`).
        train: zero-argument callable (a gin reference such as
            `@train/load_idx`) returning either one labeled `ImageSource`,
            which `sources.select_labeled` (configured in gin) splits into
            labeled and unlabeled, or a ready `(labeled, unlabeled)` pair
            (`tfds_sources.imagenet_sources`, `image_folders`).
        test: zero-argument callable returning the labeled test
            `ImageSource`, or None.
        max_unlabeled: keep a random subset of this many unlabeled images
            (short runs); None keeps them all.
        seed: seed of that subset and of the normalisation's images.
        normalization: None (the config binds the mean and std of
            `MultiCropConfig` and `eval_preprocessing` itself), `'data'`
            (computed from the images), a preset name of
            `augment.NORMALIZATIONS`, or a `(mean, std)` pair; see
            `resolve_normalization`. The folder recipes bind it through the
            macro `NORMALIZATION`.
        normalization_images: at most this many images (drawn with `seed`)
            give the `'data'` statistics.
        normalization_from: `'labeled'` or `'unlabeled'` (a sample of them,
            for a labeled set too small to be representative), one of
            `NORMALIZATION_IMAGES`.

    Returns:
        `DataBundle(labeled, unlabeled, test, normalization)`; `test` may be
        None, `normalization` is `(mean, std)` or None.

    Raises:
        ValueError: if the test classes or channels differ from the labeled
            ones, or on a bad `normalization`.
    """
    normalization_lib.normalization(normalization)
    if normalization_from not in NORMALIZATION_IMAGES:
        raise ValueError(
            f'load_data.normalization_from must be one of '
            f'{NORMALIZATION_IMAGES}, got {normalization_from!r}.')
    loaded = train()
    if isinstance(loaded, tuple):
        labeled, unlabeled = loaded
    else:
        labeled, unlabeled = sources.select_labeled(loaded,
                                                    record_dir=record_dir)
    if max_unlabeled is not None and max_unlabeled < unlabeled.num_examples:
        if not isinstance(unlabeled, sources.ImageSource):
            raise ValueError('max_unlabeled needs a random-access unlabeled '
                             'source, not a stream.')
        keep = np.random.default_rng(seed).choice(
            unlabeled.num_examples, max_unlabeled, replace=False)
        unlabeled = unlabeled.subset(np.sort(keep))
    test_source = test() if test is not None else None
    if test_source is not None:
        if tuple(test_source.class_names) != tuple(labeled.class_names):
            raise ValueError(
                f'The test set has classes {list(test_source.class_names)[:5]}'
                f'... but the labeled set {list(labeled.class_names)[:5]}...: '
                'both must list the same classes in the same order.')
        if test_source.channels != labeled.channels:
            raise ValueError(
                f'The test images have {test_source.channels} channels, the '
                f'labeled ones {labeled.channels}: decode both to the same.')
    if normalization is not None:
        source = labeled if normalization_from == 'labeled' else unlabeled
        if not isinstance(source, sources.ImageSource):
            raise ValueError(
                'The unlabeled images are a stream, which a sample cannot '
                "be drawn from: bind load_data.normalization_from = "
                "'labeled'.")
        normalization = resolve_normalization(
            normalization, source=source, record_dir=record_dir,
            max_images=normalization_images, seed=seed,
            description=normalization_from)
    return DataBundle(labeled, unlabeled, test_source, normalization)


@gin.configurable
def image_folders(labeled_root, unlabeled_root, *, channels=3,
                  include_labeled_in_unlabeled=True):
    """A labeled folder of class subfolders and a folder of unlabeled images.

    Args:
        labeled_root: `labeled_root/<class_name>/*.jpg|png|...`.
        unlabeled_root: any folder of images (searched recursively).
        channels: channels to decode to.
        include_labeled_in_unlabeled: also stream the labeled images as
            unlabeled ones (paper footnote 1).

    Returns:
        `(labeled, unlabeled)` `ImageSource`s.
    """
    labeled = folders.image_folder(labeled_root, labeled=True,
                                   channels=channels)
    unlabeled = folders.image_folder(unlabeled_root, labeled=False,
                                     channels=channels)
    if include_labeled_in_unlabeled:
        paths = ([os.path.join(unlabeled_root, n) for n in unlabeled.names] +
                 [os.path.join(labeled_root, n) for n in labeled.names])
        unlabeled = sources.from_files(paths, paths, channels=channels)
    return labeled, unlabeled


@gin.configurable(denylist=['bundle'])
def eval_preprocessing(bundle=None, *, image_size=gin.REQUIRED,
                       crop_fraction=1.0, mean=None, std=None):
    """Single centre-crop evaluation preprocessing (PAWS Appendix A).

    Args:
        bundle: the run's `DataBundle`: its `normalization`, when it has
            one, gives the mean and std, and its channels are checked.
        image_size: side S of the evaluated crop.
        crop_fraction: the shorter side is resized to S / crop_fraction
            before the centre crop (0.875 for ImageNet; 1.0 keeps CIFAR-10
            and Fashion-MNIST images whole).
        mean: per-channel normalisation mean; None with a `bundle` that
            has a normalisation (`load_data.normalization`).
        std: per-channel normalisation std, likewise.

    Returns:
        dict with the keys `image_size`, `crop_fraction`, `mean` and `std`,
        as `pipeline.make_eval_dataset` and `export` take them.

    Raises:
        ValueError: a normalisation given twice or not at all, or one that
            does not match the images' channels.
    """
    normalization = None if bundle is None else bundle.normalization
    mean, std = normalization_lib.one_normalization(
        'eval_preprocessing', mean, std, normalization,
        channels=None if bundle is None else bundle.labeled.channels)
    return dict(image_size=image_size, crop_fraction=crop_fraction,
                mean=mean, std=std)


@gin.configurable
def synthetic_source(*, num_images=512, num_classes=4, image_size=16,
                     channels=3, noise=0.25, seed=0, class_seed=0):
    """Clustered synthetic images for smoke tests and `debug.gin`.

    Each class is a coarse random luminance pattern (the same in every
    channel, so colour augmentations keep classes apart); an image is its
    class pattern, randomly shifted, plus pixel noise, so classes are
    learnable but views of one image differ.

    Args:
        num_images: images, classes taking turns.
        num_classes: classes.
        image_size: side of the square images.
        channels: channels.
        noise: pixel noise std (pixel values in [0, 1]).
        seed: seed of the shifts and noise (use another one for a test set).
        class_seed: seed of the class patterns (keep it equal across the
            train and test sets, so that they share classes).

    Returns:
        A labeled in-memory `ImageSource` of uint8 images.
    """
    coarse = np.random.default_rng(class_seed).uniform(
        size=(num_classes, 4, 4, 1)).repeat(channels, axis=-1)
    rng = np.random.default_rng(seed)
    patterns = np.kron(coarse, np.ones((1, image_size // 4 + 1,
                                        image_size // 4 + 1, 1)))
    labels = np.arange(num_images) % num_classes
    images = []
    for label in labels:
        dy, dx = rng.integers(0, patterns.shape[1] - image_size + 1, size=2)
        image = patterns[label, dy:dy + image_size, dx:dx + image_size]
        image = image + noise * rng.normal(size=image.shape)
        images.append(np.clip(image * 255.0, 0, 255).astype(np.uint8))
    return sources.from_arrays(np.stack(images), labels,
                               [f'class_{c}' for c in range(num_classes)])


@gin.configurable
def held_out(*, source=gin.REQUIRED, part='train', size=5000, seed=0):
    """One part of a labeled source split into training and validation.

    For tuning without the test split: bind the training part as
    `load_data.train` and the validation part as `load_data.test`.

    Args:
        source: zero-argument callable returning the labeled `ImageSource`.
        part: `'train'` (everything else) or `'validation'` (`size` images
            chosen by `seed`).
        size: images held out for validation.
        seed: seed of the choice.

    Returns:
        The requested part, an `ImageSource`.
    """
    full = source()
    order = np.random.default_rng(seed).permutation(full.num_examples)
    chosen = order[:size] if part == 'validation' else order[size:]
    return full.subset(np.sort(chosen))
