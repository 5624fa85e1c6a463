"""The official PyTorch PAWS parameter names of paws_tf's layers, and the
copy of a PyTorch state dict into them, every tensor matched by name."""

import re

import numpy as np
import tf_keras

from paws_tf import checks
from paws_tf.nets import layer_scale
from paws_tf.nets import vit

# PyTorch's BatchNorm counts its updates in this buffer; no Keras variable
# holds it and inference does not read it.
BN_COUNTER = 'num_batches_tracked'
_MAX_KEYS_SHOWN = 12
_STEM_PARTS = {'stem_conv': 'conv1', 'stem_bn': 'bn1', 'final_bn': 'bn1'}
_RESNET_PARTS = {'conv1': 'conv1', 'bn1': 'bn1', 'conv2': 'conv2',
                 'bn2': 'bn2', 'conv3': 'conv3', 'bn3': 'bn3',
                 'proj_conv': 'downsample.0', 'proj_bn': 'downsample.1'}
_WIDE_PARTS = {'bn1': 'bn1', 'conv1': 'conv1', 'bn2': 'bn2',
               'conv2': 'conv2', 'proj_conv': 'shortcut.0'}
# suncet paws_train.py init_model: the projection head is `fc` (fc1, bn1,
# fc2, bn2, fc3, the same names as paws_tf's), the prediction head `pred`
# (bn1, fc1, bn2, fc2, where paws_tf says bn0, fc1, bn1, fc2).
_PREDICTION_PARTS = {'bn0': 'bn1', 'fc1': 'fc1', 'bn1': 'bn2', 'fc2': 'fc2'}
# suncet fine_tune.py init_model: `fc` is fc1, bn1 (from the projection
# head) and fc2, the classifier.
_CLASSIFIER_PARTS = {'fc1': 'fc1', 'bn1': 'bn1', 'classifier': 'fc2'}


class Mismatch(ValueError):
    """A state dict does not fit the model: keys unmatched or mis-shaped."""


def _backbone_name(layer_name):
    """The PyTorch module name of a backbone layer (`suncet src/resnet.py`,
    `src/wide_resnet.py`), or None for a layer without weights there."""
    if layer_name in _STEM_PARTS:
        return _STEM_PARTS[layer_name]
    match = re.fullmatch(r'(stage|group)(\d+)_block(\d+)_(\w+)', layer_name)
    if match is None:
        return None
    kind, stage, block, part = match.groups()
    parts = _RESNET_PARTS if kind == 'stage' else _WIDE_PARTS
    if part not in parts:
        return None
    return f'layer{stage}.{int(block) - 1}.{parts[part]}'


def _weighted_layers(module):
    """The convolutions, dense layers, batch and layer norms and ViT
    tokens inside `module`."""
    kinds = (tf_keras.layers.Conv2D, tf_keras.layers.Dense,
             tf_keras.layers.BatchNormalization,
             tf_keras.layers.LayerNormalization, vit.ClassTokenAndPositions)
    layers = [module] if isinstance(module, kinds) else []
    return layers + [layer for layer in module.submodules
                     if isinstance(layer, kinds)]


def layer_names(backbone, *, projection_head=None, prediction_head=None,
                classifier_layers=()):
    """Pairs each layer holding weights with its PyTorch module name.

    Args:
        backbone: a 'resnet50' or 'wide_resnet' `build_backbone` model.
        projection_head: `heads.ProjectionHead` (`fc.*`), or None.
        prediction_head: `heads.PredictionHead` (`pred.*`), or None.
        classifier_layers: the fine-tuned classifier's layers after the
            backbone, named 'fc1', 'bn1', 'classifier' (`fc.fc1`, `fc.bn1`,
            `fc.fc2`), or a single 'classifier' Dense on the features (`fc`).

    Returns:
        list of `(keras layer, torch module name)`.

    Raises:
        ValueError: a backbone layer has no PyTorch counterpart (the
            'small_resnet' backbone has none).
    """
    pairs = []
    for layer in _weighted_layers(backbone):
        name = _backbone_name(layer.name)
        if name is None:
            raise ValueError(
                f'The backbone layer {layer.name!r} ({backbone.name}) has no '
                'counterpart in the official PAWS networks (ResNet-50 and '
                'WideResNet-28-2).')
        pairs.append((layer, name))
    if projection_head is not None:
        pairs += [(layer, f'fc.{layer.name}')
                  for layer in _weighted_layers(projection_head)]
    if prediction_head is not None:
        pairs += [(layer, f'pred.{_PREDICTION_PARTS[layer.name]}')
                  for layer in _weighted_layers(prediction_head)]
    single = len(classifier_layers) == 1
    for layer in classifier_layers:
        pairs.append((layer, 'fc' if single else
                      f'fc.{_CLASSIFIER_PARTS[layer.name]}'))
    return pairs


def vit_layer_names(backbone):
    """Pairs each layer of a `vit.build_vit` backbone holding weights with
    its name in DINO's and MSN's `VisionTransformer` (facebookresearch/dino
    vision_transformer.py, facebookresearch/msn src/deit.py), which are
    timm's: `patch_embed.proj`, `cls_token` and `pos_embed` (the tokens
    layer, prefix ''), `blocks.<i>.{norm1,attn.qkv,attn.proj,norm2,
    mlp.fc1,mlp.fc2}`, `norm`; and DINOv2's (facebookresearch/dinov2
    dinov2/models/vision_transformer.py), which adds `register_tokens`
    and each block's LayerScale `ls1`, `ls2`."""
    pairs = []
    for layer in backbone.layers:
        if isinstance(layer, vit.PatchEmbedding):
            pairs.append((layer.proj, 'patch_embed.proj'))
        elif isinstance(layer, vit.ClassTokenAndPositions):
            pairs.append((layer, ''))
        elif isinstance(layer, vit.Block):
            block = f'blocks.{layer.name.rsplit("_", 1)[1]}'
            pairs += [(layer.norm1, f'{block}.norm1'),
                      (layer.attn.qkv, f'{block}.attn.qkv'),
                      (layer.attn.proj, f'{block}.attn.proj'),
                      (layer.norm2, f'{block}.norm2'),
                      (layer.fc1, f'{block}.mlp.fc1'),
                      (layer.fc2, f'{block}.mlp.fc2')]
            if layer.layer_scale:
                pairs += [(layer.ls1, f'{block}.ls1'),
                          (layer.ls2, f'{block}.ls2')]
        elif isinstance(layer, tf_keras.layers.LayerNormalization):
            pairs.append((layer, layer.name))
    return pairs


def _torch_values(layer, prefix):
    """`{torch key: (keras variable, to_keras)}` of one layer, where
    `to_keras` turns the PyTorch array into the variable's layout."""
    same = np.asarray
    if isinstance(layer, vit.ClassTokenAndPositions):
        # All [1, N, D] in either framework.
        values = {'cls_token': (layer.cls_token, same),
                  'pos_embed': (layer.pos_embed, same)}
        if layer.registers:
            values['register_tokens'] = (layer.register_tokens, same)
        return values
    if isinstance(layer, layer_scale.LayerScale):
        return {f'{prefix}.gamma': (layer.gamma, same)}
    if isinstance(layer, tf_keras.layers.LayerNormalization):
        return {f'{prefix}.weight': (layer.gamma, same),
                f'{prefix}.bias': (layer.beta, same)}
    if isinstance(layer, tf_keras.layers.BatchNormalization):
        pairs = [('weight', layer.gamma), ('bias', layer.beta),
                 ('running_mean', layer.moving_mean),
                 ('running_var', layer.moving_variance)]
        return {f'{prefix}.{key}': (variable, same) for key, variable in pairs}
    if isinstance(layer, tf_keras.layers.Conv2D):
        # [out, in, kh, kw] -> [kh, kw, in, out].
        kernel = (layer.kernel, lambda a: np.transpose(a, (2, 3, 1, 0)))
    else:
        kernel = (layer.kernel, np.transpose)  # [out, in] -> [in, out].
    values = {f'{prefix}.weight': kernel}
    if layer.use_bias:
        values[f'{prefix}.bias'] = (layer.bias, same)
    return values


def load_state_dict(pairs, state_dict, *, description):
    """Assigns a PyTorch state dict to Keras layers, all or nothing.

    Every variable of the layers gets the tensor of its PyTorch name, and
    every tensor of `state_dict` must be used (BatchNorm's
    `num_batches_tracked` counters of matched layers aside): nothing keeps
    its initial value silently, nothing is dropped silently.

    Args:
        pairs: `(keras layer, torch module name)` from `layer_names`; the
            layers are built.
        state_dict: `{name: NumPy array}` without the DDP `module.` prefix.
        description: what `state_dict` is (the file), for the errors.

    Returns:
        The number of tensors assigned.

    Raises:
        Mismatch: keys of the model missing from `state_dict`, keys of
            `state_dict` the model has no place for, or shapes that differ;
            each listed. No variable is changed.
    """
    wanted = {key: value for layer, prefix in pairs
              for key, value in _torch_values(layer, prefix).items()}
    counters = {f'{prefix}.{BN_COUNTER}' for layer, prefix in pairs
                if isinstance(layer, tf_keras.layers.BatchNormalization)}
    missing = set(wanted) - set(state_dict)
    unused = set(state_dict) - set(wanted) - counters
    shapes = []
    for key in sorted(set(wanted) & set(state_dict)):
        variable, to_keras = wanted[key]
        array = np.asarray(state_dict[key])
        if tuple(to_keras(array).shape) != tuple(variable.shape):
            shapes.append(f'{key} {list(array.shape)} (the model: '
                          f'{_torch_shape(variable)})')
    problems = [f'{len(keys)} key(s) {what}: '
                f'{checks.listing(sorted(keys), _MAX_KEYS_SHOWN)}'
                for keys, what in (
                    (missing, 'the model needs are not in it'),
                    (unused, 'in it have no place in the model'),
                    (shapes, 'have another shape')) if keys]
    if problems:
        raise Mismatch(f'{description} does not fit the configured model '
                       f'({len(wanted)} tensors): ' + '; '.join(problems) +
                       '.')
    for key, (variable, to_keras) in wanted.items():
        variable.assign(to_keras(np.asarray(state_dict[key], np.float32)))
    return len(wanted)


def _torch_shape(variable):
    """The PyTorch shape of a Keras kernel, bias or batch-norm vector."""
    shape = list(variable.shape)
    return [shape[i] for i in (3, 2, 0, 1)] if len(shape) == 4 else shape[::-1]
