"""Cross-replica collectives of the loss and the train step, the identity
with one replica or outside a replica context; a step's values averaged
over replicas (`LastValue`)."""

import tensorflow as tf
import tf_keras

from paws_tf import as_written  # noqa: F401  (AutoGraph leaves paws_tf)


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


class LastValue(tf_keras.metrics.Metric):
    """The most recent value, averaged over replicas (not over steps).

    For values that describe the current step (learning rate, trust ratios,
    occasional diagnostics): Keras would sum raw per-replica tensors returned
    by `train_step` (its "auto" reduction), and a `Mean` tracker would
    average them over the epoch. `initial`: its value before any update.
    """

    def __init__(self, name, initial=0.0, **kwargs):
        super().__init__(name=name, **kwargs)
        self._value = self.add_weight(
            name='value', initializer=tf_keras.initializers.Constant(
                initial), aggregation=tf.VariableAggregation.MEAN)

    def update_state(self, value):
        self._value.assign(tf.cast(value, self.dtype))

    def result(self):
        return tf.identity(self._value)

    def reset_state(self):
        """Keeps the value: Keras resets metrics at every epoch start, and a
        value computed every N steps must not read 0 in between."""
