"""An experiment's data, its normalisation and evaluation preprocessing."""

import collections
import os
import typing

import gin
import numpy as np

from paws_tf import bindings
from paws_tf import checks
from paws_tf.data import folders
from paws_tf.data import normalization as normalization_lib
from paws_tf.data import sources
from paws_tf.data import splits
from paws_tf.runner import records

DataBundle = collections.namedtuple(
    'DataBundle', ['labeled', 'unlabeled', 'test', 'normalization'])


class Folder(typing.NamedTuple):
    """A folder source bound to a part of `load_data`: the configurable gin
    calls, its scope, and its parameter naming the folder of labeled class
    subfolders (`FOLDER_ROOTS`)."""
    configurable: typing.Callable
    scope: typing.Optional[str]
    root: str

    def arguments(self):
        """`bindings.arguments` of the source."""
        return bindings.arguments(self.configurable, self.scope)

    def labeled(self):
        """Whether the source holds labeled class subfolders."""
        return (self.configurable is not folders.image_folder
                or self.arguments()['labeled'][0])


def folder_source(part='train'):
    """The `Folder` of the folder source bound to `load_data`'s `part`
    ('train', 'test'), or None for other sources."""
    source = bindings.reference(load_data, part)
    if source is None:
        return None
    configurable, scope = bindings.target(source)
    if configurable not in FOLDER_ROOTS:
        return None
    return Folder(configurable, scope, FOLDER_ROOTS[configurable])


def folder_channels():
    """The channels a folder training source decodes to, else None."""
    folder = folder_source()
    return None if folder is None else folder.arguments()['channels'][0]


def train_channels():
    """`(value, name)` of the `channels` argument of the source bound to
    `load_data.train` (a folder's, or another source's that has one);
    None for a source without one."""
    source = bindings.reference(load_data, 'train')
    return None if source is None else bindings.arguments(
        *bindings.target(source)).get('channels')


def check_channels(channels, model, also=''):
    """Refuses a training source whose `channels` argument
    (`train_channels`) decodes to other than the `channels` that `model`
    (a description) takes, before its images are read; the message ends
    with the `also` binding to make with it, if any."""
    bound, name = train_channels() or (None, None)
    if bound is not None and bound != channels:
        raise checks.ConfigError(
            f'{model} takes {channels}-channel images, but {name} = '
            f'{bound}: bind {name} = {channels} (the images are decoded to '
            f'that){" and " + also if also else ""}.')


def _folder(part):
    """' (NAME = 'folder')': the binding that gives the folder of the
    source bound to `load_data`'s `part` ('train', 'test'), for a message;
    '' for other sources."""
    folder = folder_source(part)
    if folder is None:
        return ''
    root, name = folder.arguments()[folder.root]
    return f' ({name} = {root!r})' if isinstance(root, str) else ''


def _classes(source):
    """A source's class names for a message, the first few."""
    names = list(source.class_names)
    return str(names[:8])[:-1] + (', ...]' if len(names) > 8 else ']')


@gin.configurable(denylist=['run', 'trained', 'takes'])
def load_data(run, *, trained=False, takes=None, train=gin.REQUIRED, test=None,
              unlabeled=None, max_unlabeled=None, seed=0, normalization=None,
              normalization_images=5000, normalization_from='labeled'):
    """Loads the sources of an experiment.

    Args:
        run: the `RunDir` recording the labeled split and the
            normalisation; None records nothing.
        trained: `run` holds a trained run, whose records are read and
            never written: other classes, another labeled split
            (`records.check`) or normalisation than recorded are refused.
        takes: `(channels, model)`: labeled images of other channels than
            the model (described) takes are refused, first.
        train: zero-argument callable (gin: `@train/load_idx`) returning a
            labeled `ImageSource` that `splits.select_labeled` splits, or a
            `(labeled, unlabeled)` pair (`image_folders`).
        test, unlabeled: zero-argument callables returning the labeled
            test source, and the unlabeled source replacing `train`'s (e.g.
            every class's images while the labeled and test sets hold some
            classes only).
        max_unlabeled: keep a random subset of this many unlabeled images.
        seed: seed of that subset and of the normalisation's images.
        normalization: the run's one normalisation: `'data'` (computed from
            the images), a preset of `augment.NORMALIZATIONS` or a `(mean,
            std)` pair (the folder recipes' macro `NORMALIZATION`); None:
            none (sources only).
        normalization_images, normalization_from: at most this many images
            give the `'data'` statistics, of the `'labeled'` or the
            `'unlabeled'` set (a labeled set too small to be representative).

    Returns:
        `DataBundle(labeled, unlabeled, test, normalization)`; `test` and
        `normalization` (a `(mean, std)` pair) may be None.

    Raises:
        checks.DataError: the test classes or channels differ from the
            labeled ones, or the labeled channels from `takes`, or
            (`trained`) the data or normalisation from the run's records.
        ValueError: on a bad `normalization`.
    """
    normalization_lib.normalization(normalization)
    checks.one_of('load_data.normalization_from', normalization_from,
                  ('labeled', 'unlabeled'))
    loaded = train()
    _check_taken(loaded[0] if isinstance(loaded, tuple) else loaded, takes,
                 normalization)
    labeled, unlabeled_source = _split(loaded, None if trained else run)
    if trained:
        records.check(run, labeled)
    unlabeled = _at_most(
        unlabeled() if unlabeled is not None else unlabeled_source,
        max_unlabeled, seed)
    test_source = test() if test is not None else None
    _check_test(test_source, labeled)
    normalization = resolve_normalization(
        normalization, run,
        labeled if normalization_from == 'labeled' else unlabeled,
        max_images=normalization_images, seed=seed,
        description=normalization_from, writes=not trained)
    return DataBundle(labeled, unlabeled, test_source, normalization)


def _check_taken(labeled, takes, normalization):
    """Raises `checks.DataError` when the `labeled` images are not of the
    channels that `takes` (`load_data`'s, None: any) names, naming the
    normalisation to keep."""
    if takes is not None and labeled.channels != takes[0]:
        raise checks.DataError(
            f'{takes[1]} takes {takes[0]}-channel images, but load_data.train'
            f'{_folder("train")} gives {labeled.channels}-channel ones: bind '
            f'it to a source of {takes[0]}-channel images' + (
                '' if normalization is None else ', keeping '
                f'load_data.normalization = {normalization!r}') + '.')


def _split(loaded, run):
    """The `splits.Split` of what `load_data.train` gave, recorded in
    `run` (when not None)."""
    if isinstance(loaded, tuple):
        split = splits.Split(*loaded, header=(
            f'{loaded[0].num_examples} labeled: all the images of the '
            'labeled source'))
    else:
        split = splits.select_labeled(loaded)
    if run is not None:
        run.write_split(split.labeled.names, split.header)
    return split


def _at_most(unlabeled, max_unlabeled, seed):
    """A random subset (`seed`) of `max_unlabeled` unlabeled images."""
    if max_unlabeled is None or max_unlabeled >= unlabeled.num_examples:
        return unlabeled
    if not isinstance(unlabeled, sources.ImageSource):
        raise ValueError('max_unlabeled needs a random-access unlabeled '
                         'source, not a stream.')
    keep = np.random.default_rng(seed).choice(
        unlabeled.num_examples, max_unlabeled, replace=False)
    return unlabeled.subset(np.sort(keep))


def _check_test(test_source, labeled):
    """Raises `checks.DataError` unless the test set (if any) has the
    labeled set's classes and channels."""
    if test_source is None:
        return
    if tuple(test_source.class_names) != tuple(labeled.class_names):
        raise checks.DataError(
            f'The test set{_folder("test")} has classes '
            f'{_classes(test_source)} but the labeled set'
            f'{_folder("train")} has {_classes(labeled)}: both need '
            'the same class folder names (classes are numbered in sorted '
            'order). Rename the test class folders, or bind the test folder '
            'to one that holds the labeled classes.')
    if test_source.channels != labeled.channels:
        raise checks.DataError(
            f'The test images have {test_source.channels} channels, the '
            f'labeled ones {labeled.channels}: decode both to the same.')


def resolve_normalization(spec, run, source, *, writes=True, **kwargs):
    """`normalization.resolve_normalization` of `spec` (None: None) on
    `source`, read from and (`writes`) recorded in `run` (when not
    None)."""
    if spec is None:
        return None
    if spec == normalization_lib.FROM_DATA and not isinstance(
            source, sources.ImageSource):
        raise ValueError(
            'The unlabeled images are a stream, which a sample cannot be '
            "drawn from: bind load_data.normalization_from = 'labeled'.")
    values, record = normalization_lib.resolve_normalization(
        spec, source=source,
        recorded=None if run is None else run.read_json(run.normalization),
        where=None if run is None else run.normalization, **kwargs)
    if writes and run is not None and record is not None:
        run.write_json(run.normalization, record)
    return values


@gin.configurable
def image_folders(labeled_root, unlabeled_root, *, channels=3,
                  include_labeled_in_unlabeled=True):
    """`(labeled, unlabeled)` `ImageSource`s: a folder of class subfolders
    and a folder of unlabeled images.

    Args:
        labeled_root: `labeled_root/<class_name>/*.jpg|png|...`.
        unlabeled_root: any folder of images (searched recursively).
        channels: channels to decode to.
        include_labeled_in_unlabeled: also stream the labeled images as
            unlabeled ones (paper footnote 1).
    """
    labeled = folders.image_folder(labeled_root, labeled=True,
                                   channels=channels)
    unlabeled = folders.image_folder(unlabeled_root, labeled=False,
                                     channels=channels)
    if include_labeled_in_unlabeled:
        roots = {'unlabeled': (unlabeled_root, unlabeled.names),
                 'labeled': (labeled_root, labeled.names)}
        # Named apart from where the folders lie: a run resumed on a copy
        # elsewhere (a node's local disk) reads the same data.
        unlabeled = sources.from_files(
            [os.path.join(root, n) for root, names in roots.values()
             for n in names],
            [f'{part}/{n}' for part, (_, names) in roots.items()
             for n in names], channels=channels)
    return labeled, unlabeled


# The folder sources `load_data` takes, by the parameter that names the
# folder of their labeled class subfolders.
FOLDER_ROOTS = {image_folders: 'labeled_root', folders.image_folder: 'root'}


@gin.configurable(denylist=['bundle', 'normalization'])
def eval_preprocessing(bundle=None, *, normalization=None,
                       image_size=gin.REQUIRED, crop_fraction=1.0, mean=None,
                       std=None):
    """Single centre-crop evaluation preprocessing (PAWS Appendix A).

    Args:
        bundle, normalization: the run's `DataBundle` (its normalisation,
            checked against its channels), else its `(mean, std)`.
        image_size: side S of the evaluated crop.
        crop_fraction: the shorter side is resized to S / crop_fraction
            before the centre crop (0.875 for ImageNet; 1.0 keeps CIFAR-10
            and Fashion-MNIST images whole).
        mean, std: never bound (refused, naming `load_data.normalization`).

    Returns:
        dict of `image_size`, `crop_fraction`, `mean` and `std`, the
        arguments of `pipeline.make_eval_dataset` and `export`.

    Raises:
        checks.ConfigError: `mean` or `std` bound, or no normalisation.
        ValueError: a normalisation of other channels than the images'.
    """
    normalization_lib.refuse_own('eval_preprocessing', mean, std)
    if bundle is not None:
        normalization = bundle.normalization
    mean, std = normalization_lib.normalization(
        normalization_lib.required(normalization),
        channels=None if bundle is None else bundle.labeled.channels)
    return dict(image_size=image_size, crop_fraction=crop_fraction,
                mean=mean, std=std)


def recorded_preprocessing(run=None):
    """`(preprocessing, channels)`: `eval_preprocessing` of the trained
    run `run` (a `RunDir`; None for an import) without reading its images,
    and their channel count. The normalisation is the run's record or, for
    a preset or pair, the config's."""
    spec = normalization_lib.required(
        bindings.arguments(load_data)['normalization'][0])
    normalization, _ = normalization_lib.resolve_normalization(
        spec,
        recorded=None if run is None else run.read_json(run.normalization),
        where='the run directory' if run is None else run.normalization)
    preprocessing = eval_preprocessing(normalization=normalization)
    return preprocessing, len(preprocessing['mean'])


@gin.configurable
def synthetic_source(*, num_images=512, num_classes=4, image_size=16,
                     channels=3, seed=0):
    """A labeled in-memory `ImageSource` of clustered synthetic uint8
    images, for smoke tests and `debug.gin`.

    Each class is a coarse random luminance pattern (the same in every
    channel, so colour augmentations keep classes apart, and for every
    `seed`, so that the train and test sets share classes); an image is its
    class pattern, randomly shifted, plus pixel noise of std 0.25.

    Args:
        num_images, num_classes, image_size, channels: the sizes (classes
            take turns).
        seed: seed of the shifts and noise (another one for a test set).
    """
    coarse = np.random.default_rng(0).uniform(
        size=(num_classes, 4, 4, 1)).repeat(channels, axis=-1)
    rng = np.random.default_rng(seed)
    patterns = np.kron(coarse, np.ones((1, image_size // 4 + 1,
                                        image_size // 4 + 1, 1)))
    labels = np.arange(num_images) % num_classes
    images = []
    for label in labels:
        dy, dx = rng.integers(0, patterns.shape[1] - image_size + 1, size=2)
        image = patterns[label, dy:dy + image_size, dx:dx + image_size]
        image = image + 0.25 * rng.normal(size=image.shape)
        images.append(np.clip(image * 255.0, 0, 255).astype(np.uint8))
    return sources.from_arrays(np.stack(images), labels,
                               [f'class_{c}' for c in range(num_classes)])


@gin.configurable
def class_subset(*, source=gin.REQUIRED, classes=gin.REQUIRED):
    """The labeled `ImageSource` of some classes of a labeled source,
    renumbered (the class-mismatch setting's labeled and test sets).

    Args:
        source: zero-argument callable returning the labeled `ImageSource`.
        classes: class ids to keep; the i-th becomes class i.
    """
    return sources.keep_classes(source(), classes)


@gin.configurable
def held_out(*, source=gin.REQUIRED, part='train', size=5000, seed=0):
    """One part (an `ImageSource`) of a labeled source split into training
    and validation, for tuning without the test split (`load_data.train`
    and `.test`).

    Args:
        source: zero-argument callable returning the labeled `ImageSource`.
        part: `'train'` (everything else) or `'validation'` (`size` images
            chosen by `seed`).
        size, seed: the validation images' count and seed.

    Raises:
        checks.ConfigError: another `part`, or a `size` that leaves the
            training part empty.
    """
    # A typo ('val') would otherwise evaluate on the training part.
    checks.one_of('held_out.part', part, ('train', 'validation'))
    checks.integer('held_out.size', size)
    full = source()
    if size >= full.num_examples:
        raise checks.ConfigError(
            f'held_out.size = {size} leaves no training images of the '
            f'{full.num_examples}: bind a smaller size.')
    order = np.random.default_rng(seed).permutation(full.num_examples)
    chosen = order[:size] if part == 'validation' else order[size:]
    return full.subset(np.sort(chosen))
