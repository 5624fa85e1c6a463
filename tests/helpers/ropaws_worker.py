"""One worker of a two-process MultiWorkerMirroredStrategy cluster (TF_CONFIG)
computing the RoPAWS objective.

Run by tests/test_ropaws.py: every worker holds one replica, evaluates
`test_ropaws.worker_case()` (its own anchors and targets, the supports and
targets of both gathered) and writes its loss and gradients to
OUT/<task_index>.npz.
"""

import json
import os
import sys

import numpy as np

import paws_tf  # noqa: F401  (selects tf_keras)
import tensorflow as tf

from paws_tf import cluster


def main(out_dir):
    # The cluster's strategy must exist before TensorFlow runs any op.
    strategy = cluster.make_strategy('multi_worker')
    from tests import test_ropaws  # pylint: disable=import-outside-toplevel
    step = test_ropaws.two_replica_step(*test_ropaws.worker_case())
    loss, (grad_a, grad_s) = tf.function(lambda: strategy.run(step))()
    local = lambda x: strategy.experimental_local_results(x)[0]  # noqa: E731
    task = json.loads(os.environ['TF_CONFIG'])['task']
    np.savez(os.path.join(out_dir, f'{task["index"]}.npz'),
             loss=local(loss), grad_a=local(grad_a), grad_s=local(grad_s))


if __name__ == '__main__':
    main(sys.argv[1])
