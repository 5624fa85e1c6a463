"""The data a run resumes on is the data it started on: files added to an
image folder or an edited split file stop the resumed run with an error
naming what changed, before anything is written; --overwrite starts the run
again on the new data, `train.on_data_change = 'continue'` resumes on it."""

import hashlib
import os
import pathlib
import shutil

import pytest

from tests.helpers import image_folders
from tests.helpers import run_py
from paws_tf import checkpoints
from paws_tf import run_dir
from paws_tf.data import data_fingerprint
from paws_tf.runner import experiment


def digests(directory):
    return {path: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in directory.rglob('*') if path.is_file()}


@pytest.mark.slow
@pytest.mark.long
def test_files_added_to_an_image_folder_stop_the_resumed_run(tmp_path):
    bindings = image_folders.SMALL + image_folders.write_experiment(
        tmp_path, unlabeled=8, test=2) + ['train.num_epochs = 1',
                                          'train.eval_every_epochs = 0']
    model_dir = tmp_path / 'run'

    def run(*extra):
        return run_py.finish(run_py.start(
            model_dir, bindings + list(extra),
            gin_file='gin_configs/image_folders.gin'))

    code, output = run()
    assert code == 0, output[-3000:]
    recorded = digests(model_dir / 'checkpoints')
    # Two more unlabeled images.
    image_folders.write_folder(tmp_path / 'unlabeled' / 'more', [''], 2,
                                 seed=3)
    code, output = run()
    assert code == os.EX_DATAERR, output[-3000:]
    assert 'The data differs from what the run in' in output
    assert 'unlabeled: 38 images, recorded 36' in output  # Labeled too.
    assert 'unlabeled: the image names (the folder listing' in output
    assert '\n  labeled: ' not in output  # The labeled folder is the same.
    assert "train.on_data_change = 'continue'" in output
    assert digests(model_dir / 'checkpoints') == recorded

    code, output = run("train.on_data_change = 'continue'")
    assert code == 0, output[-3000:]
    assert "train.on_data_change = 'continue': resuming on it" in output
    assert '"num_examples": 38' in (
        pathlib.Path(run_dir.RunDir(model_dir).fingerprint)).read_text()


@pytest.mark.slow
@pytest.mark.long
def test_an_edited_split_file_stops_the_resumed_run(tmp_path, run_main,
                                                   capsys):
    """The refused resume is `cli.main` in this process, its error printed
    as run.py prints it (the image folder test runs its refusal as a
    process); the runs before and after are run.py."""
    split = tmp_path / 'split.txt'
    split.write_text(''.join(f'{i}\n' for i in range(64)))  # 16 per class.
    bindings = ['train.num_epochs = 1', 'select_labeled.labels_per_class = '
                'None', f"select_labeled.split_file = '{split}'"]
    model_dir = tmp_path / 'run'
    code, output = run_py.finish(run_py.start(model_dir, bindings))
    assert code == 0, output[-3000:]
    recorded = pathlib.Path(run_dir.RunDir(model_dir).split).read_text()

    split.write_text(''.join(f'{i}\n' for i in range(64, 128)))
    code, output = run_py.in_process(run_main, capsys,
                                     run_py.command(model_dir, bindings))
    assert code == os.EX_DATAERR, output[-3000:]
    assert 'labeled: the image names' in output
    # All images stay unlabeled ones too (include_labeled_in_unlabeled).
    assert '\n  unlabeled: ' not in output
    # The recorded split is the one the checkpoints were trained on.
    assert pathlib.Path(run_dir.RunDir(model_dir).split).read_text() == recorded

    code, output = run_py.finish(run_py.start(model_dir, bindings,
                                              ['--overwrite']))
    assert code == 0, output[-3000:]
    assert '--overwrite: starting the run again' in output
    assert 'Training steps 0..16' in output
    assert pathlib.Path(run_dir.RunDir(model_dir).split).read_text() != recorded
    assert checkpoints.latest(run_dir.RunDir(model_dir).checkpoints)[1] == 16


def test_image_folders_moved_elsewhere_are_the_same_data(tmp_path):
    """The labeled and unlabeled folders (the labeled images streamed as
    unlabeled too) copied to another place have the fingerprint of the
    originals, as a run resumed on a node's copy reads them. Fails if the
    unlabeled images are named by their paths (tried: their names then
    differed, and the resumed run stopped as on changed data)."""
    image_folders.write_experiment(tmp_path / 'a', unlabeled=2, test=1)
    shutil.copytree(tmp_path / 'a', tmp_path / 'b')
    prints = [data_fingerprint.describe(experiment.image_folders(
        str(tmp_path / root / 'labeled'), str(tmp_path / root / 'unlabeled'))
        [1]) for root in ('a', 'b')]
    assert prints[0] == prints[1]
    assert prints[0]['num_examples'] == 2 * 3 + 4 * 3
