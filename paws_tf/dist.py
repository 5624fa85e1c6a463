"""Cross-replica collectives of the loss and the train step, the identity
with one replica or outside a replica context."""

import tensorflow as tf


def _replica_context():
    """The replica context when there are several replicas, else None."""
    ctx = tf.distribute.get_replica_context()
    return ctx if ctx is not None and ctx.num_replicas_in_sync > 1 else None


def num_replicas():
    """Number of replicas in sync of the current strategy."""
    return tf.distribute.get_strategy().num_replicas_in_sync


def all_gather(x, axis=0):
    """Concatenates `x` (`[N, ...]` per replica) from all replicas along
    `axis`, in replica order: `[R * N, ...]`. Its gradient sums the upstream
    gradient over replicas and slices this replica's rows, as the official
    `AllGather` does. Every replica must call it, in the same order, with
    shapes that agree except along `axis` (else the collective hangs)."""
    ctx = _replica_context()
    return x if ctx is None else ctx.all_gather(x, axis=axis)


def replica_id():
    """This replica's index among all replicas of all workers (0 with one):
    its rows of an `all_gather` start at `replica_id() * rows_per_replica`."""
    ctx = _replica_context()
    return 0 if ctx is None else ctx.replica_id_in_sync_group


def all_reduce_mean(x):
    """Mean of `x` over replicas; its gradient is the mean all-reduce of the
    upstream gradient, what a loss divided by the number of replicas
    needs."""
    ctx = _replica_context()
    return x if ctx is None else ctx.all_reduce(tf.distribute.ReduceOp.MEAN, x)
