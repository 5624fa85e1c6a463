"""Runs run.py in one process whose CPU is split into two logical devices.

    python two_cpus.py [run.py flags...]

With `--strategy=mirrored` and the binding `make_strategy.devices =
['CPU:0', 'CPU:1']`, the run has the two replicas of a two-worker cluster
(the same per-replica batches, support samples and global batch norm) in
one process.
"""

import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import paws_tf  # noqa: F401,E402  (selects tf_keras)
import tensorflow as tf  # noqa: E402

from paws_tf import cli  # noqa: E402


def main():
    # Before TensorFlow initialises its devices, i.e. before any op runs.
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices('CPU')[0],
        [tf.config.LogicalDeviceConfiguration()] * 2)
    cli.run([str(REPO / 'run.py')] + sys.argv[1:])


if __name__ == '__main__':
    main()
