"""Test set-up: two logical CPU devices, so MirroredStrategy has 2 replicas."""

import os
import pathlib

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')


def _share_the_cores():
    """Under pytest-xdist, each test process (and every run.py it starts,
    which inherits the environment) takes its share of the cores for
    TensorFlow's thread pools, unless TF_NUM_INTRAOP_THREADS or
    TF_NUM_INTEROP_THREADS already choose. Each pool has a thread per
    core by default, so two processes on two cores run four threads that
    spin for each other."""
    workers = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', 0))
    if workers:
        share = str(max(1, len(os.sched_getaffinity(0)) // workers))
        os.environ.setdefault('TF_NUM_INTRAOP_THREADS', share)
        os.environ.setdefault('TF_NUM_INTEROP_THREADS', share)


_share_the_cores()

from absl import flags  # noqa: E402
import gin  # noqa: E402
# paws_tf (which selects tf_keras before TF is used) and TensorFlow loaded
# as run.py loads them: TF's start-up logs (C++ notes, the failed cuInit of
# a machine without a GPU) held back, shown if it fails.
from paws_tf import cli  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from paws_tf import cluster  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]

# Must run before TF initialises its devices, i.e. before any op executes.
_CPUS = tf.config.list_physical_devices('CPU')
tf.config.set_logical_device_configuration(
    _CPUS[0], [tf.config.LogicalDeviceConfiguration()] * 2)



def _offset_collective_keys():
    """Gives strategies created from now on collective keys of their own.

    Every MirroredStrategy numbers its collectives from group key
    1 + `_collective_key_base`, so a second strategy in one process reuses
    the first one's keys and their collectives get matched with each other
    ("Collective instance N expected type ..."). TF's own tests offset the
    base this way; a program creates one strategy and never needs it.
    """
    tf.distribute.MirroredStrategy._collective_key_base += 1000


def pytest_collection_modifyitems(items):
    """Runs the modules that hold `slow` tests first, each module's tests
    together (their order is otherwise kept).

    With `make test`'s work-stealing processes (`--dist worksteal`), a
    process that runs out of tests takes the end of another's queue, so
    the long runs at its start finish early instead of holding the other
    process idle at the end. A module's tests stay together: a
    module-scoped fixture (a trained run, a built pipeline) is built again
    each time a process comes back to its module.
    """
    slow_modules = {item.module for item in items
                    if item.get_closest_marker('slow') is not None}
    items.sort(key=lambda item: item.module not in slow_modules)


@pytest.fixture(autouse=True)
def fresh_collective_keys():
    _offset_collective_keys()


@pytest.fixture
def two_replicas():
    """A fresh 2-replica MirroredStrategy on the two logical CPUs, as
    `cluster.make_strategy` builds it."""
    strategy = cluster.make_strategy('mirrored', ['CPU:0', 'CPU:1'])
    _offset_collective_keys()
    return strategy


@pytest.fixture
def two_replicas_collective():
    """A fresh 2-replica MirroredStrategy on the two logical CPUs that
    all-reduces with collective ops, as on GPUs and across workers."""
    strategy = tf.distribute.MirroredStrategy(['CPU:0', 'CPU:1'])
    _offset_collective_keys()
    return strategy


@pytest.fixture
def eval_batches(monkeypatch):
    """The `batch_size` of each call of `pipeline.make_eval_dataset` from
    now on, in order (the calls go through)."""
    from paws_tf.data import pipeline  # pylint: disable=import-outside-toplevel
    batches, make = [], pipeline.make_eval_dataset
    monkeypatch.setattr(pipeline, 'make_eval_dataset', lambda *args, **kw: (
        batches.append(kw['batch_size']) or make(*args, **kw)))
    return batches


@pytest.fixture
def clean_gin():
    """An empty gin config that finds the repository's gin files."""
    gin.clear_config()
    gin.add_config_file_search_path(str(REPO))
    yield
    gin.clear_config()


@pytest.fixture
def run_main(clean_gin):
    """Runs run.py's `cli.main` in this process on run.py's arguments,
    flags restored after; `printed=True` runs it as run.py does, a user's
    error printed as one line and ended by `SystemExit(its exit code)`."""
    del clean_gin

    def run(*args, printed=False):
        flags.FLAGS.unparse_flags()
        flags.FLAGS(['run.py'] + list(args))
        (cli._main_with_messages if printed else cli.main)(['run.py'])

    yield run
    flags.FLAGS.unparse_flags()
