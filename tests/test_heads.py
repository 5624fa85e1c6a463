"""Tests for paws_tf.nets.heads."""

import math

import gin
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from paws_tf.nets import heads
from paws_tf.nets import sync_batch_norm

EPSILON = 1e-5
EXCLUDED_SUFFIXES = ('bias', 'beta', 'gamma')


def _layer_types(head):
    return [type(layer).__name__ for layer in head.mlp_layers]


def _short_name(variable):
    return variable.name.split('/')[-1].split(':')[0]


def _randomise(head, rng):
    """Random kernels, biases, BN affine and moving statistics."""
    for variable in head.variables:
        value = rng.normal(size=variable.shape)
        if 'moving_variance' in variable.name:
            value = rng.uniform(0.5, 2.0, size=variable.shape)
        variable.assign(value.astype(np.float32))


def _dense(x, layer):
    return x @ layer.kernel.numpy() + layer.bias.numpy()


def _bn_inference(x, layer):
    scale = layer.gamma.numpy() / np.sqrt(
        layer.moving_variance.numpy() + EPSILON)
    return (x - layer.moving_mean.numpy()) * scale + layer.beta.numpy()


@pytest.mark.parametrize('num_layers', [1, 2, 3])
def test_projection_head_structure(num_layers):
    head = heads.ProjectionHead(num_layers=num_layers, hidden_dim=16,
                                output_dim=8)
    assert head(tf.zeros([2, 12])).shape == (2, 8)
    hidden = ['Linear', 'BatchNormalization', 'ReLU'] * (num_layers - 1)
    assert _layer_types(head) == hidden + ['Linear']
    dense = [l for l in head.mlp_layers if isinstance(
        l, tf_keras.layers.Dense)]
    assert [l.units for l in dense] == [16] * (num_layers - 1) + [8]
    assert all(l.use_bias for l in dense)
    assert dense[0].kernel.shape == (12, 16 if num_layers > 1 else 8)


def test_default_sizes():
    projection = heads.ProjectionHead()
    prediction = heads.PredictionHead()
    h = projection(tf.zeros([2, 32]))  # [B, 2048]
    assert h.shape == (2, 2048)
    assert prediction(h).shape == (2, 2048)
    assert [l.units for l in prediction.mlp_layers
            if isinstance(l, tf_keras.layers.Dense)] == [512, 2048]


def test_prediction_head_structure():
    head = heads.PredictionHead(hidden_dim=4, output_dim=16)
    assert head(tf.zeros([2, 16])).shape == (2, 16)
    assert _layer_types(head) == ['BatchNormalization', 'Linear',
                                  'BatchNormalization', 'ReLU', 'Linear']
    assert all(l.use_bias for l in head.mlp_layers
               if isinstance(l, tf_keras.layers.Dense))


def test_projection_head_matches_numpy_in_inference():
    rng = np.random.RandomState(0)
    head = heads.ProjectionHead(num_layers=3, hidden_dim=4, output_dim=3)
    x = rng.normal(size=(5, 6)).astype(np.float32)
    head(x)
    _randomise(head, rng)
    fc1, bn1, _, fc2, bn2, _, fc3 = head.mlp_layers
    y = np.maximum(_bn_inference(_dense(x, fc1), bn1), 0.0)
    y = np.maximum(_bn_inference(_dense(y, fc2), bn2), 0.0)
    want = _dense(y, fc3)
    np.testing.assert_allclose(head(x, training=False), want, rtol=1e-5,
                               atol=1e-5)


def test_prediction_head_matches_numpy_in_inference():
    rng = np.random.RandomState(1)
    head = heads.PredictionHead(hidden_dim=2, output_dim=5)
    x = rng.normal(size=(4, 5)).astype(np.float32)
    head(x)
    _randomise(head, rng)
    bn0, fc1, bn1, _, fc2 = head.mlp_layers
    y = np.maximum(_bn_inference(_dense(_bn_inference(x, bn0), fc1), bn1), 0)
    np.testing.assert_allclose(head(x, training=False), _dense(y, fc2),
                               rtol=1e-5, atol=1e-5)


def _gelu(x):
    """Exact GELU, x * Phi(x), as PyTorch's `nn.GELU()`."""
    return x * 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _tanh_gelu(x):
    """GELU's tanh approximation, `nn.GELU(approximate='tanh')`."""
    return 0.5 * x * (1.0 + np.tanh(
        math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize('training', [False, True])
def test_gelu_heads_match_numpy(training):
    """Fails if the GELU is the tanh approximation or a ReLU, or if a
    hidden layer skips its activation."""
    rng = np.random.RandomState(3)
    projection = heads.ProjectionHead(num_layers=3, hidden_dim=4,
                                      output_dim=3, activation='gelu')
    prediction = heads.PredictionHead(hidden_dim=4, output_dim=3,
                                      activation='gelu')
    x = rng.normal(size=(6, 5)).astype(np.float32)
    prediction(projection(x))
    _randomise(projection, rng)
    _randomise(prediction, rng)
    fc1, bn1, _, fc2, bn2, _, fc3 = projection.mlp_layers
    bn0, pfc1, pbn1, _, pfc2 = prediction.mlp_layers

    def norm(y, layer):
        if training:
            return _bn_training(y, layer, 1)
        return _bn_inference(y, layer)

    def forward(act):
        y = act(norm(_dense(x, fc1), bn1))
        h = _dense(act(norm(_dense(y, fc2), bn2)), fc3)
        z = _dense(act(norm(_dense(norm(h, bn0), pfc1), pbn1)), pfc2)
        return h, z

    h = projection(x, training=training)
    z = prediction(h, training=training)
    want_h, want_z = forward(_gelu)
    np.testing.assert_allclose(h, want_h, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(z, want_z, rtol=1e-5, atol=1e-5)
    # The check tells the exact GELU from its tanh approximation.
    assert np.abs(forward(_tanh_gelu)[1] - want_z).max() > 1e-4
    assert _layer_types(prediction)[3] == 'Activation'


def test_training_mode_uses_batch_stats_and_updates_moving_stats():
    rng = np.random.RandomState(2)
    head = heads.ProjectionHead(num_layers=2, hidden_dim=3, output_dim=2,
                                bn_momentum=0.8)
    x = rng.normal(2.0, 3.0, size=(6, 4)).astype(np.float32)
    inference = head(x, training=False).numpy()
    fc1, bn1, _, fc2 = head.mlp_layers
    np.testing.assert_array_equal(bn1.moving_mean.numpy(), 0.0)
    hidden = _dense(x, fc1)  # BN init: gamma 1, beta 0
    normed = (hidden - hidden.mean(0)) / np.sqrt(hidden.var(0) + EPSILON)
    want = _dense(np.maximum(normed, 0.0), fc2)
    np.testing.assert_allclose(head(x, training=True), want, rtol=1e-4,
                               atol=1e-4)
    # Keras convention: new = momentum * old + (1 - momentum) * batch.
    np.testing.assert_allclose(bn1.moving_mean, 0.2 * hidden.mean(0),
                               rtol=1e-5)
    assert not np.allclose(inference, want, atol=1e-3)


def _bn_training(x, layer, groups):
    """Batch norm of x [B, C] in training mode, each of `groups` equal row
    blocks on its own mean and variance (no Bessel's correction)."""
    out = []
    for block in np.split(x, groups):
        out.append((block - block.mean(0)) / np.sqrt(block.var(0) + EPSILON)
                   * layer.gamma.numpy() + layer.beta.numpy())
    return np.concatenate(out)


# With `sync_bn`, either implementation; without, each replica's own batch.
NORMS = [dict(sync_bn=True, sync_bn_impl='keras'),
         dict(sync_bn=True, sync_bn_impl='custom'),
         dict(sync_bn=False)]


@pytest.mark.parametrize('norms', NORMS, ids=['keras', 'custom', 'local'])
def test_heads_train_on_the_global_batch_statistics(norms, two_replicas):
    """Both heads on two replicas (logical CPUs), each replica on half of a
    batch whose halves differ: with `sync_bn`, for either implementation,
    the outputs and moving statistics are those of batch norm over the
    whole batch, by hand in NumPy; without, of each half alone."""
    strategy = two_replicas
    rng = np.random.RandomState(3)
    features = rng.normal(size=(8, 6)).astype(np.float32)
    features[4:] = 3.0 * features[4:] - 1.0
    with strategy.scope():
        projection = heads.ProjectionHead(hidden_dim=5, output_dim=4,
                                          bn_momentum=0.8, **norms)
        prediction = heads.PredictionHead(hidden_dim=3, output_dim=4,
                                          bn_momentum=0.8, **norms)
        prediction(projection(features))
    norm_layers = [layer for head in (projection, prediction)
                   for layer in head.mlp_layers
                   if isinstance(layer, tf_keras.layers.BatchNormalization)]
    assert len(norm_layers) == 4
    for layer in norm_layers:
        assert layer.synchronized == norms['sync_bn']
        assert isinstance(
            layer, sync_batch_norm.GlobalBatchNormalization) == (
                norms.get('sync_bn_impl') == 'custom')
    for head in (projection, prediction):
        _randomise(head, rng)
    before = [(layer.moving_mean.numpy(), layer.moving_variance.numpy())
              for layer in norm_layers]
    # NumPy: every batch norm on the global batch (1 group) or per replica.
    groups = 1 if norms['sync_bn'] else 2
    fc1, bn1, _, fc2, bn2, _, fc3 = projection.mlp_layers
    p_bn0, p_fc1, p_bn1, _, p_fc2 = prediction.mlp_layers
    inputs = {}  # Each batch norm's input, for its moving statistics.

    def norm(x, layer):
        inputs[id(layer)] = x
        return _bn_training(x, layer, groups)

    h = np.maximum(norm(_dense(features, fc1), bn1), 0.0)
    h = _dense(np.maximum(norm(_dense(h, fc2), bn2), 0.0), fc3)
    y = norm(h, p_bn0)
    want = _dense(np.maximum(norm(_dense(y, p_fc1), p_bn1), 0.0), p_fc2)

    halves = strategy.experimental_distribute_values_from_function(
        lambda ctx: features[4 * ctx.replica_id_in_sync_group:][:4])

    @tf.function
    def forward(x):
        return strategy.run(
            lambda h: prediction(projection(h, training=True),
                                 training=True), args=(x,))

    got = np.concatenate(strategy.experimental_local_results(
        forward(halves)))  # [8, 4]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if not norms['sync_bn']:
        return
    for layer, (mean, variance) in zip(norm_layers, before):
        x = inputs[id(layer)]
        for moving, old, batch in ((layer.moving_mean, mean, x.mean(0)),
                                   (layer.moving_variance, variance,
                                    x.var(0))):
            for replica_value in strategy.experimental_local_results(moving):
                np.testing.assert_allclose(replica_value,
                                           0.8 * old + 0.2 * batch,
                                           rtol=1e-4, atol=1e-4)


def test_lars_exclusion_names():
    projection = heads.ProjectionHead(hidden_dim=4, output_dim=3)
    prediction = heads.PredictionHead(hidden_dim=2, output_dim=3)
    prediction(projection(tf.zeros([2, 5])))
    for head in (projection, prediction):
        excluded, kernels = set(), set()
        for layer in head.mlp_layers:
            if isinstance(layer, tf_keras.layers.BatchNormalization):
                excluded.update({id(layer.gamma), id(layer.beta)})
            elif isinstance(layer, tf_keras.layers.Dense):
                excluded.add(id(layer.bias))
                kernels.add(id(layer.kernel))
        names = {_short_name(v): set() for v in head.trainable_variables}
        for variable in head.trainable_variables:
            names[_short_name(variable)].add(id(variable))
        assert set(names) == {'kernel', 'bias', 'gamma', 'beta'}
        assert names['kernel'] == kernels
        assert names['bias'] | names['gamma'] | names['beta'] == excluded


def _heads(policy, inputs):
    tf_keras.mixed_precision.set_global_policy(policy)
    try:
        projection = heads.ProjectionHead(hidden_dim=8, output_dim=4)
        prediction = heads.PredictionHead(hidden_dim=2, output_dim=4)
    finally:
        tf_keras.mixed_precision.set_global_policy('float32')
    prediction(projection(inputs, training=True), training=True)
    return projection, prediction


@pytest.mark.parametrize('policy,roundoff', [('mixed_bfloat16', 2 ** -8),
                                             ('mixed_float16', 2 ** -11)])
def test_mixed_precision(policy, roundoff):
    """Float32 variables, outputs in the compute dtype that equal float32's
    with the same weights within 6 unit roundoffs, as the relative norm of
    the difference (batch norm over 4 rows amplifies rounding; measured
    over initialisation seeds 0-19: at most 4.3 for bfloat16, 4.7 for
    float16; 1.5 and 1.3 at seed 0, used here).

    Fails if the mixed-precision heads scale their output by 1.03 (1.01:
    float16 only).
    """
    tf_keras.utils.set_random_seed(0)
    inputs = tf.random.stateless_normal([4, 6], seed=[1, 2])
    projection, prediction = _heads(policy, inputs)
    reference = _heads('float32', inputs)
    for layer, weights in zip((projection, prediction), reference):
        layer.set_weights(weights.get_weights())
    z = prediction(projection(inputs, training=True), training=True)
    want = reference[1](reference[0](inputs, training=True),
                        training=True).numpy()
    assert z.dtype == tf_keras.mixed_precision.Policy(policy).compute_dtype
    assert all(v.dtype == tf.float32 for v in projection.variables)
    error = np.linalg.norm(tf.cast(z, tf.float32).numpy() - want)
    assert error < 6 * roundoff * np.linalg.norm(want), error


def test_linear_layers_have_pytorchs_default_init():
    """Every nn.Linear of the official heads keeps reset_parameters:
    weights and bias U(+-1/sqrt(fan_in)). fc1 sees the 256 backbone
    features, the others the previous layer's width."""
    tf_keras.utils.set_random_seed(0)
    projection = heads.ProjectionHead(hidden_dim=96, output_dim=64)
    prediction = heads.PredictionHead(hidden_dim=64, output_dim=64)
    prediction(projection(tf.zeros([2, 256])))
    layers = [(layer, fan_in) for head, fans in (
        (projection, (256, 96, 96)), (prediction, (64, 64)))
        for layer, fan_in in zip(
            [l for l in head.mlp_layers if isinstance(l, heads.Linear)],
            fans)]
    assert len(layers) == 5
    for layer, fan_in in layers:
        bound = 1 / np.sqrt(fan_in)
        for values in (layer.kernel.numpy(), layer.bias.numpy()):
            assert np.abs(values).max() <= bound, layer.name
            # The uniform's std, bound / sqrt(3): within 10% for the
            # >= 4096 kernel values, 25% for the >= 64 biases (4 standard
            # errors of the sample std).
            np.testing.assert_allclose(
                values.std(), bound / np.sqrt(3),
                rtol=0.1 if values.ndim == 2 else 0.25, err_msg=layer.name)


@pytest.mark.parametrize('sync_bn_impl', ['keras', 'custom'])
def test_get_config_round_trip(sync_bn_impl):
    head = heads.ProjectionHead(num_layers=2, hidden_dim=7, output_dim=5,
                                sync_bn=True, sync_bn_impl=sync_bn_impl,
                                bn_momentum=0.5)
    clone = heads.ProjectionHead.from_config(head.get_config())
    assert clone.get_config() == head.get_config()
    assert _layer_types(clone) == _layer_types(head)
    assert clone.mlp_layers[1].synchronized
    assert type(clone.mlp_layers[1]) is type(head.mlp_layers[1])
    pred = heads.PredictionHead(hidden_dim=3, output_dim=6,
                                activation='gelu')
    pred_clone = heads.PredictionHead.from_config(pred.get_config())
    assert pred_clone.get_config() == pred.get_config()
    assert pred_clone.activation == 'gelu'
    assert _layer_types(pred_clone) == _layer_types(pred)


def test_gin_configures_heads():
    gin.clear_config()
    try:
        gin.parse_config("""
            ProjectionHead.hidden_dim = 128
            ProjectionHead.output_dim = 128
            PredictionHead.hidden_dim = 32
            PredictionHead.activation = 'gelu'
        """)
        projection = heads.ProjectionHead()
        prediction = heads.PredictionHead(output_dim=128)
    finally:
        gin.clear_config()
    assert (projection.hidden_dim, projection.output_dim) == (128, 128)
    assert prediction.hidden_dim == 32
    assert (projection.activation, prediction.activation) == ('relu',
                                                              'gelu')
    assert _layer_types(prediction)[3] == 'Activation'


@pytest.mark.parametrize('head', ['ProjectionHead', 'PredictionHead'])
def test_gin_refuses_the_batch_norm_settings_of_build_model(head):
    """`sync_bn` and `sync_bn_impl` are `build_model`'s, for the backbone
    and heads alike: bound on a head they would be overridden unseen."""
    gin.clear_config()
    try:
        for parameter in ('sync_bn', 'sync_bn_impl'):
            with pytest.raises(ValueError, match=(
                    f"'{head}' has denylisted kwarg '{parameter}'")):
                gin.parse_config(f"{head}.{parameter} = 'custom'")
    finally:
        gin.clear_config()


@pytest.mark.parametrize('make,message', [
    (lambda: heads.ProjectionHead(num_layers=0), 'num_layers'),
    (lambda: heads.ProjectionHead(hidden_dim=0), 'hidden_dim'),
    (lambda: heads.PredictionHead(output_dim=0), 'output_dim'),
    (lambda: heads.PredictionHead(output_dim='2048'), 'output_dim'),
])
def test_bad_sizes(make, message):
    with pytest.raises(ValueError,
                       match=f'{message} must be a positive integer, got'):
        make()


@pytest.mark.parametrize('head', [heads.ProjectionHead, heads.PredictionHead])
def test_bad_sync_bn_impl(head):
    with pytest.raises(ValueError, match=(
            r"sync_bn_impl must be one of \('custom', 'keras'\), got "
            r"'global'")):
        head(sync_bn=True, sync_bn_impl='global')


@pytest.mark.parametrize('head', [heads.ProjectionHead, heads.PredictionHead])
def test_bad_activation(head):
    with pytest.raises(ValueError, match="activation must be one of"):
        head(activation='swish')
