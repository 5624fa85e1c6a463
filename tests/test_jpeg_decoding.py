"""JPEG files decode to PIL's pixels, as the official code reads them."""

import numpy as np
import PIL.Image
import pytest
import tensorflow as tf

from paws_tf.data import sources


def _photograph(seed, height=120, width=152):
    """Smooth shading, sharp edges and fine texture: what makes inverse
    DCTs differ (a flat or purely smooth image would hide it)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    shading = np.stack([np.sin(6 * x + c) * np.cos(4 * y - c)
                        for c in range(3)], -1)
    edges = ((x * 7).astype(int) + (y * 5).astype(int)) % 2
    image = (128 + 70 * shading + 40 * edges[..., None] +
             18 * rng.normal(size=(height, width, 3)))
    return np.clip(image, 0, 255).astype(np.uint8)


# (name, PIL save arguments, mode): baseline 4:2:0 at three qualities,
# 4:4:4, progressive, grayscale.
FILES = [
    ('q75', dict(quality=75), 'RGB'),
    ('q90', dict(quality=90), 'RGB'),
    ('q95_444', dict(quality=95, subsampling=0), 'RGB'),
    ('progressive', dict(quality=85, progressive=True), 'RGB'),
    ('gray', dict(quality=80), 'L'),
]


@pytest.fixture(scope='module')
def jpegs(tmp_path_factory):
    root = tmp_path_factory.mktemp('jpegs')
    paths = []
    for seed, (name, options, mode) in enumerate(FILES):
        path = root / f'{name}.jpg'
        PIL.Image.fromarray(_photograph(seed)).convert(mode).save(
            path, 'JPEG', **options)
        paths.append(str(path))
    return paths


def _pil(path, channels):
    with PIL.Image.open(path) as image:
        array = np.asarray(image.convert('RGB' if channels == 3 else 'L'))
    return array.reshape(array.shape[:2] + (channels,))


def _assert_pils_pixels(paths, channels):
    """The files of `paths` read by a source of `channels`, eagerly and in
    its dataset's map, are PIL's pixels (`_pil`)."""
    source = sources.from_files(paths, paths, labels=np.zeros(len(paths)),
                                channels=channels)
    in_map = [image for image, _ in
              source.ordered_dataset().as_numpy_iterator()]
    for position, path in enumerate(paths):
        expected = _pil(path, channels)
        np.testing.assert_array_equal(source.read(position).numpy(),
                                      expected, err_msg=path)
        np.testing.assert_array_equal(in_map[position], expected,
                                      err_msg=path)


@pytest.mark.parametrize('channels', [3, 1])
def test_jpegs_decode_to_pils_pixels(jpegs, channels):
    """RGB, what the official code reads (`convert('RGB')`), for every
    file; one channel for the grayscale file (a colour file's one channel
    is libjpeg's luma, not PIL's `convert('L')` of the RGB pixels)."""
    if channels == 1:
        jpegs = [path for path in jpegs if path.endswith('gray.jpg')]
    _assert_pils_pixels(jpegs, channels)


def test_tensorflows_default_decoder_is_not_pils(jpegs):
    """What the accurate IDCT fixes: tf.io.decode_image's fast one gives
    other pixels on these files."""
    differing = 0
    for path in jpegs:
        fast = tf.io.decode_image(tf.io.read_file(path), channels=3).numpy()
        differing += int(np.any(fast != _pil(path, 3)))
    assert differing >= 3


def test_png_still_decodes(tmp_path):
    image = _photograph(9, 20, 24)
    PIL.Image.fromarray(image).save(tmp_path / 'a.png')
    decoded = sources.decode_image(
        tf.io.read_file(str(tmp_path / 'a.png')), 3).numpy()
    np.testing.assert_array_equal(decoded, image)


# The other formats an image folder takes, in every mode PIL writes them:
# (extension, PIL format, mode).
OTHER_FILES = [('png', 'PNG', mode) for mode in ('RGB', 'RGBA', 'LA', 'L')] + [
    ('bmp', 'BMP', 'RGB'), ('bmp', 'BMP', 'L'), ('gif', 'GIF', 'RGB')]


@pytest.mark.parametrize('channels', [3, 1])
def test_other_formats_decode_to_pils_conversion(tmp_path, channels):
    """PNG, BMP and GIF files of every mode, as PIL's `convert('RGB')` or
    `convert('L')` gives them, in a dataset map and eagerly. Fails if BMP
    and GIF files are decoded to one channel by TensorFlow (tried: their
    decoders refuse it, and an image folder of `channels = 1` skipped them
    as undecodable), or if a colour PNG's one channel is libpng's (tried:
    1 grey level off PIL on half of the pixels)."""
    paths = []
    for index, (extension, fmt, mode) in enumerate(OTHER_FILES):
        path = tmp_path / f'{index}_{mode}.{extension}'
        PIL.Image.fromarray(_photograph(index, 24, 20)).convert(mode).save(
            path, fmt)
        paths.append(str(path))
    _assert_pils_pixels(paths, channels)
