"""Bad inputs get a clear error before training, or a counted skip, and
nothing already written is lost."""

import logging

import numpy as np
from PIL import Image
import pytest

from paws_tf import checks
from paws_tf.data import folders
from paws_tf.data import pipeline
from paws_tf.data import sources
from paws_tf.data import splits
from paws_tf.runner import experiment
from tests.helpers import run_py


def write_image(path, channels=3, mode=None, size=(20, 24)):
    rng = np.random.default_rng(abs(hash(str(path))) % 2**32)
    pixels = (rng.uniform(size=size + (channels,)) * 255).astype(np.uint8)
    if channels == 1:
        pixels = pixels[..., 0]
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels, mode).save(path)


def broken_folder(root):
    """A class folder with every kind of problem file a real folder has."""
    good = root / 'cat'
    write_image(good / 'rgb.jpg')
    write_image(good / 'gray.png', channels=1)
    write_image(good / 'rgba.png', channels=4, mode='RGBA')
    write_image(good / 'cmyk.jpg', channels=4, mode='CMYK')
    write_image(good / 'ok.bmp')
    encoded = (good / 'rgb.jpg').read_bytes()
    (good / 'truncated.jpg').write_bytes(encoded[:len(encoded) // 2])
    (good / 'zero.jpg').write_bytes(b'')
    (good / 'notes.png').write_text('not an image')
    (good / 'readme.txt').write_text('skipped: not an image extension')
    (good / 'notes.md').write_text('skipped: not an image extension')
    write_image(root / 'dog' / 'photo.webp')
    for i in range(3):
        write_image(root / 'dog' / f'{i}.jpg')
    return {'decodable': 5, 'broken': 3}


def test_broken_files_are_skipped_and_counted(tmp_path, caplog):
    counts = broken_folder(tmp_path)
    with caplog.at_level(logging.WARNING):
        source = folders.image_folder(tmp_path, channels=3)
    assert source.num_examples == counts['decodable'] + 3
    # One line counts both: 11 image files of which 3 are broken, and 3
    # files of other types.
    line, = [r.getMessage() for r in caplog.records
             if 'Skipping' in r.getMessage()]
    assert line.startswith(f'Skipping 6 of 14 files under {tmp_path}: 3 '
                           'cannot be decoded as images (')
    assert '3 not of a type read here (.md 1, .txt 1, .webp 1; read: ' in line
    for name in ('truncated.jpg', 'zero.jpg', 'notes.png'):
        assert name in line
    # Every kept image decodes to 3 channels, grayscale/RGBA/CMYK included.
    for position in range(source.num_examples):
        assert source.read(position).shape[-1] == 3


def test_broken_files_can_stop_the_run_instead(tmp_path):
    broken_folder(tmp_path)
    with pytest.raises(ValueError, match=r"3 of 11 files .* cannot be "
                       r"decoded.*on_bad_image='skip'"):
        folders.image_folder(tmp_path, on_bad_image='fail')
    with pytest.raises(ValueError, match='on_bad_image must be one of'):
        folders.image_folder(tmp_path, on_bad_image='ignore')


def test_training_input_reads_a_folder_that_had_broken_files(tmp_path):
    broken_folder(tmp_path / 'labeled')
    for i in range(6):
        write_image(tmp_path / 'unlabeled' / f'u{i}.jpg')
    (tmp_path / 'unlabeled' / 'bad.jpg').write_bytes(b'\xff\xd8garbage')
    labeled, unlabeled = experiment.image_folders(
        tmp_path / 'labeled', tmp_path / 'unlabeled')
    assert unlabeled.num_examples == 6 + labeled.num_examples
    pretrain = pipeline.make_pretrain_dataset_fn(
        unlabeled, labeled, num_replicas=1, global_batch_size=4,
        classes_per_step=2, images_per_class=3,
        multicrop=experiment_multicrop())
    # A whole epoch of views decodes: nothing broken reaches training.
    for element in pretrain.dataset_fn(None).take(pretrain.steps_per_epoch):
        assert np.all(np.isfinite(element['global_views'].numpy()))


def experiment_multicrop():
    from paws_tf.data import augment
    return augment.cifar10_multicrop(global_size=16, local_size=8,
                                     num_local=1, mean=augment.CIFAR10_MEAN,
                                     std=augment.CIFAR10_STD)


def test_empty_class_folder_is_named(tmp_path):
    write_image(tmp_path / 'cat' / 'a.jpg')
    (tmp_path / 'dog').mkdir()
    (tmp_path / 'eel').mkdir()
    (tmp_path / 'eel' / 'broken.jpg').write_bytes(b'')
    with pytest.raises(ValueError, match=r"no usable images: \['dog', 'eel'\]"):
        folders.image_folder(tmp_path)


def test_too_few_labeled_images_for_the_support(tmp_path):
    for name, count in (('cat', 5), ('dog', 2)):
        for i in range(count):
            write_image(tmp_path / name / f'{i}.jpg')
    labeled = folders.image_folder(tmp_path)
    with pytest.raises(ValueError, match="'dog'.* 2"):
        pipeline.make_pretrain_dataset_fn(
            labeled, labeled, num_replicas=1, global_batch_size=4,
            classes_per_step=2, images_per_class=3,
            multicrop=experiment_multicrop())
    with pytest.raises(ValueError, match='classes'):
        pipeline.make_pretrain_dataset_fn(
            labeled, labeled, num_replicas=1, global_batch_size=4,
            classes_per_step=3, images_per_class=1,
            multicrop=experiment_multicrop())


def test_label_files_naming_missing_or_duplicate_images(tmp_path):
    for i in range(4):
        write_image(tmp_path / 'images' / 'cat' / f'{i}.jpg')
    source = folders.image_folder(tmp_path / 'images')
    missing = tmp_path / 'missing.txt'
    missing.write_text('cat/0.jpg\ncat/9.jpg\n')
    with pytest.raises(ValueError, match=r"cat/9\.jpg"):
        splits.select_labeled(source, split_file=str(missing))
    duplicated = tmp_path / 'duplicated.txt'
    duplicated.write_text('cat/0.jpg\ncat/1.jpg\ncat/0.jpg\n')
    with pytest.raises(ValueError, match='more than once'):
        splits.select_labeled(source, split_file=str(duplicated))


@pytest.mark.parametrize('draw,message', [
    (dict(fraction=10), r'select_labeled\.fraction = 10: give the share of '
                        r'each class in \(0, 1\], e\.g\. 0\.1 for 10%'),
    (dict(fraction=0.0), r'select_labeled\.fraction = 0\.0: give the share'),
    (dict(labels_per_class=0),
     'select_labeled.labels_per_class must be a positive integer, got 0')])
def test_a_labeled_share_out_of_range_is_named(draw, message):
    """Fails if the draw takes it (tried: `fraction = 10`, meant as 10%,
    stopped on "fewer than labels_per_class=40", a binding the user never
    made; `fraction = 0` drew no labeled image)."""
    source = sources.from_arrays(np.zeros([8, 2, 2, 1], np.uint8),
                                 np.arange(8) % 2, ['a', 'b'])
    with pytest.raises(checks.ConfigError, match=message):
        splits.select_labeled(source, **draw)


def test_batch_sizes_that_do_not_divide_across_replicas():
    labeled = experiment.synthetic_source(num_images=64)
    with pytest.raises(ValueError, match='not divisible by the 3 replicas'):
        pipeline.make_pretrain_dataset_fn(
            labeled, labeled, num_replicas=3, global_batch_size=32,
            classes_per_step=3, images_per_class=2,
            unique_classes_per_replica=True,
            multicrop=experiment_multicrop())


@pytest.mark.parametrize('binding,message', [
    ("train.num_epochs = 'ten'", 'num_epochs must be a positive integer'),
    ('make_pretrain_dataset_fn.global_batch_size = 32.5',
     'global_batch_size must be a positive integer'),
    ('PAWSModel.tau = -0.1', 'tau must be positive'),
    ('load_data.train = %gin.REQUIRED', 'load_data'),
    # Else read at the first epoch's end: take(-1) takes every image.
    ('train.eval_max_queries = -1',
     'train.eval_max_queries must be a positive integer, got -1'),
    ('train.eval_max_queries = 0', 'eval_max_queries must be a positive'),
])
def test_wrong_gin_values_fail_before_training(run_main, tmp_path, capsys,
                                               binding, message):
    """run.py's command in this process (tests/test_records.py runs one
    refusal through run.py): the error line and a non-zero exit, nothing
    trained. Fails if a check is missing (tried: PAWSModel's tau > 0;
    `train.eval_max_queries` unchecked: both of its runs trained)."""
    code, stderr = run_py.in_process(run_main, capsys, [
        '--gin_file=gin_configs/debug.gin', f'--model_dir={tmp_path}',
        '--mode=train', '--gin_bindings=train.verbose = 0',
        f'--gin_bindings={binding}'])
    assert code != 0
    assert message in stderr, stderr[-2000:]
    assert not (tmp_path / 'checkpoints').exists()
