"""Argument checks."""

import dataclasses
import pathlib

import gin
import numpy as np
import pytest

from paws_tf import checks
from paws_tf import configurables  # noqa: F401  (registers configurables)
from paws_tf.data import augment
from paws_tf.data import normalization as normalization_lib
from paws_tf.evaluation import export
from paws_tf.runner import config_checks


@pytest.mark.parametrize('value', [1, 7, np.int64(3)])
def test_integer_accepts(value):
    assert checks.integer('n', value) == int(value)


@pytest.mark.parametrize('value,minimum,kind', [
    ('ten', 1, 'a positive integer'), (32.5, 1, 'a positive integer'),
    (True, 1, 'a positive integer'), (0, 1, 'a positive integer'),
    (-1, 0, 'a non-negative integer'), (1, 2, 'an integer >= 2'),
    (None, 1, 'a positive integer')])
def test_integer_rejects_with_the_value(value, minimum, kind):
    with pytest.raises(ValueError, match=f'n must be {kind}, got'):
        checks.integer('n', value, minimum=minimum)


def test_one_of():
    """Fails if `one_of` lets a value outside the choices through, or its
    message drops the name, the choices or the value."""
    assert checks.one_of('mode', 'b', ('a', 'b')) == 'b'
    with pytest.raises(checks.ConfigError, match=r"^mode must be one of "
                       r"\('a', 'b'\), got 'c'\.$"):
        checks.one_of('mode', 'c', ('a', 'b'))


def test_number():
    assert checks.number('tau', 0.1, positive=True) == 0.1
    assert checks.number('s', 0, low=0.0, high=1.0) == 0.0
    with pytest.raises(ValueError, match="tau must be positive, got -0.1"):
        checks.number('tau', -0.1, positive=True)
    with pytest.raises(ValueError, match=r"s must be a number >= 0.0 and "
                       r"< 1.0, got 1.0"):
        checks.number('s', 1.0, low=0.0, high=1.0)
    with pytest.raises(ValueError, match="x must be a number, got '3'"):
        checks.number('x', '3')


REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def folders(tmp_path):
    """Three class folders whose only files cannot be decoded: the checks
    list the folders and never read a file."""
    for name in ('a', 'b', 'c'):
        (tmp_path / 'labeled' / name).mkdir(parents=True)
        (tmp_path / 'labeled' / name / 'broken.png').write_bytes(b'')
    return [f"LABELED_DIR = '{tmp_path / 'labeled'}'",
            f"UNLABELED_DIR = '{tmp_path / 'unlabeled'}'",
            f"TEST_DIR = '{tmp_path / 'test'}'", 'SUPPORT_CLASSES = 3']


def check(name, bindings):
    gin.parse_config_files_and_bindings(
        [str(REPO / 'gin_configs' / name)], list(bindings))
    config_checks.check_config()


@pytest.mark.parametrize('name', sorted(  # base.gin: shared values only.
    p.name for p in (REPO / 'gin_configs').glob('*.gin')
    if p.name != 'base.gin'))
def test_every_shipped_config_passes(clean_gin, folders, name, tmp_path):
    bindings = folders if name.startswith('image_folders') else []
    if name == 'existing_model_folders.gin':
        # A run directory with an embedder export, as far as the checks
        # look: its preprocessing file.
        embedder = tmp_path / 'imported' / 'export' / 'embedder'
        embedder.mkdir(parents=True)
        (embedder / export.PREPROCESSING_FILENAME).write_text(
            '{"channels": 3}')
        bindings = [f"MODEL = '{tmp_path / 'imported'}'", folders[0],
                    folders[2]]
    check(name, bindings)


@pytest.mark.parametrize('name', ['image_folders.gin',
                                  'image_folders_small.gin'])
@pytest.mark.parametrize('extra', [[], ['CHANNELS = 1'],
                                   ['train.num_epochs = 1'],
                                   ["NORMALIZATION = 'imagenet'"],
                                   ["OBJECTIVE = 'ropaws'"]])
def test_folder_recipes_need_no_other_binding(clean_gin, folders, name,
                                              extra):
    check(name, folders + extra)


@pytest.mark.parametrize('name,bindings,message', [
    ('image_folders_small.gin', ['SUPPORT_CLASSES = 10'],
     r"SUPPORT_CLASSES = 10 support classes per step, but LABELED_DIR = "
     r"'.*' holds 3 class folder\(s\): bind SUPPORT_CLASSES = 3\."),
    ('image_folders_small.gin', ["LABELED_DIR = '/nonexistent/labeled'"],
     r"LABELED_DIR = '/nonexistent/labeled' is not a folder"),
    ('image_folders_small.gin', ['CHANNELS = 1', "NORMALIZATION = 'imagenet'"],
     r"NORMALIZATION \(load_data.normalization\) = 'imagenet' gives 3 "
     r'channel\(s\).* decoded to 1: bind 1 value\(s\) each, e\.g\. '
     r"\(\(0\.5,\), \(0\.25,\)\), or \(folder recipes\) NORMALIZATION = "
     r"'data'"),
    ('image_folders_small.gin', ['NORMALIZATION = ((0.5,), (0.2, 0.2))'],
     'one value per channel each'),
    ('image_folders_small.gin', ["NORMALIZATION = 'imagenett'"],
     r"= 'imagenett' is unknown: use 'data', one of \['cifar10', "
     r"'imagenet'\]"),
    ('image_folders_small.gin', ['CHANNELS = 2'],
     r'CHANNELS = 2: images are decoded to 1 \(grayscale\) or 3'),
    ('image_folders_small.gin', ['MultiCropConfig.mean = (0.5,)',
                                 'MultiCropConfig.std = (0.25,)'],
     r'MultiCropConfig.mean / MultiCropConfig.std are bound .*: the '
     r'normalisation has one source, load_data.normalization .*Remove the '
     r'MultiCropConfig bindings and bind load_data.normalization = '),
    ('debug.gin', ['cifar10_multicrop.mean = (0.5, 0.5, 0.5)'],
     r'cifar10_multicrop.mean / cifar10_multicrop.std are bound'),
    ('debug.gin', ['eval_preprocessing.std = (0.25, 0.25, 0.25)'],
     r'eval_preprocessing.mean / eval_preprocessing.std are bound \(mean '
     r'None, std \(0\.25, 0\.25, 0\.25\)\)'),
    ('image_folders_small.gin', ['NORMALIZATION = None'],
     r"No normalisation: bind load_data.normalization = 'data'"),
    ('image_folders_small.gin', ['WarmupCosineDecay.warmup_fraction = None',
                                 'WarmupCosineDecay.warmup_epochs = 10',
                                 'train.num_epochs = 1'],
     r'The warm-up fills the run, so the learning rate never decays: '
     r'WarmupCosineDecay.warmup_epochs = 10 >= train.num_epochs = 1\. Bind '
     r'WarmupCosineDecay.warmup_epochs = 0\.1'),
    ('image_folders_small.gin', ['WarmupCosineDecay.warmup_epochs = 1'],
     'both set the warm-up: bind WarmupCosineDecay.warmup_epochs = None'),
    ('image_folders_small.gin', ['IMAGE_SIZE = 4'],
     r"IMAGE_SIZE = 4 is smaller than 8 px, the downsampling of "
     r"build_backbone.name = 'small_resnet'.* Bind IMAGE_SIZE = 8 or more"),
    ('image_folders_small.gin', ['LOCAL_SIZE = 6'],
     'LOCAL_SIZE = 6 is smaller than 8 px'),
    ('image_folders.gin', ['IMAGE_SIZE = 28'],
     r"IMAGE_SIZE = 28 is smaller than 32 px.*'resnet50'.*"
     r"build_backbone.name = 'small_resnet'"),
    ('image_folders_small.gin', ["OBJECTIVE = 'robust'"],
     r"OBJECTIVE must be one of \('paws', 'ropaws'\), got 'robust'"),
    ('image_folders.gin', ["OBJECTIVE = 'ropaws'",
                           'PAWSModel.ropaws_prior_tau = -3.0'],
     'PAWSModel.ropaws_prior_tau must be positive, got -3.0'),
    ('imagenet_rn50_10pct_8gpu.gin', ["build_model.sync_bn_impl = 'tf'"],
     r"build_model\.sync_bn_impl must be one of \('custom', 'keras'\), "
     r"got 'tf'"),
    ('demo_fashion_mnist.gin',
     ['load_data.normalization = ((0.5, 0.5), (0.353,))'],
     r'mean \(0\.5, 0\.5\) and std \(0\.353,\) must have one value per '
     r'channel'),
    ('debug.gin', ['LARS.momentum = 1.5'],
     r'^LARS.momentum must be a number >= 0.0 and < 1.0, got 1.5\.$'),
    ('debug.gin', ['train.optimizer_cls = @pretrain/LARS',
                   'pretrain/LARS.momentum = -0.5'],
     r'^pretrain/LARS.momentum must be a number >= 0.0'),
    ('debug.gin', ['train.checkpoint_every_steps = 5',
                   'train.backup_every_steps = 10'],
     r'^train.checkpoint_every_steps = 5 is smaller than '
     r'train.backup_every_steps = 10: back up at least as often'),
    ('debug.gin', ["train.precision = 'float64'"],
     r"^train.precision must be one of \('float32', "),
    ('debug.gin', ["train.on_data_change = 'go'"],
     r"^train.on_data_change must be one of \('stop', 'continue'\), got "
     r"'go'\.$"),
    ('debug.gin', ['EPOCHS = 2', 'train.num_epochs = %EPOCHS',
                   'WarmupCosineDecay.warmup_fraction = None',
                   'WarmupCosineDecay.warmup_epochs = 3'],
     r'^The warm-up fills the run, so the learning rate never decays: '
     r'WarmupCosineDecay.warmup_epochs = 3 >= EPOCHS = 2\.'),
    # The demo shortened to one epoch keeps its one-epoch warm-up: it would
    # end at the peak rate, 3.2 instead of 0.032.
    ('demo_fashion_mnist.gin', ['train.num_epochs = 1'],
     r'^The warm-up fills the run, so the learning rate never decays: '
     r'WarmupCosineDecay.warmup_epochs = 1 >= train.num_epochs = 1\. Bind '
     r'WarmupCosineDecay.warmup_epochs = 0.1 '),
])
def test_config_errors_name_the_binding(clean_gin, folders, name, bindings,
                                        message):
    """Each configurable's own argument check runs on the bound values,
    naming the binding or macro. Fails if config_checks leaves out the
    optimizer's check (or reads it unscoped), the relation of checkpoint
    and backup intervals, the precision or on_data_change, or names the
    schedule's epochs `num_epochs` rather than the macro that
    `train.num_epochs` came through."""
    with pytest.raises(ValueError, match=message):
        check(name, (folders if name.startswith('image_folders') else []) +
              bindings)


def test_the_normalisation_has_one_source():
    """Fails if `normalized_multicrop` keeps a mean bound on the
    `MultiCropConfig` (`refuse_own` not called), or fills in other values
    than the run's."""
    multicrop = augment.MultiCropConfig(
        global_size=8, global_scale=(1.0, 1.0), local_size=8,
        local_scale=(1.0, 1.0), num_local=0, color_strength=0.0,
        blur_prob=0.0)
    filled = normalization_lib.normalized_multicrop(
        multicrop, ([0.5], [0.25]), 1)
    assert (filled.mean, filled.std) == ((0.5,), (0.25,))
    with pytest.raises(checks.ConfigError, match=r'MultiCropConfig.mean / '
                       r'MultiCropConfig.std are bound \(mean \(0\.1,\)'):
        normalization_lib.normalized_multicrop(
            dataclasses.replace(multicrop, mean=(0.1,), std=(0.2,)),
            ([0.5], [0.25]), 1)
    with pytest.raises(checks.ConfigError, match='No normalisation'):
        normalization_lib.normalized_multicrop(multicrop, None, 1)
    with pytest.raises(ValueError, match=r'gives 1 channel'):
        normalization_lib.normalized_multicrop(multicrop, ([0.5], [0.25]),
                                               3)
    with pytest.raises(ValueError, match='positive stds'):
        normalization_lib.normalized_multicrop(multicrop, ([0.5], [0.0]),
                                               1)
