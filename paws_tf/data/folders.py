"""Image folders as sources, undecodable files found before training."""

import collections
import pathlib

from absl import logging
import gin
import tensorflow as tf

from paws_tf import checks
from paws_tf.data import sources

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.gif')
BAD_IMAGE_POLICIES = ('skip', 'fail')
_MAX_LISTED = 5  # Files or classes named in an error; longer lists are cut.


def _image_files(directory):
    """Sorted image files under `directory`, recursively, and a count of
    the other files by extension."""
    paths = [p for p in sorted(pathlib.Path(directory).rglob('*'))
             if p.is_file()]
    other = collections.Counter(p.suffix.lower() or '(none)' for p in paths
                                if p.suffix.lower() not in IMAGE_EXTENSIONS)
    return [p for p in paths if p.suffix.lower() in IMAGE_EXTENSIONS], other


def _other_types(other):
    """`other` (extension -> count) for a message."""
    return (f'{sum(other.values())} not of a type read here ('
            + ', '.join(f'{ext} {n}' for ext, n in sorted(other.items()))
            + f'; read: {" ".join(IMAGE_EXTENSIONS)})')


def _undecodable(paths, channels):
    """Sorted positions of the `paths` that cannot be read and decoded to
    `channels` (zero-byte, truncated, corrupt, non-image files)."""
    def check(position, path):
        image = sources.decode_image(tf.io.read_file(path), channels)
        return position, tf.shape(image)[0]

    good = (tf.data.Dataset.from_tensor_slices(list(paths)).enumerate()
            .map(check, num_parallel_calls=tf.data.AUTOTUNE,
                 deterministic=False)
            .ignore_errors())
    decoded = {int(position) for position, _ in good.as_numpy_iterator()}
    return sorted(set(range(len(paths))) - decoded)


def _bad_files(root, files, other, *, channels, check_images, on_bad_image):
    """The positions in `files` (under `root`) that do not decode to
    `channels`-channel images (none unless `check_images`), logged with
    the `other` files skipped, or raised under `on_bad_image='fail'`."""
    bad = _undecodable([str(p) for p in files], channels) if check_images \
        else []
    shown = ', '.join(files[i].relative_to(root).as_posix()
                      for i in bad[:_MAX_LISTED])
    if bad and on_bad_image == 'fail':
        raise checks.DataError(
            f'{len(bad)} of {len(files)} files under {root} cannot '
            f'be decoded as images: {shown}. Remove or repair them, '
            "or set on_bad_image='skip'.")
    skipped = ([f'{len(bad)} cannot be decoded as images ({shown})']
               if bad else []) + ([_other_types(other)] if other else [])
    if skipped:
        logging.warning('Skipping %d of %d files under %s: %s.',
                        len(bad) + sum(other.values()),
                        len(files) + sum(other.values()), root,
                        '; '.join(skipped))
    return bad


@gin.configurable
def image_folder(root, *, labeled=True, channels=3, check_images=True,
                 on_bad_image='skip'):
    """The image files under `root` as an `ImageSource` (decoded on read;
    names are paths relative to `root`); broken files are found before
    training, not hours into it (`check_images`), and skipped and logged
    like files of other types, or stop the run.

    Args:
        root: folder. Labeled: `root/<class_name>/**/*.{jpg,png,...}` with
            class ids given by sorted class name. Unlabeled: every image
            under `root`, recursively.
        labeled: whether subfolders are classes.
        channels: channels to decode to (grayscale/RGBA/CMYK converted).
        check_images: decode every file once now (for a huge folder known
            to be clean, False skips it; a bad file then stops training).
        on_bad_image: `'skip'` or `'fail'`.

    Raises:
        checks.DataError: no images, an empty class folder, or a broken
            file under `on_bad_image='fail'`.
    """
    checks.one_of('image_folder.on_bad_image', on_bad_image,
                  BAD_IMAGE_POLICIES)
    root = pathlib.Path(root)
    if not root.is_dir():
        raise checks.DataError(f'Image folder {root} does not exist.')
    class_names = sorted(d.name for d in root.iterdir()
                         if d.is_dir()) if labeled else []
    files, labels, other = [], [], collections.Counter()
    for class_id, folder in enumerate(
            [root / name for name in class_names] if labeled else [root]):
        class_files, class_other = _image_files(folder)
        files += class_files
        labels += [class_id] * len(class_files)
        other += class_other
    if not files:
        raise checks.DataError(
            f'No {"/".join(IMAGE_EXTENSIONS)} images under {root}' +
            (' in class subfolders' if labeled else '') +
            (f'; {_other_types(other)}.' if other else '.'))
    bad = _bad_files(root, files, other, channels=channels,
                     check_images=check_images, on_bad_image=on_bad_image)
    keep = sorted(set(range(len(files))) - set(bad))
    files, labels = [files[i] for i in keep], [labels[i] for i in keep]
    present = set(labels)
    empty = [name for class_id, name in enumerate(class_names)
             if class_id not in present]
    if empty:
        raise checks.DataError(
            f'Class folders under {root} hold no usable images: '
            f'{empty[:_MAX_LISTED]}. Add images or remove the folders.')
    return sources.from_files([str(p) for p in files],
                              [p.relative_to(root).as_posix() for p in files],
                              labels=labels if labeled else None,
                              class_names=class_names, channels=channels)
