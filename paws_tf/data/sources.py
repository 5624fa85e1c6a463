"""Image sources: uint8 images and labels, by position or as a stream."""

import dataclasses
import gzip
import typing

import gin
import numpy as np
import tensorflow as tf

from paws_tf import checks

FASHION_MNIST_CLASS_NAMES = (
    'T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt',
    'Sneaker', 'Bag', 'Ankle boot')


def eager_constant(array):
    """A CPU tensor built outside any trace: graphs capture it by handle,
    where a NumPy array captured by `Dataset.map` is embedded as a constant
    (150 MB for CIFAR-10)."""
    with tf.init_scope(), tf.device('CPU:0'):
        return tf.constant(array)


def decode_image(encoded, channels):
    """Decodes JPEG/PNG/BMP/GIF bytes to uint8 [H, W, channels].

    JPEGs are decoded with the accurate integer inverse DCT, the one PIL
    (libjpeg's default) uses, so that the pixels are PIL's, which the
    official code reads its images with; `tf.io.decode_image` takes a
    faster IDCT, a few grey levels away from PIL on most pixels. A colour
    JPEG decoded to one channel gives libjpeg's luma, which PIL's
    `convert('L')` of the RGB pixels rounds differently. 8-bit PNGs, GIFs
    and 24- or 32-bit BMPs are converted as PIL's `convert('L')` or
    `convert('RGB')` converts them (`_pil_channels`; TensorFlow's BMP and
    GIF decoders give no single channel); a GIF gives its first frame. A
    16-bit PNG is scaled to 8 bits (PIL clips it), and a palette BMP is
    what TensorFlow's decoder gives, not its colours.
    """
    image = tf.cond(
        tf.io.is_jpeg(encoded),
        lambda: tf.io.decode_jpeg(encoded, channels=channels,
                                  dct_method='INTEGER_ACCURATE'),
        lambda: _pil_channels(tf.io.decode_image(
            encoded, expand_animations=False), channels))
    image.set_shape([None, None, channels])
    return image


def _pil_channels(image, channels):
    """uint8 `[H, W, c]` of 1 to 4 channels (grey, grey and alpha, RGB,
    RGBA) in `channels` 1 or 3, alpha dropped, as PIL converts: grey
    repeated, or RGB's luma `(19595 R + 38470 G + 7471 B + 2^15) >> 16`
    (Pillow's `L24`)."""
    grey = tf.shape(image)[-1] < 3
    if channels == 3:
        return tf.cond(grey, lambda: tf.tile(image[..., :1], [1, 1, 3]),
                       lambda: image[..., :3])

    def luma():
        rgb = tf.cast(image[..., :3], tf.int32)
        weighted = tf.tensordot(rgb, tf.constant([19595, 38470, 7471]), 1)
        return tf.cast((weighted + 2 ** 15) // 2 ** 16, tf.uint8)[..., None]

    return tf.cond(grey, lambda: image[..., :1], luma)


class _Store:
    """Decoded uint8 images [N, H, W, C], or image file paths decoded to
    `channels` on read; one copy for a source and its subsets."""

    def __init__(self, items, channels):
        self.items = items
        self.channels = channels
        self._tensor = None

    def read(self, row):
        if self._tensor is None:
            self._tensor = eager_constant(self.items)
        item = tf.gather(self._tensor, row)
        if self.items.dtype == np.uint8:
            return item  # [H, W, C]
        return decode_image(tf.io.read_file(item), self.channels)


class ImageSource:
    """Images addressable by position, with optional integer class labels
    (made by `from_arrays` and `from_files`).

    Attributes:
        labels: int32 [N] class ids, or None for an unlabeled source.
        class_names: tuple of str indexed by class id (empty if unlabeled).
        names: tuple of N str, each item's identity in split files: a path
            relative to the folder root, a TFDS file name, or the item's
            index in its dataset's canonical order.
        channels: int, channel count of every image.
    """

    def __init__(self, store, rows, names, *, labels=None, class_names=()):
        """The images at `rows` (int [N]) of the `_Store` `store`; the
        other arguments are the attributes (labels may be None)."""
        self._store = store
        self._rows = np.asarray(rows, np.int64)
        self._rows_tensor = None
        self.names = tuple(names)
        self.labels = None if labels is None else np.asarray(labels, np.int32)
        self.class_names = tuple(class_names)
        self.channels = store.channels
        num_labels = len(self._rows) if labels is None else len(self.labels)
        if len(self.names) != len(self._rows) or num_labels != len(self._rows):
            raise ValueError(
                f'{len(self._rows)} images but {len(self.names)} names and '
                f'{num_labels} labels.')

    @property
    def num_examples(self):
        return len(self._rows)

    def read(self, position):
        """Image `position` (an int tensor) as uint8 [H, W, C]; traceable
        (call it inside `tf.data.Dataset.map`)."""
        if self._rows_tensor is None:
            self._rows_tensor = eager_constant(self._rows)
        return self._store.read(tf.gather(self._rows_tensor, position))

    def subset(self, positions, labels=None, class_names=None):
        """The images at `positions` (int array) as a new source, with
        their labels and class names unless others are given."""
        positions = np.asarray(positions, np.int64)
        if labels is None and self.labels is not None:
            labels = self.labels[positions]
        return ImageSource(
            self._store, self._rows[positions],
            [self.names[p] for p in positions], labels=labels,
            class_names=(self.class_names if class_names is None
                         else class_names))

    def ordered_dataset(self):
        """`(uint8 [H, W, C], int32 label)` pairs in source order."""
        if self.labels is None:
            raise ValueError('This source has no labels to evaluate against.')
        labels = tf.data.Dataset.from_tensor_slices(self.labels)
        positions = tf.data.Dataset.range(self.num_examples)
        return tf.data.Dataset.zip((positions, labels)).map(
            lambda position, label: (self.read(position), label),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


@dataclasses.dataclass(frozen=True)
class StreamSource:
    """Images readable only in sequence, e.g. ImageNet's 1.28M from TFDS;
    items stay encoded until `decode`, so a shuffle buffer holds bytes.

    Attributes:
        open_fn: callable `(shuffle_seed, input_context) -> Dataset` of
            `(encoded string, int32 label)` making one pass. With
            `shuffle_seed=None`: every item in source order; otherwise the
            shard of `input_context` (may be None) with its file order
            shuffled by `shuffle_seed` (reshuffled every pass).
        num_examples: int, items in one pass.
        channels: int, channel count after decoding.
        class_names: tuple of str indexed by class id.
        shuffle_buffer: int, items in the seeded shuffle buffer.
    """
    open_fn: typing.Callable
    num_examples: int
    channels: int
    class_names: tuple
    shuffle_buffer: int

    def decode(self, encoded):
        """Decodes one item to uint8 [H, W, C]."""
        return decode_image(encoded, self.channels)

    def shuffled_dataset(self, seed, input_context=None):
        """An endless, seeded shuffle of `(encoded, label)` items."""
        dataset = self.open_fn(seed, input_context)
        return dataset.shuffle(self.shuffle_buffer, seed=seed,
                               reshuffle_each_iteration=True).repeat()

    def ordered_dataset(self):
        """`(uint8 [H, W, C], int32 label)` pairs in source order."""
        return self.open_fn(None, None).map(
            lambda encoded, label: (self.decode(encoded), label),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def from_arrays(images, labels=None, class_names=None):
    """uint8 [N, H, W, C] or [N, H, W] (one channel) `images` as an
    `ImageSource` named by index, with int [N] `labels` (or None) and
    `class_names` indexed by class id (default `'0'`, `'1'`, ...)."""
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim not in (3, 4):
        raise ValueError('images must be uint8 [N, H, W, C] or [N, H, W]; got '
                         f'{images.dtype} {images.shape}.')
    if images.ndim == 3:
        images = images[..., None]
    if labels is not None and class_names is None:
        num_classes = int(np.max(labels)) + 1 if len(labels) else 0
        class_names = [str(c) for c in range(num_classes)]
    return ImageSource(_Store(images, images.shape[-1]),
                       np.arange(len(images)),
                       [str(i) for i in range(len(images))], labels=labels,
                       class_names=class_names or ())


def from_files(paths, names, *, labels=None, class_names=(), channels=3):
    """N image files (JPEG, PNG, BMP or GIF, sniffed) as an `ImageSource`
    of the N `names` (for split files), decoded to `channels` on read;
    `labels`, `class_names` as `ImageSource` has them."""
    store = _Store(np.array(paths, object), channels)
    return ImageSource(store, np.arange(len(paths)), names, labels=labels,
                       class_names=class_names)


def read_idx(path):
    """An IDX file (MNIST format, gzipped or not) as a uint8 array;
    `checks.DataError` for a bad magic number or size."""
    opener = gzip.open if str(path).endswith('.gz') else open
    with opener(path, 'rb') as f:
        data = f.read()
    if len(data) < 4 or data[:3] != b'\x00\x00\x08':
        raise checks.DataError(
            f'{path}: bad IDX magic number {data[:4].hex()}; expected '
            '0000 08 NN (unsigned bytes, NN dimensions). Is it an MNIST-style '
            'file (and gzipped only if the name ends in .gz)?')
    ndim = data[3]
    shape = tuple(int(d) for d in np.frombuffer(data, '>u4', ndim, offset=4))
    offset = 4 + 4 * ndim
    if len(data) - offset != int(np.prod(shape)):
        raise checks.DataError(
            f'{path}: header says shape {shape} ({int(np.prod(shape))} '
            f'bytes) but the file holds {len(data) - offset} bytes of '
            'data.')
    return np.frombuffer(data, np.uint8, offset=offset).reshape(shape)


@gin.configurable
def load_idx(images_path, labels_path=None, class_names=None):
    """The IDX files of uint8 [N, H, W] images and [N] labels (None:
    unlabeled), e.g. Fashion-MNIST's, as an in-memory one-channel
    `ImageSource` (`class_names` as `from_arrays` takes them);
    `checks.DataError` for malformed files or other counts."""
    images = read_idx(images_path)
    labels = None if labels_path is None else read_idx(labels_path)
    if images.ndim != 3:
        raise checks.DataError(
            f'{images_path}: expected [N, H, W] images, got '
            f'shape {images.shape}.')
    if labels is not None and labels.shape != images.shape[:1]:
        raise checks.DataError(
            f'{labels_path} holds labels of shape {labels.shape} '
            f'but {images_path} holds {len(images)} images.')
    return from_arrays(images, labels, class_names)


def keep_classes(source, classes):
    """The images of the `classes` (ids) of a labeled `ImageSource`, in
    source order, the i-th class renumbered i; ValueError for an
    unlabeled source, or classes empty, repeated or unknown."""
    if source.labels is None:
        raise ValueError('keep_classes needs a source with labels.')
    classes = [int(c) for c in classes]
    count = len(source.class_names)
    if (not classes or len(set(classes)) != len(classes) or
            not all(0 <= c < count for c in classes)):
        raise ValueError(
            f'classes must be distinct class ids in [0, {count}), got '
            f'{classes!r}.')
    new_id = np.full(count, -1, np.int32)
    new_id[classes] = np.arange(len(classes))
    positions = np.flatnonzero(new_id[source.labels] >= 0)
    return source.subset(positions, new_id[source.labels[positions]],
                         [source.class_names[c] for c in classes])
