"""Processes of a two-worker MultiWorkerMirroredStrategy cluster on
127.0.0.1, each with its TF_CONFIG (or Slurm's environment, `slurm_env`)."""

import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import tensorflow as tf

from paws_tf import checkpoints
from paws_tf import run_dir
from paws_tf import cluster

REPO = pathlib.Path(__file__).resolve().parents[2]
# run.py in one process whose CPU holds two logical devices: with
# `--strategy=mirrored` and `ONE_PROCESS_TWO_REPLICAS`, the two replicas of
# a two-worker cluster.
TWO_CPUS = REPO / 'tests' / 'helpers' / 'two_cpus.py'
ONE_PROCESS_TWO_REPLICAS = "make_strategy.devices = ['CPU:0', 'CPU:1']"
# What a worker but the chief writes while it runs, and deletes.
WORKER_TEMP = ('.worker_tmp_*', 'workertemp_*')
# The line in which every process of a training run prints its final
# weights' fingerprint.
FINGERPRINT = re.compile(r'Final weights fingerprint \(SHA-256\): (\w+)')


def start_cluster(argv, workers=2, env=None, extra_args=None,
                  tf_configs=None):
    """Starts `python argv` as every worker of a cluster on 127.0.0.1,
    worker i with `extra_args[i]` after `argv` when given.

    Args:
        tf_configs: the workers' TF_CONFIG values (default
            `cluster.loopback_tf_configs(workers)`).

    Returns:
        The started workers' `subprocess.Popen`s, by task index, output
        captured.
    """
    procs = []
    for index, tf_config in enumerate(
            tf_configs or cluster.loopback_tf_configs(workers)):
        args = list(argv) + list((extra_args or {}).get(index, ()))
        environment = dict(os.environ, PYTHONPATH=str(REPO),
                           TF_CPP_MIN_LOG_LEVEL='2', TF_CONFIG=tf_config,
                           **(env or {}))
        procs.append(subprocess.Popen(
            [sys.executable] + [str(a) for a in args], cwd=REPO,
            # A variable given as None is left out.
            env={k: v for k, v in environment.items() if v is not None},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def finish_all(procs, timeout=600):
    """`[(returncode, output)]` of `procs` once they end (killed after
    `timeout` seconds)."""
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc in procs:
            proc.kill()
    return [(proc.returncode, out) for proc, out in zip(procs, outputs)]


def launch_cluster(argv, timeout=600, env=None, extra_args=None):
    """Runs `start_cluster(argv, env=env, extra_args=extra_args)`; returns
    `[(returncode, output)]` by task index."""
    return finish_all(start_cluster(argv, env=env, extra_args=extra_args),
                      timeout)


def kill_worker_after_backup(procs, model_dir, step, worker=1,
                             timeout=600):
    """Kills `procs[worker]` once the backup of the run in `model_dir` holds
    `step` or a later one; the workers must all run until then."""
    deadline = time.time() + timeout
    while checkpoints.backup_step(run_dir.RunDir(model_dir)) < step:
        assert all(p.poll() is None for p in procs), 'ended too early'
        assert time.time() < deadline
        time.sleep(0.2)
    procs[worker].kill()
    procs[worker].wait()


def check_ran(results):
    """Checks that every `(returncode, output)` of `results` ended well."""
    for index, (code, output) in enumerate(results):
        assert code == 0, f'worker {index}:\n{output[-4000:]}'


def fingerprints(outputs):
    """The final weights' fingerprints the processes of `outputs` (their
    outputs) printed, in order."""
    return [found for output in outputs
            for found in FINGERPRINT.findall(output)]


def written(model_dir):
    """The relative paths under `model_dir`, TensorBoard event files named
    by their directory (their names hold the host, process and time)."""
    paths = []
    for path in pathlib.Path(model_dir).rglob('*'):
        relative = str(path.relative_to(model_dir))
        if path.name.startswith('events.out.tfevents.'):
            relative = os.path.join(os.path.dirname(relative), 'EVENTS')
        paths.append(relative)
    return sorted(paths)


def worker_leftovers(model_dir):
    """What a worker but the chief left under `model_dir`."""
    return [path for pattern in WORKER_TEMP
            for path in pathlib.Path(model_dir).rglob(pattern)]


def exported_embeddings(model_dir, images):
    """The embeddings of preprocessed `images` by `model_dir`'s exported
    embedder."""
    embedder = tf.saved_model.load(str(model_dir / 'export' / 'embedder'))
    return embedder.call_preprocessed(images)['embeddings'].numpy()


def free_port_pair():
    """A port p such that p and p + 1 are free on 127.0.0.1
    (SlurmClusterResolver gives a node's tasks consecutive ports)."""
    for _ in range(100):
        with socket.socket() as first, socket.socket() as second:
            first.bind(('127.0.0.1', 0))
            port = first.getsockname()[1]
            try:
                second.bind(('127.0.0.1', port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError('No two consecutive free ports.')


def slurm_env(rank, tasks=2):
    """The environment srun gives task `rank` of a job step of `tasks`
    tasks on one node, 127.0.0.1, with TF_CONFIG unset: TF 2.21's
    SlurmClusterResolver expands SLURM_STEP_NODELIST itself (it calls no
    scontrol)."""
    return dict(SLURM_JOB_ID='4242', SLURM_NTASKS=str(tasks),
                SLURM_STEP_NUM_TASKS=str(tasks),
                SLURM_STEP_NODELIST='127.0.0.1',
                SLURM_STEP_TASKS_PER_NODE=str(tasks), TF_CONFIG='',
                SLURM_PROCID=str(rank))
