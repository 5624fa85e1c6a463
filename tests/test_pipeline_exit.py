"""The input pipelines run no Python, so their iterators can be destroyed at
any time: at the end of `fit`, of an evaluation, of a run, of a process."""

import concurrent.futures
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from paws_tf.data import augment
from paws_tf.data import folders
from paws_tf.data import pipeline
from paws_tf.data import sources
from paws_tf.data import splits
from tests.helpers import run_py

# The ops that call back into Python (tf.numpy_function, tf.py_function,
# Dataset.from_generator).
_PYTHON_OPS = {'PyFunc', 'PyFuncStateless', 'EagerPyFunc'}
_HELPER = run_py.REPO / 'tests' / 'helpers' / 'pipeline_exit.py'
_NORMALIZATION = (augment.IMAGENET_MEAN, augment.IMAGENET_STD)


def _write_jpegs(root, classes, per_class, size=(160, 120)):
    rng = np.random.default_rng(0)
    for c in range(classes):
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size[1], size[0], 3), np.uint8)
            path = root / f'class_{c}' / f'{i}.jpg'
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(path, quality=90)


def _python_ops(dataset):
    """The Python-calling op types in `dataset`'s graph and functions."""
    graph = tf.compat.v1.GraphDef.FromString(
        dataset._as_serialized_graph().numpy())
    nodes = list(graph.node) + [node for function in graph.library.function
                                for node in function.node_def]
    return {node.op for node in nodes} & _PYTHON_OPS


@pytest.mark.slow
def test_pipelines_run_no_python(tmp_path):
    """Every pipeline of pre-training (ImageNet views with blur from a JPEG
    folder, CIFAR-10 views from arrays) and of
    evaluation is TensorFlow ops only. Bug: a `tf.numpy_function` (the PIL
    blur) in the map, which a worker thread can be running, needing the
    GIL, while the main thread destroys the iterator holding it and waits
    for that call: the process hangs."""
    _write_jpegs(tmp_path, classes=3, per_class=2)
    jpegs = folders.image_folder(tmp_path)
    rng = np.random.default_rng(0)
    arrays = sources.from_arrays(
        rng.integers(0, 256, (40, 32, 32, 3), np.uint8), np.arange(40) % 4)
    labeled, unlabeled = splits.select_labeled(arrays, labels_per_class=4)
    # One local view of ImageNet's 6: its ops are the other five's, and
    # building each view's map is most of the test's time.
    configs = [(jpegs, jpegs, augment.imagenet_multicrop(num_local=1)),
               (unlabeled, labeled, augment.CIFAR10_MULTICROP)]
    for unlabeled_source, labeled_source, multicrop in configs:
        pretrain = pipeline.make_pretrain_dataset_fn(
            unlabeled_source, labeled_source, num_replicas=1,
            global_batch_size=2, classes_per_step=2, images_per_class=1,
            multicrop=multicrop, normalization=_NORMALIZATION)
        assert not _python_ops(pretrain.dataset_fn(None)), multicrop
    evaluation = pipeline.make_eval_dataset(
        jpegs, batch_size=2, image_size=32, crop_fraction=0.875,
        mean=augment.IMAGENET_MEAN, std=augment.IMAGENET_STD)
    assert not _python_ops(evaluation)


def _exits(folder):
    """Whether one process of the scenario takes its steps and then exits
    cleanly within 5 minutes (it takes seconds, a minute on a machine
    loaded many times over; its steps may take minutes)."""
    process = subprocess.Popen(
        [sys.executable, str(_HELPER), str(folder), '2', '8', '3', '2', '1'],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=dict(os.environ, PYTHONPATH=str(run_py.REPO),
                 TF_CPP_MIN_LOG_LEVEL='2'))
    guard = threading.Timer(600, process.kill)
    guard.start()
    try:
        took = process.stdout.readline().strip() == 'took the steps'
        process.wait(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return False
    finally:
        guard.cancel()
    return took and process.returncode == 0


@pytest.mark.long
def test_imagenet_input_exits_every_time(tmp_path):
    """A process that takes steps of the ImageNet multi-crop input on a
    JPEG folder and exits, its iterator destroyed while the map has calls
    in flight: 12 processes, no retries, each must exit within 5 minutes
    of its steps (12 runs catch a hang of 1 run in 4 with probability
    1 - 0.75^12 = 97%). Bug: Python in the map (the PIL blur as a
    `tf.numpy_function`), whose call waits for the GIL that the destroying
    main thread holds (with it, 2 of 12 processes hung). One local view of
    the 6: each process builds the pipeline in two thirds of the time."""
    _write_jpegs(tmp_path, classes=3, per_class=4)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        exits = list(pool.map(_exits, [tmp_path] * 12))
    assert all(exits), f'{exits.count(False)} of 12 processes hung or failed'
