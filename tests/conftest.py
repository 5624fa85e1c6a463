"""Test set-up: two logical CPU devices, so MirroredStrategy has 2 replicas."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import paws_tf  # noqa: F401,E402  (selects tf_keras before TF is used)
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# Must run before TF initialises its devices, i.e. before any op executes.
_CPUS = tf.config.list_physical_devices('CPU')
tf.config.set_logical_device_configuration(
    _CPUS[0], [tf.config.LogicalDeviceConfiguration()] * 2)


@pytest.fixture(scope='session')
def two_replicas():
    """The session's one 2-replica MirroredStrategy on the logical CPUs.

    Several MirroredStrategy objects in one process reuse collective
    instance keys, so collectives of one can be matched with another's
    ("Collective instance N expected type ..."): tests share this one.
    """
    return tf.distribute.MirroredStrategy(['CPU:0', 'CPU:1'])
