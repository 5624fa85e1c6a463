"""A real two-process MultiWorkerMirroredStrategy cluster on 127.0.0.1."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
WORKER = REPO / 'tests' / 'helpers' / 'mwms_worker.py'


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(('127.0.0.1', 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def launch_cluster(script, args, timeout=300, env_extra=None):
    """Runs `script args` as worker 0 and 1 of a local cluster; returns the
    completed processes (stdout and stderr captured)."""
    workers = [f'127.0.0.1:{p}' for p in free_ports(2)]
    procs = []
    for index in range(2):
        env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL='2',
                   TF_CONFIG=json.dumps({
                       'cluster': {'worker': workers},
                       'task': {'type': 'worker', 'index': index}}),
                   **(env_extra or {}))
        procs.append(subprocess.Popen(
            [sys.executable, str(script)] + [str(a) for a in args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True))
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc in procs:
            proc.kill()
    return [(proc.returncode, out) for proc, out in zip(procs, outputs)]


@pytest.mark.slow
def test_two_workers_fit_to_identical_weights_and_only_chief_saves(tmp_path):
    model_dir, out_dir = tmp_path / 'model', tmp_path / 'out'
    model_dir.mkdir()
    out_dir.mkdir()
    results = launch_cluster(WORKER, [model_dir, out_dir])
    for code, output in results:
        assert code == 0, output[-3000:]
    assert 'chief done 4' in results[0][1]
    assert 'worker done 4' in results[1][1]

    weights = [np.load(out_dir / f'{i}.npz') for i in range(2)]
    assert len(weights[0].files) > 10
    for key in weights[0].files:
        np.testing.assert_array_equal(weights[0][key], weights[1][key])
    # The chief's save is the only one left; the worker's temp dir is gone.
    assert sorted(os.listdir(model_dir)) == ['weights.h5']
