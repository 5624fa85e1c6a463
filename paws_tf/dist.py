"""Distribution strategies, and cross-replica helpers that are the identity
with one replica."""

import contextlib
import json
import os
import shutil
import socket

import gin
import tensorflow as tf

STRATEGY_KINDS = ('auto', 'one_device', 'mirrored', 'multi_worker')


def cluster_in_environment():
    """True when TF_CONFIG or Slurm describes a job of several processes
    (then `make_strategy('auto')` builds `MultiWorkerMirroredStrategy`)."""
    tf_config = json.loads(os.environ.get('TF_CONFIG') or '{}')
    workers = sum(len(tasks) for tasks in tf_config.get('cluster', {}).values())
    slurm_tasks = int(os.environ.get('SLURM_NTASKS', '1'))
    return workers > 1 or slurm_tasks > 1


def _cluster_resolver():
    if os.environ.get('TF_CONFIG'):
        return tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if 'SLURM_JOB_ID' in os.environ:
        return tf.distribute.cluster_resolver.SlurmClusterResolver()
    raise ValueError(
        'strategy "multi_worker" needs a cluster description: set TF_CONFIG '
        '(see README, "Cluster") or launch the job with Slurm (srun).')


@gin.configurable
def make_strategy(kind='auto', devices=None):
    """Builds the distribution strategy by name.

    Create it at the start of the program: `MultiWorkerMirroredStrategy`
    must exist before other TensorFlow ops run.

    Args:
        kind: one of `STRATEGY_KINDS`. `auto` picks `multi_worker` when
            TF_CONFIG or Slurm describes several processes, `mirrored` when
            several GPUs are visible, else `one_device` (TF's default
            strategy: one replica on the first GPU, or the CPU).
        devices: explicit device list for `mirrored` (e.g. logical CPUs
            `['CPU:0', 'CPU:1']`, whose replicas then sum on one device
            instead of running collectives); default all GPUs (or the CPU).

    Returns:
        A `tf.distribute.Strategy`.

    Raises:
        ValueError: unknown kind, or `multi_worker` without a cluster.
    """
    if kind not in STRATEGY_KINDS:
        raise ValueError(f'Unknown strategy {kind!r}; choose one of '
                         f'{", ".join(STRATEGY_KINDS)}.')
    gpus = tf.config.list_physical_devices('GPU')
    if kind == 'auto':
        if cluster_in_environment():
            kind = 'multi_worker'
        elif len(gpus) > 1:
            kind = 'mirrored'
        else:
            kind = 'one_device'
    if kind == 'one_device':
        # TF's default strategy: one replica on the first visible device (a
        # GPU if there is one). OneDeviceStrategy would do the same, but
        # tf_keras' BackupAndRestore refuses it.
        return tf.distribute.get_strategy()
    if kind == 'mirrored':
        return tf.distribute.MirroredStrategy(
            devices, cross_device_ops=_cross_device_ops(devices))
    return tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=_cluster_resolver())


def _cross_device_ops(devices):
    """How `MirroredStrategy` on `devices` reduces across replicas.

    Logical devices that split one CPU share its memory, so summing on the
    first device hands every replica the same buffer: one pass over the
    gradients, where a collective all-reduce copies them into and out of one
    packed buffer per replica. Other devices keep TensorFlow's default:
    collective all-reduces (NCCL on GPUs).

    Returns:
        `tf.distribute.ReductionToOneDevice` when `devices` lists only
        CPUs, else None (the strategy's default; `devices` None means all
        GPUs, or the one CPU, whose single replica never reduces).
    """
    if devices and all(tf.DeviceSpec.from_string(device).device_type == 'CPU'
                       for device in devices):
        return tf.distribute.ReductionToOneDevice()
    return None


def loopback_tf_configs(workers):
    """TF_CONFIG values of a cluster of `workers` processes on this machine.

    For trying multi-worker training, and for tests and benchmarks, on one
    machine: start worker i's process with the environment variable
    `TF_CONFIG` set to the i-th string, and `make_strategy` builds their
    `MultiWorkerMirroredStrategy` (collectives over gRPC on 127.0.0.1).

    Args:
        workers: number of worker processes, at least 1.

    Returns:
        A list of `workers` JSON strings, one per task index, naming ports
        that were free when this ran.
    """
    if workers < 1:
        raise ValueError(f'A cluster needs at least 1 worker, got {workers}.')
    sockets = [socket.socket() for _ in range(workers)]
    try:
        for s in sockets:
            s.bind(('127.0.0.1', 0))
        addresses = [f'127.0.0.1:{s.getsockname()[1]}' for s in sockets]
    finally:
        for s in sockets:
            s.close()
    return [json.dumps({'cluster': {'worker': addresses},
                        'task': {'type': 'worker', 'index': index}})
            for index in range(workers)]


def num_replicas():
    """Number of replicas in sync in the current replica context (1 outside)."""
    ctx = tf.distribute.get_replica_context()
    if ctx is None:  # Cross-replica context: ask the strategy.
        return tf.distribute.get_strategy().num_replicas_in_sync
    return ctx.num_replicas_in_sync


def all_gather(x, axis=0):
    """Concatenates `x` from all replicas along `axis`, in replica order.

    Differentiable: the backward pass all-reduces (sums) the upstream gradient
    and slices this replica's rows, as the official PAWS `AllGather` does.
    Every replica must call it, in the same order, with shapes that agree
    except along `axis` (otherwise the collective hangs).

    Args:
        x: tensor to gather, `[N, ...]` per replica.
        axis: axis to concatenate along.

    Returns:
        `[R * N, ...]` tensor (`x` itself with one replica).
    """
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return x
    return ctx.all_gather(x, axis=axis)


def all_reduce_mean(x):
    """Mean of `x` over replicas (identity with one replica).

    Its gradient is the mean all-reduce of the upstream gradient, which is
    what a loss divided by the number of replicas needs.
    """
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return x
    return ctx.all_reduce(tf.distribute.ReduceOp.MEAN, x)


def is_chief(strategy):
    """Whether this process is the chief: the `chief` task if the cluster
    has one, else worker 0; always True outside a multi-worker cluster."""
    resolver = getattr(strategy, 'cluster_resolver', None)
    if resolver is None or not resolver.task_type:
        return True
    if resolver.task_type == 'chief':
        return True
    has_chief = 'chief' in resolver.cluster_spec().as_dict()
    return (not has_chief and resolver.task_type == 'worker' and
            resolver.task_id == 0)


def write_dir(strategy, directory):
    """Where this process writes a save of `directory`: `directory` itself
    on the chief, a private `directory/.worker_tmp_<type>_<id>` elsewhere."""
    if is_chief(strategy):
        return directory
    resolver = strategy.cluster_resolver
    return os.path.join(
        directory, f'.worker_tmp_{resolver.task_type}_{resolver.task_id}')


@contextlib.contextmanager
def save_dir(strategy, directory):
    """Yields `write_dir(strategy, directory)`, deleting it on exit unless
    this process is the chief.

    Under MultiWorkerMirroredStrategy every worker must take part in a save
    (reading mirrored and sync-on-read variables runs collectives), but only
    the chief's copy is kept (TF "Multi-worker training with Keras").

    Args:
        strategy: the running `tf.distribute.Strategy`.
        directory: where the chief writes.

    Yields:
        The directory to write to.
    """
    target = write_dir(strategy, directory)
    try:
        yield target
    finally:
        if target != directory:
            shutil.rmtree(target, ignore_errors=True)


def barrier(strategy):
    """Returns once every worker of a `MultiWorkerMirroredStrategy` has
    called it; at once under any other strategy.

    A cross-worker all-reduce: what the chief does to shared files before
    it (deleting a run) is done when the other workers pass it.

    Args:
        strategy: the `tf.distribute.Strategy` every worker runs.
    """
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return
    strategy.reduce(tf.distribute.ReduceOp.SUM,
                    strategy.run(lambda: tf.ones([])), axis=None)
