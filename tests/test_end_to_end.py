"""train -> checkpoint -> resume with export and evaluate_nn
(`--mode=train_and_evaluate`) -> reload -> fine_tune, through run.py
subprocesses with gin files and bindings."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import gin
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from paws_tf import checkpoints
from paws_tf.data import pipeline
from paws_tf import run_dir
from paws_tf.runner import experiment
from paws_tf.runner import modes
from tests.helpers import debug_gin

REPO = pathlib.Path(__file__).resolve().parents[1]
# The run, and without what no check reads: the training's epoch-end
# PAWS-NN, its first step's views and the final PAWS-NN's pictures.
BINDINGS = ['train.num_epochs = 2', 'train.backup_every_steps = 4',
            'train.checkpoint_every_steps = 8', 'train.verbose = 0',
            'train.eval_every_epochs = 0', 'train.view_images = False',
            'evaluate_nn.pictures = False']


def run_py(model_dir, mode, wait=True):
    proc = subprocess.Popen(
        [sys.executable, str(REPO / 'run.py'),
         '--gin_file=gin_configs/debug.gin', f'--model_dir={model_dir}',
         f'--mode={mode}'] + [f'--gin_bindings={b}' for b in BINDINGS],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    if not wait:
        return proc
    output = proc.communicate(timeout=900)[0]
    assert proc.returncode == 0, output[-3000:]
    return output


@pytest.mark.slow
@pytest.mark.long
def test_the_whole_workflow_through_run_py(tmp_path):
    """A run preempted after its first backup resumes from it with
    `--mode=train_and_evaluate`, whose export computes the checkpoint's
    embeddings and whose PAWS-NN, of the 64 labeled images, is the bundled
    classifier's top-1; fine-tuning then reads that run.

    Fails if the resumed run does not start at its backup's step (tried:
    `start.start` resuming at step 0, `newest_restorable` not read)."""
    # 1. Train, preempted after its first backup, then resumed, exported
    # and evaluated by one process.
    proc = run_py(tmp_path, 'train', wait=False)
    deadline = time.time() + 600
    while checkpoints.backup_step(run_dir.RunDir(tmp_path)) < 4:
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=600)
    assert proc.returncode == 143
    resumed_from = checkpoints.backup_step(run_dir.RunDir(tmp_path))
    output = run_py(tmp_path, 'train_and_evaluate')
    assert f'Training steps {resumed_from}..32' in output
    assert checkpoints.latest(
        str(tmp_path / 'checkpoints'))[1] == 32

    # 2. The export, reloaded in this process.
    embedder = tf.saved_model.load(str(tmp_path / 'export' / 'embedder'))
    classifier = tf.saved_model.load(str(tmp_path / 'export' / 'classifier'))
    with debug_gin.parsed(BINDINGS):
        run = run_dir.RunDir(tmp_path)
        model, step = modes.load_trained_model(
            run, tf.distribute.get_strategy())
        bundle = experiment.load_data(run)
        preprocessing = experiment.eval_preprocessing(bundle)
    assert step == 32
    images = np.stack([bundle.test.read(i).numpy() for i in range(10)])
    preprocessed, _ = next(iter(pipeline.make_eval_dataset(
        bundle.test, batch_size=10, **preprocessing)))
    np.testing.assert_allclose(
        embedder(images)['embeddings'],
        model(preprocessed, training=False)['embeddings'], rtol=1e-4,
        atol=1e-5)
    all_test = np.stack([bundle.test.read(i).numpy()
                         for i in range(bundle.test.num_examples)])
    predicted = classifier(all_test)['class_ids'].numpy()

    # 3. PAWS-NN from the export: exactly the 64 labeled images as support,
    # and the same top-1 as the bundled classifier on every test image.
    results = json.loads((tmp_path / 'eval' / 'paws_nn.json').read_text())
    assert results['num_support'] == 64 == bundle.labeled.num_examples
    assert results['num_queries'] == 128
    assert results['top1'] > 0.5  # 4 classes: chance is 0.25.
    np.testing.assert_allclose(
        np.mean(predicted == bundle.test.labels), results['top1'],
        atol=1.5 / 128)  # a tie broken differently moves one image.

    # 4. Fine-tuning (debug.gin: the CIFAR-10 protocol, shortened).
    run_py(tmp_path, 'fine_tune')
    tuned = json.loads(
        (tmp_path / 'fine_tune' / 'results.json').read_text())
    assert tuned['protocol'] == 'cifar10' and tuned['steps'] == 10
    assert tuned['paws_nn_before']['num_support'] == 64


CIFAR10_BINDINGS = [
    # The shipped CIFAR-10 experiment, shrunk to seconds on a CPU.
    "train/load_tfds.data_dir = '{data_dir}'",
    "test/load_tfds.data_dir = '{data_dir}'",
    'select_labeled.labels_per_class = 4',
    'make_pretrain_dataset_fn.global_batch_size = 32',
    'make_pretrain_dataset_fn.images_per_class = 2',
    'wide_resnet.depth = 10', 'wide_resnet.width = 1',
    'ProjectionHead.hidden_dim = 16', 'ProjectionHead.output_dim = 16',
    'train.num_epochs = 1', 'WarmupCosineDecay.warmup_epochs = 0',
    "train.precision = 'float32'",  # float16 kernels are slow on a CPU.
    'train.backup_every_steps = 2', 'train.checkpoint_every_steps = 0',
    'train.verbose = 0',
    # What no check reads: the epoch-end PAWS-NN, the views, the pictures.
    'train.eval_every_epochs = 0', 'train.view_images = False',
    'evaluate_nn.pictures = False',
    'fine_tune_suncet.num_epochs = 2', 'fine_tune_suncet.steps_per_epoch = 2',
    'fine_tune_suncet.images_per_class = 2',
]


@pytest.mark.slow
@pytest.mark.long
def test_cifar10_experiment_on_mock_tfds(tmp_path):
    """cifar10_wrn28_2_4000.gin end to end on TFDS mock data: pre-training
    with the solarize + equalize views, export, PAWS-NN, then the official
    fine-tuning protocol with PAWS-NN after every epoch."""
    data_dir = str(tmp_path / 'tfds')
    model_dir = str(tmp_path / 'run')
    strategy = tf.distribute.get_strategy()
    gin.clear_config()
    gin.add_config_file_search_path(str(REPO))
    try:
        gin.parse_config_files_and_bindings(
            [str(REPO / 'gin_configs' / 'cifar10_wrn28_2_4000.gin')],
            [b.format(data_dir=data_dir) for b in CIFAR10_BINDINGS])
        multicrop = gin.query_parameter(
            'make_pretrain_dataset_fn.multicrop').scoped_configurable_fn()
        assert multicrop.distortion == 'cifar10'
        with tfds.testing.mock_data(num_examples=120, data_dir=data_dir):
            evaluated = modes.run(model_dir, strategy, 'train_and_evaluate')
            tuned = modes.run(model_dir, strategy, 'fine_tune')
    finally:
        gin.clear_config()
    assert evaluated['num_support'] == 40 and evaluated['num_queries'] == 120
    assert evaluated['embedding'] == 'projection'
    with open(os.path.join(model_dir, 'eval', 'paws_nn.json')) as f:
        assert json.load(f)['top1'] == evaluated['top1']
    assert tuned['protocol'] == 'cifar10' and tuned['steps'] == 4
    assert [e['epoch'] for e in tuned['paws_nn_by_epoch']] == [0, 1, 2]
    assert tuned['paws_nn_before']['num_support'] == 40
    assert tuned['top1'] == tuned['paws_nn_by_epoch'][-1]['top1']
    assert tuned['best_epoch_top1_selected_on_test'] == max(
        e['top1'] for e in tuned['paws_nn_by_epoch'])
    with open(os.path.join(model_dir, 'fine_tune', 'results.json')) as f:
        assert json.load(f)['paws_nn_by_epoch'] == tuned['paws_nn_by_epoch']
