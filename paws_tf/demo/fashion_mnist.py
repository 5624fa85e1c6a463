"""The demo's dataset: Fashion-MNIST from Debian's IDX files, or TFDS."""

import os

from absl import logging
import gin

from paws_tf.data import sources
from paws_tf.data import tfds_sources

# Where Debian's `dataset-fashion-mnist` package installs the IDX files.
FASHION_MNIST_IDX_DIR = '/usr/share/datasets/fashion-mnist'


@gin.configurable
def fashion_mnist(*, split='train', idx_dir=FASHION_MNIST_IDX_DIR,
                  data_dir=None):
    """Fashion-MNIST's `split`, `'train'` (60,000 images) or `'test'`
    (10,000), as a labeled one-channel `ImageSource`: from the
    `*-idx?-ubyte.gz` files in `idx_dir`, else from TFDS (in `data_dir`,
    which it downloads on first use)."""
    prefix = {'train': 'train', 'test': 't10k'}[split]
    images = os.path.join(idx_dir, f'{prefix}-images-idx3-ubyte.gz')
    if os.path.exists(images):
        return sources.load_idx(
            images, os.path.join(idx_dir, f'{prefix}-labels-idx1-ubyte.gz'),
            class_names=sources.FASHION_MNIST_CLASS_NAMES)
    logging.warning('%s is missing (Debian package dataset-fashion-mnist): '
                    'loading TFDS fashion_mnist instead.', images)
    return tfds_sources.load_tfds('fashion_mnist', split=split,
                                  data_dir=data_dir)
