"""Checks of a gin config before data is read: those that span
configurables, which read each one's values through its own function
(`bindings.arguments`)."""

import dataclasses
import inspect
import numbers
import os

from paws_tf import bindings
from paws_tf import checks
from paws_tf import model as model_lib
from paws_tf import nets
from paws_tf.data import augment
from paws_tf.data import folders
from paws_tf.data import normalization as normalization_lib
from paws_tf.data import pipeline
from paws_tf.data import splits
from paws_tf.data import tfds_sources
from paws_tf.evaluation import evaluate_nn
from paws_tf.evaluation import export
from paws_tf.evaluation import pictures
from paws_tf.nets import backbones
from paws_tf.runner import experiment
from paws_tf.runner import train


def _check_folders_bound(folder):
    """Every folder the config reads is bound (the folder recipes leave
    LABELED_DIR, UNLABELED_DIR and TEST_DIR as None for the command line)."""
    roots = []
    if folder is not None:
        arguments = folder.arguments()
        roots.append((arguments[folder.root], 'labeled class subfolders'
                      if folder.labeled() else 'images'))
        if folder.configurable is experiment.image_folders:
            roots.append((arguments['unlabeled_root'], 'unlabeled images'))
    test = experiment.folder_source('test')
    if test is not None and test.configurable is folders.image_folder:
        roots.append((test.arguments()['root'], 'test class subfolders'))
    for (root, name), what in roots:
        if root is None:
            raise checks.ConfigError(
                f'{name} is not bound: bind it to your folder of {what}, '
                f"e.g. --gin_bindings=\"{name} = '/data/mine/...'\".")


def check_labeled_folder(what):
    """`(root, binding)` of the labeled folder, or None when the labeled
    images are not a bound folder; raises ConfigError naming the binding
    and what needs the images (`what`) when the folder is missing."""
    folder = experiment.folder_source()
    if folder is None:
        return None
    root, root_name = folder.arguments()[folder.root]
    if not folder.labeled() or not isinstance(root, str):
        return None
    if not os.path.isdir(root):
        raise checks.ConfigError(
            f'{root_name} = {root!r} is not a folder: bind it to the '
            f'folder of labeled class subfolders ({what}).')
    return root, root_name


def _check_support():
    """The labeled folder (the folder source's) holds the classes the
    support (`make_pretrain_dataset_fn`'s) draws."""
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
    wanted, wanted_name = bindings.arguments(
        pipeline.make_pretrain_dataset_fn)['classes_per_step']
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
                         model_lib.PAWSModel)
    bindings.check_bound(pictures.Pictures.check_arguments,
                         pictures.Pictures)
    impl, name = bindings.arguments(model_lib.build_model)['sync_bn_impl']
    checks.one_of(name, impl, nets.IMPLEMENTATIONS)
    if not pretraining:
        return
    bindings.check_bound(train.check_arguments, train.train)
    # The classes `train` calls: `LARS`, `WarmupCosineDecay`, or others
    # with a check of their own.
    num_epochs = bindings.arguments(train.train)['num_epochs']
    for parameter in ('optimizer_cls', 'schedule_cls'):
        cls, scope = bindings.configured(train.train, parameter)
        if hasattr(cls, 'check_arguments'):
            bindings.check_bound(cls.check_arguments, cls, scope,
                                 num_epochs=num_epochs)


def _check_normalization(folder, required=True):
    """The folders' channels, and the normalisation bound only to
    `load_data.normalization` (bound, if `required`); returns the
    multi-crop `(config, its bindings, its selector)` bound called, or
    None."""
    channels = None
    if folder is not None:
        channels, channels_name = folder.arguments()['channels']
        if channels not in (1, 3) or isinstance(channels, bool):
            raise checks.ConfigError(
                f'{channels_name} = {channels!r}: images are decoded to 1 '
                '(grayscale) or 3 (RGB) channels.')
    multicrop = bindings.reference(pipeline.make_pretrain_dataset_fn,
                                   'multicrop')
    if multicrop is not None and multicrop.evaluate:
        _refuse_preset_overrides(multicrop)
        multicrop = (multicrop.scoped_configurable_fn(),
                     bindings.arguments(*bindings.target(multicrop)),
                     multicrop.scoped_selector)
        normalization_lib.refuse_own(multicrop[2], multicrop[0].mean,
                                     multicrop[0].std)
    else:
        multicrop = None
    preprocessing = bindings.arguments(experiment.eval_preprocessing)
    normalization_lib.refuse_own('eval_preprocessing',
                                 preprocessing['mean'][0],
                                 preprocessing['std'][0])
    normalization = bindings.arguments(
        experiment.load_data)['normalization'][0]
    if required or normalization is not None:
        normalization_lib.normalization(
            normalization_lib.required(normalization), channels)
    return multicrop


def _refuse_preset_overrides(reference):
    """Refuses `MultiCropConfig.*` bound beside the views of a preset
    (`@cifar10_multicrop()`, `reference`), which passes every field to
    `MultiCropConfig` itself, over the binding."""
    configurable, _ = bindings.target(reference)
    if configurable is augment.MultiCropConfig:
        return
    for field in dataclasses.fields(augment.MultiCropConfig):
        if bindings.is_bound(augment.MultiCropConfig, field.name):
            raise checks.ConfigError(
                f'MultiCropConfig.{field.name} is bound, but the views are '
                f'{bindings.gin_name(configurable)}()\'s preset, which sets '
                f'every field itself: bind '
                f'{bindings.gin_name(configurable)}.{field.name} instead.')


def existing_model():
    """The embedder export of the existing model `evaluate_nn.from_model`
    names (`evaluate_nn.embedder_of`), or None when the config does not
    bind it; `checks.ConfigError` naming the binding the user made when it
    is bound to None (a MODEL macro left for the command line), or to a
    path that does not exist or holds no embedder export."""
    if not bindings.is_bound(evaluate_nn.evaluate_nn, 'from_model'):
        return None
    path, name = bindings.arguments(evaluate_nn.evaluate_nn)['from_model']
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


def _check_split_bindings():
    """Refuses `select_labeled` bound beside a `load_data.train` source
    that gives its labeled images itself (a labeled folder, an ImageNet
    subset): it draws from a single labeled source only."""
    source = bindings.reference(experiment.load_data, 'train')
    if source is None:
        return
    configurable, _ = bindings.target(source)
    if configurable not in (experiment.image_folders,
                            tfds_sources.imagenet_sources):
        return
    bound = [parameter for parameter in
             inspect.signature(splits.select_labeled).parameters
             if bindings.is_bound(splits.select_labeled, parameter)]
    if bound:
        name = bindings.gin_name(configurable)
        raise checks.ConfigError(
            f'select_labeled.{bound[0]} is bound, but load_data.'
            f'train = @{name} gives its labeled images itself, which '
            'select_labeled would leave as they are: remove the binding, or '
            'draw the labeled images out of one labeled folder with '
            'load_data.train = @image_folder.')


def _check_unlabeled_bindings():
    """Refuses `include_labeled_in_unlabeled = False` beside a
    `load_data.unlabeled` source, whose images are used as they are."""
    if bindings.reference(experiment.load_data, 'unlabeled') is None:
        return
    for configurable in (splits.select_labeled, experiment.image_folders,
                         tfds_sources.imagenet_sources):
        value, name = bindings.arguments(
            configurable)['include_labeled_in_unlabeled']
        if value is False:
            raise checks.ConfigError(
                f'{name} = False is bound, but load_data.unlabeled gives the '
                'unlabeled images, which are used as they are (the labeled '
                'ones among them if it holds them): remove the binding, or '
                'bind load_data.unlabeled = None to train on the labeled '
                "source's other images.")


def _check_own_model_bindings():
    """Refuses `evaluate_nn.tau` and `.embedding` bound for a run's own
    model, which PAWS-NN evaluates as it trained: they apply to an
    existing model (`evaluate_nn.from_model`) only."""
    bound = bindings.arguments(evaluate_nn.evaluate_nn)
    for parameter, own in (('tau', 'tau'), ('embedding', 'nn_embedding')):
        if bindings.is_bound(evaluate_nn.evaluate_nn, parameter):
            value, name = bound[parameter]
            raise checks.ConfigError(
                f'{name} = {value!r} is bound, but it applies to an '
                'existing model (evaluate_nn.from_model): the run\'s own '
                f'model evaluates PAWS-NN with PAWSModel.{own}; bind that '
                'instead.')


def _check_backbone(multicrop):
    """Image sizes (evaluation's, the views' and the support's) the
    backbone takes (`backbones.check_image_sizes`)."""
    sizes = [bindings.arguments(
        experiment.eval_preprocessing)['image_size'][::-1]]
    if multicrop is not None:
        config, bound, selector = multicrop
        # A factory of `MultiCropConfig`s (`cifar10_multicrop`) takes the
        # fields it overrides as **kwargs: an unbound one has no binding.
        fields = ['global_size'] + (['local_size'] if config.num_local
                                    else [])
        for field in fields:
            sizes.append((bound.get(field, (None, f'{selector}.{field}'))[1],
                          getattr(config, field)))
        support_size = bindings.arguments(
            pipeline.make_pretrain_dataset_fn)['support_view_size']
        if support_size[0] is not None:
            sizes.append(support_size[::-1])
    backbones.check_image_sizes(sizes)


def check_config(pretraining=True, mode=None):
    """Checks the parsed gin config, raising `checks.ConfigError` on the
    first problem found, naming the binding to change and a valid value: a
    labeled folder's class folders are listed, no image is read (other
    sources' channels are checked once read); a run that is `pretraining`
    has `train`'s arguments and the labeled folder checked too (other modes
    check it when they read it). Returns the embedder export of the
    existing model the config binds (`existing_model`), or None:
    `--mode=evaluate_nn` evaluates it, and another run.py `mode` (None:
    any) refuses it."""
    folder = experiment.folder_source()
    if mode not in (None, 'evaluate_nn') and bindings.is_bound(
            evaluate_nn.evaluate_nn, 'from_model'):
        raise checks.ConfigError(
            f'evaluate_nn.from_model is bound, but --mode={mode} does not '
            'read it: only --mode=evaluate_nn evaluates an existing model '
            "(the other modes, the run's own). Run --mode=evaluate_nn, or "
            'remove the binding.')
    existing = existing_model()
    if existing is None:
        _check_own_model_bindings()
    else:
        experiment.check_channels(
            export.read_preprocessing(existing)['channels'],
            f'The model of {existing}')
        check_labeled_folder('PAWS-NN compares the test images with them')
    # An existing model brings its own normalisation.
    multicrop = _check_normalization(folder, required=existing is None)
    _check_arguments(pretraining)
    _check_split_bindings()
    _check_unlabeled_bindings()
    _check_folders_bound(folder)
    if pretraining:
        _check_support()
    _check_backbone(multicrop)
    return existing

