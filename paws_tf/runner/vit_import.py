"""Importing the published DINO, MSN and DINOv2 Vision Transformers
(PyTorch files) as paws_tf runs: the backbone's checkpoint and its
embedder export."""

import inspect
import math
import os
import typing

from absl import logging
import tensorflow as tf
import tf_keras

from paws_tf import bindings
from paws_tf.data import augment
from paws_tf.evaluation import export
from paws_tf.nets import backbones
from paws_tf.nets import torch_names
from paws_tf.nets import vit
from paws_tf.nets import vit_positions
from paws_tf.runner import building
from paws_tf.runner import official_import
from paws_tf.runner import pretrained

DINOV2 = 'dinov2'
# The architectures each source publishes, (`vit.ARCHITECTURES` name,
# patch side): facebookresearch/dino README.md's pretrained models
# (ViT-S/16, S/8, B/16, B/8), facebookresearch/msn README.md's (ViT-S/16,
# B/16, L/16, B/4, L/7), facebookresearch/dinov2 hub/backbones.py's
# (ViT-S/14, B/14, L/14; its ViT-g/14 is refused, `architecture`).
PUBLISHED = {
    vit_positions.DINO: (('vit_small', 16), ('vit_small', 8),
                         ('vit_base', 16), ('vit_base', 8)),
    vit_positions.MSN: (('vit_small', 16), ('vit_base', 16),
                        ('vit_large', 16), ('vit_base', 4),
                        ('vit_large', 7)),
    DINOV2: (('vit_small', 14), ('vit_base', 14), ('vit_large', 14)),
}
# dinov2 hub/backbones.py: the `_reg` ViTs have 4 register tokens and
# resample their positions with `interpolate_antialias=True,
# interpolate_offset=0.0` (F.interpolate(size=..., antialias=True),
# timm's resampling); the others with `interpolate_antialias=False,
# interpolate_offset=0.1` (DINO's).
DINOV2_REGISTERS = 4
# All evaluate at 224 px: Resize(256) then CenterCrop(224) (dino
# eval_knn.py and eval_linear.py; msn linear_eval.py; dinov2
# data/transforms.py `make_classification_eval_transform`), ImageNet's
# mean and std.
EVAL_IMAGE_SIZE = 224
CROP_FRACTION = 224 / 256
# MSN's projection head, `fc` of the target encoder: not the backbone.
MSN_HEAD = 'fc.'
_LETTERS = {'vit_tiny': 'Ti', 'vit_small': 'S', 'vit_base': 'B',
            'vit_large': 'L'}
# dinov2 models/vision_transformer.py `vit_giant2`: width 1536, and the
# SwiGLU feed-forward (`mlp.w12`, `mlp.w3`) hub/backbones.py gives it.
_GIANT_WIDTH, _SWIGLU_KEY = 1536, 'blocks.0.mlp.w12.weight'
# Each source's name, and its file as `import_file`'s refusal describes it.
_SOURCES = {
    vit_positions.DINO: ('DINO', 'a DINO backbone state dict (keys '
                         'cls_token, pos_embed, patch_embed.proj.weight, '
                         'blocks.0...; e.g. dino_deitsmall16_pretrain.pth)'),
    vit_positions.MSN: ('MSN', 'an MSN checkpoint (a dict whose '
                        'target_encoder holds module.cls_token, '
                        'module.pos_embed, ...; e.g. vits16_800ep.pth.tar)'),
    DINOV2: ('DINOv2', 'a DINOv2 backbone state dict (keys cls_token, '
             'pos_embed, mask_token, blocks.0.ls1.gamma...; e.g. '
             'dinov2_vits14_pretrain.pth, dinov2_vits14_reg4_pretrain.pth)'),
}
# Keys only DINOv2's ViTs have (facebookresearch/dinov2
# dinov2/models/vision_transformer.py): its mask token, register tokens
# and LayerScale.
_DINOV2_KEYS = ('mask_token', 'register_tokens', 'blocks.0.ls1.gamma')
# DINOv2's mask token replaces masked patches in its iBOT training
# (`prepare_tokens_with_masks` with `masks`); its features do not read it.
DINOV2_MASK_TOKEN = 'mask_token'


class Architecture(typing.NamedTuple):
    """A published ViT as read from its file: `vit.ARCHITECTURES` name,
    patch side, the side its position embeddings were learned for, its
    register tokens, whether its blocks hold LayerScale, and how it
    resamples its positions (`vit_positions.INTERPOLATIONS`)."""
    name: str
    patch_size: int
    image_size: int
    registers: int
    layer_scale: bool
    interpolation: str

    def title(self):
        return _architecture_name(self.name, self.patch_size, self.registers)


def source_of(checkpoint):
    """'dino', 'msn' or 'dinov2' when the object read from a file
    (`official_import.load_file`) is one of their ViTs, None when it is
    none of theirs (an official PAWS file, or anything else)."""
    if not isinstance(checkpoint, dict):
        return None
    if isinstance(checkpoint.get('target_encoder'), dict):
        return vit_positions.MSN
    if 'cls_token' in checkpoint and 'patch_embed.proj.weight' in checkpoint:
        if any(key in checkpoint for key in _DINOV2_KEYS):
            return DINOV2
        return vit_positions.DINO
    return None


def _architecture_name(name, patch, registers=0):
    title = f'ViT-{_LETTERS.get(name, "?")}/{patch}'
    return f'{title} with {registers} registers' if registers else title


def architecture(path, state, source):
    """The `Architecture` of the ViT whose state dict is `state`, read
    from its shapes and keys; ImportFailed, naming what it holds, when it
    is not one of the architectures `source` publishes (`PUBLISHED`;
    DINOv2's with 0 or 4 registers)."""
    width = state['cls_token'].shape[-1]
    # DINOv2's ViT-g/14: its blocks' SwiGLU feed-forward is not built here.
    if source == DINOV2 and (width == _GIANT_WIDTH or _SWIGLU_KEY in state):
        raise official_import.ImportFailed(
            f'{path} holds a DINOv2 ViT-g/14 (width {width}, SwiGLU '
            'feed-forward mlp.w12, mlp.w3), which is not imported: '
            "paws_tf's ViT blocks have the MLP fc1, GELU, fc2. DINOv2's "
            'ViT-S/14, ViT-B/14 and ViT-L/14 (with or without registers) '
            'are.')
    patch = state['patch_embed.proj.weight'].shape[-1]
    depth = len({key.split('.')[1] for key in state
                 if key.startswith('blocks.')})
    tokens = state['pos_embed'].shape[1] - 1
    registers = (state['register_tokens'].shape[1]
                 if 'register_tokens' in state else 0)
    grid = math.isqrt(tokens)
    name = next((name for name, (dim, _, _) in vit.ARCHITECTURES.items()
                 if dim == width), None)
    published = PUBLISHED[source]
    allowed = (0, DINOV2_REGISTERS) if source == DINOV2 else (0,)
    if ((name, patch) not in published or registers not in allowed or
            depth != vit.ARCHITECTURES[name][1] or grid * grid != tokens):
        found = (f'{_architecture_name(name, patch, registers)} (width '
                 f'{width}, depth {depth}, patch {patch}, {tokens} position '
                 'embeddings)')
        expected = ', '.join(_architecture_name(*each) for each in published)
        if source == DINOV2:
            expected += f', without or with {DINOV2_REGISTERS} registers'
        raise official_import.ImportFailed(
            f'{path} holds a {found}, not one of the ViTs '
            f'{_SOURCES[source][0]} publishes: {expected} (depth 12, 24 for '
            'ViT-L, on a square grid).')
    interpolation = source
    if source == DINOV2:
        interpolation = (vit_positions.TIMM if registers else
                         vit_positions.DINO)
    return Architecture(name, patch, grid * patch, registers,
                        'blocks.0.ls1.gamma' in state, interpolation)


def read_state(path, checkpoint, source):
    """`(state, left_out, epoch)`: the backbone's `{name: NumPy array}`,
    the number of tensors of the file not in the backbone (MSN's `fc`
    projection head, DINOv2's mask token) and the stored epoch (None when
    absent)."""
    if source == vit_positions.MSN:
        arrays = official_import.numpy_state(
            path, checkpoint['target_encoder'], 'target_encoder')
        state = {key: value for key, value in arrays.items()
                 if not key.startswith(MSN_HEAD)}
        return state, len(arrays) - len(state), checkpoint.get('epoch')
    state = official_import.numpy_state(path, checkpoint, 'state dict')
    if source == DINOV2:
        state.pop(DINOV2_MASK_TOKEN, None)
    return state, len(checkpoint) - len(state), None


class BackboneEmbedder(tf_keras.Model):
    """A backbone as `export.export_embedder` takes a model: images ->
    `features`, which PAWS-NN compares (`embeddings`), as DINO's k-NN
    evaluation compares the backbone's class token."""

    nn_embedding = 'features'

    def __init__(self, backbone, **kwargs):
        super().__init__(name='backbone_embedder', **kwargs)
        self.backbone = backbone

    def call(self, images, training=False):
        features = tf.cast(self.backbone(images, training=training),
                           tf.float32)  # [N, D]
        return {'features': features, 'embeddings': features}


# The `vit.build_vit` arguments an import record holds; of them, those a
# record may leave out (`build_vit`'s defaults then build it) and that are
# bound only when not `build_vit`'s default.
_VIT_ARGUMENTS = ('patch_size', 'image_size', 'position_interpolation',
                  'layer_scale', 'registers')
_OPTIONAL_ARGUMENTS = ('layer_scale', 'registers')


def training_bindings(record):
    """The gin bindings that build the imported backbone, for a run that
    starts from it (`train.pretrained_backbone`), named after the
    configurables' parameters."""
    defaults = inspect.signature(vit.build_vit).parameters
    return [f'{bindings.gin_name(backbones.build_backbone)}.name = '
            f"{record['network']!r}"] + [
        f'{bindings.gin_name(vit.build_vit)}.{key} = {record[key]!r}'
        for key in _VIT_ARGUMENTS if key not in _OPTIONAL_ARGUMENTS
        or record.get(key, defaults[key].default) != defaults[key].default]


def unconfigured(record):
    """The bindings of the import `record` that this config binds
    otherwise: `(recorded, configured)` sorted binding lists, both empty
    when a run from it builds the imported backbone (a wrong
    `vit.position_interpolation` adds no variable, so no checkpoint read
    notices it)."""
    configured = bindings.arguments(vit.build_vit)
    ours = training_bindings(dict(
        {key: configured[key][0] for key in _VIT_ARGUMENTS},
        network=bindings.arguments(backbones.build_backbone)['name'][0]))
    theirs = set(record['bindings'])
    return sorted(theirs - set(ours)), sorted(set(ours) - theirs)


def _build_backbone(name, **architecture):
    """The float32 ViT `name` of an import's `architecture` (`vit.build_vit`
    arguments), RGB in."""
    return building.in_float32(vit.build_vit, name,
                               input_channels=official_import.CHANNELS,
                               **architecture)


def imported_architecture(run):
    """`(name, arguments)` of the ViT backbone imported into `run` (a
    `RunDir`), read from its record (`vit.build_vit`'s); None when `run`
    holds no imported backbone. A record without `layer_scale` or
    `registers` builds `build_vit`'s defaults; one without another
    argument raises `official_import.ImportFailed`."""
    record = run.read_json(run.imported)
    if record is None or record['kind'] != official_import.BACKBONE:
        return None
    missing = [key for key in _VIT_ARGUMENTS
               if key not in record and key not in _OPTIONAL_ARGUMENTS]
    if missing:
        raise official_import.ImportFailed(
            f'{run.imported} lacks {", ".join(missing)}: import the file '
            'again into a new directory (run.py --mode=import_official '
            '--model_dir=<new directory> '
            f'--official_checkpoint={record.get("source")}); --overwrite '
            f'into {run} would delete its fine_tune/, eval/, export/ and '
            'tensorboard/.')
    return record['network'], {key: record[key] for key in _VIT_ARGUMENTS
                               if key in record}


def imported_embedder(run, strategy, architecture):
    """The ViT backbone of `architecture` (`imported_architecture(run)`)
    as a `BackboneEmbedder`, built in `strategy`'s scope and restored from
    `run`'s checkpoint, for what trains on it (--mode=fine_tune: the trunk
    is the backbone, which PAWS-NN of the import compares)."""
    name, arguments = architecture
    with strategy.scope():
        backbone = _build_backbone(name, **arguments)
        pretrained.load_backbone_weights(backbone, run)
    return BackboneEmbedder(backbone)


def import_vit(run, path, checkpoint, taken):
    """Writes the DINO, MSN or DINOv2 ViT of `path` (its contents
    `checkpoint`) into the `RunDir` `run`, replacing `taken`
    (`official_import.write_import`): the backbone's checkpoint, its
    embedder export (224-px centre crop of 0.875, ImageNet's
    normalisation, `features` compared) and the import record, which it
    returns. ImportFailed for another architecture, or tensors that do not
    fit; nothing is written."""
    source = source_of(checkpoint)
    state, left_out, epoch = read_state(path, checkpoint, source)
    found = architecture(path, state, source)
    arguments = dict(
        patch_size=found.patch_size, image_size=found.image_size,
        position_interpolation=found.interpolation,
        layer_scale=found.layer_scale, registers=found.registers)
    backbone = _build_backbone(found.name, **arguments)
    count = official_import.load_state(torch_names.vit_layer_names(backbone),
                                       state, path)
    record = dict(source=os.path.abspath(path),
                  kind=official_import.BACKBONE, origin=source,
                  network=found.name, architecture=found.title(),
                  **arguments, epoch=epoch, tensors=count, left_out=left_out)
    record['bindings'] = training_bindings(record)
    official_import.write_import(
        run, taken, record, lambda: export.export_embedder(
            BackboneEmbedder(backbone), run.embedder,
            image_size=EVAL_IMAGE_SIZE, crop_fraction=CROP_FRACTION,
            mean=augment.IMAGENET_MEAN, std=augment.IMAGENET_STD,
            channels=official_import.CHANNELS), backbone=backbone)
    logging.info('Imported the %s %s of %s (%d tensors) into %s; a run '
                 'starting from it binds %s.', _SOURCES[source][0],
                 record['architecture'], path, count, run,
                 '; '.join(record['bindings']))
    return record


def import_file(run, path, *, strategy, overwrite=False):
    """`--mode=import_official`: the file at `path` read once, then
    imported as a DINO, MSN or DINOv2 ViT (`import_vit`) or an official
    PAWS ResNet (`official_import.import_official`). Raises ImportFailed
    when `run` holds a run and not `overwrite`."""
    taken = official_import.occupied(run, overwrite)
    described = [official_import.EXPECTED] + [
        expected for _, expected in _SOURCES.values()]
    checkpoint = official_import.load_file(path, expected=(
        f'{", ".join(described[:-1])} or {described[-1]}'))
    if source_of(checkpoint) is not None:
        return import_vit(run, path, checkpoint, taken)
    return official_import.import_official(run, path, checkpoint, taken,
                                           strategy=strategy)
