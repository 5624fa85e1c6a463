"""Importing DINOv2's published ViTs (`vit_import`): the files as its hub
saves them (`dinov2_vits14_pretrain.pth`, `..._reg4_pretrain.pth`: the
state dict of `DinoVisionTransformer`), written here by the official model
code (tests/helpers/dinov2_vit.py) at the published ViT-S/14 layout with
random weights; the import's embedder against the official features, the
documented commands (import, PAWS-NN of your folders, PAWS continued from
the backbone) through run.py, and the refusals.

DINOv2's evaluation preprocessing (dinov2 data/transforms.py
`make_classification_eval_transform`, lines 77-91: Resize(256),
CenterCrop(224), ImageNet's mean and std) is DINO's, which
tests/test_vit_import.py gives the official side.
"""

import json
import os

import gin
import numpy as np
import pytest
import tensorflow as tf

torch = pytest.importorskip('torch')

from paws_tf import checkpoints  # noqa: E402
from paws_tf import checks  # noqa: E402
from paws_tf import run_dir  # noqa: E402
from paws_tf.data import augment  # noqa: E402
from paws_tf.nets import vit  # noqa: E402
from paws_tf.runner import modes  # noqa: E402
from paws_tf.runner import official_import  # noqa: E402
from paws_tf.runner import pretrained  # noqa: E402
from paws_tf.runner import start  # noqa: E402
from paws_tf.runner import vit_import  # noqa: E402
from tests.helpers import debug_gin  # noqa: E402
from tests.helpers import dinov2_vit  # noqa: E402
from tests.helpers import image_folders  # noqa: E402
from tests.helpers import run_py  # noqa: E402
from tests.helpers import timm_vit  # noqa: E402
from tests import test_vit_import  # noqa: E402
from tests.test_official_import import _config  # noqa: E402
from tests.test_official_import import _strategy  # noqa: E402

# ViT-S/14 (dinov2 vision_transformer.py `vit_small`): width, depth, heads.
VIT_S14 = (384, 12, 6)
_one_torch_thread = test_vit_import._one_torch_thread


def _official(seed, registers, layout=VIT_S14, **kwargs):
    return timm_vit.randomize(dinov2_vit.build(*layout, registers, **kwargs),
                              seed)


def _save(model, path):
    """As DINOv2's hub publishes a backbone: the state dict alone."""
    torch.save(model.state_dict(), path)
    return path


@pytest.mark.slow
def test_dinov2_import_computes_the_official_features(tmp_path):
    """`dinov2_vits14_pretrain.pth`: the record names the architecture
    read from the file (patch 14, 518 px, LayerScale, no registers, DINO's
    interpolation, the mask token left out) and its bindings; the
    embedder export's features equal the official `x_norm_clstoken` on
    the sources' 224-px evaluation views.

    Fails if the export is written at the learned 518 px (tried), or the
    mask token is not left out (the import refuses it as having no
    place)."""
    official = _official(seed=7, registers=0)
    path = _save(official, tmp_path / dinov2_vit.file_name('vit_small', 0))
    with _config(test_vit_import.CONFIG):
        record = modes.run(str(tmp_path / 'run'), _strategy(),
                           'import_official', official_checkpoint=str(path))
    assert (record['origin'], record['architecture'], record['image_size'],
            record['position_interpolation'], record['left_out']) == (
        'dinov2', 'ViT-S/14', 518, 'dino', 1)
    assert record['tensors'] == len(official.state_dict()) - 1
    assert record['bindings'][-1] == 'vit.layer_scale = True'
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (300, 260, 3), dtype=np.uint8)
              for _ in range(2)]
    loaded = tf.saved_model.load(str(tmp_path / 'run/export/embedder'))
    got = loaded(tf.constant(np.stack(images)))
    want = test_vit_import._official_features(
        official, [test_vit_import._official_view(image) for image in images])
    test_vit_import._assert_close(got['features'].numpy(), want)


def test_unpublished_dinov2_files_are_refused(tmp_path):
    """Refused before anything is written, one message each naming what
    the file holds and what was expected: DINOv2's ViT-g/14 (its SwiGLU
    feed-forward), a ViT-S of patch 8 and one with 2 registers. Fails if
    the SwiGLU keys are not looked for (the file is then refused as
    'ViT-?/14', without naming ViT-g), or any register count is taken."""
    giant = dinov2_vit.build(1536, 0, 24, img_size=28).state_dict()
    giant['blocks.0.mlp.w12.weight'] = torch.zeros(2, 2)
    torch.save(giant, tmp_path / 'giant.pth')
    small8 = dinov2_vit.build(384, 1, 6, img_size=64).state_dict()
    small8['patch_embed.proj.weight'] = torch.zeros(384, 3, 8, 8)
    torch.save(small8, tmp_path / 'small8.pth')
    torch.save(dinov2_vit.build(384, 12, 6, registers=2).state_dict(),
               tmp_path / 'reg2.pth')
    published = (r'not one of the ViTs DINOv2 publishes: ViT-S/14, '
                 r'ViT-B/14, ViT-L/14, without or with 4 registers')
    for name, match in (
            ('giant', r'giant\.pth holds a DINOv2 ViT-g/14 \(width 1536, '
                      r'SwiGLU feed-forward mlp\.w12, mlp\.w3\), which is '
                      'not imported'),
            ('small8', r'small8\.pth holds a ViT-S/8 \(width 384, depth 1, '
                       r'patch 8, 16 position embeddings\), ' + published),
            ('reg2', r'reg2\.pth holds a ViT-S/14 with 2 registers \(width '
                     r'384, depth 12, patch 14, 1369 position embeddings\), '
                     + published)):
        test_vit_import._refused(tmp_path, name, match)


@pytest.mark.slow
@pytest.mark.long
def test_dinov2_with_registers_through_the_documented_commands(
        tmp_path):
    """The official ViT-S/14 with 4 registers (random weights) as the hub
    publishes it, imported with run.py; PAWS-NN of the import on folders
    (`existing_model_folders.gin`) equals the soft nearest neighbour in
    NumPy over the official model's features; PAWS continued from its
    backbone (28 and 14 px views, one epoch at a learning rate of 0)
    keeps a backbone that computes the official model's features.

    Fails if the record's bindings leave out `vit.registers` (tried: the
    run continues without them, and its backbone does not restore into
    the official layout)."""
    official = _official(seed=3, registers=dinov2_vit.REGISTERS)
    path = _save(official, tmp_path / dinov2_vit.file_name(
        'vit_small', dinov2_vit.REGISTERS))
    folders = test_vit_import.import_with_run_py(tmp_path, path,
                                                 'dinov2_vits14_reg')
    imported = tmp_path / 'dinov2_vits14_reg'
    test_vit_import.assert_paws_nn_is_the_rule(tmp_path, imported, official)
    test_vit_import.continue_paws(
        tmp_path, imported, folders, ('IMAGE_SIZE = 28', 'LOCAL_SIZE = 14'))
    backbone = test_vit_import.restored_backbone(tmp_path, vit.build_vit(
        'vit_small', patch_size=14, image_size=518,
        position_interpolation='timm', layer_scale=True,
        registers=dinov2_vit.REGISTERS))
    views = (0.05 * np.random.default_rng(1).standard_normal(
        (2, 28, 28, 3))).astype(np.float32)
    test_vit_import._assert_close(
        backbone(views).numpy(),
        test_vit_import._official_features(official, list(views)))


def test_a_backbone_built_without_the_imports_parts_is_refused(tmp_path):
    """A backbone checkpoint (as an import writes it) of a ViT with
    LayerScale and registers, or a run's model checkpoint of that
    backbone, read by `train.pretrained_backbone` into a ViT configured
    without them (the record's bindings left out), is refused naming the
    values left over, the backbone unchanged. Fails if `pretrained`
    accepts stored values the backbone has no place for (tried: the load
    succeeds and the run continues without them; for a run's model it
    did, before the check covered the `model/backbone/` values)."""
    stored = vit.build_vit('vit_tiny', patch_size=7, image_size=28,
                           depth=1, layer_scale=True, registers=2)
    tf.train.Checkpoint(backbone=stored).write(str(tmp_path / 'ckpt-0'))
    tf.train.Checkpoint(model=tf.train.Checkpoint(backbone=stored)).write(
        str(tmp_path / 'model-0'))
    built = vit.build_vit('vit_tiny', patch_size=7, image_size=28, depth=1)
    before = built.get_weights()
    for prefix in ('ckpt-0', 'model-0'):
        with pytest.raises(checkpoints.Mismatch, match=(
                r'3 stored backbone value\(s\) have no variable in the '
                r'configured backbone \(gamma x2, register_tokens\)')):
            pretrained.load_backbone_weights(built, str(tmp_path / prefix))
    for now, then in zip(built.get_weights(), before):
        np.testing.assert_array_equal(now, then)
    # run.py's message says the same (the start read the values the other
    # way round: "3 variables of the configured backbone have no value").
    with debug_gin.parsed([
            "build_backbone.name = 'vit_tiny'", 'vit.patch_size = 7',
            'vit.image_size = 28', 'vit.depth = 1'],
            gin_file='gin_configs/image_folders_small.gin'):
        with pytest.raises(checks.ConfigError, match=(
                r'does not fit the configured backbone: 3 stored backbone '
                r'value\(s\) have no variable')):
            start.check_pretrained(
                run_dir.RunDir(str(tmp_path / 'run')), backbone=(
                    str(tmp_path / 'ckpt-0'), 'train.pretrained_backbone'))
    same = vit.build_vit('vit_tiny', patch_size=7, image_size=28, depth=1,
                         layer_scale=True, registers=2)
    pretrained.load_backbone_weights(same, str(tmp_path / 'ckpt-0'))
    for now, then in zip(same.get_weights(), stored.get_weights()):
        np.testing.assert_array_equal(now, then)


# The bindings an import of DINOv2's ViT-S/14 with registers records
# (docs/own_images.md: the model's architecture as the hub builds it,
# dinov2 hub/backbones.py `_make_dinov2_model`: patch 14, img_size 518,
# interpolate_offset 0.0 and antialias for the `_reg` models, LayerScale).
_REG4_BINDINGS = ["build_backbone.name = 'vit_small'", 'vit.patch_size = 14',
                  'vit.image_size = 518',
                  "vit.position_interpolation = 'timm'",
                  'vit.layer_scale = True', 'vit.registers = 4']


@pytest.mark.parametrize('left_out, bound, edit', [
    ("vit.position_interpolation = 'timm'",
     "vit.position_interpolation = 'dino'",
     "replace vit.position_interpolation = 'dino' -> "
     "vit.position_interpolation = 'timm'"),
    ('vit.layer_scale = True', None, 'add vit.layer_scale = True'),
    ('vit.registers = 4', 'vit.registers = 2',
     'replace vit.registers = 2 -> vit.registers = 4'),
])
def test_a_config_without_the_imports_bindings_is_refused(
        tmp_path, left_out, bound, edit):
    """`train.pretrained_backbone` naming a ViT import, in a config that
    binds one of the bindings its record lists otherwise (or not at all),
    is refused before any checkpoint is read, naming the record's binding,
    the config's and the edit that makes one the other; with all of them
    the check passes. Fails if the start reads an import into another ViT
    than the one imported (tried: without the check, 'dino' for a 'timm'
    interpolation, which changes no variable, is read silently; the run
    then computes other features)."""
    imported = tmp_path / 'dinov2_vits14_reg'
    imported.mkdir()
    (imported / 'imported.json').write_text(json.dumps(dict(
        kind='backbone', architecture='ViT-S/14', bindings=_REG4_BINDINGS)))
    configured = [each for each in _REG4_BINDINGS if each != left_out]
    with debug_gin.parsed(configured + ([bound] if bound else []),
                          gin_file='gin_configs/image_folders_small.gin'):
        with pytest.raises(checks.ConfigError) as refused:
            start.check_pretrained(
                run_dir.RunDir(str(tmp_path / 'run')),
                backbone=(str(imported), 'train.pretrained_backbone'))
    message = str(refused.value)
    assert (f'{imported} was built with {left_out}; this config builds '
            f'{bound or "the defaults"}. Start from a backbone of this '
            f'architecture, or bind its architecture: {edit}.') in message, \
        message
    with debug_gin.parsed(_REG4_BINDINGS,
                          gin_file='gin_configs/image_folders_small.gin'):
        assert vit_import.unconfigured(json.loads(
            (imported / 'imported.json').read_text())) == ([], [])


# A ViT of DINO's layout shrunk (one block of ViT-Ti on 32-px images), and
# the bindings its import records.
_TINY_DINO = dict(patch_size=16, image_size=32, depth=1)
_TINY_DINO_BINDINGS = [
    "build_backbone.name = 'vit_tiny'", 'vit.patch_size = 16',
    'vit.image_size = 32', "vit.position_interpolation = 'dino'"]


def _tiny_dino_import(path):
    """An import of `_TINY_DINO` into `path` as `vit_import.import_vit`
    writes one: its backbone's checkpoint at step 0 and its record."""
    run = run_dir.RunDir(str(path))
    official_import.write_first_checkpoint(run, backbone=vit.build_vit(
        'vit_tiny', position_interpolation='dino', **_TINY_DINO))
    run.write_json(run.imported, dict(
        source='dino_tiny.pth', kind='backbone', architecture='ViT-Ti/16',
        network='vit_tiny', bindings=_TINY_DINO_BINDINGS,
        patch_size=_TINY_DINO['patch_size'],
        image_size=_TINY_DINO['image_size'], position_interpolation='dino',
        layer_scale=False, registers=0))
    return run


def test_a_record_without_an_architecture_argument_is_refused(
        tmp_path, monkeypatch):
    """--mode=fine_tune on an import whose record lacks its patch size,
    image size or position interpolation is refused, before any image is
    read, naming it and the import command into a new directory (one
    without `layer_scale` and `registers`, which `build_vit`'s defaults
    build, is tests/test_vit_import.py's). Fails if every argument the
    record lacks takes `build_vit`'s default (tried: without
    'position_interpolation' timm's interpolation was built for DINO's
    ViT, without 'patch_size' patch 16, and its checkpoint read), if the
    labeled images are read first (tried: the record read after them), or
    if the command is the import's own with --overwrite (tried: it
    deletes the import's fine-tuning, evaluation and exports)."""
    imported = run_dir.RunDir(str(tmp_path / 'dino_tiny'))
    _write_preprocessing(imported)
    record = dict(source='dino_tiny.pth', kind='backbone',
                  architecture='ViT-Ti/16', bindings=_TINY_DINO_BINDINGS,
                  network='vit_tiny', patch_size=16, image_size=32,
                  position_interpolation='dino')
    monkeypatch.setattr(modes, 'load_labeled_data', _read_images)
    for left_out in ('patch_size', 'image_size', 'position_interpolation'):
        imported.write_json(imported.imported, {
            key: value for key, value in record.items() if key != left_out})
        with debug_gin.parsed(image_folders.path_bindings(
                tmp_path / 'images') + ["NORMALIZATION = 'imagenet'"],
                gin_file='gin_configs/image_folders_small.gin'):
            with pytest.raises(official_import.ImportFailed, match=(
                    f'imported.json lacks {left_out}: import the file again '
                    r'into a new directory \(run.py --mode=import_official '
                    '--model_dir=<new directory> '
                    r'--official_checkpoint=dino_tiny.pth\); --overwrite into '
                    f'{imported} would delete its fine_tune/, eval/, export/ '
                    'and tensorboard/.$')):
                modes.run(imported.path, _strategy(), 'fine_tune')


def test_an_imports_weights_are_read_once_its_data_is_checked(
        tmp_path, monkeypatch):
    """--mode=fine_tune of an import whose labeled folder does not exist
    is refused naming it before the imported ViT is built and restored.
    Fails if `modes._fine_tune` builds the embedder before the data is
    loaded (tried: `vit_import.imported_embedder` called first)."""
    imported = run_dir.RunDir(str(tmp_path / 'dino_tiny'))
    _write_preprocessing(imported)
    imported.write_json(imported.imported, dict(
        source='dino_tiny.pth', kind='backbone', architecture='ViT-Ti/16',
        bindings=_TINY_DINO_BINDINGS, network='vit_tiny', patch_size=16,
        image_size=32, position_interpolation='dino'))
    monkeypatch.setattr(vit_import, 'imported_embedder', _restore)
    with debug_gin.parsed(image_folders.path_bindings(
            tmp_path / 'images') + ["NORMALIZATION = 'imagenet'"],
            gin_file='gin_configs/image_folders_small.gin'):
        with pytest.raises(modes.MissingLabeledFolder, match=(
                'fine-tuning trains on them')):
            modes.run(imported.path, _strategy(), 'fine_tune')


def _write_preprocessing(imported):
    """The preprocessing an import's embedder export records (RGB,
    ImageNet's statistics), alone."""
    os.makedirs(imported.embedder)
    imported.write_json(os.path.join(imported.embedder, 'preprocessing.json'),
                        dict(channels=3, mean=list(augment.IMAGENET_MEAN),
                             std=list(augment.IMAGENET_STD)))


def _read_images(*args, **kwargs):
    raise AssertionError('the images were read before the check')


def _restore(*args, **kwargs):
    raise AssertionError('the import was restored before the data check')


@pytest.mark.parametrize('gin_file, bindings, refusal', [
    ('image_folders_small.gin', ["NORMALIZATION = 'data'"],
     "not NORMALIZATION = 'data': bind NORMALIZATION = 'imagenet'."),
    ('debug.gin', ["load_data.normalization = 'data'"],
     "not load_data.normalization = 'data': bind load_data.normalization "
     "= 'imagenet'."),
    ('image_folders_small.gin', ['CHANNELS = 1'],
     'but CHANNELS = 1: bind CHANNELS = 3 (the images are decoded to that) '
     "and NORMALIZATION = 'imagenet' (the normalisation it was trained "
     'with).'),
])
def test_fine_tuning_an_import_checks_the_config_before_the_images(
        tmp_path, monkeypatch, gin_file, bindings, refusal):
    """--mode=fine_tune on a ViT import with a config that normalises
    otherwise than its export records, or decodes a folder to another
    channel count, is refused before the images are read, naming the
    binding the config uses (its macro, or `load_data.normalization`).
    Fails if the images are read first (tried: 'data' statistics were
    computed, then refused), or the message names the macro where the
    config binds `load_data.normalization` (tried: following it failed,
    'NORMALIZATION is bound but nothing in the config reads it')."""
    imported = run_dir.RunDir(str(tmp_path / 'dino_tiny'))
    imported.write_json(imported.imported, dict(
        source='dino_tiny.pth', kind='backbone', architecture='ViT-Ti/16',
        bindings=_TINY_DINO_BINDINGS))
    _write_preprocessing(imported)
    monkeypatch.setattr(modes, 'load_labeled_data', _read_images)
    folders = (image_folders.path_bindings(tmp_path / 'images')
               if gin_file.startswith('image_folders') else [])
    with debug_gin.parsed(folders + bindings,
                          gin_file=f'gin_configs/{gin_file}'):
        with pytest.raises(checks.ConfigError) as refused:
            modes.run(imported.path, _strategy(), 'fine_tune')
    assert str(refused.value).endswith(refusal), str(refused.value)


def _start(tmp_path, pretrained):
    """`start.start` of a run into `tmp_path / 'run'` from `pretrained`
    (`(binding, path)`), whose claim makes the run's directory (as run.py's
    does); returns the `checks.ConfigError` it raises."""
    run = run_dir.RunDir(str(tmp_path / 'run'))
    binding, path = pretrained
    with pytest.raises(checks.ConfigError) as refused:
        start.start(run, _strategy(), None, num_epochs=1, history=print,
                    seed=0, claim=lambda: os.makedirs(run.path),
                    **{binding: (path, f'train.{binding}')})
    assert not os.path.exists(run.path), 'a refused start wrote'
    return str(refused.value)


def test_an_import_is_refused_in_each_form_of_its_path(tmp_path):
    """A config that builds the DINO import's ViT with timm's position
    interpolation (its `vit.position_interpolation = 'dino'` left out) is
    refused before the run writes anything, whether
    `train.pretrained_backbone` names the import's directory, its
    checkpoint directory or its checkpoint prefix; with the binding the
    backbone is read. Fails if the record is looked for in the directory
    named alone (tried: the checkpoint forms were read into the wrong
    interpolation, which changes no variable, silently)."""
    imported = _tiny_dino_import(tmp_path / 'dino_tiny')
    configured = _TINY_DINO_BINDINGS[:-1] + ['vit.depth = 1']
    for path in (imported.path, imported.checkpoints,
                 f'{imported.checkpoints}/ckpt-0'):
        with debug_gin.parsed(configured,
                              gin_file='gin_configs/image_folders_small.gin'):
            message = _start(tmp_path, ('pretrained_backbone', path))
        assert message.endswith(
            f"{imported} was built with vit.position_interpolation = 'dino'"
            "; this config builds vit.position_interpolation = 'timm'. "
            'Start from a backbone of this architecture, or bind its '
            "architecture: add vit.position_interpolation = 'dino'."), \
            message
    with debug_gin.parsed(_TINY_DINO_BINDINGS + ['vit.depth = 1'],
                          gin_file='gin_configs/image_folders_small.gin'):
        read = start.check_pretrained(
            run_dir.RunDir(str(tmp_path / 'run')),
            backbone=(imported.checkpoints, 'train.pretrained_backbone'))
    assert read.part == 'backbone'


def test_extra_bindings_are_named_for_removal(tmp_path):
    """A config that binds the import's bindings and LayerScale and
    registers its ViT has not is refused naming the lines to remove.
    Fails if the message asks to add the import's bindings (tried: 'add
    the import's bindings', which the config already holds)."""
    imported = _tiny_dino_import(tmp_path / 'dino_tiny')
    with debug_gin.parsed(_TINY_DINO_BINDINGS + [
            'vit.depth = 1', 'vit.layer_scale = True', 'vit.registers = 4'],
            gin_file='gin_configs/image_folders_small.gin'):
        message = _start(tmp_path, ('pretrained_backbone', imported.path))
    assert message.endswith(
        'bind its architecture: remove vit.layer_scale = True; remove '
        'vit.registers = 4.'), message


def test_a_backbone_import_as_a_model_names_the_backbone_binding(tmp_path):
    """`train.pretrained_model` naming a ViT import is refused saying the
    directory holds a backbone and `train.pretrained_backbone` starts a
    run from it. Fails if the model is read (tried: '176 variables of the
    configured model have no value...', the binding to use unnamed)."""
    imported = _tiny_dino_import(tmp_path / 'dino_tiny')
    with debug_gin.parsed(_TINY_DINO_BINDINGS + ['vit.depth = 1'],
                          gin_file='gin_configs/image_folders_small.gin'):
        message = _start(tmp_path, ('pretrained_model', imported.path))
    assert (f'{imported} holds the ViT-Ti/16 backbone imported from '
            'dino_tiny.pth, not a PAWS model: train.pretrained_model needs '
            'one.') in message, message
    assert (f"a PAWS run starts from it with train.pretrained_backbone = "
            f"'{imported}' and {'; '.join(_TINY_DINO_BINDINGS)}."
            ) in message, message


@pytest.mark.slow
@pytest.mark.long
def test_a_run_from_an_import_is_refused_without_its_interpolation(
        tmp_path, run_main, capsys):
    """A PAWS run that started from the DINO import (its config binds
    `vit.position_interpolation = 'dino'`), named by
    `train.pretrained_backbone` in a run.py config that leaves that
    binding out, is refused with a config error before the new run's
    directory is made (through run.py's `cli` in this process:
    test_pretrained_backbone runs such refusals as processes). Fails if
    only an import's record is compared (tried: the run's backbone, whose
    variables fit, was read into timm's interpolation silently)."""
    folders = image_folders.write_experiment(tmp_path / 'images',
                                             unlabeled=2, test=2)
    configured = folders + [binding for binding in image_folders.SMALL
                            if 'small_resnet' not in binding] + [
        *_TINY_DINO_BINDINGS[:-1], 'vit.depth = 1']
    source = run_dir.RunDir(str(tmp_path / 'paws_from_dino'))
    official_import.write_first_checkpoint(source, model=tf.train.Checkpoint(
        backbone=vit.build_vit('vit_tiny', position_interpolation='dino',
                               **_TINY_DINO)))
    with debug_gin.parsed(configured,
                          gin_file='gin_configs/image_folders_small.gin'):
        source.write(source.config, gin.config_str() +
                     f'{_TINY_DINO_BINDINGS[-1]}\n')
    code, output = run_py.in_process(run_main, capsys, run_py.command(
        tmp_path / 'run', configured + [
            f"train.pretrained_backbone = '{source}'"],
        gin_file='gin_configs/image_folders_small.gin', base_bindings=()))
    assert code == os.EX_CONFIG, output[-3000:]
    assert output.strip().splitlines()[-1].endswith(
        f"{source} was built with vit.position_interpolation = 'dino'; this "
        "config builds vit.position_interpolation = 'timm'. Start from a "
        'backbone of this '
        'architecture, or bind its architecture: add '
        "vit.position_interpolation = 'dino'."), output[-3000:]
    assert not (tmp_path / 'run').exists()
