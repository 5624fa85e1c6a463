"""Tests for paws_tf.nets.backbones."""

import functools
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
    ('resnet50', {'depth': 50}, r"\['depth'\].*width_multiplier"),
    ('wide_resnet', {'depth': 27}, r'6n \+ 4.*27'),
    ('wide_resnet', {'width': 0}, r'width must be >= 1, got 0'),
    ('small_resnet', {'widths': (8, 16)}, r'equal length.*\(8, 16\)'),
    ('small_resnet', {'stem_stride': 0}, r'>= 1, got .*stem_stride=0'),
    ('small_resnet', {'input_channels': 0}, r'input_channels.*got 0'),
])
def test_bad_arguments(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        backbones.build_backbone(name, **kwargs)


def test_gin_binds_builder_arguments():
    gin.clear_config()
    try:
        gin.parse_config("""
            build_backbone.name = 'small_resnet'
            build_backbone.input_channels = 1
            build_backbone.widths = (8, 12)
            build_backbone.blocks_per_stage = (1, 2)
            build_backbone.stage_strides = (1, 2)
        """)
        model = backbones.build_backbone()
    finally:
        gin.clear_config()
    assert model.output_dim == 12
    assert model.get_layer('stage2_block2_conv1') is not None


def test_batch_norm_train_vs_inference():
    model = backbones.build_backbone('small_resnet', input_channels=1, **tiny_model.TINY)
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
            'small_resnet', input_channels=1, sync_bn=sync_bn, **tiny_model.TINY)
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
    model = backbones.build_backbone('small_resnet', input_channels=1, **tiny_model.TINY)
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


def _trained_tiny_backbone(**kwargs):
    model = backbones.build_backbone('small_resnet', input_channels=1,
                                     **dict(tiny_model.TINY, **kwargs))
    model(tf.random.normal([4, 8, 8, 1]), training=True)  # moving stats != 0
    return model


def _save(model, tmp_path, fmt):
    if fmt in ('h5', 'weights.h5'):
        path = str(tmp_path / f'backbone.{fmt}')
        model.save_weights(path)
        return path
    checkpoint = tf.train.Checkpoint(backbone=model)
    if fmt == 'ckpt_prefix':
        return checkpoint.write(str(tmp_path / 'ckpt'))
    checkpoint.save(str(tmp_path / 'ckpt'))  # also writes the state file
    return str(tmp_path)


@pytest.mark.parametrize(
    'fmt', ['h5', 'weights.h5', 'ckpt_prefix', 'ckpt_dir'])
def test_load_weights_round_trip(tmp_path, fmt):
    source = _trained_tiny_backbone()
    target = _trained_tiny_backbone()
    path = _save(source, tmp_path, fmt)
    backbones.load_backbone_weights(target, path)
    for want, got in zip(source.variables, target.variables):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    images = tf.random.normal([2, 8, 8, 1])
    np.testing.assert_array_equal(target(images), source(images))


@pytest.mark.parametrize(
    'fmt', ['h5', 'weights.h5', 'ckpt_prefix', 'ckpt_dir'])
@pytest.mark.parametrize('other', [
    {'widths': (8, 12)},              # shape mismatch
    {'blocks_per_stage': (1, 2)},     # variables missing from the file
])
def test_load_weights_mismatch_leaves_backbone_unchanged(tmp_path, fmt,
                                                         other):
    path = _save(_trained_tiny_backbone(), tmp_path, fmt)
    target = _trained_tiny_backbone(**other)
    before = [v.numpy() for v in target.variables]
    with pytest.raises(ValueError, match='backbone is unchanged'):
        backbones.load_backbone_weights(target, path)
    for variable, value in zip(target.variables, before):
        np.testing.assert_array_equal(variable.numpy(), value)


def test_load_checkpoint_names_unrestored_variables(tmp_path):
    source = _trained_tiny_backbone()
    prefix = tf.train.Checkpoint(model=source).write(str(tmp_path / 'ckpt'))
    with pytest.raises(ValueError, match=r'35 of 35 variables.*stem_conv/'
                                         r'kernel:0.*and 15 more'):
        backbones.load_backbone_weights(_trained_tiny_backbone(), prefix)
    prefix = tf.train.Checkpoint(backbone=source).write(
        str(tmp_path / 'other'))
    target = _trained_tiny_backbone(blocks_per_stage=(1, 2))
    with pytest.raises(ValueError, match=r'10 of 45 variables.*'
                                         r'stage2_block2_conv1/kernel:0'):
        backbones.load_backbone_weights(target, prefix)


@pytest.mark.parametrize('name', ['missing.h5', 'missing.weights.h5',
                                  'missing_prefix', '.'])
def test_load_weights_missing_path(tmp_path, name):
    with pytest.raises(FileNotFoundError, match='missing|no TF checkpoint'):
        backbones.load_backbone_weights(_trained_tiny_backbone(),
                                        tmp_path / name)


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


@pytest.mark.skipif(not backbones.onednn_enabled(),
                    reason='the guard only applies when oneDNN is on')
def test_strided_1x1_convolutions_on_few_channels_are_refused_under_onednn():
    """oneDNN #6035: wrong weight gradients for these; see BUILD.md."""
    with pytest.raises(ValueError, match=r'stage2_block1_proj_conv: a strided '
                       r'1x1 convolution on 4 input channels.*'
                       r'TF_ENABLE_ONEDNN_OPTS=0'):
        backbones.build_backbone('small_resnet', widths=(4, 8),
                                 blocks_per_stage=(1, 1),
                                 stage_strides=(1, 2))
    # 8 input channels are computed correctly, so they are allowed.
    backbones.build_backbone('small_resnet', widths=(8, 8),
                             blocks_per_stage=(1, 1), stage_strides=(1, 2))


def test_importing_paws_tf_turns_onednn_on_unless_told_not_to():
    code = ('import paws_tf; from paws_tf.nets import backbones; '
            'print(backbones.onednn_enabled())')
    for setting, expected in ((None, 'True'), ('0', 'False')):
        env = {k: v for k, v in os.environ.items()
               if k != 'TF_ENABLE_ONEDNN_OPTS'}
        if setting is not None:
            env['TF_ENABLE_ONEDNN_OPTS'] = setting
        env['PYTHONPATH'] = str(pathlib.Path(__file__).resolve().parents[1])
        out = subprocess.run([sys.executable, '-c', code], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.stdout.strip().splitlines()[-1] == expected, out.stderr


def _numpy_conv_and_grads(x, kernel, stride, pad, upstream):
    """Cross-correlation over symmetric zero padding (PyTorch's Conv2d), and
    the gradients of sum(y * upstream) w.r.t. x and the kernel, by hand."""
    kh, kw = kernel.shape[:2]
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    out_h = (xp.shape[1] - kh) // stride + 1
    out_w = (xp.shape[2] - kw) // stride + 1
    y = np.zeros((x.shape[0], out_h, out_w, kernel.shape[3]))
    d_xp, d_kernel = np.zeros_like(xp), np.zeros_like(kernel)
    for a in range(kh):
        for b in range(kw):
            window = xp[:, a:a + stride * out_h:stride,
                        b:b + stride * out_w:stride, :]  # [N, oh, ow, C]
            y += np.einsum('nijc,co->nijo', window, kernel[a, b])
            d_kernel[a, b] = np.einsum('nijc,nijo->co', window, upstream)
            d_xp[:, a:a + stride * out_h:stride,
                 b:b + stride * out_w:stride, :] += np.einsum(
                     'nijo,co->nijc', upstream, kernel[a, b])
    return y, d_xp[:, pad:pad + x.shape[1], pad:pad + x.shape[2]], d_kernel


@pytest.mark.parametrize('size, kernel_size, stride', [
    (8, 3, 2), (9, 3, 2), (10, 7, 2), (6, 3, 1)])
def test_padded_conv_matches_numpy_with_gradients(size, kernel_size, stride):
    """PaddedConv2D (the strided convolutions of the ResNets) computes
    PyTorch's symmetric-padding convolution and its gradients, though the
    padded input is rebuilt for the backward pass."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, size, size, 3)).astype(np.float32)
    layer = backbones.PaddedConv2D(4, kernel_size, strides=stride,
                                   pad=kernel_size // 2, use_bias=False)
    out_size = (size + 2 * (kernel_size // 2) - kernel_size) // stride + 1
    upstream = rng.normal(size=(2, out_size, out_size, 4)).astype(np.float32)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = tf.function(layer)(xt)
        loss = tf.reduce_sum(y * upstream)
    dx, dkernel = tape.gradient(loss, [xt, layer.kernel])
    want_y, want_dx, want_dkernel = _numpy_conv_and_grads(
        x.astype(np.float64), layer.kernel.numpy().astype(np.float64),
        stride, kernel_size // 2, upstream.astype(np.float64))
    assert y.shape == want_y.shape == layer.compute_output_shape(x.shape)
    np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dkernel, want_dkernel, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('size', [8, 9])
def test_padded_max_pool_matches_numpy_with_gradients(size):
    """PaddedMaxPool2D pads with -inf like PyTorch's MaxPool2d(3, 2, 1): on
    negative inputs the border windows take the largest real value (zero
    padding would give 0), and the gradient goes to that value."""
    rng = np.random.default_rng(1)
    x = -np.abs(rng.normal(size=(2, size, size, 3))).astype(np.float32)
    layer = backbones.PaddedMaxPool2D(3, 2, pad=1)
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-np.inf)
    out = (size + 2 - 3) // 2 + 1
    upstream = rng.normal(size=(2, out, out, 3)).astype(np.float32)
    want_y = np.full((2, out, out, 3), -np.inf, np.float32)
    want_dxp = np.zeros_like(xp)
    for n in range(2):
        for i in range(out):
            for j in range(out):
                for c in range(3):
                    window = xp[n, 2 * i:2 * i + 3, 2 * j:2 * j + 3, c]
                    a, b = np.unravel_index(np.argmax(window), window.shape)
                    want_y[n, i, j, c] = window[a, b]
                    want_dxp[n, 2 * i + a, 2 * j + b, c] += upstream[n, i, j, c]
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = tf.function(layer)(xt)
        loss = tf.reduce_sum(y * upstream)
    assert y.shape == layer.compute_output_shape(x.shape)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_allclose(tape.gradient(loss, xt),
                               want_dxp[:, 1:-1, 1:-1], rtol=1e-6)


def test_padded_layers_round_trip_their_config():
    conv = backbones.PaddedConv2D(4, 3, strides=2, pad=1, name='c')
    pool = backbones.PaddedMaxPool2D(3, 2, pad=1, name='p')
    for layer in (conv, pool):
        clone = type(layer).from_config(layer.get_config())
        assert clone.get_config() == layer.get_config()
        assert clone.pad == 1


@pytest.mark.parametrize('layer_cls, args', [
    (backbones.PaddedConv2D, (4, 3)), (backbones.PaddedMaxPool2D, (3, 2))])
def test_padded_layers_reject_no_padding(layer_cls, args):
    """pad=0 would slice the input gradient to nothing: refused up front."""
    with pytest.raises(ValueError, match='needs pad >= 1, got 0'):
        layer_cls(*args, pad=0)


def _numpy_norm_relu(x, gamma, beta, mean, variance, epsilon):
    """Batch norm with the given statistics, then ReLU: (z, relu(z))."""
    z = gamma * (x - mean) / np.sqrt(variance + epsilon) + beta
    return z, np.maximum(z, 0.0)


def _numpy_training_norm_grads(x, gamma, d_z, epsilon):
    """Gradients (x, gamma, beta) of batch norm on the batch's own statistics
    (over N, H, W), given the gradient d_z of its output."""
    mean, variance = x.mean((0, 1, 2)), x.var((0, 1, 2))
    x_hat = (x - mean) / np.sqrt(variance + epsilon)
    d_x = gamma / np.sqrt(variance + epsilon) * (
        d_z - d_z.mean((0, 1, 2)) - x_hat * (d_z * x_hat).mean((0, 1, 2)))
    return d_x, (d_z * x_hat).sum((0, 1, 2)), d_z.sum((0, 1, 2))


def _numpy_norm_relu_conv(x, gamma, beta, conv, stride, pad, upstream,
                          epsilon):
    """Batch norm on x's own statistics -> ReLU -> `conv`, by hand: the
    output y, and the gradients of sum(y * upstream) w.r.t. x, gamma, beta,
    the kernel (and the bias)."""
    z, a = _numpy_norm_relu(x, gamma, beta, x.mean((0, 1, 2)),
                            x.var((0, 1, 2)), epsilon)
    y, d_a, d_kernel = _numpy_conv_and_grads(
        a, conv.kernel.numpy().astype(np.float64), stride, pad, upstream)
    grads = [*_numpy_training_norm_grads(x, gamma, d_a * (z > 0), epsilon),
             d_kernel]
    if conv.use_bias:
        return y + conv.bias.numpy(), grads + [upstream.sum((0, 1, 2))]
    return y, grads


def _norm_relu_then(layer, epsilon=1e-3, recompute=True, strategy=None):
    rng = np.random.default_rng(3)
    with (strategy or tf.distribute.get_strategy()).scope():
        norm = backbones.batch_norm('bn', sync_bn=strategy is not None,
                                    momentum=0.9, epsilon=epsilon)
        unit = backbones.NormReLUThen(norm, layer, recompute=recompute)
        unit.build((None, None, None, 6))
    for variable in unit.weights:
        value = rng.normal(size=variable.shape)
        if 'moving_variance' in variable.name:
            value = np.abs(value) + 0.5
        variable.assign(value.astype(np.float32))
    return unit


@pytest.mark.parametrize('kernel_size, stride, use_bias, recompute', [
    (3, 1, True, True), (3, 2, False, True), (1, 1, False, True),
    (3, 2, True, False)])
def test_norm_relu_then_conv_trains_like_numpy(kernel_size, stride,
                                               use_bias, recompute):
    """Training, NormReLUThen holds only its input and recomputes the ReLU
    output for the backward pass; output, gradients and moving statistics
    are still those of batch norm -> ReLU -> conv, by hand (and with
    recompute=False, which composes the tf_keras layers)."""
    pad = kernel_size // 2
    if stride > 1:
        conv = backbones.PaddedConv2D(5, kernel_size, strides=stride,
                                      pad=pad, use_bias=use_bias)
    else:
        conv = tf_keras.layers.Conv2D(5, kernel_size, padding='same',
                                      use_bias=use_bias)
    unit = _norm_relu_then(conv, recompute=recompute)
    norm = unit.norm
    rng = np.random.default_rng(4)
    x = (2.0 * rng.normal(size=(3, 7, 7, 6)) + 1.0).astype(np.float32)
    out = (7 + 2 * pad - kernel_size) // stride + 1
    upstream = rng.normal(size=(3, out, out, 5))
    gamma, beta, moving_mean, moving_variance = [
        v.numpy().astype(np.float64) for v in (
            norm.gamma, norm.beta, norm.moving_mean, norm.moving_variance)]

    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = tf.function(unit)(xt, training=True)
        loss = tf.reduce_sum(y * upstream)
    sources = [xt, norm.gamma, norm.beta, *conv.trainable_weights]
    got = tape.gradient(loss, sources)

    x64 = x.astype(np.float64)
    mean = x64.mean((0, 1, 2))
    want_y, want = _numpy_norm_relu_conv(x64, gamma, beta, conv, stride, pad,
                                         upstream, norm.epsilon)
    np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-4)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    # Moving averages as tf_keras' fused batch norm (and PyTorch) keep them:
    # the variance with Bessel's correction.
    np.testing.assert_allclose(norm.moving_mean,
                               0.9 * moving_mean + 0.1 * mean, rtol=1e-5)
    np.testing.assert_allclose(
        norm.moving_variance,
        0.9 * moving_variance + 0.1 * x64.var((0, 1, 2), ddof=1), rtol=1e-5)


def test_norm_relu_then_max_pool_trains_like_numpy():
    """The ResNet-50 stem: batch norm -> ReLU -> max pool, recomputed."""
    unit = _norm_relu_then(backbones.PaddedMaxPool2D(3, 2, pad=1))
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 5, 5, 6)).astype(np.float32)
    upstream = rng.normal(size=(2, 3, 3, 6))
    gamma, beta = unit.norm.gamma.numpy(), unit.norm.beta.numpy()
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = tf.function(unit)(xt, training=True)
        loss = tf.reduce_sum(y * upstream)
    dx = tape.gradient(loss, xt)
    x64 = x.astype(np.float64)
    mean, variance = x64.mean((0, 1, 2)), x64.var((0, 1, 2))
    z, a = _numpy_norm_relu(x64, gamma, beta, mean, variance, 1e-3)
    ap = np.pad(a, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-np.inf)
    d_a = np.zeros_like(ap)
    want_y = np.zeros((2, 3, 3, 6))
    for n, i, j, c in np.ndindex(*want_y.shape):
        window = ap[n, 2 * i:2 * i + 3, 2 * j:2 * j + 3, c]
        r, s = np.unravel_index(np.argmax(window), window.shape)
        want_y[n, i, j, c] = window[r, s]
        d_a[n, 2 * i + r, 2 * j + s, c] += upstream[n, i, j, c]
    want_dx, _, _ = _numpy_training_norm_grads(
        x64, gamma, d_a[:, 1:-1, 1:-1] * (z > 0), 1e-3)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-4, atol=1e-4)


def _train_on_two_replicas(strategy, layer, x, upstream, weights,
                           first=None):
    """Trains `layer` on two replicas, the first on the first `first` rows
    of `x` (default: half), the second on the rest: the replicas' outputs
    y, and the gradients of sum(y * upstream) w.r.t. their inputs and
    `weights`, each as the tuple of the replicas' values."""
    bounds = (0, len(x) // 2 if first is None else first, len(x))

    def per_replica(array):
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: array[bounds[ctx.replica_id_in_sync_group]:
                              bounds[ctx.replica_id_in_sync_group + 1]])

    @tf.function
    def step(x, upstream):
        def replica_step(x, upstream):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x, training=True)
                loss = tf.reduce_sum(tf.cast(y, tf.float32) * upstream)
            return y, *tape.gradient(loss, [x, *weights])

        return strategy.run(replica_step, args=(x, upstream))

    return [strategy.experimental_local_results(t)
            for t in step(per_replica(x), per_replica(upstream))]


@pytest.mark.parametrize('kernel_size, stride, use_bias, recompute', [
    (3, 2, False, True), (1, 1, True, True), (3, 2, False, False)])
def test_synchronized_norm_relu_then_trains_like_numpy(
        kernel_size, stride, use_bias, recompute, two_replicas):
    """With a synchronised batch norm on two replicas, each replica's output
    and input gradient, the replicas' summed weight gradients and the moving
    statistics are those of batch norm -> ReLU -> conv over the two
    replicas' batches concatenated, by hand: recomputed with one all-reduce
    each way, and (recompute=False) through GlobalBatchNormalization's
    own call."""
    strategy = two_replicas
    pad = kernel_size // 2
    with strategy.scope():
        conv = (backbones.PaddedConv2D(5, kernel_size, strides=stride,
                                       pad=pad, use_bias=use_bias)
                if stride > 1 else tf_keras.layers.Conv2D(
                    5, kernel_size, use_bias=use_bias))
    unit = _norm_relu_then(conv, recompute=recompute, strategy=strategy)
    norm = unit.norm
    rng = np.random.default_rng(7)
    x = rng.normal(size=(4, 7, 7, 6)).astype(np.float32)
    x[2:] = 3.0 * x[2:] - 2.0  # The replicas' statistics differ.
    out = (7 + 2 * pad - kernel_size) // stride + 1
    upstream = rng.normal(size=(4, out, out, 5)).astype(np.float32)
    gamma, beta, moving_mean, moving_variance = [
        v.numpy().astype(np.float64) for v in (
            norm.gamma, norm.beta, norm.moving_mean, norm.moving_variance)]

    y, dx, *d_weights = _train_on_two_replicas(
        strategy, unit, x, upstream,
        [norm.gamma, norm.beta, *conv.trainable_weights])

    x64 = x.astype(np.float64)
    mean, variance = x64.mean((0, 1, 2)), x64.var((0, 1, 2))
    want_y, (want_dx, *want) = _numpy_norm_relu_conv(
        x64, gamma, beta, conv, stride, pad, upstream, norm.epsilon)
    np.testing.assert_allclose(np.concatenate(y), want_y, rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(np.concatenate(dx), want_dx, rtol=1e-4,
                               atol=1e-4)
    assert len(d_weights) == len(want)
    for per_replica, w in zip(d_weights, want):
        np.testing.assert_allclose(sum(per_replica), w, rtol=1e-4, atol=1e-4)
    # As tf_keras' synchronised layer keeps them: the variance without
    # Bessel's correction.
    for replica_mean, replica_variance in zip(
            strategy.experimental_local_results(norm.moving_mean),
            strategy.experimental_local_results(norm.moving_variance)):
        np.testing.assert_allclose(replica_mean,
                                   0.9 * moving_mean + 0.1 * mean, rtol=1e-5)
        np.testing.assert_allclose(
            replica_variance, 0.9 * moving_variance + 0.1 * variance,
            rtol=1e-5)


def _numpy_training_norm(x, gamma, beta, epsilon):
    """Batch norm of x [N, H, W, C] on its own statistics."""
    z, _ = _numpy_norm_relu(x, gamma, beta, x.mean((0, 1, 2)),
                            x.var((0, 1, 2)), epsilon)
    return z


def _check_global_norm_trains_like_numpy(strategy, norm, x, upstream,
                                         tolerance, first=None):
    """Trains `norm` (a GlobalBatchNormalization) on two replicas, split as
    `_train_on_two_replicas` does, and checks each replica's output and
    input gradient, the summed gamma and beta gradients and the moving
    statistics against batch norm over the global batch, by hand. Returns
    the replicas' outputs."""
    moving_mean, moving_variance = (norm.moving_mean.numpy(),
                                    norm.moving_variance.numpy())
    y, dx, d_gamma, d_beta = _train_on_two_replicas(
        strategy, norm, x, upstream, [norm.gamma, norm.beta], first=first)
    image = (-1, 1, 1, x.shape[-1])  # [B, C] as [B, 1, 1, C].
    x64 = x.astype(np.float64).reshape(image)
    gamma = norm.gamma.numpy().astype(np.float64)
    want_y = _numpy_training_norm(x64, gamma, norm.beta.numpy(), 1e-3)
    want = _numpy_training_norm_grads(x64, gamma, upstream.reshape(image),
                                      1e-3)
    assert y[0].dtype == norm.compute_dtype
    close = functools.partial(np.testing.assert_allclose, rtol=tolerance,
                              atol=tolerance)
    close(np.concatenate(y).astype(np.float64).reshape(image), want_y)
    close(np.concatenate(dx).reshape(image), want[0])
    close(sum(d_gamma), want[1])
    close(sum(d_beta), want[2])
    for variable, before, batch in (
            (norm.moving_mean, moving_mean, x64.mean((0, 1, 2))),
            (norm.moving_variance, moving_variance, x64.var((0, 1, 2)))):
        for replica_value in strategy.experimental_local_results(variable):
            close(replica_value, 0.9 * before + 0.1 * batch)
    return y


@pytest.mark.parametrize('policy, tolerance', [
    ('float32', 1e-4), ('mixed_float16', 1e-2), ('mixed_bfloat16', 5e-2)])
@pytest.mark.parametrize('shape', [(4, 5, 5, 6), (6, 6)])
def test_global_batch_norm_trains_like_numpy(shape, policy, tolerance,
                                             two_replicas):
    """GlobalBatchNormalization on two replicas: each replica's output and
    input gradient, the summed gamma and beta gradients and the moving
    statistics are those of batch norm over the replicas' batches
    concatenated, by hand (images, and the heads' [B, C] features), in
    float32 and within the precision of mixed float16 and bfloat16."""
    with two_replicas.scope():
        norm = backbones.GlobalBatchNormalization(momentum=0.9, epsilon=1e-3,
                                                  dtype=policy)
        norm.build((None, *shape[1:]))
    rng = np.random.default_rng(8)
    for variable in norm.weights:
        variable.assign(rng.uniform(0.5, 1.5, size=variable.shape))
    x = rng.normal(size=shape).astype(np.float32)
    x[shape[0] // 2:] = 3.0 * x[shape[0] // 2:] - 2.0
    upstream = rng.normal(size=shape).astype(np.float32)
    _check_global_norm_trains_like_numpy(two_replicas, norm, x, upstream,
                                         tolerance)


@pytest.mark.parametrize('first', [0, 1])
def test_global_batch_norm_uneven_replica_batches(first, two_replicas):
    """Replicas with batches of 0 or 1 rows (whose own statistics are NaN
    or without spread) beside a larger one: outputs, input gradients, the
    summed gamma and beta gradients and the moving statistics (from their
    initial 0 and 1) are those of batch norm over the global batch, by
    hand."""
    with two_replicas.scope():
        norm = backbones.GlobalBatchNormalization(momentum=0.9, epsilon=1e-3)
        norm.build((None, 4))
    np.testing.assert_array_equal(norm.moving_mean.numpy(), 0.0)
    np.testing.assert_array_equal(norm.moving_variance.numpy(), 1.0)
    rng = np.random.default_rng(10)
    norm.gamma.assign(rng.uniform(0.5, 1.5, size=4))
    norm.beta.assign(rng.uniform(-1.0, 1.0, size=4))
    x = rng.normal(size=(4, 4)).astype(np.float32) * 2.0 + 1.0
    upstream = rng.normal(size=(4, 4)).astype(np.float32)
    y = _check_global_norm_trains_like_numpy(two_replicas, norm, x, upstream,
                                             1e-4, first=first)
    assert [len(t) for t in y] == [first, 4 - first]


def test_global_batch_norm_all_reduces_once_each_way(two_replicas_collective):
    """One collective per replica forward and one backward, for the layer
    and inside NormReLUThen; tf_keras' synchronised layer makes five.
    Counted where the strategy all-reduces with collectives (GPUs, workers);
    logical CPUs sum on one device instead (`dist.make_strategy`)."""
    strategy = two_replicas_collective

    def collectives_per_replica(make_layer):
        with strategy.scope():
            layer = make_layer()

        @tf.function
        def step(x):
            def replica_step(x):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    loss = tf.reduce_sum(tf.square(layer(x, training=True)))
                return tape.gradient(loss, x)

            return strategy.run(replica_step, args=(x,))

        graph = step.get_concrete_function(tf.zeros([2, 5, 5, 8])).graph
        return sum(op.type == 'CollectiveReduceV2'
                   for op in graph.get_operations()) / 2

    def norm():
        return backbones.batch_norm('bn', sync_bn=True, momentum=0.9,
                                    epsilon=1e-3)

    assert collectives_per_replica(norm) == 2
    assert collectives_per_replica(lambda: backbones.NormReLUThen(
        norm(), tf_keras.layers.Conv2D(4, 3))) == 2
    assert collectives_per_replica(
        lambda: tf_keras.layers.BatchNormalization(synchronized=True)) == 5


def test_global_batch_norm_elsewhere_runs_tf_keras_layer(two_replicas):
    """Inference uses the moving statistics; training outside a replica
    context normalises the local batch, and a float64 layer the global
    batch, as tf_keras' synchronised layer does; the config round-trips;
    an empty batch leaves the moving statistics; other ranks are refused
    at build."""
    x = np.random.default_rng(9).normal(size=(4, 3, 3, 2)).astype(np.float32)
    with two_replicas.scope():
        norm = backbones.batch_norm('bn', sync_bn=True, momentum=0.9,
                                    epsilon=1e-3)
        assert isinstance(norm, backbones.GlobalBatchNormalization)
        np.testing.assert_allclose(
            norm(x, training=True),
            _numpy_training_norm(x.astype(np.float64), 1.0, 0.0, 1e-3),
            rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        norm(x, training=False),
        (x - norm.moving_mean) / np.sqrt(norm.moving_variance + 1e-3),
        rtol=1e-5, atol=1e-5)
    clone = backbones.GlobalBatchNormalization.from_config(
        backbones.layer_config(norm))
    assert clone.get_config() == norm.get_config() and clone.synchronized
    # A float64 layer (no fused kernels) trains as tf_keras' layer, on the
    # global batch; an empty global batch leaves the moving statistics be.
    skewed = np.concatenate([x[:2] * 3.0, x[2:]])
    with two_replicas.scope():
        wide = backbones.GlobalBatchNormalization(epsilon=1e-3,
                                                  dtype='float64')
        wide.build((None, 3, 3, 2))
    for layer, images, want in (
            (wide, skewed, _numpy_training_norm(
                skewed.astype(np.float64), 1.0, 0.0, 1e-3)),
            (norm, x[:0], np.zeros((0, 3, 3, 2)))):
        before = layer.moving_mean.numpy()
        got, *_ = _train_on_two_replicas(two_replicas, layer, images,
                                         np.zeros_like(images), [])
        np.testing.assert_allclose(np.concatenate(got), want, rtol=1e-6,
                                   atol=1e-6)
        assert np.all(np.isfinite(layer.moving_mean.numpy()))
        if not len(want):
            np.testing.assert_array_equal(layer.moving_mean.numpy(), before)
    with pytest.raises(ValueError, match=r'needs \[B, C\] or \[B, H, W, C\]'):
        backbones.GlobalBatchNormalization()(tf.zeros([2, 3, 4]))


@pytest.mark.parametrize('frozen', [False, True])
def test_norm_relu_then_inference_and_frozen_use_moving_statistics(frozen):
    """Inference, or training with the batch norm frozen (fine-tuning's
    trunk), normalises with the moving statistics and leaves them be."""
    unit = _norm_relu_then(tf_keras.layers.Conv2D(5, 1, use_bias=False))
    unit.norm.trainable = not frozen
    x = np.random.default_rng(6).normal(size=(2, 4, 4, 6)).astype(np.float32)
    before = [v.numpy() for v in unit.weights]
    norm = unit.norm
    gamma, beta, moving_mean, moving_variance, kernel = [
        v.numpy().astype(np.float64) for v in (
            norm.gamma, norm.beta, norm.moving_mean, norm.moving_variance,
            unit.layer.kernel)]
    y = unit(x, training=frozen)
    _, a = _numpy_norm_relu(x.astype(np.float64), gamma, beta, moving_mean,
                            moving_variance, 1e-3)
    np.testing.assert_allclose(y, a @ kernel[0, 0], rtol=1e-4, atol=1e-4)
    for variable, value in zip(unit.weights, before):
        np.testing.assert_array_equal(variable.numpy(), value)


@pytest.mark.parametrize('synchronized', [False, True])
def test_norm_relu_then_does_not_hold_the_relu_output(synchronized, request):
    """A chain of four units reaches a lower tensor peak than the same
    tf_keras layers composed, by about the ReLU outputs they do not hold
    (graph optimisation could otherwise merge the recomputed ReLU output
    with the forward one and keep it), on one replica and with the batch
    norm synchronised across two (where the executor could also compute
    the backward pass's normalised input in the forward pass)."""
    try:
        tf.config.experimental.reset_memory_stats('CPU:0')
    except ValueError:
        pytest.skip('the CPU allocator keeps no statistics (oneDNN off)')
    strategy = (request.getfixturevalue('two_replicas') if synchronized
                else tf.distribute.get_strategy())
    x = tf.random.normal([32, 32, 32, 64])  # 8 MiB per replica

    def conv():
        return tf_keras.layers.Conv2D(64, 3, padding='same', use_bias=False)

    def norm():
        return backbones.batch_norm('bn', sync_bn=synchronized, momentum=0.9,
                                    epsilon=1e-5)

    def composed(y, bn, conv):
        return conv(tf.nn.relu(bn(y, training=True)))

    def peak_mib(layers):
        def replica_step():
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = x
                for layer in layers:
                    y = layer(y)
                loss = tf.reduce_sum(tf.square(y))
            return tape.gradient(loss, x)

        step = tf.function(lambda: strategy.run(replica_step))
        step()  # Traces and builds the layers.
        tf.config.experimental.reset_memory_stats('CPU:0')
        step()
        return tf.config.experimental.get_memory_info('CPU:0')['peak'] / 2**20

    with strategy.scope():
        recomputed = peak_mib([functools.partial(
            backbones.NormReLUThen(norm(), conv()), training=True)
            for _ in range(4)])
        held = peak_mib([functools.partial(composed, bn=norm(), conv=conv())
                         for _ in range(4)])
    replicas = strategy.num_replicas_in_sync
    assert recomputed <= held - 2 * 8 * replicas, (recomputed, held)


def test_norm_relu_then_round_trips_its_config():
    unit = backbones.NormReLUThen(
        backbones.batch_norm('b', sync_bn=True, momentum=0.8, epsilon=1e-4),
        backbones.PaddedConv2D(4, 3, strides=2, pad=1, name='c'),
        recompute=False, name='u')
    clone = backbones.NormReLUThen.from_config(unit.get_config())
    assert clone.get_config() == unit.get_config()
    assert clone.norm.synchronized and clone.norm.momentum == 0.8
    assert not clone.recompute
    assert isinstance(clone.layer, backbones.PaddedConv2D)


@pytest.mark.parametrize('norm, layer, match', [
    (tf_keras.layers.BatchNormalization(axis=1), tf_keras.layers.Conv2D(4, 1),
     'channels-last batch norm'),
    (tf_keras.layers.BatchNormalization(),
     tf_keras.layers.Conv2D(4, 1, activation='relu'), 'without activation'),
    (tf_keras.layers.BatchNormalization(), tf_keras.layers.Dense(4),
     'Conv2D .* or a MaxPool2D')])
def test_norm_relu_then_refuses_other_layers(norm, layer, match):
    with pytest.raises(ValueError, match=match):
        backbones.NormReLUThen(norm, layer)


def test_recompute_bn_relu_switch_keeps_variables_and_values():
    """`build_backbone.recompute_bn_relu = False` (gin) builds the same
    variables, so checkpoints move between the settings, and trains to the
    same values: only what the backward pass holds differs."""
    images = tf.random.normal([4, 12, 12, 1], mean=1.0)
    on, off = [backbones.build_backbone(
        'small_resnet', input_channels=1, recompute_bn_relu=recompute,
        **tiny_model.TINY) for recompute in (True, False)]
    off.set_weights(on.get_weights())
    results = []
    for model in (on, off):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.sin(model(images, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        results.append([loss] + grads + [v.numpy() for v in model.variables])
    assert [v.name for v in on.variables] == [v.name for v in off.variables]
    units = [layer for layer in off.layers
             if isinstance(layer, backbones.NormReLUThen)]
    assert units and not any(unit.recompute for unit in units)
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
