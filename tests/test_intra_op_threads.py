"""The intra-op threads a job sets from the devices it trains on."""

import logging

import pytest
import tensorflow as tf

from paws_tf import cluster

_GPUS = [tf.config.PhysicalDevice('/physical_device:GPU:0', 'GPU'),
         tf.config.PhysicalDevice('/physical_device:GPU:1', 'GPU')]


@pytest.mark.parametrize('devices, gpus, environ, expected', [
    (None, _GPUS, {}, 1),                       # auto / one_device on GPUs
    (['GPU:0', 'GPU:1'], _GPUS, {}, 1),         # mirrored on named GPUs
    (['/job:worker/replica:0/task:0/device:GPU:0'], [], {}, 1),
    (None, [], {}, None),                       # a CPU machine
    (['CPU:0', 'CPU:1'], _GPUS, {}, None),      # logical CPUs, GPUs unused
    (None, _GPUS, {'TF_NUM_INTRAOP_THREADS': '4'}, None),  # the user's
    (None, _GPUS, {'TF_NUM_INTRAOP_THREADS': ''}, 1),      # empty: unset
])
def test_gpu_jobs_take_one_intra_op_thread_cpu_jobs_keep_theirs(
        devices, gpus, environ, expected):
    """Catches a CPU job made single-threaded (its train step's ops would
    run on one core), a GPU job left at a thread per core (the input's ops
    split over the pool and block its tf.data workers), the visible GPUs
    taken over `devices` that name CPUs, and TF_NUM_INTRAOP_THREADS
    overridden."""
    assert cluster.intra_op_threads(devices, gpus, environ) == expected


def test_a_started_runtime_keeps_its_threads_with_a_warning(caplog,
                                                             monkeypatch):
    """Catches a RuntimeError from TensorFlow ("cannot be modified after
    initialization") escaping when a strategy is made after other ops ran,
    and a setting claimed in the log but not in effect."""
    monkeypatch.delenv('TF_NUM_INTRAOP_THREADS', raising=False)
    tf.zeros([1]).numpy()  # TensorFlow's runtime has started.
    before = tf.config.threading.get_intra_op_parallelism_threads()
    with caplog.at_level(logging.INFO):
        cluster.set_intra_op_threads(['GPU:0'], [])
    assert tf.config.threading.get_intra_op_parallelism_threads() == before
    assert 'keeps its intra-op threads' in caplog.text
