"""A real two-process MultiWorkerMirroredStrategy cluster on 127.0.0.1."""

import json
import os
import pathlib

import numpy as np
import pytest

from tests.helpers import cluster

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
