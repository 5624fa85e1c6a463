"""Tests for paws_tf.nets.heads."""

import gin
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from paws_tf.nets import heads

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


def test_sync_bn_heads_use_global_batch_statistics(two_replicas):
    strategy = two_replicas
    features = np.random.RandomState(3).normal(
        size=(8, 6)).astype(np.float32)
    features[4:] = 3.0 * features[4:] - 1.0
    results = {}
    for sync_bn in (True, False):
        with strategy.scope():
            projection = heads.ProjectionHead(hidden_dim=5, output_dim=4,
                                              sync_bn=sync_bn)
            prediction = heads.PredictionHead(hidden_dim=3, output_dim=4,
                                              sync_bn=sync_bn)
        reference = [heads.ProjectionHead(hidden_dim=5, output_dim=4),
                     heads.PredictionHead(hidden_dim=3, output_dim=4)]
        reference[1](reference[0](features))
        prediction(projection(features))
        for ref, head in zip(reference, (projection, prediction)):
            ref.set_weights(head.get_weights())
        halves = strategy.experimental_distribute_values_from_function(
            lambda ctx: features[4 * ctx.replica_id_in_sync_group:][:4])

        @tf.function
        def forward(x):
            return strategy.run(
                lambda h: prediction(projection(h, training=True),
                                     training=True), args=(x,))

        got = np.concatenate(strategy.experimental_local_results(
            forward(halves)))  # [8, 4]
        want = reference[1](reference[0](features, training=True),
                            training=True).numpy()
        results[sync_bn] = np.abs(got - want).max()
    assert results[True] < 1e-5
    assert results[False] > 1e-2


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


@pytest.mark.parametrize('policy', ['mixed_bfloat16', 'mixed_float16'])
def test_mixed_precision(policy):
    tf_keras.mixed_precision.set_global_policy(policy)
    try:
        projection = heads.ProjectionHead(hidden_dim=8, output_dim=4)
        prediction = heads.PredictionHead(hidden_dim=2, output_dim=4)
    finally:
        tf_keras.mixed_precision.set_global_policy('float32')
    z = prediction(projection(tf.random.normal([4, 6]), training=True),
                   training=True)
    assert z.dtype == tf_keras.mixed_precision.Policy(policy).compute_dtype
    assert all(v.dtype == tf.float32 for v in projection.variables)
    assert np.isfinite(tf.cast(z, tf.float32).numpy()).all()


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


def test_get_config_round_trip():
    head = heads.ProjectionHead(num_layers=2, hidden_dim=7, output_dim=5,
                                sync_bn=True, bn_momentum=0.5)
    clone = heads.ProjectionHead.from_config(head.get_config())
    assert clone.get_config() == head.get_config()
    assert _layer_types(clone) == _layer_types(head)
    assert clone.mlp_layers[1].synchronized
    pred = heads.PredictionHead(hidden_dim=3, output_dim=6)
    assert heads.PredictionHead.from_config(
        pred.get_config()).get_config() == pred.get_config()


def test_gin_configures_heads():
    gin.clear_config()
    try:
        gin.parse_config("""
            ProjectionHead.hidden_dim = 128
            ProjectionHead.output_dim = 128
            PredictionHead.hidden_dim = 32
        """)
        projection = heads.ProjectionHead()
        prediction = heads.PredictionHead(output_dim=128)
    finally:
        gin.clear_config()
    assert (projection.hidden_dim, projection.output_dim) == (128, 128)
    assert prediction.hidden_dim == 32


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
