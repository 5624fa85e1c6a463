"""Importing the published DINO and MSN Vision Transformers (PyTorch files)
as paws_tf runs: the backbone's checkpoint and its embedder export."""

import math
import os

from absl import logging
import tensorflow as tf
import tf_keras

from paws_tf.data import augment
from paws_tf.evaluation import export
from paws_tf.nets import torch_names
from paws_tf.nets import vit
from paws_tf.nets import vit_positions
from paws_tf.runner import official_import

# The architectures each source publishes, (`vit.ARCHITECTURES` name,
# patch side): facebookresearch/dino README.md's pretrained models
# (ViT-S/16, S/8, B/16, B/8), facebookresearch/msn README.md's (ViT-S/16,
# B/16, L/16, B/4, L/7).
PUBLISHED = {
    vit_positions.DINO: (('vit_small', 16), ('vit_small', 8),
                         ('vit_base', 16), ('vit_base', 8)),
    vit_positions.MSN: (('vit_small', 16), ('vit_base', 16),
                        ('vit_large', 16), ('vit_base', 4),
                        ('vit_large', 7)),
}
# Both evaluate at 224 px: Resize(256) then CenterCrop(224) (dino
# eval_knn.py and eval_linear.py; msn linear_eval.py), ImageNet's mean and
# std.
CROP_FRACTION = 224 / 256
# MSN's projection head, `fc` of the target encoder: not the backbone.
MSN_HEAD = 'fc.'
_LETTERS = {'vit_tiny': 'Ti', 'vit_small': 'S', 'vit_base': 'B',
            'vit_large': 'L'}
_EXPECTED = {
    vit_positions.DINO: ('a DINO backbone state dict (keys cls_token, '
                         'pos_embed, patch_embed.proj.weight, blocks.0...; '
                         'e.g. dino_deitsmall16_pretrain.pth)'),
    vit_positions.MSN: ('an MSN checkpoint (a dict whose target_encoder '
                        'holds module.cls_token, module.pos_embed, ...; '
                        'e.g. vits16_800ep.pth.tar)'),
}
# Keys only DINOv2's ViTs have (facebookresearch/dinov2
# dinov2/models/vision_transformer.py): its mask token, register tokens
# and LayerScale.
_DINOV2_KEYS = ('mask_token', 'register_tokens', 'blocks.0.ls1.gamma')


def source_of(checkpoint):
    """'dino' or 'msn' when the object read from a file
    (`official_import.load_file`) is one of their ViTs, None when it is
    none of theirs (an official PAWS file, or anything else)."""
    if not isinstance(checkpoint, dict):
        return None
    if isinstance(checkpoint.get('target_encoder'), dict):
        return vit_positions.MSN
    if 'cls_token' in checkpoint and 'patch_embed.proj.weight' in checkpoint:
        return vit_positions.DINO
    return None


def _architecture_name(name, patch):
    return f'ViT-{_LETTERS.get(name, "?")}/{patch}'


def architecture(path, state, source):
    """`(name, patch_size, image_size)` of the ViT whose state dict is
    `state` (`vit.ARCHITECTURES` name, patch side, the side its position
    embeddings were learned for), read from its shapes.

    Raises:
        ImportFailed: it is a DINOv2 ViT, or not one of the architectures
            `source` publishes (`PUBLISHED`), naming what it holds.
    """
    dinov2 = [key for key in _DINOV2_KEYS if key in state]
    if dinov2:
        raise official_import.ImportFailed(
            f'{path} holds a DINOv2 ViT ({", ".join(dinov2)}), which is not '
            f'imported here; expected {_EXPECTED[source]}.')
    width = state['cls_token'].shape[-1]
    patch = state['patch_embed.proj.weight'].shape[-1]
    depth = len({key.split('.')[1] for key in state
                 if key.startswith('blocks.')})
    tokens = state['pos_embed'].shape[1] - 1
    grid = math.isqrt(tokens)
    name = next((name for name, (dim, _, _) in vit.ARCHITECTURES.items()
                 if dim == width), None)
    published = PUBLISHED[source]
    if ((name, patch) not in published or
            depth != vit.ARCHITECTURES[name][1] or grid * grid != tokens):
        found = (f'{_architecture_name(name, patch)} (width {width}, depth '
                 f'{depth}, patch {patch}, {tokens} position embeddings)')
        expected = ', '.join(_architecture_name(*each) for each in published)
        raise official_import.ImportFailed(
            f'{path} holds a {found}, not one of the ViTs {source.upper()} '
            f'publishes: {expected} (depth 12, 24 for ViT-L, on a square '
            'grid).')
    return name, patch, grid * patch


def read_state(path, checkpoint, source):
    """`(state, left_out, epoch)`: the backbone's `{name: NumPy array}`,
    the number of tensors of the file not in the backbone (MSN's `fc`
    projection head) and the stored epoch (None when absent)."""
    if source == vit_positions.MSN:
        arrays = official_import.numpy_state(
            path, checkpoint['target_encoder'], 'target_encoder')
        state = {key: value for key, value in arrays.items()
                 if not key.startswith(MSN_HEAD)}
        return state, len(arrays) - len(state), checkpoint.get('epoch')
    return official_import.numpy_state(path, checkpoint, 'state dict'), 0, None


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


def training_bindings(record):
    """The gin bindings that build the imported backbone, for a run that
    starts from it (`train.pretrained_backbone`)."""
    return [f"build_backbone.name = '{record['network']}'",
            f"vit.patch_size = {record['patch_size']}",
            f"vit.image_size = {record['image_size']}",
            "vit.position_interpolation = "
            f"'{record['position_interpolation']}'"]


def import_vit(run, path, checkpoint, *, overwrite=False):
    """Writes the DINO or MSN ViT read from `path` into `run`: the
    backbone's checkpoint (`tf.train.Checkpoint(backbone=...)`, step 0, in
    `RunDir.checkpoints`), its embedder export (224-px centre crop of
    0.875, ImageNet's normalisation, `features` compared) and the import
    record, once every tensor is read and matched.

    Args:
        run, path: the `RunDir` to create, the file.
        checkpoint: the file's contents (`official_import.load_file`), for
            which `source_of` is not None.
        overwrite: replace an earlier import or run in `run`.

    Returns:
        The import record (dict).

    Raises:
        ImportFailed: another architecture, tensors that do not fit, or
            `run` holds a run; nothing is written.
    """
    taken = official_import.occupied(run, overwrite)
    source = source_of(checkpoint)
    state, left_out, epoch = read_state(path, checkpoint, source)
    name, patch, image_size = architecture(path, state, source)
    tf_keras.mixed_precision.set_global_policy('float32')
    backbone = vit.build_vit(name, patch_size=patch, image_size=image_size,
                             input_channels=official_import.CHANNELS,
                             position_interpolation=source)
    try:
        count = torch_names.load_state_dict(
            torch_names.vit_layer_names(backbone), state, description=path)
    except torch_names.Mismatch as error:
        raise official_import.ImportFailed(str(error)) from error
    official_import.make_room(run, taken)
    official_import.write_first_checkpoint(run, backbone=backbone)
    export.export_embedder(
        BackboneEmbedder(backbone), run.embedder, image_size=image_size,
        crop_fraction=CROP_FRACTION, mean=augment.IMAGENET_MEAN,
        std=augment.IMAGENET_STD, channels=official_import.CHANNELS)
    record = dict(source=os.path.abspath(path),
                  kind=official_import.BACKBONE, origin=source, network=name, architecture=_architecture_name(name, patch),
                  patch_size=patch, image_size=image_size,
                  position_interpolation=source, epoch=epoch, tensors=count,
                  left_out=left_out)
    record['bindings'] = training_bindings(record)
    run.write_json(run.imported, record, default=int)
    logging.info('Imported the %s %s of %s (%d tensors) into %s; a run '
                 'starting from it binds %s.', source.upper(),
                 record['architecture'], path, count, run,
                 '; '.join(record['bindings']))
    return record


def import_file(run, path, *, strategy, overwrite=False):
    """`--mode=import_official`: the file at `path` read once, then
    imported as a DINO or MSN ViT (`import_vit`) or an official PAWS
    ResNet (`official_import.import_official`)."""
    official_import.occupied(run, overwrite)
    checkpoint = official_import.load_file(path, expected=(
        f'{official_import.EXPECTED}, {_EXPECTED[vit_positions.DINO]} or '
        f'{_EXPECTED[vit_positions.MSN]}'))
    if source_of(checkpoint) is not None:
        return import_vit(run, path, checkpoint, overwrite=overwrite)
    return official_import.import_official(
        run, path, strategy=strategy, overwrite=overwrite,
        checkpoint=checkpoint)
