"""TFDS sources on tfds.testing.mock_data: in memory and ImageNet."""

import hashlib
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from paws_tf.data import splits
from paws_tf.data import tfds_sources
from paws_tf import run_dir


def _read_all(source):
    """Every image of `source`, read inside tf.data, in order."""
    dataset = tf.data.Dataset.range(source.num_examples).map(source.read)
    return [image.numpy() for image in dataset]


def test_canonical_cifar_order():
    ids = np.array([b'train_00002', b'train_00000', b'train_00001'])
    np.testing.assert_array_equal(
        tfds_sources._canonical_order(ids, 'train'), [1, 2, 0])
    assert tfds_sources._canonical_order(ids, 'test') is None
    assert tfds_sources._canonical_order(None, 'train') is None


@pytest.mark.parametrize('name,shape,num_classes', [
    ('cifar10', (32, 32, 3), 10), ('fashion_mnist', (28, 28, 1), 10)])
def test_tfds_in_memory(tmp_path, name, shape, num_classes):
    with tfds.testing.mock_data(num_examples=40, data_dir=str(tmp_path)):
        source = tfds_sources.load_tfds(name, data_dir=str(tmp_path))
    assert source.num_examples == 40 and source.channels == shape[-1]
    assert len(source.class_names) == num_classes
    assert _read_all(source.subset([0]))[0].shape == shape
    split = splits.select_labeled(source, fraction=0.5, seed=0)
    labeled = split.labeled
    run = run_dir.RunDir(tmp_path / 'run')
    run.write_split(labeled.names, split.header)
    assert len(set(labeled.names)) == labeled.num_examples > 0
    reloaded, _ = splits.select_labeled(
        source, split_file=run.split)
    assert reloaded.names == labeled.names


def test_imagenet_subset_cached_as_files(tmp_path):
    data_dir, cache = str(tmp_path / 'tfds'), str(tmp_path / 'cache')
    with tfds.testing.mock_data(num_examples=6, data_dir=data_dir):
        labeled, unlabeled = tfds_sources.imagenet_sources(
            labeled_subset='1pct', cache_dir=cache, data_dir=data_dir)
        stream_labels = [label for _, label in unlabeled.ordered_dataset()]
        manifest = os.path.join(cache, 'imagenet2012_subset_1pct',
                                'manifest.tsv')
        written = os.stat(manifest).st_mtime_ns
        again, _ = tfds_sources.imagenet_sources(
            labeled_subset='1pct', cache_dir=cache, data_dir=data_dir)
    assert os.stat(manifest).st_mtime_ns == written  # the cache is reused
    assert again.names == labeled.names
    assert unlabeled.num_examples == 6 and len(unlabeled.class_names) == 1000
    files = os.listdir(os.path.join(cache, 'imagenet2012_subset_1pct',
                                    'images'))
    assert len(files) == labeled.num_examples == 6
    images = _read_all(labeled)
    assert all(image.ndim == 3 and image.shape[-1] == 3 for image in images)
    np.testing.assert_array_equal(labeled.labels, stream_labels)


def test_imagenet_unlabeled_can_exclude_labeled(tmp_path):
    data_dir, cache = str(tmp_path / 'tfds'), str(tmp_path / 'cache')
    with tfds.testing.mock_data(num_examples=3, data_dir=data_dir):
        labeled, _ = tfds_sources.imagenet_sources(
            labeled_subset='10pct', cache_dir=cache, data_dir=data_dir)
    # Mocked TFDS draws the same first examples for every dataset, so the
    # 3 labeled images are the first 3 of the 8 training images.
    with tfds.testing.mock_data(num_examples=8, data_dir=data_dir):
        _, unlabeled = tfds_sources.imagenet_sources(
            labeled_subset='10pct', cache_dir=cache, data_dir=data_dir,
            include_labeled_in_unlabeled=False)
        stream = [encoded.numpy() for encoded, _ in
                  unlabeled.shuffled_dataset(seed=1).take(5)]
    folder = os.path.join(cache, 'imagenet2012_subset_10pct', 'images')
    labeled_bytes = {open(os.path.join(folder, name), 'rb').read()
                     for name in os.listdir(folder)}
    assert unlabeled.num_examples == 5 and len(labeled_bytes) == 3
    assert len(set(stream)) == 5 and not set(stream) & labeled_bytes
    with pytest.raises(ValueError, match="one of \\('1pct', '10pct'\\)"):
        tfds_sources.imagenet_sources(labeled_subset='5pct', cache_dir=cache)


def test_imagenet_validation_is_a_seeded_draw_outside_both_subsets(
        tmp_path, monkeypatch):
    """suncet's val.txt kind of set: per class, training images in neither
    labeled subset, drawn with the seed (or named by a file), cached."""
    encoded = tf.io.encode_jpeg(tf.zeros([4, 4, 3], tf.uint8)).numpy()
    names = {c: [f'n{c:08d}_{i}.JPEG' for i in range(6)] for c in range(5)}
    splits = {
        'imagenet2012': [(c, n) for c in names for n in names[c]],
        'imagenet2012_subset/1pct': [(c, names[c][0]) for c in names],
        'imagenet2012_subset/10pct': [(c, n) for c in names
                                      for n in names[c][:2]]}
    reads = []

    def examples(name, data_dir):
        reads.append(name)
        return iter([(encoded, c, n) for c, n in splits[name]])

    monkeypatch.setattr(tfds_sources, '_examples', examples)
    cache = str(tmp_path / 'cache')
    with tfds.testing.mock_data(num_examples=1, data_dir=str(tmp_path)):
        drawn = tfds_sources.imagenet_validation(cache_dir=cache,
                                                 per_class=2, seed=3)
        again = tfds_sources.imagenet_validation(cache_dir=cache,
                                                 per_class=2, seed=3)
        other = tfds_sources.imagenet_validation(cache_dir=cache,
                                                 per_class=2, seed=4)
        listed = tmp_path / 'val.txt'
        listed.write_text('n00000001_5.JPEG\nn00000003_2.JPEG\n')
        named = tfds_sources.imagenet_validation(cache_dir=cache,
                                                 names_file=str(listed))
    expected = []
    for c in names:
        candidates = sorted(names[c][2:], key=lambda n: hashlib.sha256(
            f'3:{n}'.encode()).digest())
        expected += sorted(candidates[:2])
    assert list(drawn.names) == list(again.names) == expected
    assert drawn.labels.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert other.names != drawn.names
    assert list(named.names) == ['n00000001_5.JPEG', 'n00000003_2.JPEG']
    assert named.labels.tolist() == [1, 3]
    assert len(drawn.class_names) == 1000
    # Three draws, three passes; the repeated draw read the cache.
    assert reads.count('imagenet2012') == 3
    assert drawn.read(0).shape == (4, 4, 3)
