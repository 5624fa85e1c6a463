"""Cross-replica collectives of the loss and the train step, the identity
with one replica or outside a replica context."""

import tensorflow as tf


def num_replicas():
    """Number of replicas in sync in the current replica context (1
    outside)."""
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


def replica_id():
    """This replica's index among all replicas of all workers (0 outside a
    replica context or with one replica): its rows of an `all_gather` start
    at `replica_id() * rows_per_replica`."""
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return 0
    return ctx.replica_id_in_sync_group


def all_reduce_mean(x):
    """Mean of `x` over replicas (identity with one replica).

    Its gradient is the mean all-reduce of the upstream gradient, which is
    what a loss divided by the number of replicas needs.
    """
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return x
    return ctx.all_reduce(tf.distribute.ReduceOp.MEAN, x)
