"""Bit-identical reruns on one machine: TensorFlow's op determinism and the
graph rewrites that differ from process to process."""

import tensorflow as tf

# Grappler rewrites turned off by `enable`: with op determinism alone, two
# processes training debug.gin differed within 95 steps, until Grappler's
# arithmetic optimizer was off (docs/operations.md, "Reproducibility").
GRAPPLER_OFF = {'arithmetic_optimization': False}


def enable():
    """Makes training reproducible, bit for bit, on one machine: turns on
    TensorFlow's op determinism (kernels without a deterministic
    implementation raise) and turns off `GRAPPLER_OFF`. Call it before the
    first `tf.function` is traced, which Grappler options apply to."""
    tf.config.experimental.enable_op_determinism()
    tf.config.optimizer.set_experimental_options(GRAPPLER_OFF)
