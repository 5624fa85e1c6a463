"""Tests for paws_tf.schedules."""

import math

import gin
import numpy as np
import pytest
import tensorflow as tf

from paws_tf import schedules


def _reference_lr(step, steps_per_epoch, num_epochs, start_lr, ref_lr,
                  final_lr, warmup_epochs):
    """Closed form of the schedule, written independently in plain Python."""
    warmup = round(warmup_epochs * steps_per_epoch)
    total = num_epochs * steps_per_epoch
    if step < warmup:
        return start_lr + (ref_lr - start_lr) * step / warmup
    if step > total:
        return final_lr
    if total == warmup:
        return ref_lr
    progress = (step - warmup) / (total - warmup)
    return final_lr + (ref_lr - final_lr) * 0.5 * (
        1.0 + math.cos(math.pi * progress))


# (steps_per_epoch, num_epochs, start_lr, ref_lr, final_lr, warmup_epochs)
CONFIGS = [
    (5, 10, 0.3, 6.4, 0.0, 2),     # warmup 10 steps, total 50
    (4, 6, 0.8, 3.2, 0.064, 1.5),  # fractional warm-up: 6 steps
    (3, 4, 0.1, 1.0, 0.01, 0),     # no warm-up
    (3, 2, 0.1, 1.0, 0.01, 1.8),   # warm-up for all but one step
    (3, 2, 0.1, 1.0, 0.01, 1.9),   # warm-up rounded to the whole run
]


@pytest.fixture(name='clean_gin')
def fixture_clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.mark.parametrize('config', CONFIGS)
def test_values_at_key_steps_match_closed_form(config):
    schedule = schedules.WarmupCosineDecay(*config)
    warmup, total = schedule.warmup_steps, schedule.total_steps
    steps = sorted({0, max(warmup - 1, 0), warmup, (warmup + total) // 2,
                    total, total + 5})
    got = [float(schedule(tf.constant(s, tf.int64))) for s in steps]
    want = [_reference_lr(s, *config) for s in steps]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_anchor_values():
    schedule = schedules.WarmupCosineDecay(
        steps_per_epoch=5, num_epochs=10, start_lr=0.3, ref_lr=6.4,
        final_lr=0.01, warmup_epochs=2)
    assert (schedule.warmup_steps, schedule.total_steps) == (10, 50)
    np.testing.assert_allclose(
        [float(schedule(0)), float(schedule(10)), float(schedule(50)),
         float(schedule(55))],
        [0.3, 6.4, 0.01, 0.01], rtol=1e-6)


def test_zero_warmup_starts_at_ref_lr():
    schedule = schedules.WarmupCosineDecay(
        steps_per_epoch=3, num_epochs=4, start_lr=0.1, ref_lr=1.0,
        warmup_epochs=0)
    assert schedule.warmup_steps == 0
    np.testing.assert_allclose(float(schedule(0)), 1.0, rtol=1e-6)
    assert np.isfinite([float(schedule(s)) for s in range(15)]).all()


def test_fractional_warmup_is_rounded_to_steps():
    schedule = schedules.WarmupCosineDecay(
        steps_per_epoch=10, num_epochs=5, start_lr=0.0, ref_lr=1.0,
        warmup_epochs=0.26)
    assert (schedule.warmup_steps, schedule.total_steps) == (3, 50)


@pytest.mark.parametrize('config', CONFIGS)
def test_increases_during_warmup_and_decreases_after(config):
    schedule = schedules.WarmupCosineDecay(*config)
    warmup, total = schedule.warmup_steps, schedule.total_steps
    lrs = np.array([float(schedule(s)) for s in range(total + 4)])
    assert np.isfinite(lrs).all()
    assert (np.diff(lrs[:warmup + 1]) > 0).all()
    assert (np.diff(lrs[warmup:]) <= 1e-7).all()
    if warmup < total:
        assert (np.diff(lrs[warmup:total + 1]) < 0).all()


@pytest.mark.parametrize('kwargs, message', [
    (dict(steps_per_epoch=0), 'steps_per_epoch must be a positive integer'),
    (dict(steps_per_epoch=-3), 'steps_per_epoch must be a positive integer'),
    (dict(steps_per_epoch=2.5), 'steps_per_epoch must be a positive integer'),
    (dict(num_epochs=0), 'num_epochs must be a positive integer'),
    (dict(warmup_epochs=11), r'The warm-up fills the run, so the learning '
     r'rate never decays: WarmupCosineDecay.warmup_epochs = 11 >= '
     r'WarmupCosineDecay.num_epochs = 10\. Bind '
     r'WarmupCosineDecay.warmup_epochs = 1 '),
    # A run shortened to its config's warm-up: it would end at ref_lr.
    (dict(warmup_epochs=10), r'The warm-up fills the run, so the learning '
     r'rate never decays: WarmupCosineDecay.warmup_epochs = 10 >= '
     r'WarmupCosineDecay.num_epochs = 10\.'),
    (dict(warmup_epochs=-1), 'warmup_epochs must be a number >= 0, got -1'),
    (dict(start_lr=-0.1), 'start_lr must be a number >= 0'),
    (dict(ref_lr=-1.0), 'ref_lr must be a number >= 0'),
    (dict(final_lr=-1e-3), 'final_lr must be a number >= 0'),
    (dict(num_epochs='ten'),
     "num_epochs must be a positive integer, got 'ten'"),
    (dict(ref_lr='6.4'), "ref_lr must be a number >= 0, got '6.4'"),
])
def test_invalid_arguments_raise(kwargs, message):
    args = dict(steps_per_epoch=5, num_epochs=10, start_lr=0.3, ref_lr=6.4,
                final_lr=0.0, warmup_epochs=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        schedules.WarmupCosineDecay(**args)


def test_inside_tf_function_with_int64_and_float_steps():
    config = (5, 10, 0.3, 6.4, 0.0, 2)
    schedule = schedules.WarmupCosineDecay(*config)
    lr_fn = tf.function(schedule)
    for step in (0, 7, 10, 31, 50, 60):
        for dtype in (tf.int64, tf.float32):
            lr = lr_fn(tf.constant(step, dtype))
            assert lr.dtype == tf.float32
            np.testing.assert_allclose(float(lr), _reference_lr(step, *config),
                                       rtol=1e-6, atol=1e-7)


def test_get_config_round_trip():
    schedule = schedules.WarmupCosineDecay(
        steps_per_epoch=7, num_epochs=3, start_lr=0.2, ref_lr=2.0,
        final_lr=0.02, warmup_epochs=0.5)
    config = schedule.get_config()
    assert config == dict(steps_per_epoch=7, num_epochs=3, start_lr=0.2,
                          ref_lr=2.0, final_lr=0.02, warmup_epochs=0.5)
    clone = schedules.WarmupCosineDecay.from_config(config)
    assert clone.get_config() == config
    steps = np.arange(25)
    np.testing.assert_allclose(clone(steps), schedule(steps))


def test_gin_binds_learning_rates_but_not_step_counts(clean_gin):
    gin.parse_config(['WarmupCosineDecay.ref_lr = 6.4',
                      'WarmupCosineDecay.start_lr = 0.3',
                      'WarmupCosineDecay.warmup_epochs = 1'])
    schedule = schedules.WarmupCosineDecay(steps_per_epoch=4, num_epochs=2)
    assert (schedule.ref_lr, schedule.start_lr) == (6.4, 0.3)
    assert schedule.warmup_steps == 4
    with pytest.raises(ValueError, match='steps_per_epoch'):
        gin.parse_config('WarmupCosineDecay.steps_per_epoch = 10')


def test_warmup_fraction_follows_the_epochs():
    # A quarter of the run, 8 steps per epoch: 2 warm-up steps of 8 for one
    # epoch, 8 of 32 for four.
    for num_epochs, warmup_steps in ((1, 2), (4, 8)):
        schedule = schedules.WarmupCosineDecay(
            steps_per_epoch=8, num_epochs=num_epochs, start_lr=0.0,
            ref_lr=1.0, warmup_epochs=None, warmup_fraction=0.25)
        assert schedule.warmup_steps == warmup_steps
        np.testing.assert_allclose(
            [float(schedule(warmup_steps // 2)),
             float(schedule(warmup_steps))], [0.5, 1.0], rtol=1e-6)
        rebuilt = schedules.WarmupCosineDecay.from_config(
            schedule.get_config())
        assert rebuilt.warmup_steps == warmup_steps


@pytest.mark.parametrize('kwargs,message', [
    (dict(warmup_epochs=1, warmup_fraction=0.5), 'both set the warm-up'),
    (dict(warmup_epochs=None, warmup_fraction=1.5),
     r'warmup_fraction must be a number in \[0, 1\) \(a share of the '
     r'run, which must leave the decay some of it\), got 1.5'),
    (dict(warmup_epochs=None, warmup_fraction=1.0),
     r'warmup_fraction must be a number in \[0, 1\)'),
    (dict(warmup_epochs=None, warmup_fraction=-0.1),
     'warmup_fraction must be a number >= 0'),
])
def test_warmup_fraction_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        schedules.WarmupCosineDecay(steps_per_epoch=10, num_epochs=2,
                                    start_lr=0.0, ref_lr=1.0, **kwargs)
