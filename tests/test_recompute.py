"""Tests for paws_tf.nets.recompute."""

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from paws_tf import nets
from paws_tf.nets import recompute as recompute_lib
from paws_tf.nets import sync_batch_norm
from tests.helpers import layer_reference

REPO = pathlib.Path(__file__).resolve().parents[1]


def _norm_relu_then(layer, epsilon=1e-3, recompute=True, strategy=None,
                    padding=None):
    rng = np.random.default_rng(3)
    with (strategy or tf.distribute.get_strategy()).scope():
        norm = sync_batch_norm.batch_norm(
            'bn', sync_bn=strategy is not None, momentum=0.9,
            epsilon=epsilon, impl=nets.CUSTOM)
        unit = recompute_lib.NormReLUThen(norm, layer, recompute=recompute,
                                          padding=padding)
        unit.build((None, None, None, 6))
    for variable in unit.weights:
        value = rng.normal(size=variable.shape)
        if 'moving_variance' in variable.name:
            value = np.abs(value) + 0.5
        variable.assign(value.astype(np.float32))
    return unit


def _padded_conv(filters, kernel_size, stride, use_bias=False):
    """(ZeroPadding2D of kernel_size // 2, 'valid' Conv2D): the backbones'
    strided convolution."""
    return (tf_keras.layers.ZeroPadding2D(kernel_size // 2),
            tf_keras.layers.Conv2D(filters, kernel_size, strides=stride,
                                   use_bias=use_bias, name='c'))


@pytest.mark.parametrize('kernel_size, stride, use_bias, recompute', [
    (3, 1, True, True), (3, 2, False, True), (1, 1, False, True),
    (3, 2, True, False)])
def test_norm_relu_then_conv_trains_like_numpy(kernel_size, stride,
                                               use_bias, recompute):
    """Training, NormReLUThen holds only its input and recomputes the ReLU
    output for the backward pass; output, gradients and moving statistics
    are still those of batch norm -> ReLU -> conv, by hand (and with
    recompute=False, which composes the tf_keras layers). A strided
    convolution is a 'valid' Conv2D behind the unit's ZeroPadding2D."""
    pad = kernel_size // 2
    padding = None
    if stride > 1:
        padding, conv = _padded_conv(5, kernel_size, stride, use_bias)
    else:
        conv = tf_keras.layers.Conv2D(5, kernel_size, padding='same',
                                      use_bias=use_bias)
    unit = _norm_relu_then(conv, recompute=recompute, padding=padding)
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
    want_y, want = layer_reference.numpy_norm_relu_conv(
        x64, gamma, beta, conv, stride, pad, upstream, norm.epsilon)
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
    """The ResNet-50 stem: batch norm -> ReLU -> max pool, recomputed; the
    reference pads with -inf, as PyTorch does, and the unit's ZeroPadding2D
    gives the same on ReLU outputs."""
    unit = _norm_relu_then(tf_keras.layers.MaxPool2D(3, 2),
                           padding=tf_keras.layers.ZeroPadding2D(1))
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
    z, a = layer_reference.numpy_norm_relu(x64, gamma, beta, mean, variance,
                                           1e-3)
    ap = np.pad(a, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-np.inf)
    d_a = np.zeros_like(ap)
    want_y = np.zeros((2, 3, 3, 6))
    for n, i, j, c in np.ndindex(*want_y.shape):
        window = ap[n, 2 * i:2 * i + 3, 2 * j:2 * j + 3, c]
        r, s = np.unravel_index(np.argmax(window), window.shape)
        want_y[n, i, j, c] = window[r, s]
        d_a[n, 2 * i + r, 2 * j + s, c] += upstream[n, i, j, c]
    want_dx, _, _ = layer_reference.numpy_training_norm_grads(
        x64, gamma, d_a[:, 1:-1, 1:-1] * (z > 0), 1e-3)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('kernel_size, stride, use_bias, recompute', [
    (3, 2, False, True), (1, 1, True, True), (3, 2, False, False)])
def test_synchronized_norm_relu_then_trains_like_numpy(
        kernel_size, stride, use_bias, recompute, two_replicas):
    """With a synchronised batch norm on two replicas, each replica's output
    and input gradient, the replicas' summed weight gradients and the moving
    statistics are those of batch norm -> ReLU -> conv over the two
    replicas' batches concatenated, by hand: recomputed with one all-reduce
    each way (padding the ReLU output with the unit's ZeroPadding2D), and
    (recompute=False) through
    GlobalBatchNormalization's own call."""
    strategy = two_replicas
    pad = kernel_size // 2
    padding = None
    with strategy.scope():
        if stride > 1:
            padding, conv = _padded_conv(5, kernel_size, stride, use_bias)
        else:
            conv = tf_keras.layers.Conv2D(5, kernel_size, use_bias=use_bias)
    unit = _norm_relu_then(conv, recompute=recompute, strategy=strategy,
                           padding=padding)
    norm = unit.norm
    rng = np.random.default_rng(7)
    x = rng.normal(size=(4, 7, 7, 6)).astype(np.float32)
    x[2:] = 3.0 * x[2:] - 2.0  # The replicas' statistics differ.
    out = (7 + 2 * pad - kernel_size) // stride + 1
    upstream = rng.normal(size=(4, out, out, 5)).astype(np.float32)
    gamma, beta, moving_mean, moving_variance = [
        v.numpy().astype(np.float64) for v in (
            norm.gamma, norm.beta, norm.moving_mean, norm.moving_variance)]

    y, dx, *d_weights = layer_reference.train_on_two_replicas(
        strategy, unit, x, upstream,
        [norm.gamma, norm.beta, *conv.trainable_weights])

    x64 = x.astype(np.float64)
    mean, variance = x64.mean((0, 1, 2)), x64.var((0, 1, 2))
    want_y, (want_dx, *want) = layer_reference.numpy_norm_relu_conv(
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
    _, a = layer_reference.numpy_norm_relu(x.astype(np.float64), gamma, beta,
                                           moving_mean, moving_variance, 1e-3)
    np.testing.assert_allclose(y, a @ kernel[0, 0], rtol=1e-4, atol=1e-4)
    for variable, value in zip(unit.weights, before):
        np.testing.assert_array_equal(variable.numpy(), value)


# Tensor peaks of four units of batch norm, ReLU and convolution, as
# NormReLUThen and as tf_keras layers composed, on one replica and with the
# batch norm synchronised across two: `synchronized recomputed held` per
# line, MiB. In a process of its own: the CPU allocator's peak counts every
# thread's tensors, and in the test process another test's tf.data
# iterator still filling its buffer once made it 1215 MiB against 258.
_PEAKS = textwrap.dedent('''
    import functools
    import paws_tf  # noqa: F401  (selects tf_keras)
    import tensorflow as tf
    import tf_keras
    from paws_tf import cluster
    from paws_tf import nets
    from paws_tf.nets import recompute
    from paws_tf.nets import sync_batch_norm
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices('CPU')[0],
        [tf.config.LogicalDeviceConfiguration()] * 2)
    x = tf.random.normal([32, 32, 32, 64])  # 8 MiB per replica

    def peak_mib(strategy, layers):
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

    for synchronized in (False, True):
        strategy = (cluster.make_strategy('mirrored', ['CPU:0', 'CPU:1'])
                    if synchronized else tf.distribute.get_strategy())

        def conv():
            return tf_keras.layers.Conv2D(64, 3, padding='same',
                                          use_bias=False)

        def norm():
            return sync_batch_norm.batch_norm(
                'bn', sync_bn=synchronized, momentum=0.9, epsilon=1e-5,
                impl=nets.CUSTOM)

        def composed(y, bn, conv):
            return conv(tf.nn.relu(bn(y, training=True)))

        with strategy.scope():
            recomputed = peak_mib(strategy, [functools.partial(
                recompute.NormReLUThen(norm(), conv()), training=True)
                for _ in range(4)])
            held = peak_mib(strategy, [functools.partial(
                composed, bn=norm(), conv=conv()) for _ in range(4)])
        print(int(synchronized), recomputed, held)
''')


@pytest.mark.slow
def test_norm_relu_then_does_not_hold_the_relu_output():
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
    out = subprocess.run([sys.executable, '-c', _PEAKS],
                         env={**os.environ, 'PYTHONPATH': str(REPO)},
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.strip().splitlines()]
    assert [row[0] for row in rows] == ['0', '1'], out.stdout
    for synchronized, recomputed, held in rows:
        replicas = 1 + int(synchronized)
        # Four ReLU outputs of 8 MiB per replica are not held; half of
        # them is the margin.
        assert float(recomputed) <= float(held) - 2 * 8 * replicas, rows


def test_norm_relu_then_round_trips_its_config():
    padding, conv = _padded_conv(4, 3, 2)
    unit = recompute_lib.NormReLUThen(
        sync_batch_norm.batch_norm('b', sync_bn=True, momentum=0.8,
                                   epsilon=1e-4, impl=nets.CUSTOM),
        conv, recompute=False, padding=padding, name='u')
    clone = recompute_lib.NormReLUThen.from_config(unit.get_config())
    assert clone.get_config() == unit.get_config()
    assert clone.norm.synchronized and clone.norm.momentum == 0.8
    assert not clone.recompute
    assert clone.layer.strides == (2, 2)
    assert clone.padding.padding == ((1, 1), (1, 1))


@pytest.mark.parametrize('norm, layer, match', [
    (tf_keras.layers.BatchNormalization(axis=1), tf_keras.layers.Conv2D(4, 1),
     'channels-last batch norm'),
    (tf_keras.layers.BatchNormalization(),
     tf_keras.layers.Conv2D(4, 1, activation='relu'), 'without activation'),
    (tf_keras.layers.BatchNormalization(), tf_keras.layers.Dense(4),
     'Conv2D .* or a MaxPool2D')])
def test_norm_relu_then_refuses_other_layers(norm, layer, match):
    with pytest.raises(ValueError, match=match):
        recompute_lib.NormReLUThen(norm, layer)


def test_norm_relu_then_refuses_other_padding():
    with pytest.raises(ValueError, match='pads with a ZeroPadding2D'):
        recompute_lib.NormReLUThen(
            tf_keras.layers.BatchNormalization(),
            tf_keras.layers.Conv2D(4, 3),
            padding=tf_keras.layers.Cropping2D(1))
