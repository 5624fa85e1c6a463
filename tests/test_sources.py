"""Image sources: arrays, IDX files, image folders, labeled splits.

Bugs tried: Fashion-MNIST's 'Sandal' and 'Shirt' swapped in
`sources.FASHION_MNIST_CLASS_NAMES`.
"""

import numpy as np
import PIL.Image
import pytest
import tensorflow as tf

from tests.helpers import idx
from paws_tf import checks
from paws_tf.data import folders
from paws_tf.data import sources
from paws_tf.data import splits
from paws_tf import run_dir

# Fashion-MNIST's class names by label, from its README's "Labels" table
# (zalandoresearch/fashion-mnist at 02cf067, README.md).
FASHION_MNIST_NAMES = ('T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat',
                       'Sandal', 'Shirt', 'Sneaker', 'Bag', 'Ankle boot')


def _read_all(source):
    """Every image of `source`, read inside tf.data, in order."""
    dataset = tf.data.Dataset.range(source.num_examples).map(source.read)
    return [image.numpy() for image in dataset]


def test_from_arrays_reads_in_tf_data_and_adds_channel():
    images = np.arange(5 * 4 * 3, dtype=np.uint8).reshape(5, 4, 3)
    source = sources.from_arrays(images, labels=[0, 1, 2, 1, 0])
    assert source.channels == 1 and source.class_names == ('0', '1', '2')
    assert source.names == ('0', '1', '2', '3', '4')
    for i, image in enumerate(_read_all(source)):
        np.testing.assert_array_equal(image, images[i][..., None])


def test_subset_keeps_names_labels_and_pixels():
    images = np.random.default_rng(0).integers(0, 255, [6, 2, 2, 3], np.uint8)
    source = sources.from_arrays(images, labels=[0, 1, 0, 1, 0, 1])
    subset = source.subset([4, 1])
    assert subset.names == ('4', '1')
    np.testing.assert_array_equal(subset.labels, [0, 1])
    np.testing.assert_array_equal(np.stack(_read_all(subset)), images[[4, 1]])


@pytest.mark.parametrize('suffix', ['', '.gz'])
def test_load_idx(tmp_path, suffix):
    images = np.random.default_rng(1).integers(0, 255, [7, 5, 4], np.uint8)
    labels = np.array([0, 1, 2, 3, 4, 5, 9], np.uint8)
    idx.write_idx(tmp_path / f'img{suffix}', images)
    idx.write_idx(tmp_path / f'lab{suffix}', labels)
    source = sources.load_idx(tmp_path / f'img{suffix}',
                              tmp_path / f'lab{suffix}',
                              sources.FASHION_MNIST_CLASS_NAMES)
    assert source.num_examples == 7 and source.channels == 1
    assert tuple(source.class_names) == FASHION_MNIST_NAMES
    np.testing.assert_array_equal(source.labels, labels)
    np.testing.assert_array_equal(np.stack(_read_all(source))[..., 0], images)


def test_idx_errors(tmp_path):
    """Data errors, which run.py prints as one line. Fails if read_idx
    raises a plain ValueError."""
    (tmp_path / 'bad').write_bytes(b'\x00\x00\x0d\x03' + bytes(16))
    with pytest.raises(checks.DataError, match='bad IDX magic number'):
        sources.read_idx(tmp_path / 'bad')
    idx.write_idx(tmp_path / 'short', np.zeros([3, 2, 2], np.uint8))
    (tmp_path / 'short').write_bytes((tmp_path / 'short').read_bytes()[:-1])
    with pytest.raises(checks.DataError,
                       match=r'shape \(3, 2, 2\) \(12 bytes\)'):
        sources.read_idx(tmp_path / 'short')
    idx.write_idx(tmp_path / 'img', np.zeros([3, 2, 2], np.uint8))
    idx.write_idx(tmp_path / 'lab', np.zeros([4], np.uint8))
    with pytest.raises(ValueError, match='holds 3 images'):
        sources.load_idx(tmp_path / 'img', tmp_path / 'lab')


@pytest.fixture(name='folder')
def _folder(tmp_path):
    """cat/: RGB JPEG + grayscale PNG; dog/: RGB PNG + RGBA PNG in a subdir."""
    root = tmp_path / 'images'
    rgb = np.random.default_rng(2).integers(0, 255, [6, 5, 3], np.uint8)
    pixels = {}
    (root / 'cat').mkdir(parents=True)
    (root / 'dog' / 'more').mkdir(parents=True)
    PIL.Image.fromarray(rgb).save(root / 'cat' / 'a.jpg')
    PIL.Image.fromarray(rgb[..., 0]).save(root / 'cat' / 'b.PNG')
    PIL.Image.fromarray(rgb).save(root / 'dog' / 'c.png')
    rgba = np.concatenate([rgb, np.full([6, 5, 1], 255, np.uint8)], -1)
    PIL.Image.fromarray(rgba, 'RGBA').save(root / 'dog' / 'more' / 'd.png')
    (root / 'dog' / 'notes.txt').write_text('not an image')
    pixels['gray'], pixels['rgb'] = rgb[..., 0], rgb
    return root, pixels


def test_labeled_image_folder(folder):
    root, pixels = folder
    source = folders.image_folder(root)
    assert source.class_names == ('cat', 'dog')
    assert source.names == ('cat/a.jpg', 'cat/b.PNG', 'dog/c.png',
                            'dog/more/d.png')
    np.testing.assert_array_equal(source.labels, [0, 0, 1, 1])
    images = _read_all(source)
    assert all(image.shape == (6, 5, 3) for image in images)
    np.testing.assert_array_equal(images[1], np.repeat(
        pixels['gray'][..., None], 3, -1))  # grayscale -> 3 channels
    np.testing.assert_array_equal(images[2], pixels['rgb'])
    np.testing.assert_array_equal(images[3], pixels['rgb'])  # alpha dropped
    gray = folders.image_folder(root, channels=1)
    assert {image.shape for image in _read_all(gray)} == {(6, 5, 1)}


def test_unlabeled_image_folder_is_recursive(folder):
    root, _ = folder
    source = folders.image_folder(root, labeled=False)
    assert source.labels is None and source.num_examples == 4
    assert source.names[-1] == 'dog/more/d.png'
    with pytest.raises(ValueError, match='has no labels'):
        source.ordered_dataset()


def test_empty_folder_errors(tmp_path):
    (tmp_path / 'cls').mkdir()
    with pytest.raises(ValueError, match='No .* images under'):
        folders.image_folder(tmp_path)
    with pytest.raises(ValueError, match='does not exist'):
        folders.image_folder(tmp_path / 'missing')


def test_labeled_paths_file(folder, tmp_path):
    root, _ = folder
    split = tmp_path / 'labeled.txt'
    split.write_text('# two labeled images\ndog/more/d.png\n\ncat/a.jpg\n')
    labeled, unlabeled = splits.select_labeled(
        folders.image_folder(root), split_file=split,
        include_labeled_in_unlabeled=False)
    assert labeled.names == ('cat/a.jpg', 'dog/more/d.png')
    np.testing.assert_array_equal(labeled.labels, [0, 1])
    assert unlabeled.names == ('cat/b.PNG', 'dog/c.png')


def _cifar_like_labels(seed=0):
    """50k CIFAR-10-like labels with 1x1 images (selection ignores pixels)."""
    labels = np.random.default_rng(seed).permutation(np.repeat(
        np.arange(10), 5000))
    return sources.from_arrays(np.zeros([50000, 1, 1, 3], np.uint8), labels)


def test_cifar_split_400_per_class_recorded_and_reloaded(tmp_path):
    source = _cifar_like_labels()
    split = splits.select_labeled(source, labels_per_class=400, seed=3)
    labeled, unlabeled = split
    run = run_dir.RunDir(tmp_path)
    run.write_split(labeled.names, split.header)
    assert labeled.num_examples == 4000 and unlabeled is source
    np.testing.assert_array_equal(np.bincount(labeled.labels), [400] * 10)
    assert len(set(labeled.names)) == 4000
    recorded = run.split
    reloaded, _ = splits.select_labeled(source, split_file=recorded)
    assert reloaded.names == labeled.names
    np.testing.assert_array_equal(reloaded.labels, labeled.labels)
    again, _ = splits.select_labeled(source, labels_per_class=400, seed=3)
    other, _ = splits.select_labeled(source, labels_per_class=400, seed=4)
    assert again.names == labeled.names and other.names != labeled.names


def test_select_labeled_fraction_and_complement():
    source = _cifar_like_labels()
    labeled, unlabeled = splits.select_labeled(
        source, fraction=0.01, include_labeled_in_unlabeled=False)
    np.testing.assert_array_equal(np.bincount(labeled.labels), [50] * 10)
    assert unlabeled.num_examples == 50000 - 500
    assert not set(labeled.names) & set(unlabeled.names)


def test_select_labeled_errors(tmp_path):
    source = sources.from_arrays(np.zeros([6, 1, 1, 1], np.uint8),
                                 [0, 0, 0, 1, 1, 2], ['a', 'b', 'c'])
    with pytest.raises(ValueError, match="Class 'c' .id 2. has 1 images, "
                       'fewer than labels_per_class=2'):
        splits.select_labeled(source, labels_per_class=2)
    with pytest.raises(ValueError, match='exactly one of'):
        splits.select_labeled(source, labels_per_class=1, fraction=0.5)
    (tmp_path / 'unknown.txt').write_text('1\n99\n')
    with pytest.raises(ValueError, match=r"names are not in the source.*'99'"):
        splits.select_labeled(source, split_file=tmp_path / 'unknown.txt')
    (tmp_path / 'twice.txt').write_text('1\n1\n')
    with pytest.raises(ValueError, match='more than once'):
        splits.select_labeled(source, split_file=tmp_path / 'twice.txt')
