"""Importing DINO's and MSN's published ViTs (`vit_import`): the files as
their code saves them, written here by the official model code
(tests/helpers/dino_msn_vit.py) at the published ViT-S/16 layout with
random weights; the import's embedder against the official features, the
documented commands (import, PAWS-NN of your folders, PAWS continued from
the backbone, fine-tuning) through run.py, and the refusals.

The evaluation preprocessing the official side gets here is written from
the sources: Resize(256) and CenterCrop(224) (facebookresearch/dino
eval_knn.py lines 33-34; facebookresearch/msn linear_eval.py lines
125-126), ImageNet's mean and std.
"""

import json
import os
import shutil

import numpy as np
import PIL.Image
import pytest
import tensorflow as tf

torch = pytest.importorskip('torch')

from paws_tf import checks  # noqa: E402
from paws_tf import run_dir  # noqa: E402
from paws_tf.data import augment  # noqa: E402
from paws_tf.evaluation import tuning  # noqa: E402
from paws_tf.nets import backbones  # noqa: E402
from paws_tf.nets import vit  # noqa: E402
from paws_tf.runner import modes  # noqa: E402
from paws_tf.runner import official_import  # noqa: E402
from paws_tf.runner import vit_import  # noqa: E402
from tests.helpers import debug_gin  # noqa: E402
from tests.helpers import dino_msn_vit  # noqa: E402
from tests.helpers import image_folders  # noqa: E402
from tests.helpers import once  # noqa: E402
from tests.helpers import run_py  # noqa: E402
from tests.helpers import timm_vit  # noqa: E402
from tests import test_existing_model  # noqa: E402
from tests import test_official_import  # noqa: E402
from tests.test_official_import import _config  # noqa: E402
from tests.test_official_import import _strategy  # noqa: E402

CONFIG = 'import_vit.gin'
OFFICIAL_RESIZE, OFFICIAL_CROP = 256, 224
OFFICIAL_IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
# ViT-S/16 (dino vision_transformer.py `vit_small`, msn src/deit.py
# `deit_small`): width, depth, heads, patch.
VIT_S16 = (384, 12, 6, 16)
RTOL = 1e-4
# One PyTorch thread: the 2 cores are shared with TensorFlow's.
_one_torch_thread = test_official_import._one_torch_thread


def _official(source, seed, layout=VIT_S16):
    return timm_vit.randomize(dino_msn_vit.build(source, *layout), seed)


def _save_dino(model, path):
    """As DINO publishes a backbone (`dino_deitsmall16_pretrain.pth`): the
    state dict alone."""
    torch.save(model.state_dict(), path)
    return path


def _save_msn(model, path, epoch=800):
    """As msn src/msn_train.py `save_checkpoint` (lines 277-296) saves
    it: the DDP (`module.`) state dicts of the encoders with their `fc`
    projection head (`init_model`: fc1, gelu1, fc2, gelu2, fc3), the
    prototypes, the epoch and the run's settings."""
    head = torch.nn.Sequential()
    for name, layer in (('fc1', torch.nn.Linear(model.embed_dim, 32)),
                        ('gelu1', torch.nn.GELU()),
                        ('fc2', torch.nn.Linear(32, 32)),
                        ('gelu2', torch.nn.GELU()),
                        ('fc3', torch.nn.Linear(32, 16))):
        head.add_module(name, layer)
    model.fc = head
    state = {f'module.{key}': value for key, value in
             model.state_dict().items()}
    del model.fc
    torch.save({'encoder': state, 'target_encoder': state,
                'prototypes': torch.zeros(8, 16), 'epoch': epoch,
                'loss': 1.0, 'batch_size': 1024, 'world_size': 32,
                'lr': 1e-3, 'temperature': 0.1}, path)
    return path


def _official_view(image):
    """Resize(256) + CenterCrop(224) + ImageNet's normalisation, as paws_tf
    computes them (`augment.center_view`), NHWC float32."""
    return augment.center_view(
        image, OFFICIAL_CROP, crop_fraction=OFFICIAL_CROP / OFFICIAL_RESIZE,
        mean=OFFICIAL_IMAGENET[0], std=OFFICIAL_IMAGENET[1]).numpy()


def _small_view(image, size=32):
    """The evaluation view of image_folders_small.gin with ImageNet's
    normalisation: the image resized whole to `size` px, NHWC float32."""
    return augment.center_view(
        image, size, crop_fraction=1.0, mean=OFFICIAL_IMAGENET[0],
        std=OFFICIAL_IMAGENET[1]).numpy()


def _official_features(model, views):
    with torch.no_grad():
        return model(torch.from_numpy(np.stack(views)).permute(
            0, 3, 1, 2)).numpy()


def _assert_close(ours, theirs):
    scale = np.abs(theirs).max()
    np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=RTOL * scale)


def _tiny_dino_state(**extra):
    """A small state dict of DINO's layout (ViT-S/8, 1 block), plus
    `extra` tensors."""
    model = _official('dino', seed=0, layout=(384, 1, 6, 8))
    return {**model.state_dict(), **extra}


def _refused(tmp_path, name, match):
    with _config(CONFIG):
        with pytest.raises(official_import.ImportFailed, match=match):
            modes.run(str(tmp_path / name), _strategy(), 'import_official',
                      official_checkpoint=str(tmp_path / f'{name}.pth'))
    assert not os.path.exists(tmp_path / name), 'a refused import wrote'


def test_other_sources_architectures_and_damaged_files_are_refused(
        tmp_path):
    """Each refused before anything is written, one message naming what
    the file holds and what was expected: a ViT-S/8 of one block as DINO's
    and as MSN's (which publishes no S/8), a truncated file, and a pickled
    model (code, not tensors).

    Fails if an unreadable file's message expects PAWS's checkpoints
    alone, or leaves out a source."""
    torch.save(_tiny_dino_state(), tmp_path / 'small8.pth')
    torch.save({'target_encoder': {f'module.{key}': value for key, value
                                   in _tiny_dino_state().items()}},
               tmp_path / 'msn_small8.pth')
    data = (tmp_path / 'small8.pth').read_bytes()
    (tmp_path / 'cut.pth').write_bytes(data[:len(data) // 3])
    torch.save(torch.nn.Linear(2, 2), tmp_path / 'pickled.pth')
    for name, match in (
            ('small8', r'small8\.pth holds a ViT-S/8 \(width 384, depth 1, '
                       r'patch 8, 784 position embeddings\), not one of the '
                       'ViTs DINO publishes: ViT-S/16, ViT-S/8, ViT-B/16, '
                       'ViT-B/8'),
            ('msn_small8', r'not one of the ViTs MSN publishes: ViT-S/16, '
                           'ViT-B/16, ViT-L/16, ViT-B/4, ViT-L/7'),
            ('cut', r'cut\.pth cannot be read by torch\.load .*Expected an '
                    'official PAWS checkpoint.*, a DINO backbone state dict '
                    r'.*, an MSN checkpoint \(a dict whose target_encoder.* '
                    'or a DINOv2 backbone state dict'),
            ('pickled', r'pickled\.pth cannot be read by torch\.load .*'
                        'holding objects other than tensors.*'
                        'UnpicklingError')):
        _refused(tmp_path, name, match)
    assert official_import.ImportFailed.EXIT_CODE == 65


def import_with_run_py(tmp_path, path, name):
    """The documented import of the file `path` into `tmp_path / name`
    through run.py, and folders of three classes under `tmp_path /
    'images'`; returns the folders' bindings."""
    code, output = run_py.finish(run_py.start(
        tmp_path / name, gin_file=f'gin_configs/{CONFIG}',
        mode='import_official', base_bindings=(),
        flags=[f'--official_checkpoint={path}']))
    assert code == 0, output[-3000:]
    return image_folders.write_experiment(tmp_path / 'images', unlabeled=2,
                                          test=2)


def assert_paws_nn_is_the_rule(tmp_path, imported, official, images=None):
    """`existing_model_folders.gin` on the import `imported` and the
    folders under `images` (default `tmp_path / 'images'`), run.py into
    `tmp_path / 'nn'`: per-image probabilities and classes of its PAWS-NN
    classifier, and PAWS-NN's top-1, equal the soft nearest neighbour in
    NumPy over the features of `official` (the source's PyTorch model) on
    the sources' evaluation views. Without the pictures, which no check
    here reads."""
    images = images or tmp_path / 'images'
    code, output = run_py.finish(run_py.start(
        tmp_path / 'nn', (f"MODEL = '{imported}'",
                          f"LABELED_DIR = '{images / 'labeled'}'",
                          f"TEST_DIR = '{images / 'test'}'",
                          'evaluate_nn.pictures = False'),
        gin_file='gin_configs/existing_model_folders.gin',
        mode='evaluate_nn', base_bindings=()))
    assert code == 0, output[-3000:]
    results = json.loads((tmp_path / 'nn/eval/paws_nn.json').read_text())
    probabilities, _, labels, _ = test_existing_model.numpy_paws_nn(
        lambda batch: _official_features(
            official, [_official_view(image) for image in batch]),
        images, results['tau'])
    classifier = tf.saved_model.load(str(tmp_path / 'nn/export/classifier'))
    raw, _, _ = test_existing_model._folder_images(images / 'test')
    out = classifier(tf.constant(np.stack(raw)))
    np.testing.assert_allclose(out['probabilities'], probabilities,
                               atol=1e-4)
    np.testing.assert_array_equal(out['class_ids'],
                                  probabilities.argmax(axis=1))
    assert results['top1'] == pytest.approx(
        np.mean(probabilities.argmax(axis=1) == labels))


def continue_paws(tmp_path, imported, folders, sizes=()):
    """PAWS started with run.py from the import `imported`'s backbone
    (`train.pretrained_backbone`, the bindings of its record, `sizes`
    overriding the shrunk views) into `tmp_path / 'continued'`, one epoch
    at a learning rate of 0, so its trained weights are the ones it
    started from. Returns the record's bindings."""
    record = json.loads((imported / 'imported.json').read_text())
    shrunk = [binding for binding in image_folders.SMALL
              if 'small_resnet' not in binding]
    code, output = run_py.finish(run_py.start(
        tmp_path / 'continued', folders + shrunk + list(sizes) +
        record['bindings'] + [
            f"train.pretrained_backbone = '{imported}'",
            "NORMALIZATION = 'imagenet'", 'train.num_epochs = 1',
            'train.eval_every_epochs = 0', 'train.view_images = False',
            'WarmupCosineDecay.start_lr = 0.0',
            'WarmupCosineDecay.ref_lr = 0.0',
            'WarmupCosineDecay.final_lr = 0.0'],
        gin_file='gin_configs/image_folders_small.gin', base_bindings=()),
        timeout=900)
    assert code == 0, output[-3000:]
    return record['bindings']


def restored_backbone(tmp_path, backbone):
    """`backbone` restored alone from the continued run's last
    checkpoint."""
    tf.train.Checkpoint(model=tf.train.Checkpoint(backbone=backbone)).read(
        tf.train.latest_checkpoint(str(tmp_path / 'continued/checkpoints'))
    ).expect_partial().assert_existing_objects_matched()
    return backbone


@pytest.mark.slow
@pytest.mark.long
def test_msn_through_the_documented_commands(tmp_path):
    """MSN's file (`vits16_800ep.pth.tar`, written as its code saves it)
    imported with run.py: the target encoder's backbone without its `fc`
    projection head; the embedder export's features equal the official
    model's (MSN evaluates with `fc = None`) on the recorded preprocessing;
    PAWS-NN of the import on folders (`existing_model_folders.gin`) is the
    soft nearest neighbour in NumPy over the official features; PAWS
    continued from its backbone with the record's bindings (shrunk: 32
    and 16 px views, one epoch at a learning rate of 0) keeps a backbone
    (built by the run's recorded config, restored from its checkpoint)
    that computes the official model's features at 32 px.

    Fails if the `fc.` tensors are not left out (the import refuses them
    as having no place), or if the export records another crop than the
    sources' 224 of 256, or if the record's bindings name DINO's
    interpolation for MSN's (tried: the continued run builds the ViT
    with `'dino'`, whose 0.1 offset resamples the positions otherwise;
    its weights are the import's, and its features are not MSN's)."""
    official = _official('msn', seed=4)
    path = _save_msn(official, tmp_path / 'vits16_800ep.pth.tar')
    folders = import_with_run_py(tmp_path, path, 'msn_vits16')
    imported = tmp_path / 'msn_vits16'
    record = json.loads((imported / 'imported.json').read_text())
    assert (record['kind'], record['origin'], record['architecture']) == (
        'backbone', 'msn', 'ViT-S/16')
    assert (record['epoch'], record['left_out']) == (800, 6)
    assert record['tensors'] == len(official.state_dict())
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (300, 260, 3), dtype=np.uint8)
              for _ in range(2)]
    loaded = tf.saved_model.load(str(imported / 'export/embedder'))
    got = loaded(tf.constant(np.stack(images)))  # Raw images in.
    want = _official_features(official, [_official_view(image)
                                         for image in images])
    _assert_close(got['features'].numpy(), want)
    np.testing.assert_array_equal(got['embeddings'], got['features'])
    assert_paws_nn_is_the_rule(tmp_path, imported, official)
    # PAWS continued with the record's bindings, as docs/own_images.md
    # types it. The backbone its recorded config builds (the run's
    # interpolation from 224 px to these 32), restored alone from its
    # checkpoint, computes the official model's features.
    continue_paws(tmp_path, imported, folders)
    with debug_gin.parsed(gin_file=str(tmp_path / 'continued/config.gin')):
        backbone = restored_backbone(tmp_path, backbones.build_backbone())
    views = [_small_view(image) for image in images]
    _assert_close(backbone(np.stack(views)).numpy(),
                  _official_features(official, views))


DINO_SEED = 2


def dino_import(tmp_path_factory):
    """`(directory, folders' bindings)`: the official DINO ViT-S/16 (random
    weights, `DINO_SEED`) as DINO publishes it, imported with run.py into
    `directory / 'dino_vits16'`, and folders of three classes under
    `directory / 'images'`; made once per pytest run (`once.made`, also
    for test_vit_recipe): tests read it, and write elsewhere."""
    def make(directory):
        path = _save_dino(_official('dino', seed=DINO_SEED),
                          directory / 'dino_deitsmall16_pretrain.pth')
        return import_with_run_py(directory, path, 'dino_vits16')

    return once.made(tmp_path_factory, 'dino_import', make)


@pytest.fixture(scope='module')
def dino_run(tmp_path_factory):
    """`dino_import`'s directory and folders, with the official model it
    imported."""
    directory, folders = dino_import(tmp_path_factory)
    return directory, _official('dino', seed=DINO_SEED), folders


@pytest.mark.slow
@pytest.mark.long
def test_paws_nn_of_the_dino_import_is_the_rule_on_official_features(
        dino_run, run_main, capsys, tmp_path):
    """`existing_model_folders.gin` on the import: per-image probabilities
    and classes of its PAWS-NN classifier, and PAWS-NN's top-1, equal the
    soft nearest neighbour in NumPy over the official model's features.
    The import's own directory is refused by --mode=evaluate_nn (run.py's
    `cli` in this process: one line, exit 65, as test_official_import's
    process shows for an import's refusal) and by training, naming the
    ways to use it (PAWS-NN, fine-tuning, PAWS).

    Fails if the export records another crop than 224 of 256 (tried:
    crop_fraction 1.0), or compares another output than the features, or
    training over the import names train.pretrained_model (tried)."""
    shared, official, _ = dino_run
    imported = shared / 'dino_vits16'
    assert_paws_nn_is_the_rule(tmp_path, imported, official,
                               images=shared / 'images')
    code, output = run_py.in_process(run_main, capsys, [
        f'--gin_file=gin_configs/{CONFIG}', f'--model_dir={imported}',
        '--mode=evaluate_nn'])
    assert code == 65, output[-2000:]
    assert (f"holds the ViT-S/16 backbone imported from "
            f"{shared}/dino_deitsmall16_pretrain.pth, not a PAWS model"
            ) in output
    assert f"train.pretrained_backbone = '{imported}'" in output
    assert '--mode=fine_tune fine-tunes it' in output
    with _config(CONFIG):  # Training over it names the backbone binding.
        with pytest.raises(official_import.ImportFailed, match=(
                f"with train.pretrained_backbone = '{imported}' to start "
                'from this backbone')):
            modes.run(str(imported), _strategy(), 'train')


@pytest.mark.slow
@pytest.mark.long
def test_paws_continues_from_the_dino_backbone(dino_run, tmp_path):
    """`train.pretrained_backbone` naming the import's directory, with the
    bindings its record gives, starts a PAWS run (shrunk: 32 and 16 px
    views, one epoch at a learning rate of 0, so its trained weights are
    the ones it started from) whose backbone computes the official model's
    features.

    Fails if `pretrained.load_backbone_weights` does not resolve a run
    directory to its checkpoint (tried: `checkpoints.resolve_prefix`; the
    run is refused, exit 78)."""
    shared, official, folders = dino_run
    continue_paws(tmp_path, shared / 'dino_vits16', folders)
    # The trained run's backbone, restored alone, computes the official
    # model's features (at 32 px: DINO's interpolation).
    backbone = restored_backbone(tmp_path, vit.build_vit(
        'vit_small', patch_size=16, position_interpolation='dino'))
    views = (0.05 * np.random.default_rng(1).standard_normal(
        (2, 32, 32, 3))).astype(np.float32)
    _assert_close(backbone(views).numpy(),
                  _official_features(official, list(views)))


def test_an_import_recorded_without_layer_scale_or_registers_loads(
        tmp_path):
    """A DINO or MSN import whose record predates LayerScale and register
    tokens (no `layer_scale`, `registers` keys) is read by what fine-tunes
    it as the ViT it is, the stored weights restored. Fails if the reader
    requires the keys (tried: KeyError 'layer_scale')."""
    run = run_dir.RunDir(str(tmp_path / 'dino_vits16'))
    stored = vit.build_vit('vit_tiny', patch_size=16, image_size=32,
                           position_interpolation='dino')
    official_import.write_first_checkpoint(run, backbone=stored)
    run.write_json(run.imported, dict(
        kind=official_import.BACKBONE, network='vit_tiny', patch_size=16,
        image_size=32, position_interpolation='dino'))
    embedder = vit_import.imported_embedder(
        run, tf.distribute.get_strategy(),
        vit_import.imported_architecture(run))
    for loaded, written in zip(embedder.backbone.get_weights(),
                               stored.get_weights()):
        np.testing.assert_array_equal(loaded, written)


def _noise_test_folder(root, labeled, per_class=4):
    """`root/test`: `per_class` images of uniform noise under each of
    `image_folders.CLASSES`, which a random model classifies by the
    details of its embeddings (the folders' gradients it gets all
    right); `root/labeled` links to `labeled`."""
    rng = np.random.default_rng(5)
    for name in image_folders.CLASSES:
        (root / 'test' / name).mkdir(parents=True)
        for i in range(per_class):
            PIL.Image.fromarray(rng.integers(0, 256, (40, 40, 3), np.uint8)
                                ).save(root / 'test' / name / f'{i}.png')
    (root / 'labeled').symlink_to(labeled)
    return root


@pytest.mark.slow
@pytest.mark.long
def test_fine_tuning_the_dino_import_starts_from_its_backbone(dino_run,
                                                            tmp_path):
    """--mode=fine_tune on the import's directory with the protocol of
    image_folders.gin (SuNCEt's, shrunk: 32-px views, 2 epochs, a learning
    rate of 0, so the trunk it writes is the one it started from): the
    trunk computes the official model's features, and the reported top-1
    on a test folder of noise is the soft nearest neighbour in NumPy over
    the official features of the config's evaluation views.

    Fails if the imported backbone is refused by --mode=fine_tune (tried:
    ImportFailed 'needs one'), or the trunk wants the projection head an
    import does not have (tried: AttributeError), or fine-tuning evaluates
    on other views than the config's (tried: crop_fraction 0.5), or
    fine-tunes on images normalised otherwise than the import's record, or
    of one channel, where it must refuse naming the record and the binding
    (tried: without the check, the config's 'data' statistics were used
    silently, and grayscale images failed in a Keras traceback)."""
    shared, official, folders = dino_run
    # A copy: fine-tuning writes into the import's directory.
    imported = shutil.copytree(shared / 'dino_vits16',
                               tmp_path / 'dino_vits16')
    noise = _noise_test_folder(tmp_path / 'noise', shared / 'images/labeled')
    shrunk = [binding for binding in image_folders.SMALL
              if 'small_resnet' not in binding]
    for other, refusal in (
            ("NORMALIZATION = 'data'", r"bind NORMALIZATION = 'imagenet'"),
            ('CHANNELS = 1', r'but CHANNELS = 1: bind CHANNELS = 3')):
        with debug_gin.parsed(folders + shrunk + [other],
                              gin_file='gin_configs/image_folders_small.gin'):
            with pytest.raises(checks.ConfigError, match=refusal):
                modes.run(str(imported), _strategy(), 'fine_tune')
        assert not (imported / 'fine_tune').exists()
    with debug_gin.parsed(folders + shrunk + [
            f"TEST_DIR = '{noise / 'test'}'", "NORMALIZATION = 'imagenet'",
            'fine_tune_suncet.tau = 0.1',
            'fine_tune_suncet.learning_rate = 0.0',
            'fine_tune_suncet.final_learning_rate = 0.0'],
            gin_file='gin_configs/image_folders_small.gin'):
        results = modes.run(str(imported), _strategy(), 'fine_tune')
    trunk = tuning.build_trunk(vit_import.BackboneEmbedder(vit.build_vit(
        'vit_small', patch_size=16, position_interpolation='dino')))
    trunk.load_weights(str(imported / 'fine_tune' / tuning.TRUNK_WEIGHTS))
    views = (0.05 * np.random.default_rng(1).standard_normal(
        (2, 32, 32, 3))).astype(np.float32)
    _assert_close(trunk(views).numpy(),
                  _official_features(official, list(views)))
    _, predictions, labels, _ = test_existing_model.numpy_paws_nn(
        lambda images: _official_features(
            official, [_small_view(image) for image in images]), noise, 0.1)
    assert results['top1'] == pytest.approx(np.mean(predictions == labels))
