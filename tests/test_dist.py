"""The cross-replica collectives."""

import numpy as np
import tensorflow as tf

from paws_tf import dist


def test_helpers_are_identity_with_one_replica():
    x = tf.constant([[1.0, 2.0]])
    assert dist.num_replicas() == 1
    np.testing.assert_array_equal(dist.all_gather(x), x)
    np.testing.assert_array_equal(dist.all_reduce_mean(x), x)


def test_gather_and_mean_across_two_replicas(two_replicas):
    strategy = two_replicas

    @tf.function
    def step():
        rid = tf.distribute.get_replica_context().replica_id_in_sync_group
        x = tf.fill([2, 1], tf.cast(rid, tf.float32) + 1.0)
        return dist.all_gather(x), dist.all_reduce_mean(x), dist.num_replicas()

    gathered, mean, count = strategy.run(step)
    for value in strategy.experimental_local_results(gathered):
        np.testing.assert_array_equal(value, [[1.0], [1.0], [2.0], [2.0]])
    for value in strategy.experimental_local_results(mean):
        np.testing.assert_array_equal(value, [[1.5], [1.5]])
    assert all(int(c) == 2 for c in strategy.experimental_local_results(count))
