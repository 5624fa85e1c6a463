"""Writes MNIST-style IDX files, as tests need them."""

import gzip

import numpy as np


def write_idx(path, array):
    """Writes a uint8 array as an IDX file (gzipped if `path` ends in .gz)."""
    header = bytes([0, 0, 0x08, array.ndim]) + np.array(
        array.shape, '>u4').tobytes()
    opener = gzip.open if str(path).endswith('.gz') else open
    with opener(path, 'wb') as f:
        f.write(header + array.astype(np.uint8).tobytes())
