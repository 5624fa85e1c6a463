"""Saves checkpoints through checkpoints.RunState in a loop, for ever.

Every weight of checkpoint `ckpt-<s>` equals s, so a checkpoint mixing two
saves is detectable. The weights are large (64 MB) to widen the window in
which tests/test_checkpoint_atomicity.py kills this process mid-save.
"""

import sys

import paws_tf  # noqa: F401  (selects tf_keras)
import tensorflow as tf
import tf_keras

from paws_tf import checkpoints
from paws_tf import run_dir


def main(directory):
    inputs = tf_keras.Input([2048])
    hidden = tf_keras.layers.Dense(2048)(inputs)
    model = tf_keras.Model(inputs, tf_keras.layers.Dense(2048)(hidden))
    model.compile(optimizer=tf_keras.optimizers.SGD(0.1, momentum=0.9))
    model.optimizer.build(model.trainable_variables)
    state = checkpoints.RunState(run_dir.RunDir(directory), model,
                                 tf.distribute.get_strategy(),
                                 keep_checkpoints=3)
    step = 0
    while True:
        step += 1
        model.optimizer.iterations.assign(step)
        for variable in model.variables + model.optimizer.variables():
            if variable.dtype.is_floating:
                variable.assign(tf.fill(variable.shape, float(step)))
        state.save(checkpoints.CHECKPOINT)
        print('saved', step, flush=True)


if __name__ == '__main__':
    main(sys.argv[1])
