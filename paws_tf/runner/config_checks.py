"""Checks of a gin config before data is read."""

import inspect
import numbers
import os

import gin

from paws_tf import bindings
from paws_tf import checks
from paws_tf import model as model_lib
from paws_tf import nets
from paws_tf.data import normalization as normalization_lib
from paws_tf.evaluation import evaluate_nn
from paws_tf.evaluation import export
from paws_tf.nets import backbones
from paws_tf.nets import vit
from paws_tf.runner import train

def _folder_source():
    """`(selector prefix, labeled-root parameter)` of a folder training
    source bound to `load_data.train`, or None for other sources."""
    train = bindings.reference('load_data.train')
    roots = dict(image_folders='labeled_root', image_folder='root')
    if train is None or train.configurable.name not in roots:
        return None
    return train.scoped_selector, roots[train.configurable.name]


def _check_folders_bound(folder):
    """Every folder the config reads is bound (the folder recipes leave
    LABELED_DIR, UNLABELED_DIR and TEST_DIR as None for the command line)."""
    roots = []
    if folder is not None:
        prefix, parameter = folder
        labeled = bindings.bound(f'{prefix}.labeled', True)
        roots.append((f'{prefix}.{parameter}', 'labeled class subfolders'
                      if labeled else 'images'))
        if parameter == 'labeled_root':
            roots.append((f'{prefix}.unlabeled_root', 'unlabeled images'))
    test = bindings.reference('load_data.test')
    if test is not None and test.configurable.name == 'image_folder':
        roots.append((f'{test.scoped_selector}.root', 'test class subfolders'))
    for selector, what in roots:
        root, name = bindings.binding(selector)
        if root is None:
            raise checks.ConfigError(
                f'{name} is not bound: bind it to your folder of {what}, '
                f"e.g. --gin_bindings=\"{name} = '/data/mine/...'\".")


def check_labeled_folder(what):
    """`(root, binding)` of the labeled folder, or None when the labeled
    images are not a bound folder; raises ConfigError naming the binding
    and what needs the images (`what`) when the folder is missing."""
    folder = _folder_source()
    if folder is None or not bindings.bound(f'{folder[0]}.labeled', True):
        return None
    root, root_name = bindings.binding(f'{folder[0]}.{folder[1]}')
    if not isinstance(root, str):
        return None
    if not os.path.isdir(root):
        raise checks.ConfigError(
            f'{root_name} = {root!r} is not a folder: bind it to the '
            f'folder of labeled class subfolders ({what}).')
    return root, root_name


def _check_support():
    """The labeled folder holds the classes the support draws."""
    labeled = check_labeled_folder(
        'the supports of pre-training are drawn from them')
    if labeled is None:
        return
    root, root_name = labeled
    classes = sorted(entry.name for entry in os.scandir(root)
                     if entry.is_dir())
    if len(classes) == 1:
        raise checks.DataError(
            f'{root_name} = {root!r} holds one class folder ({classes[0]!r})'
            ': PAWS needs labeled images of at least two classes (each view '
            'is classified among the support\'s classes). Add a folder of '
            'images for each other class.')
    wanted, wanted_name = bindings.binding(
        'make_pretrain_dataset_fn.classes_per_step')
    if (isinstance(wanted, numbers.Integral) and classes
            and wanted > len(classes)):
        raise checks.ConfigError(
            f'{wanted_name} = {wanted} support classes per step, but '
            f'{root_name} = {root!r} holds {len(classes)} class folder(s): '
            f'bind {wanted_name} = {len(classes)}.')


def _check_arguments(pretraining):
    """The argument checks of the configurables a run calls, on the values
    bound to them."""
    bindings.check_bound(model_lib.PAWSModel.check_arguments,
                         model_lib.PAWSModel, 'PAWSModel')
    nets.check_impl(*bindings.binding('build_model.sync_bn_impl', nets.KERAS))
    if not pretraining:
        return
    bindings.check_bound(train.check_arguments, train.train, 'train')
    # The classes `train` calls: `LARS`, `WarmupCosineDecay`, or others
    # with a check of their own.
    defaults = inspect.signature(train.train).parameters
    num_epochs = bindings.binding('train.num_epochs', gin.REQUIRED)
    for parameter in ('optimizer_cls', 'schedule_cls'):
        cls, selector = bindings.configured(f'train.{parameter}',
                                            defaults[parameter].default)
        if hasattr(cls, 'check_arguments'):
            bindings.check_bound(cls.check_arguments, cls, selector,
                                 num_epochs=num_epochs)


def _check_size(size, size_name, minimum, backbone, backbone_name):
    if checks.integer(size_name, size) < minimum:
        other = ("fewer build_backbone.stage_strides" if backbone ==
                 'small_resnet' else "a backbone for small images "
                 "(build_backbone.name = 'small_resnet', as the recipe "
                 "gin_configs/image_folders_small.gin)")
        raise checks.ConfigError(
            f'{size_name} = {size} is smaller than {minimum} px, the '
            f'downsampling of {backbone_name} = {backbone!r}: its last '
            'stages would see a single pixel padded with zeros. Bind '
            f'{size_name} = {minimum} or more, or {other}.')


def _check_normalization(folder, required=True):
    """The folders' channels, and the normalisation bound only to
    `load_data.normalization` (bound, if `required`); returns the
    multi-crop `(config, selector)` bound called, or None."""
    channels = None
    if folder is not None:
        channels, channels_name = bindings.binding(f'{folder[0]}.channels', 3)
        if channels not in (1, 3) or isinstance(channels, bool):
            raise checks.ConfigError(
                f'{channels_name} = {channels!r}: images are decoded to 1 '
                '(grayscale) or 3 (RGB) channels.')
    multicrop = bindings.reference('make_pretrain_dataset_fn.multicrop')
    if multicrop is not None and multicrop.evaluate:
        multicrop = (multicrop.scoped_configurable_fn(),
                     multicrop.scoped_selector)
        normalization_lib.refuse_own(multicrop[1], multicrop[0].mean,
                                     multicrop[0].std)
    else:
        multicrop = None
    normalization_lib.refuse_own('eval_preprocessing',
                                 bindings.bound('eval_preprocessing.mean'),
                                 bindings.bound('eval_preprocessing.std'))
    normalization = bindings.bound('load_data.normalization')
    if required or normalization is not None:
        normalization_lib.normalization(
            normalization_lib.required(normalization), channels)
    return multicrop


def existing_model():
    """The embedder export of the existing model `evaluate_nn.from_model`
    names (`evaluate_nn.embedder_of`), or None when the config does not
    bind it.

    Raises:
        checks.ConfigError: it is bound to None (a MODEL macro left for the
            command line), or to a path that does not exist or holds no
            embedder export (naming the binding the user made).
    """
    try:
        gin.query_parameter('evaluate_nn.from_model')
    except ValueError:
        return None
    path, name = bindings.binding('evaluate_nn.from_model')
    if path is None:
        raise checks.ConfigError(
            f'{name} is not bound: bind it to the model to evaluate (a run '
            f"directory or its export), e.g. --gin_bindings=\"{name} = "
            "'runs/imported'\".")
    if not os.path.exists(path):
        raise checks.ConfigError(
            f'{name} = {path!r} does not exist: bind it to the model to '
            'evaluate (a run directory or its export/embedder).')
    return evaluate_nn.embedder_of(path, name=name)


def _check_backbone(multicrop):
    """The backbone's arguments, and image sizes at least its
    downsampling."""
    backbone, backbone_name = bindings.binding('build_backbone.name')
    if not isinstance(backbone, str):
        return
    explicit = inspect.signature(backbones.build_backbone).parameters
    backbones.check_arguments(backbone, [
        key for key, value in gin.get_bindings(
            'build_backbone', resolve_references=False).items()
        if key not in explicit and value is not None])
    strides = {key: bindings.bound(f'build_backbone.{key}')
               for key in ('stem_stride', 'stage_strides', 'patch_size')}
    minimum = backbones.downsampling(
        backbone, **{k: v for k, v in strides.items() if v is not None})
    sizes = [bindings.binding('eval_preprocessing.image_size')[::-1]]
    if multicrop is not None:
        config, selector = multicrop
        sizes.append((bindings.binding(f'{selector}.global_size')[1],
                      config.global_size))
        if config.num_local:
            sizes.append((bindings.binding(f'{selector}.local_size')[1],
                          config.local_size))
        support_size = bindings.binding(
            'make_pretrain_dataset_fn.support_view_size')
        if support_size[0] is not None:
            sizes.append(support_size[::-1])
    for size_name, size in sizes:
        _check_size(size, size_name, minimum, backbone, backbone_name)
        if backbone in vit.ARCHITECTURES and size % minimum:
            raise checks.ConfigError(
                f'{size_name} = {size} is not a multiple of '
                f'build_backbone.patch_size = {minimum}: {backbone_name} = '
                f'{backbone!r} cuts images into patches of that side.')


def check_config(pretraining=True):
    """Checks the parsed gin config (a labeled folder's class folders are
    listed, no image is read; other sources' channels are checked once
    read); each check names the binding to change and a valid value.

    Args:
        pretraining: the run pre-trains: check `train`'s arguments and the
            labeled folder (other modes check it when they read it).

    Raises:
        checks.ConfigError: on the first problem found.
    """
    folder = _folder_source()
    existing = existing_model()
    if existing is not None:
        check_folder_channels(export.read_preprocessing(existing)['channels'],
                              f'The model of {existing}')
        check_labeled_folder('PAWS-NN compares the test images with them')
    # An existing model brings its own normalisation.
    multicrop = _check_normalization(folder, required=existing is None)
    _check_arguments(pretraining)
    _check_folders_bound(folder)
    if pretraining:
        _check_support()
    _check_backbone(multicrop)


def folder_channels():
    """The channels a folder training source decodes to, or None for other
    sources (known once read)."""
    folder = _folder_source()
    return (None if folder is None else
            bindings.binding(f'{folder[0]}.channels', 3)[0])


def check_folder_channels(channels, model):
    """Refuses a folder source of the config that decodes to other than
    the `channels` that `model` (a description) takes, before its images
    are read."""
    folder = _folder_source()
    if folder is None:
        return
    bound, name = bindings.binding(f'{folder[0]}.channels', 3)
    if bound != channels:
        raise checks.ConfigError(
            f'{model} takes {channels}-channel images, but {name} = {bound}: '
            f'bind {name} = {channels} (the images are decoded to that).')
