"""Distribution strategies, and cross-replica helpers that are the identity
with one replica."""

import json
import os

import gin
import tensorflow as tf

STRATEGY_KINDS = ('auto', 'one_device', 'mirrored', 'multi_worker')


def _cluster_in_environment():
    """True when TF_CONFIG or Slurm describes a job of several processes."""
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
            several GPUs are visible, else `one_device`.
        devices: explicit device list for `mirrored` (e.g. logical CPUs
            `['CPU:0', 'CPU:1']`); default all GPUs (or the CPU).

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
        if _cluster_in_environment():
            kind = 'multi_worker'
        elif len(gpus) > 1:
            kind = 'mirrored'
        else:
            kind = 'one_device'
    if kind == 'one_device':
        return tf.distribute.OneDeviceStrategy('/gpu:0' if gpus else '/cpu:0')
    if kind == 'mirrored':
        return tf.distribute.MirroredStrategy(devices)
    return tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=_cluster_resolver())


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
