"""Tests for paws_tf.nets.padded_layers."""

import numpy as np
import pytest
import tensorflow as tf

from paws_tf.nets import padded_layers
from tests.helpers import layer_reference


@pytest.mark.parametrize('size, kernel_size, stride', [
    (8, 3, 2), (9, 3, 2), (10, 7, 2), (6, 3, 1)])
def test_padded_conv_matches_numpy_with_gradients(size, kernel_size, stride):
    """PaddedConv2D (the strided convolutions of the ResNets) computes
    PyTorch's symmetric-padding convolution and its gradients, though the
    padded input is rebuilt for the backward pass."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, size, size, 3)).astype(np.float32)
    layer = padded_layers.PaddedConv2D(4, kernel_size, strides=stride,
                                       pad=kernel_size // 2, use_bias=False)
    out_size = (size + 2 * (kernel_size // 2) - kernel_size) // stride + 1
    upstream = rng.normal(size=(2, out_size, out_size, 4)).astype(np.float32)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = tf.function(layer)(xt)
        loss = tf.reduce_sum(y * upstream)
    dx, dkernel = tape.gradient(loss, [xt, layer.kernel])
    want_y, want_dx, want_dkernel = layer_reference.numpy_conv_and_grads(
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
    layer = padded_layers.PaddedMaxPool2D(3, 2, pad=1)
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
    conv = padded_layers.PaddedConv2D(4, 3, strides=2, pad=1, name='c')
    pool = padded_layers.PaddedMaxPool2D(3, 2, pad=1, name='p')
    for layer in (conv, pool):
        clone = type(layer).from_config(layer.get_config())
        assert clone.get_config() == layer.get_config()
        assert clone.pad == 1


@pytest.mark.parametrize('layer_cls, args', [
    (padded_layers.PaddedConv2D, (4, 3)),
    (padded_layers.PaddedMaxPool2D, (3, 2))])
def test_padded_layers_reject_no_padding(layer_cls, args):
    """pad=0 would slice the input gradient to nothing: refused up front."""
    with pytest.raises(ValueError, match='needs pad >= 1, got 0'):
        layer_cls(*args, pad=0)
