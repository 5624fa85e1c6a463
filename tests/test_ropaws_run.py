"""RoPAWS trained through run.py on image folders whose unlabeled folder
holds images of a class the labeled folder lacks (docs/ropaws.md): the run
finishes, exports and logs `in_domain`, and the trained model gives the
out-of-class unlabeled images a lower in-domain probability p_in than the
in-class ones, and the model it built evaluates the official RoPAWS
objective at the config's settings.

Bugs tried: PAWSModel's objective ignored (PAWS trained, no in_domain);
the epoch's in_domain fed the mean of p_in squared;
ropaws_targets' in-domain prior dropped (pi = 1); the config's
`PAWSModel.ropaws_prior_pow` 0 (every view weighted 1).
"""

import glob
import os

import numpy as np
from PIL import Image
import pytest
from tensorboard.backend.event_processing import event_accumulator
import tensorflow as tf

from paws_tf import losses
from paws_tf import run_dir
from paws_tf.runner import modes
from tests.helpers import debug_gin
from tests.helpers import image_folders
from tests.helpers import ropaws_reference
from tests.helpers import run_py
from tests.helpers import tiny_model
from tests.test_ropaws import official_step_objective

# The labeled classes, each a colour; the out-of-class images are a black
# and white checkerboard, unlike any of them in colour and texture.
COLOURS = {'red': (220, 30, 30), 'green': (30, 200, 40),
           'blue': (40, 50, 220)}
LABELED, IN_CLASS, OUT_OF_CLASS = 4, 8, 12
# image_folders_small.gin's RoPAWS and PAWS settings (and base.gin's).
TAU, PRIOR_TAU, LABEL_RATIO, SMOOTHING = 0.1, 0.1, 5.0, 0.1
PRIOR_POW = 1.0
BINDINGS = image_folders.SMALL + [
    "OBJECTIVE = 'ropaws'", 'train.num_epochs = 4',
    'train.log_every_steps = 1', 'train.eval_every_epochs = 0',
    'train.view_images = False',
    f'make_pretrain_dataset_fn.images_per_class = {LABELED}']


def colour_image(colour, rng):
    noise = rng.normal(0, 12, size=(40, 40, 3))
    return np.clip(np.array(colour) + noise, 0, 255).astype(np.uint8)


def checkerboard(rng):
    size = int(rng.integers(3, 7))
    cells = (np.add.outer(np.arange(40), np.arange(40)) // size) % 2
    pixels = np.repeat(cells[..., None] * 255, 3, axis=2).astype(float)
    return np.clip(pixels + rng.normal(0, 12, size=pixels.shape), 0,
                   255).astype(np.uint8)


def write(path, pixels):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    return pixels


def write_data(root):
    """The folders, and the images of each kind as uint8 arrays."""
    rng = np.random.default_rng(0)
    images = {'labeled': [], 'labels': [], 'in': [], 'out': []}
    for label, (name, colour) in enumerate(sorted(COLOURS.items())):
        for i in range(LABELED):
            images['labeled'].append(write(
                root / 'labeled' / name / f'{i}.png', colour_image(colour,
                                                                   rng)))
            images['labels'].append(label)
        for i in range(IN_CLASS):
            images['in'].append(write(
                root / 'unlabeled' / f'{name}_{i}.png', colour_image(colour,
                                                                     rng)))
    for i in range(OUT_OF_CLASS):
        images['out'].append(write(root / 'unlabeled' / f'other_{i}.png',
                                   checkerboard(rng)))
    for name, colour in COLOURS.items():
        write(root / 'test' / name / '0.png', colour_image(colour, rng))
    return {key: np.stack(value) for key, value in images.items()}


def logged_scalars(log_dir, tag):
    values = []
    for path in glob.glob(os.path.join(log_dir, 'events.out.tfevents.*')):
        acc = event_accumulator.EventAccumulator(
            path, size_guidance={event_accumulator.TENSORS: 0})
        acc.Reload()
        if tag in acc.Tags()['tensors']:
            values += [(event.step, float(tf.make_ndarray(event.tensor_proto)))
                       for event in acc.Tensors(tag)]
    return sorted(values)


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp('ropaws')
    images = write_data(root / 'data')
    code, output = run_py.finish(run_py.start(
        root / 'run', image_folders.path_bindings(root / 'data'),
        mode='train_and_evaluate',
        gin_file='gin_configs/image_folders_small.gin',
        base_bindings=BINDINGS), timeout=600)
    assert code == 0, output[-3000:]
    return root / 'run', images, output


@pytest.mark.slow
@pytest.mark.long
def test_the_trained_model_descends_the_official_objective(trained):
    """The run's model, rebuilt from its config and checkpoint as the run
    built it, evaluates on a step of its own layout (3 classes x 2
    images x 2 views of supports, 4 unlabeled images, 2 local views) the
    official RoPAWS objective at the config's settings, written here
    (`official_step_objective`), not PAWS's.

    Fails if the run's model is not built with the config's RoPAWS
    settings (tried: `PAWSModel.ropaws_prior_pow = 0.0` in
    image_folders_small.gin, every view weighted 1)."""
    model_dir, _, _ = trained
    with debug_gin.parsed(
            BINDINGS + image_folders.path_bindings(model_dir.parent / 'data'),
            gin_file='gin_configs/image_folders_small.gin'):
        model, _ = modes.load_trained_model(
            run_dir.RunDir(model_dir), tf.distribute.get_strategy(),
            local=True)
    data = tiny_model.random_step(np.random.default_rng(0), 4, 3, 2, 2, 2,
                                  size=32)
    loss, *_ = model._forward(data, training=True)
    expected, paws = official_step_objective(
        model, data, classes=3, images=2, smoothing=SMOOTHING, multicrop=2,
        prior_tau=PRIOR_TAU, prior_pow=PRIOR_POW, label_ratio=LABEL_RATIO)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    assert abs(paws - expected) > 1e-3


@pytest.mark.slow
@pytest.mark.long
def test_ropaws_run_logs_in_domain(trained):
    """Each epoch's logged in_domain is the mean of its steps' (each step's
    mean p_in, logged at every step here).

    Fails if the run trains PAWS's objective instead (PAWSModel's objective
    ignored: no in_domain), or if the epoch's figure is not the mean of its
    steps (tried: the epoch mean fed the mean of p_in squared)."""
    model_dir, _, output = trained
    log_dir = str(model_dir / 'tensorboard' / 'train')
    # 36 unlabeled images and the 12 labeled ones, which join them, in
    # batches of 16: 3 steps an epoch; the epoch means at its last step.
    epochs = logged_scalars(log_dir, 'epoch/in_domain')
    steps = logged_scalars(log_dir, 'paws/in_domain')
    assert [step for step, _ in epochs] == [3, 6, 9, 12], epochs
    assert [step for step, _ in steps] == list(range(1, 13)), steps
    step_values = np.array([value for _, value in steps]).reshape(4, 3)
    np.testing.assert_allclose([value for _, value in epochs],
                               step_values.mean(axis=1), rtol=1e-5)
    assert 'in_domain=' in output


@pytest.mark.slow
@pytest.mark.long
def test_out_of_class_images_get_a_lower_in_domain_probability(trained):
    """Fails if ropaws_targets' in-domain prior is dropped (pi = 1: p_in is
    1 for every image)."""
    model_dir, images, _ = trained
    embedder = tf.saved_model.load(run_dir.RunDir(model_dir).embedder)

    def targets(kind):
        return embedder(tf.constant(images[kind]))['projection'].numpy()

    supports = targets('labeled')
    labels = losses.label_matrix(images['labels'], 3,
                                 smoothing=SMOOTHING).numpy()
    # Every unlabeled image in one batch, as one view and again as the
    # other (the exported model is deterministic).
    unlabeled = np.concatenate([targets('in'), targets('out')])
    rows = len(unlabeled)
    _, in_domain = losses.ropaws_targets(
        np.concatenate([unlabeled, unlabeled]), supports, labels,
        multicrop=0, tau=TAU, sharpen_temperature=0.25,
        images_per_class=LABELED, prior_tau=PRIOR_TAU,
        label_ratio=LABEL_RATIO)
    # The official code's p_in, in float64 NumPy.
    _, expected = ropaws_reference.snn_semi(
        [np.concatenate([unlabeled, unlabeled]).astype(np.float64)],
        supports.astype(np.float64), labels.astype(np.float64), rank=0,
        tau=TAU, prior_tau=PRIOR_TAU, label_ratio=LABEL_RATIO,
        s_batch_size=LABELED, u_batch_size=rows)
    np.testing.assert_allclose(in_domain.numpy(), expected, rtol=1e-4,
                               atol=1e-6)
    in_class, out_of_class = np.split(expected, [3 * IN_CLASS])
    # Measured: in-class 0.993 to 0.9996, out-of-class 0.65 to 0.89.
    assert out_of_class.max() < in_class.min(), (in_class, out_of_class)
