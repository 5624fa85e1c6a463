"""The cluster's life cycle: the strategy by name, the chief, each worker's
save directory, barriers, and a failed collective told as the lost worker."""

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket

from absl import logging
import gin
import numpy as np
import tensorflow as tf

from paws_tf import checks
from paws_tf import rendezvous

STRATEGY_KINDS = ('auto', 'one_device', 'mirrored', 'multi_worker')
# TensorFlow's intra-op threads in a job that trains on GPUs: its host CPU
# makes the input, whose ops then each run whole in their tf.data worker
# instead of splitting over the pool and blocking it (docs/performance.md,
# "Why one intra-op thread").
GPU_JOB_INTRA_OP_THREADS = 1


def _tf_config():
    """TF_CONFIG as a dict ({} when unset); ConfigError for one that is not
    a JSON object."""
    text = os.environ.get('TF_CONFIG') or '{}'
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise checks.ConfigError(
            f'TF_CONFIG is not a JSON object: {text[:200]!r}. Set it to one '
            'such as {"cluster": {"worker": ["host0:2222", "host1:2222"]}, '
            '"task": {"type": "worker", "index": 0}} (BUILD.md, "Cluster '
            'launch").')
    return value


def cluster_in_environment():
    """True when TF_CONFIG or Slurm describes a job of several processes."""
    workers = sum(map(len, _tf_config().get('cluster', {}).values()))
    return workers > 1 or int(os.environ.get('SLURM_NTASKS', '1')) > 1


def _cluster_resolver(slurm_port_base):
    if _tf_config():
        return tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if 'SLURM_JOB_ID' in os.environ:
        gpus = {}
        if not tf.config.list_physical_devices('GPU'):
            # CPU workers: the resolver gives each task of a node its own
            # GPUs, and would find none (or no nvidia-smi) to give.
            tasks = int(os.environ.get('SLURM_STEP_NUM_TASKS', 1))
            gpus = dict(gpus_per_node=tasks, gpus_per_task=1,
                        auto_set_gpu=False)
        return tf.distribute.cluster_resolver.SlurmClusterResolver(
            port_base=slurm_port_base, **gpus)
    raise ValueError(
        'strategy "multi_worker" needs a cluster description: set TF_CONFIG '
        'or launch the job with Slurm (srun); see BUILD.md, section '
        '"Cluster launch".')


def intra_op_threads(devices, gpus, environ=None):
    """The intra-op threads of a job training on `devices` (device names,
    of which any of type GPU makes a GPU job; None: every GPU of `gpus`,
    the visible ones, else the CPU): `GPU_JOB_INTRA_OP_THREADS` on GPUs;
    None, TensorFlow's default of a thread per core, on the CPU, whose
    train step's ops use them, or when TF_NUM_INTRAOP_THREADS in `environ`
    (default `os.environ`) chooses."""
    environ = os.environ if environ is None else environ
    if environ.get('TF_NUM_INTRAOP_THREADS'):
        return None
    on_gpus = (any(tf.DeviceSpec.from_string(device).device_type == 'GPU'
                   for device in devices) if devices else bool(gpus))
    return GPU_JOB_INTRA_OP_THREADS if on_gpus else None


def set_intra_op_threads(devices, gpus):
    """Sets `intra_op_threads(devices, gpus)`, if any, before TensorFlow's
    runtime starts (afterwards it keeps its threads, said in a warning)."""
    threads = intra_op_threads(devices, gpus)
    if threads is None:
        return
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    except RuntimeError:
        logging.warning('TensorFlow started before the strategy: it keeps '
                        'its intra-op threads, not the %d of a GPU job.',
                        threads)
    else:
        logging.info('%d intra-op thread(s): the host CPU makes the input.',
                     threads)


# The kind is run.py's --strategy flag.
@gin.configurable(denylist=['kind'])
def make_strategy(kind='auto', devices=None, slurm_port_base=8888,
                  start_timeout=600):
    """Builds the distribution strategy by name, before other TensorFlow
    ops run (`MultiWorkerMirroredStrategy` must come first), and sets the
    intra-op threads of a job on the devices the strategy trains on
    (`set_intra_op_threads`).

    Args:
        kind: one of `STRATEGY_KINDS`. `auto` picks `multi_worker` when
            TF_CONFIG or Slurm describes several processes, `mirrored` when
            several GPUs are visible, else `one_device` (TF's default
            strategy: one replica on the first GPU, or the CPU).
        devices: the devices of `mirrored` (e.g. logical CPUs `['CPU:0',
            'CPU:1']`); default all GPUs (or the CPU). Refused for the
            other kinds, which train on the visible GPUs (or the CPU).
        slurm_port_base: under Slurm, the port of a node's first task.
        start_timeout: seconds `multi_worker` waits for every task of the
            cluster to start (`rendezvous.wait_for_tasks`); 0: for ever.

    Raises:
        ValueError: unknown kind, or `multi_worker` without a cluster.
        checks.ConfigError: `devices` for another kind than `mirrored`.
        ClusterFailed: a task of the cluster did not start in time.
    """
    checks.one_of('make_strategy.kind', kind, STRATEGY_KINDS)
    gpus = tf.config.list_physical_devices('GPU')
    if kind == 'auto':
        kind = ('multi_worker' if cluster_in_environment() else
                'mirrored' if len(gpus) > 1 else 'one_device')
    if devices is not None and kind != 'mirrored':
        raise checks.ConfigError(
            f'make_strategy.devices = {devices!r} is bound, but the strategy '
            f'is {kind}, which trains on the visible GPUs (or the CPU) '
            'whatever it names: run with --strategy=mirrored, or remove the '
            'binding.')
    set_intra_op_threads(devices if kind == 'mirrored' else None, gpus)
    if kind == 'one_device':
        return tf.distribute.get_strategy()
    if kind == 'mirrored':
        return tf.distribute.MirroredStrategy(
            devices, cross_device_ops=_cross_device_ops(devices))
    checks.number('make_strategy.start_timeout', start_timeout, low=0)
    resolver = _cluster_resolver(slurm_port_base)
    try:
        rendezvous.wait_for_tasks(resolver, start_timeout)
    except rendezvous.NotStarted as error:
        raise ClusterFailed(str(error)) from None
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver)
    logging.info('MultiWorkerMirroredStrategy: %s of the cluster %s (from '
                 '%s), %d replicas.', task_name(strategy),
                 resolver.cluster_spec().as_dict(), type(resolver).__name__,
                 strategy.num_replicas_in_sync)
    return strategy


def report_results_once(model):
    """Makes `model`'s `fit` and `evaluate` report its metrics' results
    as they are, and returns `model`.

    A metric's result is already reduced over every replica of the cluster
    (`Metric.result` reads its sync-on-read variables); under
    MultiWorkerMirroredStrategy, tf_keras' default reduction of a step's
    results ("auto": a sum over the workers) would add the workers' copies
    up, every logged value times the number of workers.
    """
    model.distribute_reduction_method = 'first'
    return model


def _cross_device_ops(devices):
    """`ReductionToOneDevice` when `devices` lists only CPUs, else None
    (TensorFlow's collective all-reduces, NCCL on GPUs): logical CPUs share
    one memory, so summing on the first is one pass over the gradients,
    where a collective copies them into and out of a buffer per replica."""
    if devices and all(tf.DeviceSpec.from_string(device).device_type == 'CPU'
                       for device in devices):
        return tf.distribute.ReductionToOneDevice()
    return None


def loopback_tf_configs(workers):
    """The TF_CONFIG JSON string of each of `workers` (at least 1) processes
    of a cluster on 127.0.0.1, at ports free when this ran."""
    if workers < 1:
        raise ValueError(f'A cluster needs at least 1 worker, got {workers}.')
    # Bound at once, so that no two workers are given the same free port.
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.create_server(('127.0.0.1', 0)))
                   for _ in range(workers)]
        addresses = [f'127.0.0.1:{s.getsockname()[1]}' for s in sockets]
    return [json.dumps({'cluster': {'worker': addresses},
                        'task': {'type': 'worker', 'index': index}})
            for index in range(workers)]


class ClusterFailed(RuntimeError):
    """A collective across the workers of a cluster failed: a worker died,
    was stopped, never started, or runs another program."""
    EXIT_CODE = os.EX_UNAVAILABLE  # run.py's exit code.


# Errors of a collective whose peer is gone or stuck, beside the
# `Collective ...` errors of mismatched collectives.
_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.CancelledError,
                tf.errors.AbortedError, tf.errors.DeadlineExceededError)


def task_name(strategy):
    """'worker 1', 'chief 0'..., or 'this process' outside a cluster."""
    resolver = getattr(strategy, 'cluster_resolver', None)
    if resolver is None or not resolver.task_type:
        return 'this process'
    return f'{resolver.task_type} {resolver.task_id}'


def _lost_task(strategy, message):
    """'worker 1 (127.0.0.1:2223)': the first other task of the cluster
    that TensorFlow's `message` names (`/job:worker/replica:0/task:1`),
    with its address from TF_CONFIG; None when it names none."""
    addresses = rendezvous.cluster_tasks(strategy.cluster_resolver)
    for kind, index in re.findall(r'/job:(\w+)/replica:\d+/task:(\d+)',
                                  message):
        task = f'{kind} {int(index)}'
        if task != task_name(strategy):
            address = addresses.get(task)
            return task + (f' ({address})' if address else '')
    return None


def _cause(message):
    """The first line of TensorFlow's error `message` that says what went
    wrong (the peer that stopped, the mismatched collective): after a
    function's 'Graph execution error:', the node and its indented Python
    stack come first; the op's {{...}} name is left out."""
    for line in re.sub(r'\{\{.*?\}\}\s*', '', message).splitlines():
        if line.strip() and not line[0].isspace() and not line.startswith(
                ('Graph execution error:', 'Detected at node')):
            return line.strip()[:300]
    return message.strip().splitlines()[0][:300] if message.strip() else ''


def cluster_failure(strategy, error, *, what, step, resume):
    """The `ClusterFailed` that `error` stands for, or None.

    Args:
        strategy: the running strategy.
        error: the exception raised.
        what: what this worker was doing ('the training step').
        step: the global step it had reached.
        resume: where relaunching resumes ('its backup (step 8)').
    """
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return None
    if not isinstance(error, tf.errors.OpError) or not (
            isinstance(error, _PEER_ERRORS) or 'ollective' in error.message or
            'oordination' in error.message):
        return None
    cause = _cause(error.message)
    lost = _lost_task(strategy, error.message)
    if lost:
        culprit = f'{lost} was lost'
        logs = f'the log of {lost.split(" (")[0]}'
    else:
        culprit = "TensorFlow's error names no other worker"
        logs = "every worker's log"
    return ClusterFailed(
        f'{task_name(strategy)} stopped at step {step}: {culprit}; a '
        f'collective with the other workers failed during {what} '
        f'({type(error).__name__}: {cause}). A worker died, was stopped, or '
        f'runs another config or program. Find the first error in {logs}, '
        'fix it, then start the same command on every worker again: the '
        f'run resumes from {resume}.')


def check_same_config(strategy, config):
    """Raises `ClusterFailed` on every worker unless all workers pass the
    same `config` text (the gin config and the mode), which differing would
    make collectives mismatch: a hang, or an error far from the cause.
    Every worker must call it at the same point."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return
    digest = np.frombuffer(hashlib.sha256(config.encode()).digest()[:8],
                           np.int32)
    # [replicas, 2]: worker w's replicas are consecutive rows.
    digests = _traced(lambda: strategy.gather(
        strategy.run(lambda: tf.constant(digest)[tf.newaxis]), axis=0))
    tasks = list(rendezvous.cluster_tasks(strategy.cluster_resolver))
    per_worker = len(digests) // len(tasks)
    differing = [task for task, row in zip(tasks, digests[::per_worker])
                 if not np.array_equal(row, digests[0])]
    if differing:
        raise ClusterFailed(
            f'{task_name(strategy)}: the workers were started with different '
            f'configs: that of {", ".join(differing)} differs from that of '
            f'{tasks[0]} (gin files, --gin_bindings or --mode). Start the '
            'same command, with the same gin files, on every worker.')


def is_chief(strategy):
    """Whether this process is the chief: the `chief` task if the cluster
    has one, else worker 0; always True outside a multi-worker cluster."""
    resolver = getattr(strategy, 'cluster_resolver', None)
    if resolver is None or resolver.task_type in (None, '', 'chief'):
        return True
    return (resolver.task_type == 'worker' and resolver.task_id == 0 and
            'chief' not in resolver.cluster_spec().as_dict())


def write_dir(strategy, directory):
    """Where this process writes a save of `directory`: `directory` itself
    on the chief, a private `directory/.worker_tmp_<type>_<id>` elsewhere."""
    if is_chief(strategy):
        return directory
    resolver = strategy.cluster_resolver
    return os.path.join(
        directory, f'.worker_tmp_{resolver.task_type}_{resolver.task_id}')


@contextlib.contextmanager
def save_dir(strategy, directory):
    """Yields `write_dir(strategy, directory)`, deleting it on exit unless
    this process is the chief: every worker takes part in a save (reading
    the variables runs collectives), only the chief's copy is kept."""
    target = write_dir(strategy, directory)
    try:
        yield target
    finally:
        if target != directory:
            shutil.rmtree(target, ignore_errors=True)


def barrier(strategy):
    """Returns once every worker of a `MultiWorkerMirroredStrategy` has
    called it; at once under any other strategy. Workers whose part is done
    wait here for the chief's own work (deleting a run, export,
    evaluation): one that exits first is reported by the others'
    coordination service as a crash."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return
    _traced(lambda: strategy.reduce(tf.distribute.ReduceOp.SUM,
                                    strategy.run(lambda: tf.ones([])),
                                    axis=None))


def _traced(collective):
    """The NumPy value of `collective()` run as a tf.function: called
    eagerly, `strategy.run` logs a warning of its overhead every time."""
    return tf.function(collective, autograph=False)().numpy()
