"""The class-mismatch experiment's data: known classes labeled and tested,
every class unlabeled (or the known ones only, curated).

Bugs tried: Fashion-MNIST's 'Sandal' and 'Shirt' swapped in
`sources.FASHION_MNIST_CLASS_NAMES` (the known classes' names are written
in tests/test_sources.py, not read from it).
"""

import pathlib
import re

import gin
import numpy as np
import pytest

from paws_tf import bindings
from paws_tf import checks
from paws_tf import configurables  # noqa: F401  (registers configurables)
from paws_tf import model
from paws_tf.data import sources
from paws_tf import run_dir
from paws_tf.runner import experiment
from tests.helpers import idx
from tests.test_sources import FASHION_MNIST_NAMES

REPO = pathlib.Path(__file__).resolve().parents[1]
TRAIN_PER_CLASS, TEST_PER_CLASS = 50, 10


@pytest.fixture
def fake_fashion_mnist(tmp_path):
    """IDX files of 10 classes whose pixels encode the image's index."""
    for prefix, per_class in (('train', TRAIN_PER_CLASS),
                              ('t10k', TEST_PER_CLASS)):
        count = 10 * per_class
        labels = np.arange(count) % 10
        images = np.zeros([count, 28, 28], np.uint8)
        images[:, 0, 0] = np.arange(count) % 256
        images[:, 0, 1] = np.arange(count) // 256
        idx.write_idx(tmp_path / f'{prefix}-images-idx3-ubyte.gz', images)
        idx.write_idx(tmp_path / f'{prefix}-labels-idx1-ubyte.gz', labels)
    return tmp_path


def load(name, idx_dir, record_dir, *bindings):
    gin.parse_config_files_and_bindings(
        [str(REPO / 'gin_configs' / name)],
        [f"fashion_mnist.idx_dir = '{idx_dir}'", *bindings])
    return experiment.load_data(run_dir.RunDir(record_dir))


def original_labels(source):
    """Class ids in the full training set, from the pixels' index code."""
    pixels = np.stack([source.read(p).numpy()[0, :2, 0]
                       for p in range(source.num_examples)]).astype(int)
    return (pixels[:, 0] + 256 * pixels[:, 1]) % 10


@pytest.mark.parametrize('name,unlabeled_count', [
    ('mismatch_fashion_mnist.gin', 10 * TRAIN_PER_CLASS),
    ('mismatch_fashion_mnist_ropaws.gin', 10 * TRAIN_PER_CLASS),
    ('mismatch_fashion_mnist_curated.gin', 6 * TRAIN_PER_CLASS),
    ('mismatch_fashion_mnist_curated_ropaws.gin', 6 * TRAIN_PER_CLASS)])
def test_known_classes_are_labeled_and_tested(clean_gin, fake_fashion_mnist,
                                              tmp_path, name,
                                              unlabeled_count):
    bundle = load(name, fake_fashion_mnist, tmp_path / 'run')
    names = FASHION_MNIST_NAMES[:6]
    assert bundle.labeled.class_names == names
    assert bundle.test.class_names == names
    assert bundle.labeled.num_examples == 6 * 40
    np.testing.assert_array_equal(np.bincount(bundle.labeled.labels),
                                  [40] * 6)
    np.testing.assert_array_equal(original_labels(bundle.labeled),
                                  bundle.labeled.labels)
    assert bundle.test.num_examples == 6 * TEST_PER_CLASS
    np.testing.assert_array_equal(np.bincount(bundle.test.labels),
                                  [TEST_PER_CLASS] * 6)
    assert bundle.unlabeled.num_examples == unlabeled_count
    held = np.bincount(original_labels(bundle.unlabeled), minlength=10)
    want = [TRAIN_PER_CLASS] * 6 + [TRAIN_PER_CLASS if unlabeled_count ==
                                    10 * TRAIN_PER_CLASS else 0] * 4
    np.testing.assert_array_equal(held, want)
    assert bindings.arguments(model.PAWSModel)['objective'][0] == (
        'ropaws' if 'ropaws' in name else 'paws')


def test_validation_split_holds_out_training_images(
        clean_gin, fake_fashion_mnist, tmp_path):
    bundle = load('mismatch_fashion_mnist_validation.gin', fake_fashion_mnist,
                  tmp_path / 'run', 'held_out.size = 100',
                  'select_labeled.labels_per_class = 20')
    held_out = experiment.held_out(
        source=lambda: sources.load_idx(
            str(fake_fashion_mnist / 'train-images-idx3-ubyte.gz'),
            str(fake_fashion_mnist / 'train-labels-idx1-ubyte.gz')),
        part='validation', size=100)
    known = np.isin(held_out.labels, range(6))
    assert bundle.test.num_examples == known.sum()
    assert set(bundle.test.names) == {
        n for n, k in zip(held_out.names, known) if k}
    assert bundle.unlabeled.num_examples == 10 * TRAIN_PER_CLASS - 100
    for part in (bundle.labeled, bundle.unlabeled):
        assert not set(part.names) & set(held_out.names)


@pytest.mark.parametrize('part,size,message', [
    ('val', 2, "held_out.part must be one of ('train', 'validation'), got "
               "'val'"),
    ('validation', 8, 'held_out.size = 8 leaves no training images of the '
                      '8: bind a smaller size.'),
    ('train', 0, 'held_out.size must be a positive integer, got 0')])
def test_held_out_refuses_a_part_or_size_it_has_not(part, size, message):
    """Fails if another part is taken for the training part (tried: no
    check of `part`: 'val' held 6 of 8 images, the training ones, so a
    validation run evaluated on its training images)."""
    source = sources.from_arrays(np.zeros([8, 2, 2, 1], np.uint8),
                                 np.arange(8) % 2, ['a', 'b'])
    with pytest.raises(checks.ConfigError, match=re.escape(message)):
        experiment.held_out(source=lambda: source, part=part, size=size)


@pytest.mark.parametrize('classes', [(), (1, 1), (10,), (-1,)])
def test_keep_classes_rejects_bad_ids(classes):
    source = sources.from_arrays(np.zeros([4, 2, 2, 1], np.uint8),
                                 np.arange(4) % 2, ['a', 'b'])
    with pytest.raises(ValueError, match='distinct class ids in'):
        sources.keep_classes(source, classes)
