"""Tests for paws_tf.adamw against NumPy and torch.optim.AdamW."""

import math

import gin
import numpy as np
import pytest
import tensorflow as tf
import tf_keras
import torch

from paws_tf import adamw
from paws_tf import checks
from paws_tf import schedules

BETA_1, BETA_2, EPSILON = 0.9, 0.999, 1e-8
# The ViT recipe's weight decay, 0.04 -> 0.4, over a run of 2 epochs of 2
# steps; its learning rate's shape, scaled up so that the decay (lr * wd
# of the weights) is far above float32's roundoff.
WD, FINAL_WD = 0.04, 0.4
STEPS_PER_EPOCH, NUM_EPOCHS = 2, 2
START_LR, REF_LR, FINAL_LR = 0.02, 0.1, 0.001

# Variables named as the ViT's (timm's names under tf_keras layers) and the
# heads', with whether DINO's rule and timm's no_weight_decay leave them
# undecayed.
VIT_VARIABLES = {
    'vit/patch_embed/proj/kernel': ((2, 2, 3, 4), False),
    'vit/patch_embed/proj/bias': ((4,), True),
    'vit/tokens/cls_token': ((1, 1, 4), True),
    'vit/tokens/pos_embed': ((1, 5, 4), True),
    'vit/blocks_0/norm1/gamma': ((4,), True),
    'vit/blocks_0/norm1/beta': ((4,), True),
    'vit/blocks_0/attn/qkv/kernel': ((4, 12), False),
    'vit/blocks_0/attn/qkv/bias': ((12,), True),
    'vit/blocks_0/attn/proj/kernel': ((4, 4), False),
    'vit/blocks_0/mlp/fc1/kernel': ((4, 8), False),
    'vit/blocks_0/mlp/fc2/kernel': ((8, 4), False),
    'vit/norm/gamma': ((4,), True),
    'projection_head/fc1/kernel': ((4, 3), False),
    'projection_head/bn1/beta': ((3,), True),
    # Rank 1 without a bias or norm name: DINO's ndim == 1.
    'vit/layer_scale/scale': ((4,), True),
}
# Its gradients are near epsilon: PyTorch's epsilon, added after the bias
# correction of sqrt(v), differs there from tf_keras' (added before).
TINY = 'vit/blocks_0/mlp/fc2/kernel'


def _dino_cosine_scheduler(base_value, final_value, epochs, niter_per_ep):
    """facebookresearch/dino utils.cosine_scheduler without warm-up."""
    iters = np.arange(epochs * niter_per_ep)
    return final_value + 0.5 * (base_value - final_value) * (
        1 + np.cos(np.pi * iters / len(iters)))


def _learning_rates():
    """The warm-up + cosine of `WarmupCosineDecay` by its closed form: one
    epoch of linear warm-up, then half a cosine over the last epoch."""
    warmup = [START_LR + (REF_LR - START_LR) * t / STEPS_PER_EPOCH
              for t in range(STEPS_PER_EPOCH)]
    cosine = [FINAL_LR + (REF_LR - FINAL_LR) * 0.5 * (
        1 + math.cos(math.pi * t / STEPS_PER_EPOCH))
        for t in range(STEPS_PER_EPOCH)]
    return warmup + cosine


def _initial_values():
    rng = np.random.default_rng(0)
    return {name: rng.normal(size=shape).astype(np.float32)
            for name, (shape, _) in VIT_VARIABLES.items()}


def _gradients(num_steps, seed=1):
    rng = np.random.default_rng(seed)
    return [{name: (rng.normal(size=shape) * (
        3e-8 if name == TINY else 1.0)).astype(np.float32)
        for name, (shape, _) in VIT_VARIABLES.items()}
        for _ in range(num_steps)]


def _numpy_adamw(values, grads, lrs, wds):
    """torch.optim.AdamW's update by hand, in float64: per step t = 1, 2,
    ..., decay theta by (1 - lr_t * wd_t) unless excluded, then Adam with
    bias correction and epsilon outside the corrected sqrt."""
    values = {k: v.astype(np.float64) for k, v in values.items()}
    m = {k: np.zeros_like(v) for k, v in values.items()}
    v = {k: np.zeros_like(x) for k, x in values.items()}
    for t, (step_grads, lr, wd) in enumerate(zip(grads, lrs, wds), 1):
        for name, theta in values.items():
            g = step_grads[name].astype(np.float64)
            if not VIT_VARIABLES[name][1]:
                theta = theta * (1 - lr * wd)
            m[name] = BETA_1 * m[name] + (1 - BETA_1) * g
            v[name] = BETA_2 * v[name] + (1 - BETA_2) * g * g
            m_hat = m[name] / (1 - BETA_1 ** t)
            v_hat = v[name] / (1 - BETA_2 ** t)
            values[name] = theta - lr * m_hat / (np.sqrt(v_hat) + EPSILON)
    return values


def _torch_adamw(values, grads, lrs, wds):
    """torch.optim.AdamW as DINO drives it: two parameter groups, the
    excluded with weight decay 0, lr and wd set before each step."""
    params = {name: torch.nn.Parameter(torch.tensor(value))
              for name, value in values.items()}
    decayed = [p for n, p in params.items() if not VIT_VARIABLES[n][1]]
    excluded = [p for n, p in params.items() if VIT_VARIABLES[n][1]]
    optimizer = torch.optim.AdamW(
        [{'params': decayed}, {'params': excluded, 'weight_decay': 0.0}],
        betas=(BETA_1, BETA_2), eps=EPSILON)
    for step_grads, lr, wd in zip(grads, lrs, wds):
        for i, group in enumerate(optimizer.param_groups):
            group['lr'] = lr
            if i == 0:
                group['weight_decay'] = wd
        for name, param in params.items():
            param.grad = torch.tensor(step_grads[name])
        optimizer.step()
    return {name: p.detach().numpy() for name, p in params.items()}


def _make_optimizer(**kwargs):
    schedule = schedules.WarmupCosineDecay(
        steps_per_epoch=STEPS_PER_EPOCH, num_epochs=NUM_EPOCHS,
        start_lr=START_LR, ref_lr=REF_LR, final_lr=FINAL_LR,
        warmup_epochs=1)
    kwargs = dict(dict(weight_decay=WD, final_weight_decay=FINAL_WD),
                  **kwargs)
    return adamw.AdamW(learning_rate=schedule, **kwargs)


def _make_variables(values):
    return [tf.Variable(value, name=name) for name, value in values.items()]


def _name(variable):
    return variable.name.split(':')[0]


def _run(optimizer, variables, grads):
    @tf.function
    def step(step_grads):
        optimizer.apply_gradients(zip(step_grads, variables))

    for step_grads in grads:
        step([tf.constant(step_grads[_name(v)]) for v in variables])


@pytest.mark.parametrize('name', list(VIT_VARIABLES))
def test_exclusion_of_the_vit_variables(name):
    """Fails if the rank-1 rule (biases, norms) or the class token and
    position embeddings are dropped from `is_excluded_from_decay`."""
    shape, excluded = VIT_VARIABLES[name]
    variable = tf.Variable(tf.zeros(shape), name=name)
    assert adamw.is_excluded_from_decay(variable) == excluded


@pytest.mark.parametrize('num_steps', [1, 3])
def test_updates_match_numpy_by_hand(num_steps):
    """Fails if the weight decay is taken at the next step's value, is
    coupled (added to the gradient), decays an excluded variable, or if
    epsilon is added before the bias correction (tf_keras' Adam)."""
    values = _initial_values()
    grads = _gradients(num_steps)
    lrs = _learning_rates()[:num_steps]
    wds = _dino_cosine_scheduler(WD, FINAL_WD, NUM_EPOCHS,
                                 STEPS_PER_EPOCH)[:num_steps]
    variables = _make_variables(values)
    optimizer = _make_optimizer()
    _run(optimizer, variables, grads)
    want = _numpy_adamw(values, grads, lrs, wds)
    for variable in variables:
        np.testing.assert_allclose(variable.numpy(), want[_name(variable)],
                                   rtol=1e-6, atol=1e-7,
                                   err_msg=variable.name)
    assert optimizer.iterations.numpy() == num_steps
    # The check sees the decay: without it a decayed kernel would end
    # elsewhere.
    undecayed = _numpy_adamw(values, grads, lrs, [0.0] * num_steps)
    name = 'vit/blocks_0/attn/qkv/kernel'
    assert np.abs(undecayed[name] - want[name]).max() > 1e-4


def test_three_updates_match_torch_adamw():
    """Fails if the decay is not PyTorch's decoupled p * (1 - lr * wd), if
    epsilon is added before the bias correction, or if the cosine weight
    decay is not DINO's per-step schedule."""
    values = _initial_values()
    grads = _gradients(3)
    lrs = _learning_rates()[:3]
    wds = _dino_cosine_scheduler(WD, FINAL_WD, NUM_EPOCHS,
                                 STEPS_PER_EPOCH)[:3]
    variables = _make_variables(values)
    _run(_make_optimizer(), variables, grads)
    want = _torch_adamw(values, grads, lrs, wds)
    for variable in variables:
        np.testing.assert_allclose(variable.numpy(), want[_name(variable)],
                                   rtol=1e-6, atol=1e-7,
                                   err_msg=variable.name)


def test_mirrored_step_equals_one_device(two_replicas):
    """Fails if the update under MirroredStrategy differs from one device's
    with the summed gradient: e.g. if the exclusion is decided in
    update_step, on per-device names (`.../cls_token/replica_1:0`)."""
    values = _initial_values()
    grads = _gradients(2)
    names = list(values)
    with two_replicas.scope():
        mirrored = _make_variables(values)
        optimizer = _make_optimizer()

    def replica_step(step_grads):
        replica_id = tf.distribute.get_replica_context(
        ).replica_id_in_sync_group
        # Replica r sends (r + 1) g: the all-reduced (summed) gradient is
        # 3 g.
        scale = tf.cast(replica_id, tf.float32) + 1.0
        optimizer.apply_gradients(
            zip([scale * g for g in step_grads], mirrored))

    @tf.function
    def step(step_grads):
        two_replicas.run(replica_step, args=(step_grads,))

    for step_grads in grads:
        step([tf.constant(step_grads[name]) for name in names])

    single = _make_variables(values)
    _run(_make_optimizer(), single,
         [{k: 3.0 * g for k, g in step_grads.items()}
          for step_grads in grads])
    for variable, reference in zip(mirrored, single):
        for local in two_replicas.experimental_local_results(variable):
            np.testing.assert_allclose(local.numpy(), reference.numpy(),
                                       rtol=1e-6, atol=1e-7,
                                       err_msg=variable.name)
    assert optimizer.iterations.numpy() == 2


def test_checkpoint_restores_moments_and_iterations(tmp_path):
    """Fails if a moment is not a tracked slot (left out of checkpoints):
    a resumed run must continue as the uninterrupted one, its weight decay
    and bias corrections at the restored step."""
    values = _initial_values()
    grads = _gradients(4)

    def make(initial_values):
        variables = _make_variables(initial_values)
        optimizer = _make_optimizer()
        model = tf.Module()
        model.variables_list = variables
        return variables, optimizer, tf.train.Checkpoint(optimizer=optimizer,
                                                         model=model)

    variables, optimizer, checkpoint = make(values)
    _run(optimizer, variables, grads[:2])
    path = checkpoint.save(str(tmp_path / 'ckpt'))
    _run(optimizer, variables, grads[2:])

    zeros = {name: np.zeros_like(v) for name, v in values.items()}
    restored_vars, restored_opt, restored_ckpt = make(zeros)
    restored_ckpt.restore(path).assert_existing_objects_matched()
    assert int(restored_opt.iterations) == 2
    _run(restored_opt, restored_vars, grads[2:])
    for got, want in zip(restored_vars, variables):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6,
                                   err_msg=want.name)


def test_cosine_schedule_is_dinos():
    """Fails if the cosine ends at the last step rather than after it
    (DINO divides by the number of steps), or goes on past the run."""
    schedule = schedules.cosine_decay(3, 4, WD, FINAL_WD)
    want = _dino_cosine_scheduler(WD, FINAL_WD, 4, 3)
    got = [float(schedule(step)) for step in range(12)]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for step in (12, 20):
        np.testing.assert_allclose(float(schedule(step)), FINAL_WD,
                                   rtol=1e-6)


def test_constant_weight_decay_without_final():
    """Fails if the weight decay changes without `final_weight_decay`."""
    optimizer = adamw.AdamW(learning_rate=0.1, weight_decay=0.05)
    for step in (0, 7, 1000):
        assert float(optimizer.weight_decay_schedule(step)) == 0.05


def test_final_weight_decay_needs_the_run_length():
    with pytest.raises(checks.ConfigError, match='steps_per_epoch'):
        adamw.AdamW(learning_rate=0.1, final_weight_decay=0.4)


def test_custom_exclusion_is_honoured():
    """Fails if a regex `exclude_from_weight_decay` is ignored."""
    kernel = tf.Variable(tf.ones([2, 2]), name='head/fc/kernel')
    bias = tf.Variable(tf.ones([2]), name='head/fc/bias')
    optimizer = adamw.AdamW(learning_rate=0.5, weight_decay=0.1,
                            exclude_from_weight_decay='kernel')
    optimizer.apply_gradients([(tf.zeros([2, 2]), kernel),
                               (tf.zeros([2]), bias)])
    # Zero gradients: the Adam step is 0, only the decay moves a variable.
    np.testing.assert_array_equal(kernel.numpy(), 1.0)
    np.testing.assert_allclose(bias.numpy(), 1.0 - 0.5 * 0.1, rtol=1e-6)


def test_invalid_exclusion_raises():
    with pytest.raises(TypeError, match=r'exclude_from_weight_decay .* '
                                        r'callable tf\.Variable -> bool'):
        adamw.AdamW(learning_rate=0.1, exclude_from_weight_decay=3)


def test_get_config_round_trip():
    optimizer = _make_optimizer(beta_2=0.99, epsilon=1e-6,
                                exclude_from_weight_decay='bias$',
                                global_clipnorm=1.0, name='adamw_test')
    config = optimizer.get_config()
    assert optimizer.weight_decay is None  # Base-class decay stays off.
    for clone in (adamw.AdamW.from_config(dict(config)),
                  tf_keras.optimizers.deserialize(
                      tf_keras.optimizers.serialize(optimizer),
                      use_legacy_optimizer=False)):
        assert isinstance(clone, adamw.AdamW)
        assert clone.get_config() == config
        np.testing.assert_allclose(
            float(clone.weight_decay_schedule(STEPS_PER_EPOCH)),
            (WD + FINAL_WD) / 2, rtol=1e-6)


@pytest.mark.parametrize('kwargs', [dict(weight_decay=-0.1),
                                    dict(final_weight_decay=-0.1),
                                    dict(beta_1=1.0), dict(beta_2=-0.1),
                                    dict(epsilon=-1.0)])
def test_invalid_hyperparameters_raise(kwargs):
    with pytest.raises(ValueError, match=list(kwargs)[0]):
        _make_optimizer(**kwargs)


def test_gin_binding_is_picked_up(clean_gin):
    gin.parse_config('AdamW.final_weight_decay = 0.4\n'
                     'AdamW.beta_2 = 0.99')
    optimizer = adamw.AdamW(learning_rate=schedules.WarmupCosineDecay(
        steps_per_epoch=2, num_epochs=2, start_lr=0.0, ref_lr=1e-3,
        warmup_epochs=1))
    assert (optimizer.final_weight_decay, optimizer.beta_2) == (0.4, 0.99)
