"""Tests for the switches between tf_keras' standard layers (the defaults)
and paws_tf's CPU layers (build_backbone's, and build_model's batch-norm
implementation for the backbone and heads): the same variables, values and
gradients; which configs select which."""

import pathlib

import gin
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from paws_tf import configurables  # noqa: F401  (what the configs bind)
from paws_tf import model as model_lib
from paws_tf.nets import backbones
from paws_tf.nets import recompute
from paws_tf.nets import sync_batch_norm
from tests.helpers import layer_reference
from tests.helpers import tiny_model

SMALL = ('small_resnet', tiny_model.TINY)
# Its strided convolutions follow a batch norm and ReLU (in NormReLUThen).
WIDE = ('wide_resnet', {'depth': 10, 'width': 1})
STANDARD = {'sync_bn_impl': 'keras', 'recompute_bn_relu': False}
# paws_tf's CPU-tuned layers, which the CPU configs select.
CPU = {'sync_bn_impl': 'custom', 'recompute_bn_relu': True}
# Where gin binds each switch: how batch norm is synchronised is
# build_model's, for the backbone and the heads alike.
CONFIGURABLE = {'sync_bn_impl': 'build_model',
                'recompute_bn_relu': 'build_backbone'}
REPO = pathlib.Path(__file__).resolve().parents[1]


def _build(arch, strategy=None, **switches):
    name, kwargs = arch
    with (strategy or tf.distribute.get_strategy()).scope():
        return backbones.build_backbone(name, **kwargs, **switches)


def _randomise(model, seed=0):
    """Random weights and moving statistics, so that no gamma, beta or
    moving statistic sits at a value where two paths could agree by
    accident."""
    rng = np.random.default_rng(seed)
    for variable in model.variables:
        value = rng.normal(scale=0.5, size=variable.shape)
        if 'moving_variance' in variable.name:
            value = rng.uniform(0.5, 2.0, size=variable.shape)
        elif 'gamma' in variable.name:
            value = rng.uniform(0.5, 1.5, size=variable.shape)
        variable.assign(value.astype(np.float32))


def _copy_through_checkpoint(source, target, tmp_path):
    """Restores `source`'s tf.train.Checkpoint into `target`, which must
    match every stored value and have none left over."""
    prefix = tf.train.Checkpoint(backbone=source).write(
        str(tmp_path / f'{source.name}_{id(target)}'))
    tf.train.Checkpoint(backbone=target).read(prefix).assert_consumed()


def _inputs(arch, seed=1):
    """Images [4, 18, 18, 3] and the gradient [4, F] of a loss w.r.t. the
    features; odd sizes inside the network exercise the padding."""
    rng = np.random.default_rng(seed)
    images = (1.5 * rng.normal(size=(4, 18, 18, 3)) + 0.5).astype(np.float32)
    model_dim = {'small_resnet': 16, 'wide_resnet': 64}
    upstream = rng.normal(size=(4, model_dim[arch[0]])).astype(np.float32)
    return images, upstream


def _one_device_step(model, images, upstream):
    """One training-mode step of sum(features * upstream): the features,
    the gradients w.r.t. the images and every trainable variable, then the
    variables (moving statistics updated)."""
    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            features = model(x, training=True)
            loss = tf.reduce_sum(features * upstream)
        return features, *tape.gradient(loss,
                                        [x, *model.trainable_variables])

    values = step(tf.constant(images))
    return [*values, *(v.numpy() for v in model.variables)]


def _assert_all_close(got, want, rtol=1e-5):
    """Each pair equal within float32 rounding: relative to the largest
    value of the tensor (gradients have entries near zero), and at least
    1e-6 (a convolution bias before a batch norm has a gradient of zero,
    which comes out as the rounding error of terms near one)."""
    assert len(got) == len(want)
    for index, (g, w) in enumerate(zip(got, want)):
        w = np.asarray(w)
        np.testing.assert_allclose(np.asarray(g), w, rtol=rtol,
                                   atol=max(rtol * np.abs(w).max(), 1e-6),
                                   err_msg=f'tensor {index}')


@pytest.mark.parametrize('arch', [SMALL, WIDE], ids=lambda arch: arch[0])
def test_recompute_switch_gives_the_same_values_and_gradients(arch,
                                                              tmp_path):
    """`recompute_bn_relu=False` (the tf_keras layers composed) against the
    recomputation of the CPU settings: same features, image and weight
    gradients and moving statistics."""
    custom = _build(arch, **CPU)
    held = _build(arch, **dict(CPU, recompute_bn_relu=False))
    _randomise(custom)
    _copy_through_checkpoint(custom, held, tmp_path)
    images, upstream = _inputs(arch)
    want = _one_device_step(custom, images, upstream)
    _assert_all_close(_one_device_step(held, images, upstream), want)


def test_recompute_bn_relu_switch_keeps_variables_and_values():
    """`build_backbone.recompute_bn_relu = False` (gin) builds the same
    variables, so checkpoints move between the settings, and trains to the
    same values: only what the backward pass holds differs."""
    images = tf.random.normal([4, 12, 12, 1], mean=1.0)
    on, off = [backbones.build_backbone(
        'small_resnet', input_channels=1, **tiny_model.TINY,
        **dict(CPU, recompute_bn_relu=setting)) for setting in (True, False)]
    off.set_weights(on.get_weights())
    results = []
    for model in (on, off):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.sin(model(images, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        results.append([loss] + grads + [v.numpy() for v in model.variables])
    assert [v.name for v in on.variables] == [v.name for v in off.variables]
    units = [layer for layer in off.layers
             if isinstance(layer, recompute.NormReLUThen)]
    assert units and not any(unit.recompute for unit in units)
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _two_replica_step(strategy, model, images, upstream):
    """`_one_device_step` on two replicas, each on half the batch: the
    features and image gradients concatenated, the replicas' weight
    gradients summed (as the optimizer sums them), then the variables."""
    y, dx, *d_weights = layer_reference.train_on_two_replicas(
        strategy, model, images, upstream, model.trainable_variables)
    return [np.concatenate(y), np.concatenate(dx),
            *[sum(g) for g in d_weights],
            *(v.numpy() for v in model.variables)]


@pytest.mark.parametrize('arch', [SMALL, WIDE], ids=lambda arch: arch[0])
@pytest.mark.parametrize('strategy_fixture', [
    'two_replicas', 'two_replicas_collective'])
@pytest.mark.slow
def test_sync_bn_switch_gives_the_same_values_and_gradients(
        arch, strategy_fixture, request, tmp_path):
    """On a two-replica MirroredStrategy (logical CPUs), tf_keras'
    `BatchNormalization(synchronized=True)` (alone, and with the other
    switch at tf_keras' layers too) against the CPU settings'
    GlobalBatchNormalization: same features, image and weight gradients and
    moving statistics; and the latter against one device with local batch
    norm on the whole batch (without the moving variance, which that layer
    keeps with Bessel's correction)."""
    strategy = request.getfixturevalue(strategy_fixture)
    custom = _build(arch, strategy, sync_bn=True, **CPU)
    reference = _build(arch)
    _randomise(reference)
    _copy_through_checkpoint(reference, custom, tmp_path)
    images, upstream = _inputs(arch)
    images[2:] = 2.0 * images[2:] - 1.0  # The replicas' statistics differ.
    want = _two_replica_step(strategy, custom, images, upstream)
    for switches in ({'sync_bn_impl': 'keras'}, STANDARD):
        keras = _build(arch, strategy, sync_bn=True, **dict(CPU, **switches))
        kinds = {type(layer) for layer in keras.submodules}
        assert sync_batch_norm.GlobalBatchNormalization not in kinds
        assert any(getattr(layer, 'synchronized', False)
                   for layer in keras.submodules)
        _copy_through_checkpoint(reference, keras, tmp_path)
        got = _two_replica_step(strategy, keras, images, upstream)
        _assert_all_close(got, want)
    one_device = _one_device_step(reference, images, upstream)
    trainable = 2 + len(reference.trainable_variables)
    _assert_all_close(want[:trainable], one_device[:trainable], rtol=1e-4)
    moving_means = [index for index, v in enumerate(reference.variables)
                    if 'moving_mean' in v.name]
    _assert_all_close([want[trainable + i] for i in moving_means],
                      [one_device[trainable + i] for i in moving_means],
                      rtol=1e-4)


@pytest.mark.parametrize('sync_bn', [False, True])
@pytest.mark.parametrize('arch', [SMALL, WIDE], ids=lambda arch: arch[0])
@pytest.mark.parametrize('source_switches,target_switches', [
    ({}, {}), ({}, CPU), (CPU, {})], ids=['default', 'to_cpu', 'from_cpu'])
def test_backbone_checkpoint_restores_into_a_new_one(
        arch, sync_bn, source_switches, target_switches, tmp_path):
    """A tf.train.Checkpoint of a backbone restores into a freshly built
    one with the same switches or the other settings, every value
    matched, with the same inference features."""
    source = _build(arch, sync_bn=sync_bn, **source_switches)
    _randomise(source)
    checkpoint = tf.train.Checkpoint(backbone=source)
    path = checkpoint.save(str(tmp_path / 'ckpt'))
    target = _build(arch, sync_bn=sync_bn, **target_switches)
    tf.train.Checkpoint(backbone=target).restore(path).assert_consumed()
    for want, got in zip(source.variables, target.variables):
        assert got.name == want.name
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    images, _ = _inputs(arch)
    np.testing.assert_allclose(target(images), source(images), rtol=1e-5,
                               atol=1e-5)


def _assert_standard_layers(model):
    """Synchronised tf_keras batch norms, ZeroPadding2D, no recomputation."""
    norms = [layer for layer in model.submodules
             if isinstance(layer, tf_keras.layers.BatchNormalization)]
    assert norms and all(
        type(norm) is tf_keras.layers.BatchNormalization
        and norm.synchronized for norm in norms)
    kinds = {type(layer) for layer in model.submodules}
    assert tf_keras.layers.ZeroPadding2D in kinds
    assert not any(layer.recompute for layer in model.submodules
                   if isinstance(layer, recompute.NormReLUThen))


def test_defaults_are_the_standard_tf_keras_layers():
    _assert_standard_layers(_build(WIDE, sync_bn=True))


def _gin_model(impl=None, **bindings):
    """`model.build_model` with sync_bn (the tiny WideResNet and heads),
    `build_model.sync_bn_impl = impl` unless None, and `bindings`."""
    lines = ["build_backbone.name = 'wide_resnet'",
             'wide_resnet.depth = 10', 'wide_resnet.width = 1',
             'ProjectionHead.hidden_dim = 8', 'ProjectionHead.output_dim = 4',
             'PredictionHead.hidden_dim = 2']
    if impl is not None:
        lines.append(f"build_model.sync_bn_impl = '{impl}'")
    lines += [f'{key} = {value!r}' for key, value in bindings.items()]
    gin.parse_config(lines)
    return model_lib.build_model(input_channels=3, sync_bn=True)


def _norm_kinds(model):
    """The batch norms' classes in the backbone, each head, of `model`."""
    return [{type(layer) for layer in part.submodules
             if isinstance(layer, tf_keras.layers.BatchNormalization)}
            for part in (model.backbone, model.projection_head,
                         model.prediction_head)]


@pytest.mark.parametrize('impl,kind', [
    (None, tf_keras.layers.BatchNormalization),
    ('keras', tf_keras.layers.BatchNormalization),
    ('custom', sync_batch_norm.GlobalBatchNormalization)],
    ids=['default', 'keras', 'custom'])
def test_build_model_sync_bn_impl_sets_every_batch_norm(impl, kind,
                                                        clean_gin):
    """One binding selects the synchronised batch norm of the backbone and
    both heads; unbound, tf_keras' layer."""
    model = _gin_model(impl)
    assert _norm_kinds(model) == [{kind}] * 3
    assert all(layer.synchronized for layer in model.submodules
               if isinstance(layer, tf_keras.layers.BatchNormalization))


def test_gin_binds_the_switches(clean_gin):
    model = _gin_model('custom', **{'build_backbone.recompute_bn_relu': True})
    kinds = {type(layer) for layer in model.backbone.submodules}
    assert sync_batch_norm.GlobalBatchNormalization in kinds
    assert all(layer.recompute for layer in model.backbone.submodules
               if isinstance(layer, recompute.NormReLUThen))


@pytest.mark.parametrize('source,target', [('custom', 'keras'),
                                           ('keras', 'custom')])
def test_model_checkpoint_restores_across_sync_bn_impls(source, target,
                                                        two_replicas,
                                                        tmp_path, clean_gin):
    """A tf.train.Checkpoint of the whole model (backbone and heads) on two
    replicas with one implementation restores into a model with the other:
    the same variable names, every value matched on every replica, the
    same inference outputs of the prediction head."""
    models = {}
    for impl in (source, target):
        gin.clear_config()
        with two_replicas.scope():
            models[impl] = _gin_model(impl)
            models[impl](tf.zeros([1, 18, 18, 3]))
    _randomise(models[source])
    path = tf.train.Checkpoint(model=models[source]).save(
        str(tmp_path / 'ckpt'))
    tf.train.Checkpoint(model=models[target]).restore(
        path).assert_consumed()
    names = [[v.name.removeprefix(model.name + '/')
              for v in model.variables]
             for model in (models[source], models[target])]
    assert names[0] == names[1]
    for want, got in zip(models[source].variables,
                         models[target].variables):
        for replica_value in two_replicas.experimental_local_results(got):
            np.testing.assert_array_equal(replica_value, want.numpy())
    images, _ = _inputs(WIDE)
    np.testing.assert_allclose(models[target](images)['prediction'],
                               models[source](images)['prediction'],
                               rtol=1e-5, atol=1e-5)


# The configs meant for CPUs; the others (ImageNet, CIFAR-10, own images at
# full size) are for GPUs and keep the defaults.
CPU_CONFIGS = ('debug', 'demo_fashion_mnist', 'demo_fashion_mnist_quick',
               'demo_fashion_mnist_validation', 'demo_fashion_mnist_vit',
               'demo_fashion_mnist_vit_validation', 'image_folders_small',
               'mismatch_fashion_mnist', 'mismatch_fashion_mnist_curated',
               'mismatch_fashion_mnist_curated_ropaws',
               'mismatch_fashion_mnist_ropaws',
               'mismatch_fashion_mnist_validation', 'transfer_fashion_mnist',
               'transfer_fashion_mnist_source',
               'transfer_fashion_mnist_validation')


@pytest.mark.parametrize('config', sorted(
    path.stem for path in (REPO / 'gin_configs').glob('*.gin')
    if path.stem != 'base'))
def test_cpu_configs_select_the_cpu_layers_and_gpu_configs_the_defaults(
        config, clean_gin):
    bindings = ["LABELED_DIR = 'l'", "UNLABELED_DIR = 'u'", "TEST_DIR = 't'"]
    gin.parse_config_files_and_bindings(
        [str(REPO / 'gin_configs' / f'{config}.gin')],
        bindings if config.startswith('image_folders') else [])
    switches = {}
    for key, configurable in CONFIGURABLE.items():
        try:
            switches[key] = gin.query_parameter(f'{configurable}.{key}')
        except ValueError:  # Not bound: the default.
            pass
    assert switches == (CPU if config in CPU_CONFIGS else {})


@pytest.mark.parametrize('build,binding', [
    (lambda: backbones.build_backbone('small_resnet', **tiny_model.TINY,
                                      sync_bn_impl='tf_keras'),
     'sync_bn_impl'),
    (lambda: model_lib.build_model(input_channels=3, sync_bn=True,
                                   sync_bn_impl='tf_keras'),
     r'build_model\.sync_bn_impl')],
    ids=['backbone_sync_bn_impl', 'model_sync_bn_impl'])
def test_bad_switch_values_are_refused(build, binding):
    with pytest.raises(ValueError, match=(
            rf"^{binding} must be one of \('custom', 'keras'\), got "
            "'tf_keras'")):
        build()


@pytest.mark.parametrize('parameter', ['sync_bn', 'sync_bn_impl'])
def test_gin_refuses_the_backbones_batch_norm_settings(parameter, clean_gin):
    """`build_model` sets them for the backbone and heads alike: bound on
    `build_backbone` they would be overridden unseen."""
    with pytest.raises(ValueError, match=(
            f"'build_backbone' has denylisted kwarg '{parameter}'")):
        gin.parse_config(f"build_backbone.{parameter} = 'custom'")
