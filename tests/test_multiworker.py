"""A real two-process MultiWorkerMirroredStrategy cluster on 127.0.0.1.

Bug tried that no test here catches: under --overwrite, no barrier after
the chief's deletion (the second `cluster.barrier` in `start._accept`
removed): the overwrite test passed (not traced further).
"""

import json
import os
import pathlib

import numpy as np
import pytest

from paws_tf import checkpoints
from tests.helpers import cluster
from tests.helpers import run_py

REPO = pathlib.Path(__file__).resolve().parents[1]
WORKER = REPO / 'tests' / 'helpers' / 'mwms_worker.py'


@pytest.mark.slow
@pytest.mark.long
def test_two_workers_fit_to_identical_weights_and_only_chief_saves(tmp_path):
    """Both workers end with the same weights; only the chief's save is
    left. What `fit` logs is the cluster's value once: LARS's constant
    learning rate 0.5; a zero-initialised fine-tuning classifier's top-1 of
    1 and loss ln 2 on images of class 0 (of 2).

    Fails if tf_keras adds up the workers' metric results (its reduction
    "auto" under MultiWorkerMirroredStrategy; tried: without
    `cluster.report_results_once`, learning rate 1.0; without it in
    `linear_fine_tune.build_classifier`, top-1 2.0).
    """
    model_dir, out_dir = tmp_path / 'model', tmp_path / 'out'
    model_dir.mkdir()
    out_dir.mkdir()
    results = cluster.launch_cluster([WORKER, model_dir, out_dir], timeout=300)
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
    for index in range(2):
        reported = json.loads((out_dir / f'{index}.json').read_text())
        assert reported['logged']['learning_rate'] == [0.5, 0.5]
        losses = reported['logged']['loss']
        assert len(losses) == 2 and all(np.isfinite(losses))
        assert reported['scores']['top1'] == 1.0
        np.testing.assert_allclose(reported['scores']['loss'], np.log(2),
                                   rtol=1e-6)


def run_py_args(model_dir):
    """run.py's command on every worker: `run_py.BINDINGS` on half of
    debug.gin's data (2 epochs of 8 steps, backups every 4)."""
    return ['run.py'] + run_py.command(
        model_dir, ['train/synthetic_source.num_images = 256'],
        ['--strategy=multi_worker'])


@pytest.mark.slow
@pytest.mark.long
def test_overwrite_on_a_cluster_the_chief_deletes_the_workers_wait(
        tmp_path):
    """--overwrite with another config: the chief deletes the previous run
    while the other worker waits at a barrier, so that it never reads the
    files being deleted (here a backup that cannot be restored)."""
    (tmp_path / 'config.gin').write_text('train.num_epochs = 99\n')
    backup = tmp_path / 'backup' / 'chief'
    backup.mkdir(parents=True)
    (backup / 'checkpoint').write_text('model_checkpoint_path: "ckpt-1"\n')
    (backup / 'ckpt-1.index').write_bytes(b'not a checkpoint')
    (tmp_path / 'run_history.txt').write_text('the previous run\n')
    # Deleted before the backup, these keep the chief deleting for seconds:
    # a worker that did not wait would find the backup still there.
    slow = tmp_path / 'checkpoints'
    slow.mkdir()
    for i in range(30_000):
        (slow / f'events.{i}').touch()
    results = cluster.launch_cluster(run_py_args(tmp_path) + ['--overwrite'],
                                     timeout=600)
    outputs = [output for _, output in results]
    for code, output in results:
        assert code == 0, output[-3000:]
        assert 'Training steps 0..16' in output
        assert 'cannot be restored' not in output
    assert '--overwrite: deleting the previous run' in outputs[0]
    assert 'deleting' not in outputs[1]
    prints = cluster.fingerprints(outputs)
    assert len(prints) == 2 and prints[0] == prints[1]
    assert checkpoints.latest(str(tmp_path / 'checkpoints'))[1] == 16
    history = (tmp_path / 'run_history.txt').read_text()
    assert 'the previous run' not in history
    assert history.count('started a new run of 16 steps') == 1
