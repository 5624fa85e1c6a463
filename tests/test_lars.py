"""Tests for paws_tf.lars against a NumPy re-implementation."""

import gin
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from paws_tf import lars
from paws_tf import schedules

MOMENTUM = 0.9
WEIGHT_DECAY = 0.05
# Large enough that adaptation visibly changes the trajectory.
TRUST_COEFFICIENT = 0.5
EPS = 1e-8
LRS = [0.2, 0.5, 1.0, 0.8, 0.3, 0.1]


class _ListSchedule(tf_keras.optimizers.schedules.LearningRateSchedule):
    """lr = lrs[step], so the NumPy reference can use the same list."""

    def __init__(self, lrs):
        super().__init__()
        self.lrs = list(lrs)

    def __call__(self, step):
        return tf.gather(tf.constant(self.lrs, tf.float32),
                         tf.minimum(step, len(self.lrs) - 1))

    def get_config(self):
        return {'lrs': self.lrs}


def _initial_values():
    """name -> float32 array; the names exercise the default exclusions."""
    rng = np.random.default_rng(0)
    return {
        'dense/kernel': rng.normal(size=(3, 2)).astype(np.float32),
        'dense/bias': rng.normal(size=(2,)).astype(np.float32),
        'batch_normalization/gamma': (
            1.0 + 0.1 * rng.normal(size=(2,))).astype(np.float32),
        'batch_normalization/beta': rng.normal(size=(2,)).astype(np.float32),
        'zero_init/kernel': np.zeros((2, 2), np.float32),
        'unused/kernel': rng.normal(size=(3,)).astype(np.float32),
    }


def _gradients(values, num_steps, seed=1):
    """Per-step gradients: a list of name -> float32 array dicts.

    `unused/kernel` always gets a zero gradient.
    """
    rng = np.random.default_rng(seed)
    return [{name: (np.zeros_like(v) if name == 'unused/kernel' else
                    rng.normal(size=v.shape).astype(np.float32))
             for name, v in values.items()} for _ in range(num_steps)]


def _numpy_lars(values, grads, lrs, adapted, momentum=MOMENTUM,
                weight_decay=WEIGHT_DECAY, trust_coefficient=TRUST_COEFFICIENT,
                eps=EPS):
    """PAWS Appendix A Eq. (mom) with LARS adaptation, in float64. Where a
    norm is zero the official code (facebookresearch/suncet src/lars.py,
    `LARS.step`: `if param_norm != 0 and grad_norm != 0`) neither adds the
    weight decay nor scales the gradient.

    Args:
        values: name -> initial array.
        grads: list (one per step) of name -> gradient array.
        lrs: list of learning rates, one per step.
        adapted: name -> bool, False for excluded variables.

    Returns:
        (values, velocities, trust ratios of the last step) dicts by name;
        trust ratios only for adapted names.
    """
    values = {k: v.astype(np.float64) for k, v in values.items()}
    velocities = {k: np.zeros_like(v) for k, v in values.items()}
    ratios = {}
    for step_grads, lr in zip(grads, lrs):
        for name, theta in values.items():
            g = step_grads[name].astype(np.float64)
            if adapted[name]:
                d, ratio = g, 1.0
                theta_norm, g_norm = np.linalg.norm(theta), np.linalg.norm(g)
                if theta_norm > 0 and g_norm > 0:
                    d = g + weight_decay * theta
                    ratio = trust_coefficient * theta_norm / (
                        g_norm + weight_decay * theta_norm + eps)
                ratios[name] = ratio
            else:
                d, ratio = g, 1.0
            velocities[name] = momentum * velocities[name] - lr * ratio * d
            values[name] = theta + velocities[name]
    return values, velocities, ratios


def _make_variables(values):
    return [tf.Variable(v, name=k) for k, v in values.items()]


def _name(variable):
    return variable.name.split(':')[0]


def _run_lars(optimizer, variables, grads, mode='tf.function'):
    """Applies `grads` (from `_gradients`); returns the last stats dict.

    `mode` is 'eager', 'tf.function' or 'xla' (`jit_compile=True`, as a
    `Model.compile(jit_compile=True)` train step runs the optimizer).
    """

    def step(step_grads):
        optimizer.apply_gradients(zip(step_grads, variables))
        return optimizer.trust_ratio_stats()

    if mode != 'eager':
        step = tf.function(step, jit_compile=mode == 'xla')
    for step_grads in grads:
        stats = step([tf.constant(step_grads[_name(v)]) for v in variables])
    return stats


def _stats(ratios):
    ratios = list(ratios.values())
    return np.mean(ratios), np.min(ratios), np.max(ratios)


@pytest.fixture(name='clean_gin')
def fixture_clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def _make_lars(lrs=LRS, **kwargs):
    kwargs = dict(dict(momentum=MOMENTUM, weight_decay=WEIGHT_DECAY,
                       trust_coefficient=TRUST_COEFFICIENT, eps=EPS), **kwargs)
    return lars.LARS(learning_rate=_ListSchedule(lrs), **kwargs)


def _default_adapted(values):
    return {name: not name.endswith(('bias', 'gamma', 'beta'))
            for name in values}


def _assert_matches(variables, want_values, rtol=1e-5, atol=1e-6):
    for var in variables:
        np.testing.assert_allclose(var.numpy(), want_values[_name(var)],
                                   rtol=rtol, atol=atol, err_msg=var.name)


@pytest.mark.parametrize('mode', ['eager', 'tf.function', 'xla'])
def test_trajectory_matches_numpy(mode):
    values = _initial_values()
    grads = _gradients(values, len(LRS))
    variables = _make_variables(values)
    optimizer = _make_lars()
    stats = _run_lars(optimizer, variables, grads, mode)

    want_values, want_velocities, want_ratios = _numpy_lars(
        values, grads, LRS, _default_adapted(values))
    _assert_matches(variables, want_values)
    for var, velocity in zip(variables, optimizer.momentums):
        np.testing.assert_allclose(velocity.numpy(),
                                   want_velocities[_name(var)],
                                   rtol=1e-5, atol=1e-6, err_msg=var.name)
    # One trust-ratio slot per adapted variable, in variable order.
    adapted_names = ['dense/kernel', 'zero_init/kernel', 'unused/kernel']
    np.testing.assert_allclose(
        [float(slot) for slot in optimizer.trust_ratios],
        [want_ratios[name] for name in adapted_names], rtol=1e-5)
    np.testing.assert_allclose(
        [float(stats[key]) for key in ('mean', 'min', 'max')],
        _stats(want_ratios), rtol=1e-5)
    assert int(optimizer.iterations) == len(LRS)


def test_adaptation_and_decay_change_the_trajectory():
    # Guards the reference itself: the exclusions and the zero-norm
    # fallbacks above are not no-ops with these hyperparameters.
    values = _initial_values()
    grads = _gradients(values, len(LRS))
    adapted, _, ratios = _numpy_lars(values, grads, LRS,
                                     _default_adapted(values))
    plain, _, _ = _numpy_lars(values, grads, LRS,
                              {name: False for name in values})
    assert np.abs(adapted['dense/kernel'] - plain['dense/kernel']).max() > 0.1
    assert ratios['unused/kernel'] == 1.0
    # Without gradient, the official code does not decay it either (a decay
    # applied there moves it: test_trajectory_matches_numpy then fails).
    np.testing.assert_array_equal(adapted['unused/kernel'],
                                  values['unused/kernel'])


def _numpy_tf_style_momentum(values, grads, lrs, momentum=MOMENTUM):
    """v <- beta v + g; theta <- theta - lr v (PAWS Appendix A, Eq. 2)."""
    values = {k: v.astype(np.float64) for k, v in values.items()}
    velocities = {k: np.zeros_like(v) for k, v in values.items()}
    for step_grads, lr in zip(grads, lrs):
        for name in values:
            velocities[name] = momentum * velocities[name] + step_grads[name]
            values[name] = values[name] - lr * velocities[name]
    return values


def test_momentum_is_classical_not_tf_style():
    values = _initial_values()
    grads = _gradients(values, len(LRS))
    never_adapt = {name: False for name in values}

    variables = _make_variables(values)
    _run_lars(_make_lars(exclude_from_adaptation=lambda name: True),
              variables, grads)
    classical, _, _ = _numpy_lars(values, grads, LRS, never_adapt)
    tf_style = _numpy_tf_style_momentum(values, grads, LRS)
    _assert_matches(variables, classical)
    # With a changing learning rate the two forms differ ...
    assert np.abs(classical['dense/kernel'] - tf_style['dense/kernel']).max(
    ) > 0.1

    # ... and with a constant one they coincide.
    constant_lrs = [0.3] * len(LRS)
    variables = _make_variables(values)
    _run_lars(_make_lars(constant_lrs,
                         exclude_from_adaptation=lambda name: True),
              variables, grads)
    _assert_matches(variables,
                    _numpy_tf_style_momentum(values, grads, constant_lrs))


@pytest.mark.parametrize('name, excluded', [
    ('dense/kernel:0', False),
    ('conv2d/bias:0', True),
    ('encoder/conv1/bias:0', True),
    ('batch_normalization/gamma:0', True),
    ('encoder/block1/batch_normalization_3/beta:0', True),
    ('layer_normalization/gamma:0', True),
    ('bias', True),
    ('batch_normalization/moving_mean:0', False),
    ('bn_beta:0', False),
    ('dense/bias_kernel:0', False),
    ('gamma/kernel:0', False),
    ('dense/kernel_bias:0', False),
])
def test_default_exclusion_predicate(name, excluded):
    assert lars.is_bias_or_norm(name) is excluded


@pytest.mark.parametrize('exclude', [lambda name: 'kernel' in name,
                                     'kernel'])
def test_custom_exclusion_is_honoured(exclude):
    values = _initial_values()
    grads = _gradients(values, 3)
    variables = _make_variables(values)
    optimizer = _make_lars(exclude_from_adaptation=exclude)
    _run_lars(optimizer, variables, grads)

    adapted = {name: 'kernel' not in name for name in values}
    want_values, _, want_ratios = _numpy_lars(values, grads, LRS[:3], adapted)
    _assert_matches(variables, want_values)
    assert len(optimizer.trust_ratios) == 3
    np.testing.assert_allclose(
        [float(slot) for slot in optimizer.trust_ratios],
        [want_ratios[name] for name in ('dense/bias',
                                        'batch_normalization/gamma',
                                        'batch_normalization/beta')],
        rtol=1e-5)


def test_invalid_exclusion_raises():
    with pytest.raises(TypeError, match='exclude_from_adaptation'):
        lars.LARS(learning_rate=0.1, exclude_from_adaptation=3)


def test_trust_ratio_stats_are_one_without_adapted_variables():
    optimizer = _make_lars(exclude_from_adaptation=lambda name: True)
    for stats in (optimizer.trust_ratio_stats(),
                  _run_lars(optimizer, _make_variables(_initial_values()),
                            _gradients(_initial_values(), 1))):
        assert {k: float(v) for k, v in stats.items()} == {
            'mean': 1.0, 'min': 1.0, 'max': 1.0}
        assert all(v.dtype == tf.float32 for v in stats.values())


def test_sparse_gradient_matches_dense():
    table = np.arange(8, dtype=np.float32).reshape(4, 2) / 8.0
    results = []
    for densify in (False, True):
        variable = tf.Variable(table, name='embedding/embeddings')
        optimizer = _make_lars()
        for _ in range(2):
            with tf.GradientTape() as tape:
                rows = tf.gather(variable, [0, 2, 2])
                loss = tf.reduce_sum(rows * [[1.0, -2.0]])
            grad = tape.gradient(loss, variable)
            assert isinstance(grad, tf.IndexedSlices)
            if densify:
                grad = tf.convert_to_tensor(grad)
            optimizer.apply_gradients([(grad, variable)])
        results.append(variable.numpy())
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6)
    assert np.abs(results[0] - table).max() > 0


def test_mirrored_strategy_sums_replica_gradients_once(two_replicas):
    strategy = two_replicas
    values = _initial_values()
    grads = _gradients(values, 3)
    names = list(values)
    with strategy.scope():
        variables = _make_variables(values)
        optimizer = _make_lars()

    def replica_step(step_grads):
        replica_id = tf.distribute.get_replica_context(
        ).replica_id_in_sync_group
        # Replica r sends (r + 1) g: the all-reduced (summed) gradient is 3 g.
        scale = tf.cast(replica_id, tf.float32) + 1.0
        optimizer.apply_gradients(
            zip([scale * g for g in step_grads], variables))
        return optimizer.trust_ratio_stats()

    @tf.function
    def step(step_grads):
        return strategy.run(replica_step, args=(step_grads,))

    for step_grads in grads:
        stats = step([tf.constant(step_grads[name]) for name in names])

    summed = [{name: 3.0 * g[name] for name in names} for g in grads]
    want_values, _, want_ratios = _numpy_lars(values, summed, LRS[:3],
                                              _default_adapted(values))
    for var in variables:
        for local in strategy.experimental_local_results(var):
            np.testing.assert_allclose(local.numpy(), want_values[_name(var)],
                                       rtol=1e-5, atol=1e-6, err_msg=var.name)
    for key, want in zip(('mean', 'min', 'max'), _stats(want_ratios)):
        for local in strategy.experimental_local_results(stats[key]):
            np.testing.assert_allclose(float(local), want, rtol=1e-5)
    assert optimizer.iterations.numpy() == 3


def test_checkpoint_restores_slots_and_iterations(tmp_path):
    values = _initial_values()
    grads = _gradients(values, 5)

    def make(initial_values):
        variables = _make_variables(initial_values)
        optimizer = lars.LARS(
            learning_rate=schedules.WarmupCosineDecay(
                steps_per_epoch=2, num_epochs=3, start_lr=0.1, ref_lr=1.0,
                final_lr=0.01, warmup_epochs=1),
            weight_decay=WEIGHT_DECAY, trust_coefficient=TRUST_COEFFICIENT)
        model = tf.Module()
        model.variables_list = variables
        return variables, optimizer, tf.train.Checkpoint(optimizer=optimizer,
                                                         model=model)

    variables, optimizer, checkpoint = make(values)
    _run_lars(optimizer, variables, grads[:3])
    path = checkpoint.save(str(tmp_path / 'ckpt'))
    saved_slots = [v.numpy() for v in optimizer.momentums +
                   optimizer.trust_ratios]
    _run_lars(optimizer, variables, grads[3:])

    zeros = {name: np.zeros_like(v) for name, v in values.items()}
    restored_vars, restored_opt, restored_ckpt = make(zeros)
    restored_ckpt.restore(path).assert_existing_objects_matched()
    assert int(restored_opt.iterations) == 3
    restored_opt.build(restored_vars)  # Slots are restored on creation.
    for got, want in zip(restored_opt.momentums + restored_opt.trust_ratios,
                         saved_slots):
        np.testing.assert_array_equal(got.numpy(), want)

    _run_lars(restored_opt, restored_vars, grads[3:])
    for got, want in zip(restored_vars + restored_opt.momentums,
                         variables + optimizer.momentums):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


def test_loss_scale_optimizer_gives_same_update():
    values = _initial_values()
    targets = {name: np.full_like(v, 0.5) for name, v in values.items()}

    def train(wrap):
        variables = _make_variables(values)
        optimizer = _make_lars()
        if wrap:
            optimizer = tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
        for _ in range(3):
            with tf.GradientTape() as tape:
                loss = tf.add_n([
                    tf.reduce_sum(tf.square(v - targets[_name(v)]))
                    for v in variables])
            optimizer.minimize(loss, variables, tape=tape)
        return variables, optimizer

    plain_vars, plain_opt = train(wrap=False)
    scaled_vars, scaled_opt = train(wrap=True)
    assert float(scaled_opt.loss_scale) > 1.0
    for got, want in zip(scaled_vars, plain_vars):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    got_stats = scaled_opt.inner_optimizer.trust_ratio_stats()
    for key, want in plain_opt.trust_ratio_stats().items():
        np.testing.assert_allclose(float(got_stats[key]), float(want),
                                   rtol=1e-6)


def test_get_config_round_trip():
    schedule = schedules.WarmupCosineDecay(
        steps_per_epoch=4, num_epochs=3, start_lr=0.3, ref_lr=6.4,
        warmup_epochs=1)
    optimizer = lars.LARS(learning_rate=schedule, momentum=0.8,
                          weight_decay=1e-4, trust_coefficient=0.02,
                          eps=1e-9, exclude_from_adaptation='bias$',
                          global_clipnorm=1.0, name='lars_test')
    config = optimizer.get_config()
    assert config['weight_decay'] == 1e-4
    assert optimizer.weight_decay is None  # Base-class decay stays off.
    for clone in (lars.LARS.from_config(dict(config)),
                  tf_keras.optimizers.deserialize(
                      tf_keras.optimizers.serialize(optimizer),
                      use_legacy_optimizer=False)):
        assert isinstance(clone, lars.LARS)
        assert clone.get_config() == config
        assert isinstance(clone._learning_rate, schedules.WarmupCosineDecay)
        assert clone.exclude_from_adaptation('dense/bias')
        assert not clone.exclude_from_adaptation('bn/gamma')

    constant = lars.LARS(learning_rate=0.25)
    clone = lars.LARS.from_config(constant.get_config())
    np.testing.assert_allclose(float(clone.learning_rate), 0.25)
    assert clone.get_config() == constant.get_config()


@pytest.mark.parametrize('kwargs', [dict(momentum=1.0), dict(momentum=-0.1),
                                    dict(weight_decay=-1e-6),
                                    dict(eps=-1.0),
                                    dict(trust_coefficient=0.0)])
def test_invalid_hyperparameters_raise(kwargs):
    with pytest.raises(ValueError, match=list(kwargs)[0]):
        lars.LARS(learning_rate=0.1, **kwargs)


def test_gin_binding_is_picked_up(clean_gin):
    gin.parse_config('LARS.momentum = 0.8')
    assert lars.LARS(learning_rate=0.1).momentum == 0.8
