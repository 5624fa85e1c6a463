"""A shrunk imagenet_rn50_10pct.gin trains through run.py on TFDS ImageNet
prepared from a tiny manual_dir, is killed mid-epoch, resumes and finishes;
the resumed run differs from the uninterrupted one only where
docs/fidelity.md says ("The ImageNet unlabeled stream on resume"): which
unlabeled images the rest of the interrupted epoch shows."""

import glob
import os
import re
import shutil
import signal

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
import tensorflow as tf

from paws_tf import checkpoints
from paws_tf.data import augment
from paws_tf.data import pipeline
from paws_tf.data import tfds_sources
from tests.helpers import run_py
from tests.helpers import tfds_archives

PER_CLASS = 30  # unlabeled JPEGs of each of the 2 classes
LABELED = 4  # of them in the 10% subset, per class
BATCH = 4
STEPS_PER_EPOCH = 2 * PER_CLASS // BATCH  # 15
EPOCHS = 2
TOTAL_STEPS = EPOCHS * STEPS_PER_EPOCH
# Only sizes and steps shrunk; determinism on, so that the uninterrupted
# run and the resumed one are comparable bit for bit up to the kill.
SHRINK = [
    f'make_pretrain_dataset_fn.global_batch_size = {BATCH}',
    'make_pretrain_dataset_fn.classes_per_step = 2',
    'make_pretrain_dataset_fn.images_per_class = 2',
    'imagenet_multicrop.global_size = 32',
    'imagenet_multicrop.local_size = 16',
    'imagenet_multicrop.num_local = 2', 'eval_preprocessing.image_size = 32',
    "build_backbone.name = 'small_resnet'", 'small_resnet.widths = (8, 16)',
    'small_resnet.blocks_per_stage = (1, 1)',
    'small_resnet.stage_strides = (2, 2)',
    'ProjectionHead.hidden_dim = 16', 'ProjectionHead.output_dim = 16',
    'PredictionHead.hidden_dim = 8', "train.precision = 'float32'",
    f'train.num_epochs = {EPOCHS}', 'WarmupCosineDecay.warmup_epochs = 1',
    'imagenet_sources.shuffle_buffer = 16',
    'train.deterministic_ops = True', 'train.backup_every_steps = 2',
    'train.checkpoint_every_steps = 2', 'train.keep_checkpoints = 40',
    'train.log_every_steps = 1', 'train.eval_every_epochs = 0',
    'train.view_images = False', 'train.verbose = 0']


def image(k, i):
    return np.random.default_rng([k, i]).integers(
        0, 256, size=(24, 24, 3), dtype=np.uint8)


@pytest.fixture(scope='module')
def imagenet(tmp_path_factory):
    """The data bindings of TFDS imagenet2012 and imagenet2012_subset/10pct
    prepared from a tiny manual_dir, as docs/experiments.md prepares them."""
    root = tmp_path_factory.mktemp('imagenet')
    data_dir = tfds_archives.prepare_imagenet(
        root, per_class=PER_CLASS, subsets={'10pct': range(LABELED)},
        images=image)
    return [f"DATA_DIR = '{data_dir}'",
            f"imagenet_sources.cache_dir = '{root / 'cache'}'"]


def data_dir(imagenet):
    return imagenet[0].split("'")[1]


def start(model_dir, imagenet):
    return run_py.start(model_dir, imagenet,
                        gin_file='gin_configs/imagenet_rn50_10pct.gin',
                        base_bindings=SHRINK)


def variables(path):
    """Every variable of a checkpoint but the count of its saves."""
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name)
            for name in reader.get_variable_to_shape_map()
            if not name.startswith(('_CHECKPOINTABLE_OBJECT_GRAPH',
                                    'save_counter'))}


def checkpoint_at(model_dir, step):
    return os.path.join(model_dir, 'checkpoints', f'ckpt-{step}')


def learning_rates(model_dir):
    """The learning rate logged at each step (1 the first), by step; a
    step logged again after a resume, as the resumed run logged it."""
    rates = {}
    # Named by their start time: the resumed process's files come later.
    for path in sorted(glob.glob(os.path.join(
            model_dir, 'tensorboard', 'train', 'events.out.tfevents.*'))):
        acc = event_accumulator.EventAccumulator(
            path, size_guidance={event_accumulator.TENSORS: 0})
        acc.Reload()
        if 'optimizer/learning_rate' not in acc.Tags()['tensors']:
            continue
        for event in acc.Tensors('optimizer/learning_rate'):
            rates[event.step] = float(tf.make_ndarray(event.tensor_proto))
    return rates


@pytest.fixture(scope='module')
def uninterrupted(imagenet, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp('uninterrupted')
    code, output = run_py.finish(start(model_dir, imagenet))
    assert code == 0, output[-3000:]
    return model_dir


@pytest.mark.slow
@pytest.mark.long
def test_killed_imagenet_run_resumes_where_the_doc_says(
        tmp_path, imagenet, uninterrupted):
    """Fails if a resumed ImageNet run starts at another step than its
    backup's (callbacks.fit_from starting at step 0: it trains 32 steps), or
    if the saver runs before TensorBoard's callback (the backup's step is
    never logged)."""
    proc = start(tmp_path, imagenet)
    run_py.wait_for_backup(tmp_path, proc, 2)
    proc.send_signal(signal.SIGKILL)
    run_py.finish(proc)
    # The resumed run deletes its backup when it finishes; the kill may
    # have come while the next one was being written.
    kept = tmp_path.parent / f'{tmp_path.name}_backup'
    shutil.copytree(tmp_path / 'backup', kept)
    code, output = run_py.finish(start(tmp_path, imagenet))
    assert code == 0, output[-3000:]
    resumed = re.search(r'resumed at step (\d+) of (\d+) \(epoch (\d+) of '
                        r'(\d+), step (\d+) of it\) from the (backup|'
                        r'checkpoint) (\S+)', output)
    assert resumed, output[-3000:]
    stopped_at = int(resumed[1])
    epoch, batch = divmod(stopped_at, STEPS_PER_EPOCH)
    assert resumed.groups()[1:5] == (str(TOTAL_STEPS), str(epoch + 1),
                                     str(EPOCHS), str(batch))
    # Mid-epoch: the rest of the epoch is what differs.
    assert stopped_at % STEPS_PER_EPOCH, stopped_at
    assert f'Training steps {stopped_at}..{TOTAL_STEPS}' in output
    path = resumed[7].rstrip('.')
    if resumed[6] == 'backup':
        path = str(kept / os.path.relpath(path, tmp_path / 'backup'))
    backup = variables(path)

    # Up to the kill, the runs are one: the model, optimizer and step.
    reference = variables(checkpoint_at(uninterrupted, stopped_at))
    assert backup.keys() == reference.keys()
    for name, value in reference.items():
        np.testing.assert_array_equal(backup[name], value, name)
    # Both end at the same step, with the same schedule all along.
    assert checkpoints.latest(str(tmp_path / 'checkpoints'))[1] == \
        checkpoints.latest(str(uninterrupted / 'checkpoints'))[1] \
        == TOTAL_STEPS
    rates, resumed_rates = (learning_rates(uninterrupted),
                            learning_rates(tmp_path))
    # Every step logged once by the one run and by the two processes of the
    # other, the killed one up to its backup at least.
    steps = list(range(1, TOTAL_STEPS + 1))
    assert sorted(rates) == sorted(resumed_rates) == steps
    np.testing.assert_array_equal([resumed_rates[step] for step in steps],
                                  [rates[step] for step in steps])
    # After the kill, the unlabeled images differ: the first step after
    # the resume already trains the weights apart.
    after = variables(checkpoint_at(tmp_path, stopped_at + 2))
    first_after = variables(checkpoint_at(uninterrupted, stopped_at + 2))
    assert any(not np.array_equal(after[name], first_after[name])
               for name in after if '/backbone/' in name)


def first_steps(unlabeled, labeled, start_step, steps):
    """`steps` elements of the shrunk config's input from global
    `start_step` on (one replica)."""
    pretrain = pipeline.make_pretrain_dataset_fn(
        unlabeled, labeled, num_replicas=1, global_batch_size=BATCH,
        classes_per_step=2, images_per_class=2,
        multicrop=augment.imagenet_multicrop(
            global_size=32, local_size=16, num_local=2),
        unique_classes_per_replica=True, seed=0, start_step=start_step,
        normalization=(augment.IMAGENET_MEAN, augment.IMAGENET_STD))
    assert pretrain.steps_per_epoch == STEPS_PER_EPOCH
    return list(pretrain.dataset_fn().take(steps).as_numpy_iterator())


@pytest.mark.slow
@pytest.mark.long
def test_resumed_imagenet_input_differs_only_in_its_unlabeled_views(
        imagenet, tmp_path):
    """The input of a run resumed at a mid-epoch step against the
    uninterrupted run's at the same steps: the same supports (the cached
    labeled subset replays), other unlabeled views (a fresh pass).
    Fails if the support stream restarts at step 0 on resume
    (pipeline._support's counter starting at 0)."""
    labeled, unlabeled = tfds_sources.imagenet_sources(
        labeled_subset='10pct', cache_dir=str(tmp_path / 'cache'),
        data_dir=data_dir(imagenet), shuffle_buffer=16)
    assert labeled.num_examples == 2 * LABELED
    assert unlabeled.num_examples == 2 * PER_CLASS
    resumed_at, steps = 5, 4
    uninterrupted = first_steps(unlabeled, labeled, 0,
                                resumed_at + steps)[resumed_at:]
    resumed = first_steps(unlabeled, labeled, resumed_at, steps)
    for before, after in zip(uninterrupted, resumed):
        assert before.keys() == after.keys()
        for key in ('support_views', 'support_labels', 'support_one_hot',
                    'support_view_index'):
            np.testing.assert_array_equal(after[key], before[key], key)
        assert not np.array_equal(after['global_views'],
                                  before['global_views'])
    # A second resume at the same step shows the same images again: the
    # fresh pass is a function of (seed, step), not of the process.
    again = first_steps(unlabeled, labeled, resumed_at, steps)
    for first, second in zip(resumed, again):
        for key, value in first.items():
            np.testing.assert_array_equal(second[key], value, key)
