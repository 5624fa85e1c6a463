"""Tests for paws_tf.nets.sync_batch_norm."""

import functools

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from paws_tf import nets
from paws_tf.nets import recompute
from paws_tf.nets import sync_batch_norm
from tests.helpers import layer_reference


def _check_global_norm_trains_like_numpy(strategy, norm, x, upstream,
                                         tolerance, first=None):
    """Trains `norm` (a GlobalBatchNormalization) on two replicas, split as
    `layer_reference.train_on_two_replicas` does, and checks each replica's
    output and input gradient, the summed gamma and beta gradients and the
    moving statistics against batch norm over the global batch, by hand.
    Returns the replicas' outputs."""
    moving_mean, moving_variance = (norm.moving_mean.numpy(),
                                    norm.moving_variance.numpy())
    y, dx, d_gamma, d_beta = layer_reference.train_on_two_replicas(
        strategy, norm, x, upstream, [norm.gamma, norm.beta], first=first)
    image = (-1, 1, 1, x.shape[-1])  # [B, C] as [B, 1, 1, C].
    x64 = x.astype(np.float64).reshape(image)
    gamma = norm.gamma.numpy().astype(np.float64)
    want_y = layer_reference.numpy_training_norm(x64, gamma,
                                                 norm.beta.numpy(), 1e-3)
    want = layer_reference.numpy_training_norm_grads(
        x64, gamma, upstream.reshape(image), 1e-3)
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
        norm = sync_batch_norm.GlobalBatchNormalization(
            momentum=0.9, epsilon=1e-3, dtype=policy)
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
        norm = sync_batch_norm.GlobalBatchNormalization(momentum=0.9,
                                                        epsilon=1e-3)
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
    logical CPUs sum on one device instead (`cluster.make_strategy`)."""
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
        return sync_batch_norm.batch_norm('bn', sync_bn=True, momentum=0.9,
                                          epsilon=1e-3,
                                          impl=nets.CUSTOM)

    assert collectives_per_replica(norm) == 2
    assert collectives_per_replica(lambda: recompute.NormReLUThen(
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
        norm = sync_batch_norm.batch_norm('bn', sync_bn=True, momentum=0.9,
                                          epsilon=1e-3,
                                          impl=nets.CUSTOM)
        assert isinstance(norm, sync_batch_norm.GlobalBatchNormalization)
        np.testing.assert_allclose(
            norm(x, training=True),
            layer_reference.numpy_training_norm(x.astype(np.float64), 1.0,
                                                0.0, 1e-3),
            rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        norm(x, training=False),
        (x - norm.moving_mean) / np.sqrt(norm.moving_variance + 1e-3),
        rtol=1e-5, atol=1e-5)
    clone = sync_batch_norm.GlobalBatchNormalization.from_config(
        sync_batch_norm.layer_config(norm))
    assert clone.get_config() == norm.get_config() and clone.synchronized
    # A float64 layer (no fused kernels) trains as tf_keras' layer, on the
    # global batch; an empty global batch leaves the moving statistics be.
    skewed = np.concatenate([x[:2] * 3.0, x[2:]])
    with two_replicas.scope():
        wide = sync_batch_norm.GlobalBatchNormalization(epsilon=1e-3,
                                                        dtype='float64')
        wide.build((None, 3, 3, 2))
    for layer, images, want in (
            (wide, skewed, layer_reference.numpy_training_norm(
                skewed.astype(np.float64), 1.0, 0.0, 1e-3)),
            (norm, x[:0], np.zeros((0, 3, 3, 2)))):
        before = layer.moving_mean.numpy()
        got, *_ = layer_reference.train_on_two_replicas(
            two_replicas, layer, images, np.zeros_like(images), [])
        np.testing.assert_allclose(np.concatenate(got), want, rtol=1e-6,
                                   atol=1e-6)
        assert np.all(np.isfinite(layer.moving_mean.numpy()))
        if not len(want):
            np.testing.assert_array_equal(layer.moving_mean.numpy(), before)
    with pytest.raises(ValueError, match=r'needs \[B, C\] or \[B, H, W, C\]'):
        sync_batch_norm.GlobalBatchNormalization()(tf.zeros([2, 3, 4]))


def test_batch_norm_defaults_to_tf_keras_synchronized_layer():
    """`impl` defaults to tf_keras' layer (the GPU-first default); a bad
    value is refused with the allowed ones."""
    norm = sync_batch_norm.batch_norm('bn', sync_bn=True, momentum=0.9,
                                      epsilon=1e-3)
    assert type(norm) is tf_keras.layers.BatchNormalization
    assert norm.synchronized
    with pytest.raises(ValueError, match=(
            r"impl must be one of \('custom', 'keras'\), got 'tf_keras'")):
        sync_batch_norm.batch_norm('bn', sync_bn=True, momentum=0.9,
                                   epsilon=1e-3, impl='tf_keras')
