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
    (['/job:gpu_hosts/replica:0/task:0/device:CPU:0'], [], {}, None),
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
    taken over `devices` that name CPUs, TF_NUM_INTRAOP_THREADS
    overridden, and a CPU of a job named gpu_hosts taken for a GPU (tried:
    'GPU' looked for in the device's name, 1 thread)."""
    assert cluster.intra_op_threads(devices, gpus, environ) == expected


@pytest.mark.parametrize('kind, devices, gpus, expected', [
    ('one_device', None, _GPUS[:1], 1),
    ('one_device', None, [], None),  # A CPU machine.
    ('mirrored', None, _GPUS, 1),
    ('mirrored', ['CPU:0', 'CPU:1'], _GPUS, None),
    ('multi_worker', None, _GPUS[:1], 1),  # Its workers' GPUs.
])
def test_make_strategy_sets_the_threads_of_its_devices_first(
        monkeypatch, kind, devices, gpus, expected):
    """`make_strategy` on a machine of faked `gpus` sets the intra-op
    threads of the devices its strategy trains on before it builds the
    strategy: `devices` for mirrored, the visible GPUs (or the CPU) for
    one_device and multi_worker (which then stops for want of a cluster).
    Caught: the call of `set_intra_op_threads` deleted (nothing set on
    GPUs)."""
    events = []
    for name in ('TF_NUM_INTRAOP_THREADS', 'TF_CONFIG', 'SLURM_JOB_ID',
                 'SLURM_NTASKS'):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tf.config, 'list_physical_devices',
                        lambda device_type=None: gpus)
    monkeypatch.setattr(tf.config.threading,
                        'set_intra_op_parallelism_threads', events.append)
    monkeypatch.setattr(tf.distribute, 'get_strategy',
                        lambda: events.append('strategy'))
    monkeypatch.setattr(tf.distribute, 'MirroredStrategy',
                        lambda *args, **kwargs: events.append('strategy'))
    if kind == 'multi_worker':
        with pytest.raises(ValueError, match='needs a cluster description'):
            cluster.make_strategy(kind, devices)
    else:
        cluster.make_strategy(kind, devices)
        assert events.pop() == 'strategy'
    assert events == ([] if expected is None else [expected])


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
