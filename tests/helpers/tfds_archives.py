"""Tiny archives in the real layouts, and TFDS serving them offline.

TFDS' own download manager fetches each URL (served from a local file
instead of the network) and checks its size and SHA-256 against the
checksums registered for the builder (here, the tiny archive's); ImageNet's
archives come from `manual_dir` as for a real install.
"""

import gzip
import io
import pathlib
import tarfile

import numpy as np
from PIL import Image
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import checksums
from tensorflow_datasets.core.download import downloader

FASHION_MNIST_URL = ('http://fashion-mnist.s3-website.eu-central-1.'
                     'amazonaws.com/')
CIFAR10_URL = 'https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz'
SUBSET_URLS = {
    subset: ('https://raw.githubusercontent.com/google-research/simclr/'
             f'master/imagenet_subsets/{percent}percent.txt')
    for subset, percent in (('1pct', 1), ('10pct', 10))}
# The first two ImageNet classes (TFDS labels 0 and 1).
SYNSETS = ('n01440764', 'n01443537')
# The classes of the validation archive's first two images: TFDS labels
# the sorted file names of ILSVRC2012_img_val.tar by the lines of its
# validation_labels.txt, in order.
VALIDATION_SYNSETS = tuple(pathlib.Path(tfds.core.tfds_path(
    'datasets/imagenet2012/validation_labels.txt')).read_text().split()[:2])


def serve(monkeypatch, builder_name, files_by_url):
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


def write_tar(path, members, mode='w'):
    """Writes a tar file of (name, bytes) members."""
    with tarfile.open(path, mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def cifar10_archive(path, rng, per_batch=2, test=3):
    """A cifar-10-binary.tar.gz in the real layout, `per_batch` images per
    training batch file and `test` test images; returns the training images
    (HWC) and labels in file order."""
    train = 5 * per_batch
    images = rng.integers(0, 256, size=(train + test, 32, 32, 3),
                          dtype=np.uint8)
    labels = rng.integers(0, 10, size=train + test, dtype=np.uint8)

    def records(rows):
        return b''.join(bytes([labels[i]]) + images[i].transpose(2, 0, 1)
                        .tobytes() for i in rows)

    names = [f'class_{k}' for k in range(10)]
    prefix = 'cifar-10-batches-bin/'
    members = [(f'{prefix}data_batch_{b + 1}.bin',
                records(range(per_batch * b, per_batch * (b + 1))))
               for b in range(5)]
    members += [(f'{prefix}test_batch.bin', records(range(train,
                                                          train + test))),
                (f'{prefix}batches.meta.txt', '\n'.join(names).encode())]
    write_tar(path, members, mode='w:gz')
    return images[:train], labels[:train], names


def idx_files(folder, split, count, rng):
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


def jpeg(pixels):
    """JPEG bytes of an RGB colour tuple (a 24 x 20 image of it) or of an
    HWC uint8 array."""
    image = (Image.new('RGB', (24, 20), pixels) if isinstance(pixels, tuple)
             else Image.fromarray(pixels))
    buffer = io.BytesIO()
    image.save(buffer, format='JPEG')
    return buffer.getvalue()


def imagenet_manual_dir(manual_dir, synsets=SYNSETS, per_class=2,
                        images=None):
    """ILSVRC2012_img_train.tar (a tar of one tar per synset, `per_class`
    JPEGs each, named `<synset>_<i>.JPEG`) and ILSVRC2012_img_val.tar (2
    JPEGs) as ImageNet ships them.

    Args:
        images: None for one colour per image, or a function
            `(class index, image index) -> HWC uint8 array`. With
            `synsets` `VALIDATION_SYNSETS`, validation image k is made as
            the training image `per_class` of class k would be, else it
            has one colour of no class.
    """
    manual_dir.mkdir()
    class_tars = []
    for k, synset in enumerate(synsets):
        inner = io.BytesIO()
        with tarfile.open(fileobj=inner, mode='w') as tar:
            for i in range(per_class):
                data = jpeg((100 * k % 256, 50 * i % 256, 0) if images is None
                            else images(k, i))
                info = tarfile.TarInfo(f'{synset}_{i}.JPEG')
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        class_tars.append((f'{synset}.tar', inner.getvalue()))
    write_tar(manual_dir / 'ILSVRC2012_img_train.tar', class_tars)
    labeled = images is not None and tuple(synsets) == VALIDATION_SYNSETS
    write_tar(manual_dir / 'ILSVRC2012_img_val.tar',
              [(f'ILSVRC2012_val_0000000{k + 1}.JPEG',
                jpeg(images(k, per_class) if labeled else (0, 0, 200)))
               for k in range(2)])


def prepare_imagenet(root, *, per_class, subsets, images=None,
                     num_shards=None, synsets=SYNSETS):
    """TFDS imagenet2012 and its labeled subsets prepared by the real
    builders from a tiny manual_dir under `root`, as docs/experiments.md
    prepares them; returns the TFDS data_dir.

    Args:
        per_class: training JPEGs of each of the 2 classes (`synsets`).
        subsets: subset name ('1pct', '10pct') -> the indices, within each
            class, of the images its SimCLR subset file lists.
        images: as in `imagenet_manual_dir`.
        num_shards: files of each split (TFDS' default when None); a
            cluster's workers each read their own.
    """
    root = pathlib.Path(root)
    root.mkdir(parents=True, exist_ok=True)
    imagenet_manual_dir(root / 'manual', synsets, per_class=per_class,
                        images=images)
    (root / 'served').mkdir()
    data_dir = str(root / 'tfds')
    config = tfds.download.DownloadConfig(
        manual_dir=str(root / 'manual'), num_shards=num_shards)
    tfds.builder('imagenet2012', data_dir=data_dir).download_and_prepare(
        download_config=config)
    for subset, indices in subsets.items():
        path = root / 'served' / f'{subset}.txt'
        path.write_text(''.join(f'{synset}_{i}.JPEG\n' for synset in synsets
                                for i in indices))
        with pytest.MonkeyPatch.context() as monkeypatch:
            serve(monkeypatch, f'imagenet2012_subset/{subset}',
                  {SUBSET_URLS[subset]: path})
            tfds.builder(f'imagenet2012_subset/{subset}',
                         data_dir=data_dir).download_and_prepare(
                             download_config=config)
    return data_dir
