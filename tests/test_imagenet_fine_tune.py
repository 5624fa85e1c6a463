"""The ImageNet fine-tuning protocol against the official run's settings:
imagenet.gin's bindings, and the learning rate of every step."""

import inspect
import math

import gin
import pytest

from paws_tf.evaluation import linear_fine_tune
from tests.helpers import debug_gin

# The official ImageNet fine-tuning (facebookresearch/suncet at
# 731547d727b8c94d06c08a7848b4955de3a70cea), value and source line.
OFFICIAL = {
    # configs/paws/imgnt_fine_tune.yaml:24 `lr: 0.02`
    'learning_rate': 0.02,
    # configs/paws/imgnt_fine_tune.yaml:23 `epochs: 50`
    'epochs': 50,
    # src/fine_tune.py:387 `momentum=0.9` (with nesterov=True, :385)
    'momentum': 0.9,
    # src/fine_tune.py:82 `crop_scale = ... else (0.08, 1.0)`
    'crop_scale': (0.08, 1.0),
    # src/fine_tune.py:106 `batch_size = 256` per process
    'batch_per_process': 256,
}
# Also official, and not bindings here: no weight decay
# (imgnt_fine_tune.yaml:26 `weight_decay: 0.0`; paws_tf's fine-tuning SGD
# has none), a zero-initialised last layer (:27 `zero_init: true`;
# `build_classifier`), no warm-up (src/fine_tune.py:339 `warmup_epochs=0`)
# and a cosine to 0 (src/utils.py:77 `final_lr=0.`): see
# test_learning_rate_is_the_official_cosine_to_zero_at_every_step.
# The official runs' world size is in no file of the repository: the
# global batch is 256 per process times the 4 processes docs/fidelity.md
# names.
OFFICIAL_PROCESSES = 4
IMAGENET_CONFIGS = ['imagenet.gin', 'imagenet_rn50_1pct.gin',
                    'imagenet_rn50_10pct.gin', 'imagenet_rn50_10pct_8gpu.gin',
                    'imagenet_rn50x2_10pct.gin', 'imagenet_rn50x4_10pct.gin',
                    'imagenet_vits16_10pct.gin']


@pytest.mark.parametrize('gin_file', IMAGENET_CONFIGS)
def test_imagenet_fine_tuning_bindings_are_the_official_runs(gin_file):
    """Fails if a binding of imagenet.gin (or a config's override) leaves
    the official value (tried: `fine_tune_linear.learning_rates = (0.05,)`
    in imagenet.gin)."""
    with debug_gin.parsed(gin_file=f'gin_configs/{gin_file}'):
        assert gin.query_parameter('fine_tune.protocol') == 'imagenet'
        query = gin.query_parameter
        assert query('fine_tune_linear.selection') == 'best_epoch'
        assert tuple(query('fine_tune_linear.learning_rates')) == (
            OFFICIAL['learning_rate'],)
        assert tuple(gin.query_parameter('fine_tune_linear.epochs')) == (
            OFFICIAL['epochs'],)
        # Defaults of fine_tune_linear not rebound by the config.
        bound = _defaults()
        for name, value in bound.items():
            try:
                value = gin.query_parameter(f'fine_tune_linear.{name}')
            except ValueError:
                pass
            bound[name] = value
    assert bound['momentum'] == OFFICIAL['momentum']
    assert tuple(bound['crop_scale']) == OFFICIAL['crop_scale']
    assert bound['global_batch_size'] == (
        OFFICIAL['batch_per_process'] * OFFICIAL_PROCESSES)


def _defaults():
    parameters = inspect.signature(
        linear_fine_tune.fine_tune_linear).parameters
    return {name: parameters[name].default for name in
            ('momentum', 'crop_scale', 'global_batch_size')}


@pytest.mark.parametrize('gin_file', IMAGENET_CONFIGS + [
    'image_folders.gin'])
def test_learning_rate_is_the_official_cosine_to_zero_at_every_step(
        gin_file):
    """suncet WarmupCosineSchedule(warmup_steps=0, start_lr=ref_lr=lr,
    T_max=epochs * ipe, final_lr=0), stepped after every update, whatever
    the pre-training schedule's bindings in the same config.

    Fails if the pre-training's WarmupCosineDecay bindings reach the
    fine-tuning schedule (tried: `final_lr` and `warmup_fraction` left to
    gin in `linear_fine_tune._optimizer`: imagenet.gin's lr rose from 0.02
    to 0.064; image_folders.gin's refused to build).
    """
    learning_rate, total = 0.02, 12
    with debug_gin.parsed(gin_file=f'gin_configs/{gin_file}'):
        optimizer = linear_fine_tune._optimizer(learning_rate, total,
                                                momentum=0.9)
    assert optimizer.nesterov
    schedule = optimizer._learning_rate  # called with the update's step
    for step in range(total + 1):
        expected = learning_rate * 0.5 * (1 + math.cos(math.pi * step /
                                                       total))
        assert float(schedule(step)) == pytest.approx(
            expected, abs=1e-7), step
