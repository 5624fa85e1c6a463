"""Importing official PyTorch PAWS checkpoints (`.pth.tar`) as paws_tf runs."""

import os

from absl import logging
import numpy as np
import tensorflow as tf
import tf_keras

from paws_tf import bindings
from paws_tf import checkpoints
from paws_tf import checks
from paws_tf.data import augment
from paws_tf.data import normalization
from paws_tf.evaluation import export
from paws_tf.nets import backbones
from paws_tf.nets import heads
from paws_tf.nets import sync_batch_norm
from paws_tf.nets import torch_names
from paws_tf import run_dir
from paws_tf.runner import building
from paws_tf.runner import experiment

# The kinds of import (a backbone alone: the DINO, MSN and DINOv2 ViTs of
# `vit_import`).
PRETRAINED, FINE_TUNED, BACKBONE = run_dir.RunDir.IMPORT_KINDS
# The official networks take RGB images.
CHANNELS = 3
_INSTALL_HINT = ('Reading official .pth.tar checkpoints needs PyTorch: '
                 'pip install .[torch] (or pip install paws_tf[torch]; the '
                 'CPU wheel suffices).')
# What --mode=import_official reads here; `vit_import` adds DINO's, MSN's
# and DINOv2's.
EXPECTED = ('an official PAWS checkpoint: a dict whose "encoder" entry is '
            'the state dict of ResNet-50 or WideResNet-28-2 (keys '
            '"module.conv1.weight", ...) with the "fc" projection head '
            '(pre-trained) or the "fc" classifier (fine-tuned)')


class ImportFailed(checks.DataError):
    """The official checkpoint cannot be imported; nothing was written."""


def load_file(path, expected=EXPECTED):
    """The object stored in the PyTorch file `path`, read without running
    code from it (`weights_only`: tensors and plain containers);
    ImportFailed when PyTorch is not installed, or the file is missing,
    truncated, not a PyTorch file or holds other objects (a pickled class
    or function), naming what was `expected`."""
    try:
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError as error:
        raise ImportFailed(_INSTALL_HINT) from error
    if not os.path.isfile(path):
        raise ImportFailed(f'--official_checkpoint={path}: no such file.')
    try:
        return torch.load(path, map_location='cpu', weights_only=True)
    # torch.load fails in many ways on a damaged file (RuntimeError from
    # the zip reader, EOFError, UnpicklingError): each means it is unusable.
    except Exception as error:  # pylint: disable=broad-except
        raise ImportFailed(
            f'{path} cannot be read by torch.load (truncated, corrupted, '
            'not a PyTorch file, or holding objects other than tensors): '
            f'{type(error).__name__}: '
            f'{str(error).strip().splitlines()[0] if str(error) else ""}. '
            f'Expected {expected}.') from error


def numpy_state(path, state, entry):
    """`{name: NumPy array}` of the state dict `state` (the file's `entry`)
    without the DDP `module.` prefix; ImportFailed on a value that is not
    a tensor."""
    import torch  # pylint: disable=import-outside-toplevel
    arrays = {}
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise ImportFailed(f'{path}: {entry} entry {name!r} is a '
                               f'{type(tensor).__name__}, not a tensor.')
        arrays[name.removeprefix('module.')] = tensor.detach().cpu().numpy()
    return arrays


def read_checkpoint(path, checkpoint):
    """`(state, epoch)` of the official `.pth.tar` file `path` (what suncet
    `paws_train.py` and `fine_tune.py` save) of contents `checkpoint`: its
    encoder's `numpy_state`, its epoch (None when absent); ImportFailed
    when it is not such a checkpoint."""
    encoder = checkpoint.get('encoder') if isinstance(checkpoint,
                                                      dict) else None
    if not isinstance(encoder, dict) or not encoder:
        keys = (sorted(checkpoint)[:8] if isinstance(checkpoint, dict)
                else type(checkpoint).__name__)
        raise ImportFailed(f'{path} holds {keys}, not {EXPECTED}.')
    return numpy_state(path, encoder, 'encoder'), checkpoint.get('epoch')


def architecture(state):
    """The paws_tf backbone name (`backbone.name`) of an official state
    dict: 'resnet50_<w>x' or 'wide_resnet<depth>_<width>', else None."""
    conv1 = state.get('conv1.weight')
    if conv1 is None or conv1.ndim != 4:
        return None
    blocks = [len({key.split('.')[1] for key in state
                   if key.startswith(f'layer{i}.')}) for i in (1, 2, 3, 4)]
    if 'layer1.0.conv3.weight' in state and blocks == [3, 4, 6, 3]:
        return f'resnet50_{conv1.shape[0] // 64}x'
    if 'layer1.0.conv1.bias' in state and blocks[3] == 0:
        width = state['layer1.0.conv1.weight'].shape[0] // 16
        return f'wide_resnet{6 * blocks[0] + 4}_{width}'
    return None


def _fine_tuned_classifier(state):
    """`(classifier, classifier_layers)`: the configured backbone, then
    `fc1 -> bn1 -> ReLU -> fc2` (suncet `fine_tune.py`) or a linear `fc`,
    sized from `state` (images -> float32 logits), and the weighted layers
    after the backbone."""
    backbone = backbones.build_backbone(input_channels=CHANNELS, sync_bn=False)
    inputs = tf_keras.Input((None, None, CHANNELS), name='images')
    x = backbone(inputs)  # [B, F]
    layers = []
    if 'fc.fc2.weight' in state:
        fc1 = heads.Linear(state['fc.fc1.weight'].shape[0], name='fc1')
        # PyTorch's BatchNorm1d: epsilon 1e-5.
        bn1 = sync_batch_norm.batch_norm('bn1', sync_bn=False, momentum=0.9,
                                         epsilon=1e-5)
        x = tf_keras.layers.ReLU(name='relu1')(bn1(fc1(x)))
        layers = [fc1, bn1]
        num_classes = state['fc.fc2.weight'].shape[0]
    else:
        num_classes = state['fc.weight'].shape[0]
    dense = tf_keras.layers.Dense(num_classes, name='classifier',
                                  dtype='float32')
    classifier = tf_keras.Model(inputs, dense(x), name='fine_tuned_classifier')
    return classifier, layers + [dense]


def _network(path, state, strategy):
    """`(kind, network, backbone, tensors)`: the kind of `state`, the
    configured network holding its values, its backbone, their count."""
    hint = ''
    if 'fc.fc3.weight' in state:
        found = PRETRAINED
        network = building.in_float32(building.build_model, strategy,
                                      input_channels=CHANNELS)
        backbone, named = network.backbone, dict(
            projection_head=network.projection_head,
            prediction_head=network.prediction_head)
        has_head = network.prediction_head is not None
        if has_head and 'pred.fc1.weight' not in state:
            hint = (" It has no prediction head: bind build_model."
                    "prediction_head = False and PAWSModel.nn_embedding = "
                    "'projection'.")
        elif not has_head and 'pred.fc1.weight' in state:
            hint = (' It has a prediction head: bind build_model.'
                    'prediction_head = True (and PredictionHead.hidden_dim '
                    'to its width).')
    elif 'fc.fc2.weight' in state or 'fc.weight' in state:
        found = FINE_TUNED
        with strategy.scope():
            network, layers = building.in_float32(_fine_tuned_classifier,
                                                  state)
        backbone, named = network.layers[1], dict(classifier_layers=layers)
    else:
        raise ImportFailed(
            f'{path} has neither a projection head (fc.fc3.*, pre-trained) '
            f'nor a classifier (fc.fc2.* or fc.*, fine-tuned); expected '
            f'{EXPECTED}.')
    held = architecture(state)
    if held != backbone.name:
        raise ImportFailed(
            f'{path} holds {held or "an unknown network"} (conv1.weight '
            f'{list(state.get("conv1.weight", np.zeros(0)).shape)}), but '
            f'the gin config builds {backbone.name}: use the config of that '
            'network (gin_configs/imagenet_rn50_{1,10}pct.gin for '
            'ResNet-50, imagenet_rn50x2_10pct.gin for 2x, '
            'cifar10_wrn28_2_4000.gin for WideResNet-28-2).')
    count = load_state(torch_names.layer_names(backbone, **named), state,
                       path, hint)
    return found, network, backbone, count


def load_state(layer_names, state, path, hint=''):
    """`torch_names.load_state_dict` of `state` (read from `path`);
    ImportFailed naming what does not fit, then `hint`."""
    try:
        return torch_names.load_state_dict(layer_names, state,
                                           description=path)
    except torch_names.Mismatch as error:
        raise ImportFailed(f'{error}{hint}') from error


def occupied(run, overwrite):
    """What an import into the `RunDir` `run` would replace; ImportFailed
    when it holds something and not `overwrite`."""
    taken = [path for path in (
        run.imported, run.checkpoints, run.backup, run.export)
             if os.path.exists(path)]
    if taken and not overwrite:
        names = ', '.join(os.path.basename(path) for path in taken)
        raise ImportFailed(
            f'{run} already holds {names}: import into a new '
            '--model_dir, or pass --overwrite to replace them.')
    return taken


def write_import(run, taken, record, export_model, **checkpointed):
    """Writes an import, once everything is read and matched, into the
    `RunDir` `run`: the earlier run `occupied` found (`taken`) deleted,
    `checkpointed` (as `tf.train.Checkpoint` takes them) as the checkpoint
    of step 0, `export_model()`'s SavedModel, then the `record`."""
    if taken:
        run.delete(run.overwritten)
    os.makedirs(run, exist_ok=True)
    if checkpointed:
        write_first_checkpoint(run, **checkpointed)
    export_model()
    run.write_json(run.imported, record, default=int)


def write_first_checkpoint(run, **objects):
    """Writes `objects` (as `tf.train.Checkpoint` takes them) as the
    checkpoint of step 0 of the `RunDir` `run`: what an import holds."""
    tf.train.CheckpointManager(
        tf.train.Checkpoint(**objects), run.checkpoints, max_to_keep=1,
        checkpoint_name=checkpoints.CHECKPOINT_PREFIX,
    ).save(checkpoint_number=0)


def import_official(run, path, checkpoint, taken, *, strategy):
    """Writes the official checkpoint `path` (its contents `checkpoint`)
    into the `RunDir` `run`, replacing `taken` (`write_import`), built in
    `strategy`; returns the import record. Pre-trained: a checkpoint of the
    gin-configured `PAWSModel`, which the other modes read as a run
    trained here, and its embedder SavedModel. Fine-tuned: the classifier
    SavedModel (`export.export_fine_tuned`). ImportFailed when the file
    cannot be imported into this config."""
    state, epoch = read_checkpoint(path, checkpoint)
    found, network, backbone, count = _network(path, state, strategy)
    preprocessing, _ = experiment.recorded_preprocessing()
    exporter, directory = ((export.export_embedder, run.embedder)
                           if found == PRETRAINED else
                           (export.export_fine_tuned, run.fine_tuned))
    record = dict(source=os.path.abspath(path), kind=found, epoch=epoch,
                  network=backbone.name, tensors=count)
    write_import(
        run, taken, record,
        lambda: exporter(network, directory, channels=CHANNELS,
                         strategy=strategy, **preprocessing),
        **(dict(model=network) if found == PRETRAINED else {}))
    logging.info('Imported %s (%s, %s, epoch %s, %d tensors) into %s.', path,
                 found, backbone.name, epoch, count, run)
    return record


def check_preprocessing(run):
    """Refuses fine-tuning the import in `run` with a config whose source
    decodes other channels (`experiment.check_channels`), or whose
    `load_data.normalization` is another than its export records (what its
    weights were trained on), before any image is read, naming the record
    and the binding (`checks.ConfigError`); both wrong, one message names
    both bindings. Returns `(channels, model)`, `experiment.load_data`'s
    `takes`: the images of a source without a `channels` argument are
    checked once read."""
    recorded = export.read_preprocessing(run.embedder)
    where = os.path.join(run.embedder, export.PREPROCESSING_FILENAME)
    spec, name = bindings.arguments(experiment.load_data)['normalization']
    values = recorded['mean'], recorded['std']
    given = normalization.normalization(spec)
    if (isinstance(given, tuple) and len(given[0]) == len(values[0])
            and np.allclose(given, values, rtol=1e-6)):
        fix = ''
    else:
        fix = f'{name} = ' + next((
            f"'{preset}'" for preset, (mean, std) in
            augment.NORMALIZATIONS.items()
            if np.allclose((mean, std), values, rtol=1e-6)), str(values))
    experiment.check_channels(
        recorded['channels'], f'The model imported into {run} ({where})',
        also=fix and f'{fix} (the normalisation it was trained with)')
    if fix:
        raise checks.ConfigError(
            f'{where} records the normalisation the model imported into '
            f'{run} was trained with (mean {values[0]}, std {values[1]}), '
            f'not {name} = {spec!r}: bind {fix}'
            f'{_decode(given, recorded["channels"])}.')
    return recorded['channels'], f'The model imported into {run}'


def _decode(given, channels):
    """' and ...': what makes the training source decode the `channels`
    the import takes, where the normalisation `given` is of other channels
    and the source's `channels` argument does not say it decodes them (a
    bound value that differs `experiment.check_channels` refused); ''
    where it does."""
    bound = experiment.train_channels()
    if not isinstance(given, tuple) or len(given[0]) == channels or (
            bound is not None and bound[0] == channels):
        return ''
    if bound is None:
        return f' and use a source of {channels}-channel images'
    return f' and {bound[1]} = {channels}'


def backbone_only(run, record, needs):
    """The message for `needs` (a mode or binding) that needs a PAWS model
    where `run` holds the backbone import `record`: what the import is
    used with."""
    return (f'{run} holds the {record["architecture"]} backbone imported '
            f'from {record["source"]}, not a PAWS model: {needs} needs one. '
            'Its PAWS-NN is gin_configs/existing_model_folders.gin with '
            f"MODEL = '{run}', --mode=fine_tune fine-tunes it, and a PAWS "
            f"run starts from it with train.pretrained_backbone = '{run}' "
            f'and {"; ".join(record["bindings"])}.')


def check_mode(run, mode, *, trains=False, backbone=False):
    """Whether the `RunDir` `run` holds imported weights that the mode
    named `mode` (one that `trains`, or not; that runs on a `backbone`
    alone, or not) runs on. ImportFailed for pre-training on an import, or
    for another mode on an imported fine-tuned classifier, or on an
    imported backbone unless the mode takes a `backbone`."""
    record = run.read_json(run.imported)
    if record is None:
        return False
    if trains:
        part = ('backbone' if record['kind'] == BACKBONE else 'model')
        raise ImportFailed(
            f'{run} holds weights imported from {record["source"]}, '
            'not a paws_tf training run: pre-train in another --model_dir, '
            f"with train.pretrained_{part} = '{run}' to start from "
            f'this {part}.')
    if record['kind'] == BACKBONE and not backbone:
        raise ImportFailed(backbone_only(run, record, f'--mode={mode}'))
    if record['kind'] == FINE_TUNED:
        raise ImportFailed(fine_tuned_only(run, record, f'--mode={mode}',
                                           backbone=backbone))
    return True


def fine_tuned_only(run, record, needs, backbone=False):
    """The message for `needs` (a mode or binding) that needs a PAWS model,
    or with `backbone` a backbone alone, where `run` holds the fine-tuned
    classifier import `record`, a SavedModel alone."""
    wanted = ('a backbone: a PAWS, DINO, MSN or DINOv2 checkpoint imported '
              'into another --model_dir, or a paws_tf run '
              '(train.pretrained_backbone also reads a backbone weights '
              'file)' if backbone else
              'a pre-trained checkpoint (backbone, fc projection and pred '
              'prediction heads), e.g. paws_imgnt_10percent_300ep.pth.tar, '
              'imported into another --model_dir')
    return (f'{run} holds the fine-tuned classifier imported from '
            f'{record["source"]} (its SavedModel is {run.fine_tuned}): '
            f'{needs} needs {wanted}.')
