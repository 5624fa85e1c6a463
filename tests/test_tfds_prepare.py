"""TFDS preparation as a user runs it, offline: real builders, tiny archives.

TFDS' own download manager fetches each URL (served here from a local file
instead of the network) and checks its size and SHA-256 against the
checksums registered for the builder (here, the tiny archive's); ImageNet's
archives come from `manual_dir` as for a real install. A module TFDS needs
to prepare a dataset and the requirements do not install fails here.
"""

import gzip
import io
import os
import tarfile

import numpy as np
from PIL import Image
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import checksums
from tensorflow_datasets.core.download import downloader

from paws_tf.data import tfds_sources

FASHION_MNIST_URL = ('http://fashion-mnist.s3-website.eu-central-1.'
                     'amazonaws.com/')
CIFAR10_URL = 'https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz'
SUBSET_1PCT_URL = ('https://raw.githubusercontent.com/google-research/'
                   'simclr/master/imagenet_subsets/1percent.txt')
# The first two ImageNet classes (TFDS labels 0 and 1).
SYNSETS = ('n01440764', 'n01443537')


def _serve(monkeypatch, builder_name, files_by_url):
    """Serves URLs from local files and registers those files' checksums as
    the builder's, so TFDS downloads and validates them as it would the
    real ones."""
    def fetch(self, url, destination_path, verify=True):
        del verify
        return self._sync_file_copy(files_by_url[url], destination_path)

    monkeypatch.setattr(downloader._Downloader, '_sync_download', fetch)
    builder_cls = type(tfds.builder(builder_name))
    monkeypatch.setattr(builder_cls, 'url_infos', {
        url: checksums.compute_url_info(path)
        for url, path in files_by_url.items()})


def _tar(path, members, mode='w'):
    """Writes a tar file of (name, bytes) members."""
    with tarfile.open(path, mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _cifar10_archive(path, rng):
    """A cifar-10-binary.tar.gz in the real layout, 2 images per training
    batch file and 3 test images; returns the training images (HWC) and
    labels in file order."""
    images = rng.integers(0, 256, size=(13, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, size=13, dtype=np.uint8)

    def records(rows):
        return b''.join(bytes([labels[i]]) + images[i].transpose(2, 0, 1)
                        .tobytes() for i in rows)

    names = [f'class_{k}' for k in range(10)]
    prefix = 'cifar-10-batches-bin/'
    members = [(f'{prefix}data_batch_{b + 1}.bin',
                records(range(2 * b, 2 * b + 2))) for b in range(5)]
    members += [(f'{prefix}test_batch.bin', records(range(10, 13))),
                (f'{prefix}batches.meta.txt', '\n'.join(names).encode())]
    _tar(path, members, mode='w:gz')
    return images[:10], labels[:10], names


def test_cifar10_prepares_from_its_archive(tmp_path, monkeypatch):
    archive = tmp_path / 'served' / 'cifar-10-binary.tar.gz'
    archive.parent.mkdir()
    images, labels, names = _cifar10_archive(archive,
                                             np.random.default_rng(0))
    data_dir = str(tmp_path / 'tfds')
    # The checksum is checked: a file that differs from the registered one
    # is refused.
    _serve(monkeypatch, 'cifar10', {CIFAR10_URL: archive})
    builder_cls = type(tfds.builder('cifar10'))
    registered = builder_cls.url_infos[CIFAR10_URL]
    monkeypatch.setattr(builder_cls, 'url_infos', {
        CIFAR10_URL: checksums.UrlInfo(size=registered.size,
                                       checksum='0' * 64,
                                       filename=registered.filename)})
    with pytest.raises(Exception, match='wrong checksum'):
        tfds.builder('cifar10', data_dir=data_dir).download_and_prepare()
    _serve(monkeypatch, 'cifar10', {CIFAR10_URL: archive})
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


def _idx_files(folder, split, count, rng):
    """Gzipped IDX images and labels of `count` images (the TFDS builder
    reads exactly the real split's count), the first 8 random, the rest
    zero; returns those 8 and their labels."""
    images = np.zeros((count, 28, 28), np.uint8)
    labels = np.zeros(count, np.uint8)
    images[:8] = rng.integers(0, 256, size=(8, 28, 28))
    labels[:8] = rng.integers(0, 10, size=8)
    header = np.array([2051, count, 28, 28], '>i4').tobytes()
    with gzip.open(folder / f'{split}-images-idx3-ubyte.gz', 'wb') as f:
        f.write(header + images.tobytes())
    with gzip.open(folder / f'{split}-labels-idx1-ubyte.gz', 'wb') as f:
        f.write(np.array([2049, count], '>i4').tobytes() + labels.tobytes())
    return images[:8], labels[:8]


def test_fashion_mnist_prepares_from_its_files(tmp_path, monkeypatch):
    folder = tmp_path / 'served'
    folder.mkdir()
    rng = np.random.default_rng(1)
    images, labels = _idx_files(folder, 'train', 60_000, rng)
    _idx_files(folder, 't10k', 10_000, rng)
    _serve(monkeypatch, 'fashion_mnist', {
        FASHION_MNIST_URL + path.name: path for path in folder.iterdir()})
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


def _jpeg(colour):
    """A 24 x 20 JPEG of one colour."""
    buffer = io.BytesIO()
    Image.new('RGB', (24, 20), colour).save(buffer, format='JPEG')
    return buffer.getvalue()


def _imagenet_manual_dir(manual_dir):
    """ILSVRC2012_img_train.tar (a tar of one tar per synset, 2 JPEGs each)
    and ILSVRC2012_img_val.tar (2 JPEGs) as ImageNet ships them."""
    manual_dir.mkdir()
    class_tars = []
    for k, synset in enumerate(SYNSETS):
        inner = io.BytesIO()
        with tarfile.open(fileobj=inner, mode='w') as tar:
            for i in range(2):
                data = _jpeg((100 * k, 50 * i, 0))
                info = tarfile.TarInfo(f'{synset}_{i}.JPEG')
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        class_tars.append((f'{synset}.tar', inner.getvalue()))
    _tar(manual_dir / 'ILSVRC2012_img_train.tar', class_tars)
    _tar(manual_dir / 'ILSVRC2012_img_val.tar',
         [(f'ILSVRC2012_val_0000000{i}.JPEG', _jpeg((0, 0, 200)))
          for i in (1, 2)])


def test_imagenet_prepares_from_manual_archives(tmp_path, monkeypatch):
    manual_dir = tmp_path / 'manual'
    _imagenet_manual_dir(manual_dir)
    subset_file = tmp_path / 'served' / '1percent.txt'
    subset_file.parent.mkdir()
    subset_file.write_text(f'{SYNSETS[0]}_1.JPEG\n{SYNSETS[1]}_0.JPEG\n')
    _serve(monkeypatch, 'imagenet2012_subset/1pct',
           {SUBSET_1PCT_URL: subset_file})
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
    assert sorted(labeled.names) == [f'{SYNSETS[0]}_1.JPEG',
                                     f'{SYNSETS[1]}_0.JPEG']
    assert {name: int(label) for name, label in
            zip(labeled.names, labeled.labels)} == {
                f'{SYNSETS[0]}_1.JPEG': 0, f'{SYNSETS[1]}_0.JPEG': 1}
    assert unlabeled.num_examples == 4
    assert sorted(int(label) for _, label in
                  unlabeled.ordered_dataset()) == [0, 0, 1, 1]
    validation = tfds.builder('imagenet2012', data_dir=data_dir).info
    assert validation.splits['validation'].num_examples == 2
    assert os.path.isdir(os.path.join(data_dir, 'imagenet2012_subset'))
