"""TFDS preparation as a user runs it, offline: real builders, tiny archives.

TFDS' own download manager fetches each URL (served here from a local file
instead of the network) and checks its size and SHA-256 against the
checksums registered for the builder (here, the tiny archive's); ImageNet's
archives come from `manual_dir` as for a real install. A module TFDS needs
to prepare a dataset and the requirements do not install fails here.
"""

import os

import numpy as np
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import checksums

from paws_tf.data import tfds_sources
from tests.helpers import tfds_archives


def test_cifar10_prepares_from_its_archive(tmp_path, monkeypatch):
    archive = tmp_path / 'served' / 'cifar-10-binary.tar.gz'
    archive.parent.mkdir()
    images, labels, names = tfds_archives.cifar10_archive(
        archive, np.random.default_rng(0))
    data_dir = str(tmp_path / 'tfds')
    # The checksum is checked: a file that differs from the registered one
    # is refused.
    tfds_archives.serve(monkeypatch, 'cifar10',
                        {tfds_archives.CIFAR10_URL: archive})
    builder_cls = type(tfds.builder('cifar10'))
    registered = builder_cls.url_infos[tfds_archives.CIFAR10_URL]
    monkeypatch.setattr(builder_cls, 'url_infos', {
        tfds_archives.CIFAR10_URL: checksums.UrlInfo(
            size=registered.size, checksum='0' * 64,
            filename=registered.filename)})
    with pytest.raises(Exception, match='wrong checksum'):
        tfds.builder('cifar10', data_dir=data_dir).download_and_prepare()
    tfds_archives.serve(monkeypatch, 'cifar10',
                        {tfds_archives.CIFAR10_URL: archive})
    # What run.py does for cifar10_wrn28_2_4000.gin: download and prepare.
    source = tfds_sources.load_tfds('cifar10', data_dir=data_dir)
    assert list(source.class_names) == names
    np.testing.assert_array_equal(source.labels, labels)
    read = np.stack([image for image, _ in
                     source.ordered_dataset().as_numpy_iterator()])
    np.testing.assert_array_equal(read, images)
    test = tfds_sources.load_tfds('cifar10', split='test', data_dir=data_dir,
                                  download=False)
    assert test.num_examples == 3


def test_fashion_mnist_prepares_from_its_files(tmp_path, monkeypatch):
    folder = tmp_path / 'served'
    folder.mkdir()
    rng = np.random.default_rng(1)
    images, labels = tfds_archives.idx_files(folder, 'train', 60_000, rng)
    tfds_archives.idx_files(folder, 't10k', 10_000, rng)
    tfds_archives.serve(monkeypatch, 'fashion_mnist', {
        tfds_archives.FASHION_MNIST_URL + path.name: path
        for path in folder.iterdir()})
    data_dir = str(tmp_path / 'tfds')
    # The demo's fallback when Debian's IDX files are missing; 8 images per
    # split are enough to write.
    tfds.builder('fashion_mnist', data_dir=data_dir).download_and_prepare(
        download_config=tfds.download.DownloadConfig(
            max_examples_per_split=8, force_checksums_validation=True))
    source = tfds_sources.load_tfds('fashion_mnist', data_dir=data_dir,
                                    download=False)
    assert source.class_names[0] == 'T-shirt/top'
    read = sorted((int(label), image.tobytes()) for image, label in
                  source.ordered_dataset().as_numpy_iterator())
    assert read == sorted((int(label), image[..., None].tobytes())
                          for image, label in zip(images, labels))


def test_imagenet_prepares_from_manual_archives(tmp_path, monkeypatch):
    manual_dir = tmp_path / 'manual'
    tfds_archives.imagenet_manual_dir(manual_dir)
    subset_file = tmp_path / 'served' / '1percent.txt'
    subset_file.parent.mkdir()
    first, second = tfds_archives.SYNSETS
    subset_file.write_text(f'{first}_1.JPEG\n{second}_0.JPEG\n')
    tfds_archives.serve(monkeypatch, 'imagenet2012_subset/1pct',
                        {tfds_archives.SUBSET_URLS['1pct']: subset_file})
    data_dir = str(tmp_path / 'tfds')
    config = tfds.download.DownloadConfig(manual_dir=str(manual_dir),
                                          force_checksums_validation=True)
    # The preparation docs/experiments.md gives for the ImageNet configs.
    for name in ('imagenet2012', 'imagenet2012_subset/1pct'):
        tfds.builder(name, data_dir=data_dir).download_and_prepare(
            download_config=config)
    labeled, unlabeled = tfds_sources.imagenet_sources(
        labeled_subset='1pct', cache_dir=str(tmp_path / 'cache'),
        data_dir=data_dir)
    assert sorted(labeled.names) == [f'{first}_1.JPEG', f'{second}_0.JPEG']
    assert {name: int(label) for name, label in
            zip(labeled.names, labeled.labels)} == {
                f'{first}_1.JPEG': 0, f'{second}_0.JPEG': 1}
    assert unlabeled.num_examples == 4
    assert sorted(int(label) for _, label in
                  unlabeled.ordered_dataset()) == [0, 0, 1, 1]
    validation = tfds.builder('imagenet2012', data_dir=data_dir).info
    assert validation.splits['validation'].num_examples == 2
    assert os.path.isdir(os.path.join(data_dir, 'imagenet2012_subset'))
