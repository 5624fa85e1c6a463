"""Tests for paws_tf.nets.backbones."""

import os
import pathlib
import subprocess
import sys

import gin
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from paws_tf.nets import backbones
from tests.helpers import tiny_model

EXCLUDED_SUFFIXES = ('bias', 'beta', 'gamma')


def _num_trainable(model):
    return sum(int(np.prod(v.shape)) for v in model.trainable_variables)


def _short_name(variable):
    return variable.name.split('/')[-1].split(':')[0]


def _resnet50_trunk_params(w):
    """torchvision ResNet-50 without fc, all widths times w (BN: 2 per ch)."""
    stem = 64 * w
    total = 7 * 7 * 3 * stem + 2 * stem
    in_ch = stem
    for stage, num_blocks in enumerate((3, 4, 6, 3)):
        p = stem * 2 ** stage
        for block in range(num_blocks):
            total += in_ch * p + 2 * p          # 1x1 conv + BN
            total += 9 * p * p + 2 * p          # 3x3 conv + BN
            total += p * 4 * p + 2 * 4 * p      # 1x1 conv + BN
            if block == 0:
                total += in_ch * 4 * p + 2 * 4 * p  # projection + BN
            in_ch = 4 * p
    return total


def _wide_resnet_params(depth, k):
    """Official PAWS WideResNet (conv biases, pre-activation, final BN)."""
    total = 3 * 3 * 3 * 16 + 16
    in_ch = 16
    for group, p in enumerate((16 * k, 32 * k, 64 * k)):
        for block in range((depth - 4) // 6):
            total += 2 * in_ch + 9 * in_ch * p + p   # BN, conv3x3 + bias
            total += 2 * p + 9 * p * p + p           # BN, conv3x3 + bias
            if block == 0 and (group > 0 or in_ch != p):
                total += in_ch * p + p               # 1x1 conv + bias
            in_ch = p
    return total + 2 * 64 * k


@pytest.fixture(scope='module')
def resnet50():
    return backbones.build_backbone('resnet50')


@pytest.fixture(scope='module')
def resnet50_2x_zero_init():
    return backbones.build_backbone('resnet50', width_multiplier=2,
                                    zero_init_residual=True)


def test_resnet50_formula_matches_torchvision():
    # torchvision resnet50: 25,557,032 including the 2048 x 1000 + 1000 fc.
    assert _resnet50_trunk_params(1) == 25_557_032 - 2048 * 1000 - 1000
    for w in (1, 2, 4):  # conv weights scale with w^2, stem conv + BN with w
        assert _resnet50_trunk_params(w) == 23_445_504 * w**2 + 62_528 * w


def test_resnet50_1x_param_count(resnet50):
    assert _num_trainable(resnet50) == 23_508_032
    assert resnet50.output_dim == 2048


def test_resnet50_2x_param_count(resnet50_2x_zero_init):
    assert _num_trainable(resnet50_2x_zero_init) == (
        _resnet50_trunk_params(2))  # 93,907,072
    assert resnet50_2x_zero_init.output_dim == 4096


@pytest.mark.slow
def test_resnet50_4x_param_count():
    # Eagerly, building the 4x trunk takes ~20 s and 2.3 GB here. Variables
    # made inside a tf.Graph are never initialised, so that build is cheap;
    # it runs in a subprocess because a graph-mode build invalidates the
    # eager models of this process.
    code = ('from paws_tf.nets import backbones\n'
            'import numpy as np, tensorflow as tf\n'
            'with tf.Graph().as_default():\n'
            '    m = backbones.build_backbone("resnet50",'
            ' width_multiplier=4)\n'
            '    print(sum(int(np.prod(v.shape))'
            ' for v in m.trainable_variables), m.output_dim)\n')
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3',
               PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[1]))
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=300, env=env, check=True)
    count, output_dim = map(int, proc.stdout.split())
    assert count == _resnet50_trunk_params(4)  # 375,378,176
    assert output_dim == 8192


def test_zero_init_residual(resnet50, resnet50_2x_zero_init):
    for model, want in ((resnet50, 1.0), (resnet50_2x_zero_init, 0.0)):
        gammas = [v for v in model.variables if 'bn3/gamma' in v.name]
        assert len(gammas) == 16
        for gamma in gammas:
            np.testing.assert_array_equal(gamma.numpy(), want)
    stem_gamma = resnet50_2x_zero_init.get_layer('stem_bn_pool').norm.gamma
    np.testing.assert_array_equal(stem_gamma.numpy(), 1.0)


def test_wide_resnet_28_2_param_count():
    model = backbones.build_backbone('wide_resnet', depth=28, width=2)
    assert _num_trainable(model) == _wide_resnet_params(28, 2) == 1_468_352
    assert model.output_dim == 128


@pytest.mark.parametrize('depth,width', [(10, 1), (16, 3)])
def test_wide_resnet_other_sizes(depth, width):
    model = backbones.build_backbone('wide_resnet', depth=depth, width=width)
    assert _num_trainable(model) == _wide_resnet_params(depth, width)


def _assert_uniform(values, bound, what):
    """`values` look like U(-bound, bound): inside it, filling it, with the
    uniform's standard deviation bound / sqrt(3) (within 10%: >= 432
    values, the sample std is within 4 of its standard errors)."""
    values = np.ravel(values)
    assert values.size >= 432, what
    assert np.abs(values).max() <= bound, what
    assert np.abs(values).max() > 0.9 * bound, what
    np.testing.assert_allclose(values.std(), bound / np.sqrt(3), rtol=0.1,
                               err_msg=what)


def test_wide_resnet_convolutions_have_pytorchs_default_init():
    """suncet src/wide_resnet.py leaves nn.Conv2d's reset_parameters:
    kaiming_uniform_(a=sqrt(5)) is U(+-1/sqrt(fan_in)), and so is the bias
    (fan_in = kernel area x input channels)."""
    tf_keras.utils.set_random_seed(0)
    model = backbones.build_backbone('wide_resnet', depth=10, width=2)
    convs = [layer for layer in model.submodules
             if isinstance(layer, tf_keras.layers.Conv2D)]
    assert len(convs) == 10  # stem, 3 blocks x 2, 3 projections
    for conv in convs:
        kernel, bias = conv.kernel.numpy(), conv.bias.numpy()
        bound = 1 / np.sqrt(np.prod(kernel.shape[:3]))
        _assert_uniform(kernel, bound, conv.name)
        # A bias has as few as 16 values: its range, and a spread that
        # fills it, within the uniform's 0.5% and 99.5% quantiles.
        assert np.abs(bias).max() <= bound and bias.std() > 0.25 * bound


def test_resnet_convolutions_are_kaiming_normal_fan_out():
    """torchvision / suncet src/resnet.py: kaiming_normal_(mode='fan_out',
    nonlinearity='relu'): N(0, 2 / (kernel area x output channels))."""
    tf_keras.utils.set_random_seed(0)
    model = backbones.build_backbone('small_resnet', widths=(16, 32),
                                     blocks_per_stage=(1, 1),
                                     stage_strides=(2, 2))
    convs = [layer for layer in model.submodules
             if isinstance(layer, tf_keras.layers.Conv2D)]
    for conv in convs:
        kernel = conv.kernel.numpy()
        assert not conv.use_bias
        std = np.sqrt(2 / (np.prod(kernel.shape[:2]) * kernel.shape[3]))
        # >= 432 values: the sample std within 10%, the mean within 4
        # standard errors.
        np.testing.assert_allclose(kernel.std(), std, rtol=0.1,
                                   err_msg=conv.name)
        assert abs(kernel.mean()) < 4 * std / np.sqrt(kernel.size)


def test_wide_resnet_last_batch_norm_follows_the_last_batch():
    """The official last BN has PyTorch momentum 0.99: one training-mode
    forward moves its moving mean 99% of the way to the batch mean (the
    other batch norms 10%)."""
    model = backbones.build_backbone('wide_resnet', depth=10, width=1)
    final = model.get_layer('final_bn')
    block = model.get_layer('group1_block1_bn2_conv2')  # BN, ReLU, conv
    other = block.norm
    images = tf.random.stateless_normal([4, 8, 8, 3], [0, 1])
    batch_means = {}
    for bn, layer in ((final, final), (other, block)):
        # The batch mean of the batch norm's input (training mode: the
        # earlier batch norms use the batch statistics, as below).
        probe = tf_keras.Model(model.input, layer.input)
        batch_means[bn.name] = probe(images, training=True).numpy().mean(
            axis=(0, 1, 2))
    # After the probes, which moved the batch norms before their outputs.
    before = {bn.name: bn.moving_mean.numpy() for bn in (final, other)}
    model(images, training=True)
    for bn, fraction in ((final, 0.99), (other, 0.1)):
        old, target = before[bn.name], batch_means[bn.name]
        np.testing.assert_allclose(bn.moving_mean.numpy(),
                                   old + fraction * (target - old),
                                   rtol=1e-4, atol=1e-5, err_msg=bn.name)


def test_resnet50_any_resolution(resnet50):
    for size in (64, 32):
        features = resnet50(tf.zeros([1, size, size, 3]), training=False)
        assert features.shape == (1, 2048)


def test_wide_resnet_any_resolution_one_channel():
    model = backbones.build_backbone('wide_resnet', input_channels=1,
                                     depth=10, width=2)
    for size in (32, 18):
        images = tf.random.normal([2, size, size, 1])
        assert model(images, training=True).shape == (2, 128)
    assert model(tf.zeros([2, 19, 17, 1])).shape == (2, 128)


def test_small_resnet_defaults():
    model = backbones.build_backbone('small_resnet', input_channels=1)
    assert model.output_dim == 128
    assert model(tf.zeros([2, 28, 28, 1])).shape == (2, 128)
    # Stem at stride 1, then every stage halves: 28 -> 14 -> 7 -> 4.
    last = model.get_layer('stage3_block1_out').output
    grid = tf_keras.Model(model.input, last)(tf.zeros([1, 28, 28, 1]))
    assert grid.shape == (1, 4, 4, 128)


@pytest.mark.parametrize('name,kwargs,match', [
    ('resnet18', {}, r"'resnet18'.*resnet50.*small_resnet.*wide_resnet"),
    ('resnet50', {'width_multiplier': 3}, r'\(1, 2, 4\), got 3'),
    ('resnet50', {'depth': 50},
     r"build_backbone\.depth \(an argument of 'wide_resnet'\) is not an "
     r"argument of backbone 'resnet50'\. "
     r"Its arguments: \['width_multiplier'"),
    ('small_resnet', {'widht': (8,)},
     r'build_backbone\.widht \(did you mean build_backbone\.widths\?\) is '
     r'not an argument'),
    ('wide_resnet', {'depth': 27}, r'6n \+ 4.*27'),
    ('wide_resnet', {'width': 0}, r'width must be >= 1, got 0'),
    ('small_resnet', {'widths': (8, 16)}, r'equal length.*\(8, 16\)'),
    ('small_resnet', {'stem_stride': 0}, r'>= 1, got .*stem_stride=0'),
    ('small_resnet', {'input_channels': 0}, r'input_channels.*got 0'),
    ('small_resnet', {'bn_momentum': 1.0},
     r'bn_momentum must be a number >= 0.0 and < 1.0, got 1.0'),
])
def test_bad_arguments(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        backbones.build_backbone(name, **kwargs)


def test_gin_binds_builder_arguments():
    gin.clear_config()
    try:
        gin.parse_config("""
            build_backbone.name = 'small_resnet'
            small_resnet.widths = (8, 12)
            small_resnet.blocks_per_stage = (1, 2)
            small_resnet.stage_strides = (1, 2)
        """)
        model = backbones.build_backbone(input_channels=1)
    finally:
        gin.clear_config()
    assert model.output_dim == 12
    assert model.get_layer('stage2_block2_conv1') is not None


def test_batch_norm_train_vs_inference():
    model = backbones.build_backbone('small_resnet', input_channels=1,
                                     **tiny_model.TINY)
    images = tf.random.normal([4, 8, 8, 1], mean=3.0)
    stem_bn = model.get_layer('stem_bn')
    before = stem_bn.moving_mean.numpy()
    inference = model(images, training=False).numpy()
    np.testing.assert_array_equal(stem_bn.moving_mean.numpy(), before)
    train = model(images, training=True).numpy()
    assert not np.allclose(stem_bn.moving_mean.numpy(), before)
    assert not np.allclose(train, inference, atol=1e-3)
    # The next inference call uses the (updated) moving statistics only.
    np.testing.assert_allclose(model(images, training=False),
                               model(images, training=False))


@pytest.mark.parametrize('sync_bn', [True, False])
def test_sync_bn_uses_global_batch_statistics(sync_bn, two_replicas):
    strategy = two_replicas
    images = np.random.RandomState(0).normal(
        size=(8, 6, 6, 1)).astype(np.float32)
    images[4:] = 2.0 * images[4:] + 1.0  # the two halves differ in stats
    with strategy.scope():
        distributed = backbones.build_backbone(
            'small_resnet', input_channels=1, sync_bn=sync_bn,
            **tiny_model.TINY)
    reference = backbones.build_backbone('small_resnet', input_channels=1,
                                         **tiny_model.TINY)
    reference.set_weights(distributed.get_weights())
    halves = strategy.experimental_distribute_values_from_function(
        lambda ctx: images[4 * ctx.replica_id_in_sync_group:][:4])

    @tf.function
    def forward(x):
        return strategy.run(distributed, args=(x,),
                            kwargs={'training': True})

    got = np.concatenate(strategy.experimental_local_results(
        forward(halves)))  # [8, F]
    want = reference(images, training=True).numpy()
    if sync_bn:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    else:
        assert np.abs(got - want).max() > 1e-2


@pytest.mark.parametrize('policy', ['mixed_bfloat16', 'mixed_float16'])
def test_mixed_precision_forward(policy):
    images = tf.random.normal([2, 12, 12, 1])
    reference = backbones.build_backbone('small_resnet', input_channels=1,
                                         **tiny_model.TINY)
    want = reference(images, training=True).numpy()
    tf_keras.mixed_precision.set_global_policy(policy)
    try:
        model = backbones.build_backbone('small_resnet', input_channels=1,
                                         **tiny_model.TINY)
    finally:
        tf_keras.mixed_precision.set_global_policy('float32')
    assert all(v.dtype == tf.float32 for v in model.variables)
    model.set_weights(reference.get_weights())
    features = model(images, training=True)
    assert features.dtype == tf_keras.mixed_precision.Policy(
        policy).compute_dtype
    got = tf.cast(features, tf.float32).numpy()
    np.testing.assert_allclose(got, want, atol=0.05 * np.abs(want).max())


def test_xla_forward_and_backward_match_eager():
    model = backbones.build_backbone('small_resnet', input_channels=1,
                                     **tiny_model.TINY)
    images = tf.random.normal([2, 10, 10, 1])

    def loss_and_grads(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True)))
        return loss, tape.gradient(loss, model.trainable_variables)

    xla_loss, xla_grads = tf.function(loss_and_grads, jit_compile=True)(
        images)
    loss, grads = loss_and_grads(images)
    np.testing.assert_allclose(xla_loss, loss, rtol=1e-4)
    for xla_grad, grad in zip(xla_grads, grads):
        np.testing.assert_allclose(xla_grad, grad, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize('name,kwargs', [
    ('small_resnet', tiny_model.TINY),
    ('wide_resnet', {'depth': 10, 'width': 1}),
    ('resnet50', None),
])
def test_lars_exclusion_names(name, kwargs, resnet50):
    model = (resnet50 if kwargs is None
             else backbones.build_backbone(name, **kwargs))
    excluded, kernels = set(), set()
    for layer in model.submodules:  # NormReLUThen holds BN and conv
        if isinstance(layer, tf_keras.layers.BatchNormalization):
            excluded.update({id(layer.gamma), id(layer.beta)})
        elif hasattr(layer, 'kernel'):
            kernels.add(id(layer.kernel))
            if layer.bias is not None:
                excluded.add(id(layer.bias))
    by_name = {id(v) for v in model.trainable_variables
               if _short_name(v) in EXCLUDED_SUFFIXES}
    assert by_name == excluded
    assert {id(v) for v in model.trainable_variables
            if _short_name(v) == 'kernel'} == kernels
    assert len(kernels) + len(excluded) == len(model.trainable_variables)
    for variable in model.variables:  # a regex search must not misfire
        layer_name = variable.name.rsplit('/', 1)[0]
        assert not any(s in layer_name for s in EXCLUDED_SUFFIXES)


def test_block_wiring(resnet50):
    # ResNet v1.5: the stride sits on the 3x3 conv, not on the first 1x1.
    assert resnet50.get_layer('stage2_block1_conv1').strides == (1, 1)
    unit = resnet50.get_layer('stage2_block1_bn1_conv2')  # BN, ReLU, conv
    assert (unit.norm.name, unit.layer.name) == ('stage2_block1_bn1',
                                                 'stage2_block1_conv2')
    assert unit.layer.strides == (2, 2)
    assert resnet50.get_layer('stage2_block1_proj_conv').strides == (2, 2)
    wrn = backbones.build_backbone('wide_resnet', depth=10, width=2)
    # The projection shortcut reads the raw block input, as in suncet.
    block_input = wrn.get_layer('group1_block1_add').output
    assert wrn.get_layer('group2_block1_proj_conv').input is block_input
    assert wrn.get_layer('group2_block1_bn1_conv1').input is block_input
    assert wrn.get_layer('group2_block1_bn2_conv2').layer.strides == (2, 2)

