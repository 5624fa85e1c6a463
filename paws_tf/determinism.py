"""Bit-identical reruns on one machine: TensorFlow's op determinism and the
graph rewrites that differ from process to process."""

import tensorflow as tf

# Grappler rewrites turned off by `enable`. With op determinism alone, two
# processes training gin_configs/debug.gin on a 2-core CPU differed after 9
# to 95 of 192 steps in most pairs (first a LARS trust ratio one rounding
# apart, from a weight gradient's norm; the input batches were identical),
# with one thread or two, oneDNN on or off. With Grappler's arithmetic
# optimizer off, every pair was bit-identical; with its remapper off instead,
# they still differed. So that optimizer does not rewrite the train step's
# graph the same way in every process (TensorFlow 2.21).
GRAPPLER_OFF = {'arithmetic_optimization': False}


def enable():
    """Makes training reproducible, bit for bit, on one machine: turns on
    TensorFlow's op determinism (kernels without a deterministic
    implementation raise) and turns off `GRAPPLER_OFF`. Call it before the
    first `tf.function` is traced, which Grappler options apply to."""
    tf.config.experimental.enable_op_determinism()
    tf.config.optimizer.set_experimental_options(GRAPPLER_OFF)
