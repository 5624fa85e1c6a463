"""Every shipped gin file parses, builds its model and holds the paper's
hyper-parameters."""

import inspect
import pathlib
import sys

import gin
import numpy as np
import pytest
import tensorflow as tf
import torch

from paws_tf import bindings
from paws_tf import configurables
from paws_tf.evaluation import evaluate_nn
from paws_tf.evaluation import suncet_fine_tune
from paws_tf import model as model_lib
from paws_tf.runner import experiment
from tests.helpers import official_torch
from tests.helpers import run_py
from tests.helpers import timm_vit

REPO = pathlib.Path(__file__).resolve().parents[1]
GIN_FILES = sorted((REPO / 'gin_configs').glob('*.gin'))


def parse(name, bindings=()):
    gin.parse_config_files_and_bindings(
        [str(REPO / 'gin_configs' / name)], list(bindings))


# Each config's model and count, by the parsed config: the tests of a
# config's settings read the model its build test built.
_BUILT = {}


def trainable_parameters(channels=3):
    """Builds the configured model in a throwaway graph (no initialisation,
    so even ResNet-50 4x is cheap) and counts its trainable parameters,
    once per parsed config."""
    key = (gin.config_str(), channels)
    if key not in _BUILT:
        with tf.Graph().as_default():
            model = model_lib.build_model(input_channels=channels,
                                          sync_bn=False)
            model._encode(tf.zeros([2, 32, 32, channels]), training=False)
            _BUILT[key] = model, sum(int(np.prod(v.shape))
                                     for v in model.trainable_variables)
    return _BUILT[key]


def test_there_are_configs():
    names = {path.name for path in GIN_FILES}
    assert {'base.gin', 'debug.gin', 'imagenet_rn50_10pct.gin',
            'imagenet_rn50_1pct.gin', 'imagenet_rn50x2_10pct.gin',
            'imagenet_rn50x4_10pct.gin', 'imagenet_rn50_10pct_8gpu.gin',
            'cifar10_wrn28_2_4000.gin', 'demo_fashion_mnist.gin',
            'demo_fashion_mnist_quick.gin', 'image_folders.gin',
            'image_folders_small.gin'} <= names


# What a file needs bound by the user (its documented command line).
FOLDERS = ["LABELED_DIR = '/data/labeled'",
           "UNLABELED_DIR = '/data/unlabeled'", "TEST_DIR = '/data/test'"]
USER_BINDINGS = {'image_folders.gin': FOLDERS,
                 'image_folders_small.gin': FOLDERS,
                 # With a DINO ViT-S/16 import's bindings.
                 'image_folders_vit.gin': FOLDERS + [
                     "build_backbone.name = 'vit_small'",
                     'vit.patch_size = 16', 'vit.image_size = 224',
                     "vit.position_interpolation = 'dino'"],
                 'existing_model_folders.gin': [
                     "MODEL = 'runs/imported'", *FOLDERS[::2]]}


def official_parameters(encoder, output_dim, use_pred):
    """Trainable parameters of an official network with its pre-training
    heads, built on PyTorch's meta device (no memory, no initialisation)."""
    with torch.device('meta'):
        encoder = official_torch.add_pretraining_heads(encoder(), output_dim,
                                                       use_pred)
    return sum(p.numel() for p in encoder.parameters() if p.requires_grad)


def small_resnet_parameters(widths, channels=3):
    """Hand sum of small_resnet's layers (one basic block per stage, convs
    without bias, batch norms' gamma and beta)."""
    total = 9 * channels * widths[0] + 2 * widths[0]  # Stem conv, BN.
    inputs = widths[0]
    for filters in widths:  # Strided blocks: a 1x1 projection each.
        total += (9 * inputs * filters + 9 * filters * filters +
                  inputs * filters + 3 * 2 * filters)
        inputs = filters
    return total


def head_parameters(features, hidden, output):
    """Three-layer projection head: Dense + BN twice, then Dense."""
    return (features * hidden + hidden + 2 * hidden + hidden * hidden +
            hidden + 2 * hidden + hidden * output + output)


def prediction_parameters(width, hidden):
    """Prediction head: BN, Dense, BN, Dense back to `width`."""
    return (2 * width + width * hidden + hidden + 2 * hidden +
            hidden * width + width)


def vit_parameters(name, hidden, output, prediction=True, **trunk):
    """timm's ViT (tests/helpers/timm_vit.py, on PyTorch's meta device;
    16-px patches at 224 px unless `trunk` says otherwise) and the heads
    counted by hand."""
    dim, depth, heads = {'vit_tiny': (192, 12, 3),
                         'vit_small': (384, 12, 6)}[name]
    with torch.device('meta'):
        trunk = timm_vit.VisionTransformer(
            embed_dim=dim, num_heads=heads, **{'depth': depth, **trunk})
    return (sum(p.numel() for p in trunk.parameters()) +
            head_parameters(dim, hidden, output) +
            (prediction_parameters(output, hidden) if prediction else 0))


def resnet50(widen):
    return lambda: official_parameters(
        lambda: official_torch.ResNet50(widen), 2048, True)


SMALL_96 = lambda: (small_resnet_parameters((24, 48, 96)) +  # noqa: E731
                    head_parameters(96, 128, 128))
DEMO_VIT = lambda: vit_parameters(  # noqa: E731
    'vit_tiny', 128, 128, prediction=False, img_size=28, patch_size=4,
    depth=2)
# Each config's trainable parameters (3 input channels), counted without
# paws_tf: the official networks for ResNet-50 and WRN-28-2, a hand sum of
# the layers' shapes for small_resnet, timm's ViT for the ViTs. A new config
# needs its line here.
PARAMETERS = {
    'cifar10_wrn28_2_4000.gin': lambda: official_parameters(
        lambda: official_torch.WideResNet(28, 2), 128, False),
    'debug.gin': lambda: (small_resnet_parameters((8, 16)) +
                          head_parameters(16, 32, 32)),
    'demo_fashion_mnist.gin': SMALL_96,
    'demo_fashion_mnist_quick.gin': SMALL_96,
    'demo_fashion_mnist_validation.gin': SMALL_96,
    'demo_fashion_mnist_vit.gin': DEMO_VIT,
    'demo_fashion_mnist_vit_validation.gin': DEMO_VIT,
    'image_folders.gin': resnet50(1),
    'image_folders_small.gin': SMALL_96,
    'image_folders_vit.gin': lambda: vit_parameters('vit_small', 256, 256),
    'imagenet.gin': resnet50(1),
    'imagenet_rn50_10pct.gin': resnet50(1),
    'imagenet_rn50_10pct_8gpu.gin': resnet50(1),
    'imagenet_rn50_1pct.gin': resnet50(1),
    'imagenet_rn50x2_10pct.gin': resnet50(2),
    'imagenet_rn50x4_10pct.gin': resnet50(4),
    'imagenet_vits16_10pct.gin': lambda: vit_parameters('vit_small', 256,
                                                        256),
    'mismatch_fashion_mnist.gin': SMALL_96,
    'mismatch_fashion_mnist_curated.gin': SMALL_96,
    'mismatch_fashion_mnist_curated_ropaws.gin': SMALL_96,
    'mismatch_fashion_mnist_ropaws.gin': SMALL_96,
    'mismatch_fashion_mnist_validation.gin': SMALL_96,
    'transfer_fashion_mnist.gin': SMALL_96,
    'transfer_fashion_mnist_source.gin': SMALL_96,
    'transfer_fashion_mnist_validation.gin': SMALL_96,
}


@pytest.mark.parametrize('path', GIN_FILES, ids=lambda p: p.name)
def test_every_config_parses_and_builds_its_model(clean_gin, path):
    """Fails if a config builds another network than its table line, e.g.
    the projection head without its second hidden layer (ProjectionHead
    num_layers 2) or the prediction head off in imagenet.gin."""
    parse(path.name, USER_BINDINGS.get(path.name, ()))
    if path.name == 'base.gin':  # Shared values only, no model.
        assert gin.query_parameter('PAWSModel.tau') == 0.1
        return
    if path.name == 'existing_model_folders.gin':  # The model's, no own.
        assert bindings.arguments(evaluate_nn.evaluate_nn)['from_model'][
            0] == 'runs/imported'
        return
    if path.name == 'import_vit.gin':  # The file's ViT, no own.
        assert bindings.arguments(experiment.load_data)['normalization'][
            0] == 'imagenet'
        return
    model, params = trainable_parameters()
    assert params == PARAMETERS[path.name]()
    assert model.tau == 0.1 and model.sharpen_temperature == 0.25


def q(name):
    return gin.query_parameter(name)


@pytest.mark.parametrize('name,width,params', [
    ('imagenet_rn50_10pct.gin', 1, 23_508_032),
    ('imagenet_rn50x2_10pct.gin', 2, 93_907_072),
    ('imagenet_rn50x4_10pct.gin', 4, 375_378_176),
])
def test_imagenet_configs_hold_the_paper_settings(clean_gin, name, width,
                                                  params):
    parse(name)
    # Sec. 5: batch 4096, support 960 classes x 7, multi-crop 2x224 + 6x96,
    # LARS lr 0.3 -> 6.4 over 10 epochs then cosine, wd 1e-6, tau 0.1,
    # T 0.25, smoothing 0.1, prediction head on.
    assert q('make_pretrain_dataset_fn.global_batch_size') == 4096
    assert q('make_pretrain_dataset_fn.classes_per_step') == 960
    assert q('make_pretrain_dataset_fn.images_per_class') == 7
    assert q('make_pretrain_dataset_fn.unique_classes_per_replica')
    assert (q('WarmupCosineDecay.start_lr'), q('WarmupCosineDecay.ref_lr'),
            q('WarmupCosineDecay.warmup_epochs')) == (0.3, 6.4, 10)
    assert q('LARS.weight_decay') == 1e-6 and q('LARS.momentum') == 0.9
    assert q('PAWSModel.label_smoothing') == 0.1
    assert q('build_model.prediction_head')
    # The official PAWS-NN figures compare the prediction head's output.
    assert q('PAWSModel.nn_embedding') == 'prediction'
    assert q('train.num_epochs') == 100
    model, count = trainable_parameters()
    trunk = sum(int(np.prod(v.shape))
                for v in model.backbone.trainable_variables)
    assert trunk == params  # ResNet-50 at this width (Table 2).
    assert model.projection_head.output_dim == 2048


def test_vit_config_is_the_recipe_of_the_paws_authors(clean_gin):
    """imagenet_vits16_10pct.gin holds facebookresearch/suncet#26's
    settings: ViT-S/16, batch 1024, support 960 x 7, tau 0.1, T 0.25,
    me-max, AdamW with lr 2e-4 -> 1e-3 -> 1e-6 and weight decay 0.04 ->
    0.4, GELU heads of widths [256, 256, 256] and [256, 256].

    Fails if a head's widths or layers are not the recipe's (tried:
    `ProjectionHead.num_layers = 2`, `PredictionHead.hidden_dim = 64`)."""
    parse('imagenet_vits16_10pct.gin')
    assert q('imagenet_sources.labeled_subset') == '10pct'
    assert q('make_pretrain_dataset_fn.global_batch_size') == 1024
    assert q('make_pretrain_dataset_fn.classes_per_step') == 960
    assert q('make_pretrain_dataset_fn.images_per_class') == 7
    assert (q('PAWSModel.me_max_weight'), q('PAWSModel.nn_embedding')) == (
        1.0, 'prediction')
    assert q('train.optimizer_cls').scoped_configurable_fn.__name__ == \
        'AdamW'
    assert (q('WarmupCosineDecay.start_lr'), q('WarmupCosineDecay.ref_lr'),
            q('WarmupCosineDecay.final_lr'),
            q('WarmupCosineDecay.warmup_epochs')) == (2e-4, 1e-3, 1e-6, 10)
    assert (q('AdamW.weight_decay'), q('AdamW.final_weight_decay')) == (
        0.04, 0.4)
    multicrop = q('make_pretrain_dataset_fn.multicrop'
                  ).scoped_configurable_fn()
    assert (multicrop.global_size, multicrop.local_size) == (224, 96)
    model, _ = trainable_parameters()
    assert model.backbone.name == 'vit_small'
    assert model.backbone.side_multiple == 16
    assert [(layer.name, getattr(layer, 'units', None))
            for layer in model.projection_head.mlp_layers] == [
        ('fc1', 256), ('bn1', None), ('gelu1', None), ('fc2', 256),
        ('bn2', None), ('gelu2', None), ('fc3', 256)]
    assert [(layer.name, getattr(layer, 'units', None))
            for layer in model.prediction_head.mlp_layers] == [
        ('bn0', None), ('fc1', 256), ('bn1', None), ('gelu1', None),
        ('fc2', 256)]


def test_small_batch_config_is_table_7(clean_gin):
    parse('imagenet_rn50_10pct_8gpu.gin')
    assert q('make_pretrain_dataset_fn.global_batch_size') == 256
    assert q('make_pretrain_dataset_fn.classes_per_step') == 560
    assert q('make_pretrain_dataset_fn.images_per_class') == 3
    assert q('WarmupCosineDecay.ref_lr') == 1.2
    assert q('PAWSModel.me_max_weight') == 0.0
    assert q('imagenet_sources.labeled_subset') == '10pct'


def test_one_percent_config(clean_gin):
    parse('imagenet_rn50_1pct.gin')
    assert q('imagenet_sources.labeled_subset') == '1pct'


@pytest.mark.parametrize('name, classes, labels, epochs', [
    ('transfer_fashion_mnist_source.gin', (0, 1, 2, 3, 4), 40, 4),
    ('transfer_fashion_mnist.gin', (5, 6, 7, 8, 9), 10, 1),
    ('transfer_fashion_mnist_validation.gin', (5, 6, 7, 8, 9), 10, 1)])
def test_transfer_configs_split_the_classes(clean_gin, name, classes, labels,
                                            epochs):
    """The source model sees five classes, the transfer the other five;
    fails if the transfer config keeps the source's classes or labels."""
    parse(name)
    assert q('%CLASSES') == classes  # class_subset.classes = %CLASSES
    assert q('select_labeled.labels_per_class') == labels
    assert q('train.num_epochs') == epochs
    assert q('make_pretrain_dataset_fn.classes_per_step') == 5


def test_cifar10_config_is_appendix_c(clean_gin):
    parse('cifar10_wrn28_2_4000.gin')
    assert q('select_labeled.labels_per_class') == 400
    assert q('make_pretrain_dataset_fn.global_batch_size') == 256
    assert q('make_pretrain_dataset_fn.classes_per_step') == 10
    assert q('make_pretrain_dataset_fn.images_per_class') == 64
    assert q('make_pretrain_dataset_fn.support_views') == 2
    assert (q('WarmupCosineDecay.start_lr'),
            q('WarmupCosineDecay.ref_lr')) == (0.8, 3.2)
    assert q('train.num_epochs') == 600
    assert not q('build_model.prediction_head')
    multicrop = gin.query_parameter(
        'make_pretrain_dataset_fn.multicrop').scoped_configurable_fn()
    assert (multicrop.global_size, multicrop.global_scale,
            multicrop.local_size, multicrop.local_scale,
            multicrop.num_local) == (32, (0.75, 1.0), 18, (0.3, 0.75), 6)
    assert multicrop.color_strength == 0.5 and multicrop.blur_prob == 0.0
    assert multicrop.distortion == 'cifar10'  # solarize + equalize
    assert q('train.precision') == 'mixed_float16'  # use_fp16
    assert q('fine_tune.protocol') == 'cifar10'
    model, count = trainable_parameters()
    assert 1_450_000 < count < 1_550_000  # "1.5M" with its 128-d head.
    assert model.nn_embedding == 'projection'
    final_bn = model.backbone.get_layer('final_bn')
    assert final_bn.momentum == 0.01  # PyTorch momentum 0.99
    # The fine-tuning defaults are cifar10_snn.yaml's.
    defaults = {name: p.default for name, p in inspect.signature(
        suncet_fine_tune.fine_tune_suncet).parameters.items()}
    assert {k: defaults[k] for k in (
        'num_epochs', 'classes_per_step', 'images_per_class', 'views',
        'flip', 'learning_rate', 'final_learning_rate', 'momentum', 'lars',
        'trust_coefficient', 'tau')} == dict(
            num_epochs=30, classes_per_step=10, images_per_class=64,
            views=2, flip=True, learning_rate=0.1, final_learning_rate=0.01,
            momentum=0.9, lars=True, trust_coefficient=0.001, tau=0.1)


@pytest.mark.parametrize('binding,message', [
    ('train.num_epochz = 3', 'num_epochz'),
    ('PAWSModel.tau = ', 'PAWSModel.tau'),
    ('nonexistent_fn.x = 1', 'nonexistent_fn'),
])
def test_bad_gin_fails_before_any_data_is_read(run_main, capsys, tmp_path,
                                               binding, message):
    """run.py's command in this process. Fails if the bindings are parsed
    with `skip_unknown` (tried: the unknown configurable is skipped and
    training runs)."""
    model_dir = tmp_path / 'run'
    code, stderr = run_py.in_process(run_main, capsys, [
        '--gin_file=gin_configs/debug.gin', f'--gin_bindings={binding}',
        f'--model_dir={model_dir}', '--mode=train'])
    assert code != 0
    assert message in stderr
    assert not model_dir.exists()  # Nothing was written or read.


def test_a_shipped_config_parses_from_another_directory(
        clean_gin, tmp_path, monkeypatch):
    """`python /checkout/run.py --gin_file=/checkout/gin_configs/x.gin` from
    another directory: the checkout is on sys.path (as run.py's directory
    is) and the working directory holds no gin_configs/, so the shipped
    includes ('gin_configs/base.gin') resolve through gin's Python-package
    reader. Fails if gin_configs/ is a namespace package (no __init__.py):
    gin's reader then stops with a TypeError."""
    assert str(REPO) in sys.path
    monkeypatch.chdir(tmp_path)
    configurables.parse([str(REPO / 'gin_configs' / 'debug.gin')], [])
    assert gin.query_parameter('PAWSModel.tau') == 0.1
