"""gin_configs/image_folders_vit.gin, PAWS continued from an imported ViT:
its documented command (docs/own_images.md) through run.py from a DINO
ViT-S/16 of random weights written by the official model code, shrunk,
against the recipe's numbers computed here (the schedule's closed form,
AdamW's largest step), and its views at the recipe's sizes."""

import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

pytest.importorskip('torch')

from paws_tf import bindings  # noqa: E402
from paws_tf.data import augment  # noqa: E402
from paws_tf.runner import experiment  # noqa: E402
from tests.helpers import debug_gin  # noqa: E402
from tests.helpers import run_py  # noqa: E402
from tests import test_documented_commands as documented  # noqa: E402
from tests import test_vit_import  # noqa: E402

CONFIG = 'gin_configs/image_folders_vit.gin'
# The recipe as docs/own_images.md gives it: DINO's 0.0005 per 256 images
# times the mean of 0.65 ** k over the 12 blocks (MAE's layer-wise decay),
# rounded, from 0 over 5 % of the run, cosine to 1e-6; weight decay 0.04
# -> 0.4.
DERIVED_LR = 5e-4 * np.mean(0.65 ** np.arange(1, 13))
REF_LR = 7.7e-5
START_LR, FINAL_LR, WARMUP_FRACTION = 0.0, 1e-6, 0.05
WEIGHT_DECAY, FINAL_WEIGHT_DECAY = 0.04, 0.4
BETA_1, BETA_2 = 0.9, 0.999  # AdamW's, as PyTorch's.
# Shrunk: the 18 images of `import_with_run_py`'s folders (its 12 labeled
# ones are unlabeled too), two a step, two epochs: 18 updates, the first
# of them the warm-up's.
STEPS_PER_EPOCH, EPOCHS, PATCH = 9, 2, 16
SIZES = {'global_views': 32, 'local_views': 16, 'support_views': 32}
SHRINK = ['IMAGE_SIZE = 32', 'LOCAL_SIZE = 16', 'SUPPORT_CLASSES = 3',
          'make_pretrain_dataset_fn.global_batch_size = 2',
          f'train.num_epochs = {EPOCHS}', 'train.log_every_steps = 1',
          'train.eval_every_epochs = 0', 'train.verbose = 0',
          'evaluate_nn.pictures = False']


def _documented():
    """The recipe's command of docs/own_images.md."""
    [command] = [c for c in documented._commands(
        documented.DOCS / 'own_images.md') if f'--gin_file={CONFIG}' in c]
    return command


def learning_rates(total, warmup):
    """The rate of each of `total` updates: linear from `START_LR` over
    `warmup` updates, then half a cosine from `REF_LR` to `FINAL_LR`."""
    step = np.arange(total)
    cosine = FINAL_LR + (REF_LR - FINAL_LR) * 0.5 * (
        1 + np.cos(np.pi * (step - warmup) / max(total - warmup, 1)))
    return np.where(step < warmup,
                    START_LR + (REF_LR - START_LR) * step / max(warmup, 1),
                    cosine)


def largest_adam_steps(total):
    """The bound of |m_hat| / sqrt(v_hat) at each update t = 1..total: by
    Cauchy-Schwarz, sqrt(sum_s a_s^2 / b_s) for the bias-corrected
    weights a_s, b_s of the gradient s in m_hat and v_hat."""
    bounds = []
    for t in range(1, total + 1):
        age = t - np.arange(1, t + 1)
        a = (1 - BETA_1) * BETA_1 ** age / (1 - BETA_1 ** t)
        b = (1 - BETA_2) * BETA_2 ** age / (1 - BETA_2 ** t)
        bounds.append(np.sqrt(np.sum(a ** 2 / b)))
    return np.array(bounds)


def _events(log_dir):
    """`{tag: {step: tensor}}` of the event files in `log_dir`."""
    found = {}
    for path in pathlib.Path(log_dir).glob('events.out.tfevents.*'):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                found.setdefault(value.tag, {})[event.step] = (
                    tf.make_ndarray(value.tensor))
    return found


def _backbone_weights(path, prefix):
    """`{name below prefix: value}` of the checkpoint `path`."""
    reader = tf.train.load_checkpoint(path)
    return {name[len(prefix):]: reader.get_tensor(name)
            for name in reader.get_variable_to_shape_map()
            if name.startswith(prefix) and '.OPTIMIZER_SLOT' not in name}


def recipe_run(tmp_path_factory, tmp_path):
    """The command as written, its folders and import those of the DINO
    ViT-S/16 imported with run.py that tests share
    (`test_vit_import.dino_import`), its model_dir the test's, shrunk (32-
    and 16-px views, two images a step, 18 steps), its final PAWS-NN
    without pictures (no check reads them); the import's directory, the
    run's, the import's record and the run's training events."""
    shared, _ = test_vit_import.dino_import(tmp_path_factory)
    imported, run = shared / 'dino_vits16', tmp_path / 'continued'
    images = shared / 'images'
    command = documented._as_run_here(_documented(), {
        'LABELED_DIR': images / 'labeled',
        'UNLABELED_DIR': images / 'unlabeled', 'TEST_DIR': images / 'test',
        'train.pretrained_backbone': imported, '--model_dir': run},
        [f'--gin_bindings={binding}' for binding in SHRINK])
    record = json.loads((imported / 'imported.json').read_text())
    assert set(record['bindings']) <= {
        argument.partition('=')[2] for argument in command}
    code, output = run_py.finish(documented._start(command), timeout=900)
    assert code == 0, output[-3000:]
    return imported, run, record, _events(run / 'tensorboard' / 'train')


TOTAL = STEPS_PER_EPOCH * EPOCHS
RATES = learning_rates(TOTAL, round(
    WARMUP_FRACTION * EPOCHS * STEPS_PER_EPOCH))
# DINO's cosine over the run, from its first update.
DECAYS = FINAL_WEIGHT_DECAY + (WEIGHT_DECAY - FINAL_WEIGHT_DECAY) * (
    0.5 * (1 + np.cos(np.pi * np.arange(TOTAL) / TOTAL)))


def _logged(events, tag):
    """The values of `tag` after updates 1..TOTAL, each that update's."""
    return [events[tag][t] for t in range(1, TOTAL + 1)]


def _check_rate(events):
    """The rate of each update of the run is the recipe's, computed here:
    0 at the first (the warm-up's), then the cosine from 7.7e-5 to 1e-6.

    Fails if the recipe's rate is not the documented one (tried:
    `WarmupCosineDecay.ref_lr = 5e-4`, DINO's from scratch)."""
    assert float(f'{DERIVED_LR:.2g}') == REF_LR
    assert RATES[0] == 0.0 and RATES[1] == pytest.approx(REF_LR)
    np.testing.assert_allclose(
        _logged(events, 'optimizer/learning_rate'), RATES,
        rtol=1e-5, atol=1e-12)


def _check_adamw_weight_decay(events):
    """The run's weight decay (AdamW's; no LARS trust ratio is logged) is
    DINO's cosine from 0.04 to 0.4 over the run, computed here.

    Fails if the weight decay is constant (tried:
    `AdamW.final_weight_decay` left out of the recipe)."""
    assert not any(tag.startswith('lars/') for tag in events)
    np.testing.assert_allclose(_logged(events, 'adamw/weight_decay'),
                               DECAYS, rtol=1e-5)


def _check_view_sizes(events):
    """The views the run trained on (its TensorBoard pictures) are
    IMAGE_SIZE and LOCAL_SIZE as bound, multiples of the patch.

    Fails if the recipe binds a view size past its macro (tried:
    `MultiCropConfig.global_size = 48`, IMAGE_SIZE still read by the
    evaluation: the run trained on 48-px views)."""
    for key, size in SIZES.items():
        width, height = (int(v) for v in events[f'views/{key}'][0][:2])
        assert (width, height) == (size, size) and size % PATCH == 0


def _check_start_from_import(imported, run, record):
    """Every backbone variable at the end of the run is the import's
    moved by at most the sum over the updates of the rate times AdamW's
    largest step (its bias-corrected moments' bound) plus the weight
    decay's share.

    Fails if the run does not start from the import's backbone (tried:
    `pretrained.load_backbone_weights` restoring nothing: the fresh
    backbone's LayerNorm gammas stay near 1, the import's are random)."""
    start = _backbone_weights(str(imported / 'checkpoints' / 'ckpt-0'),
                              'backbone/')
    end = _backbone_weights(tf.train.latest_checkpoint(
        str(run / 'checkpoints')), 'model/backbone/')
    assert start.keys() == end.keys() and len(start) == record['tensors']
    largest = max(np.abs(value).max() for value in start.values()) + 1.0
    moved = np.sum(RATES * (largest_adam_steps(TOTAL) + DECAYS * largest))
    for name, value in start.items():
        np.testing.assert_allclose(end[name], value, rtol=0, atol=moved,
                                   err_msg=name)


@pytest.mark.slow
@pytest.mark.long
def test_the_recipe_run_trains_as_documented(tmp_path_factory, tmp_path):
    """The documented command's run (`recipe_run`), one run for all the
    checks, each failing under its own bug: its rate (`_check_rate`), its
    weight decay (`_check_adamw_weight_decay`), its views' sizes
    (`_check_view_sizes`) and its start from the import
    (`_check_start_from_import`). One test, so that parallel test
    processes never train it twice."""
    imported, run, record, events = recipe_run(tmp_path_factory, tmp_path)
    _check_rate(events)
    _check_adamw_weight_decay(events)
    _check_view_sizes(events)
    _check_start_from_import(imported, run, record)


@pytest.mark.parametrize('patch_bindings,patch,local', [
    (['vit.patch_size = 16'], 16, 96),
    (['vit.patch_size = 14', 'vit.image_size = 518', 'LOCAL_SIZE = 98'],
     14, 98)])
def test_the_recipe_views_are_multiples_of_the_patch(patch_bindings, patch,
                                                     local):
    """At its own sizes, the recipe's views are 224 px (global and
    support, and the evaluation's) and 96 px, multiples of patch 16; a
    patch-14 import with LOCAL_SIZE = 98, as the config's header says,
    224 and 98 px.

    Fails if the recipe's sizes are not multiples of the patch (tried:
    `IMAGE_SIZE = 220`)."""
    with debug_gin.parsed(["build_backbone.name = 'vit_small'",
                           *patch_bindings],
                          gin_file=CONFIG):
        multicrop = augment.MultiCropConfig()
        evaluation, _ = bindings.arguments(
            experiment.eval_preprocessing)['image_size']
    assert (multicrop.global_size, multicrop.local_size, evaluation) == (
        224, local, 224)
    assert not (224 % patch or local % patch)
