"""A damaged checkpoint is not the end: resuming skips a backup or a
checkpoint that cannot be restored for the newest one that can, with a
warning naming what was skipped; when none can, the error lists what was
tried and every file stays where it was."""

import hashlib
import json
import os
import pathlib
import shutil

import pytest

from tests.helpers import failing_saves
from tests.helpers import once
from tests.helpers import run_py
from paws_tf import checkpoints

HELPER = pathlib.Path(failing_saves.__file__)
BINDINGS = ['train.num_epochs = 3']  # 48 steps.


@pytest.fixture(scope='module')
def stopped_run(tmp_path_factory):
    """A run stopped at step 32 of 48 (its fourth checkpoint could not be
    written): ckpt-8, ckpt-16, ckpt-24 and a backup of step 32."""
    def stop(model_dir):
        code, output = run_py.finish(run_py.start(
            model_dir, BINDINGS, script=HELPER,
            script_args=['checkpoints', 3, 'ENOSPC']))
        assert code == os.EX_IOERR, output[-3000:]

    model_dir, _ = once.made(tmp_path_factory, 'stopped', stop)
    return model_dir


def data_file(prefix):
    return pathlib.Path(f'{prefix}.data-00000-of-00001')


def backup_prefix(model_dir):
    (prefix, _), = checkpoints.all_checkpoints(
        str(model_dir / 'backup' / 'chief'))
    return prefix


def truncate(path):
    os.truncate(path, os.path.getsize(path) // 2)


def corrupt(path):
    """Flips bytes mid-file, keeping its size (a checksum catches it)."""
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 16):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def copy_of(stopped_run, tmp_path):
    model_dir = tmp_path / 'run'
    shutil.copytree(stopped_run, model_dir)
    return model_dir


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize('damaged_checkpoints, resumed_at', [
    ((), 24),  # Mid-epoch: fit starts at step 8 of epoch 2.
    ((24,), 16),
], ids=['backup', 'backup-and-newest-checkpoint'])
def test_resume_falls_back_to_the_newest_that_restores(
        stopped_run, tmp_path, damaged_checkpoints, resumed_at):
    model_dir = copy_of(stopped_run, tmp_path)
    checkpoint_dir = model_dir / 'checkpoints'
    backup = backup_prefix(model_dir)
    truncate(data_file(backup))
    for step in damaged_checkpoints:
        corrupt(data_file(checkpoint_dir / f'ckpt-{step}'))
    code, output = run_py.finish(run_py.start(model_dir, BINDINGS))
    assert code == 0, output[-3000:]
    assert 'Skipping what cannot be restored' in output
    assert f'the backup {backup}: ' in output
    for step in damaged_checkpoints:
        assert f'{checkpoint_dir / f"ckpt-{step}"}: ' in output
    assert (f'Resuming from {checkpoint_dir / f"ckpt-{resumed_at}"} (step '
            f'{resumed_at})') in output
    assert f'Training steps {resumed_at}..48' in output
    assert checkpoints.latest(str(checkpoint_dir))[1] == 48
    # The damaged backup is kept aside, not deleted.
    moved, = (model_dir / 'damaged').iterdir()
    assert (moved / 'chief' / data_file(backup).name).stat().st_size == \
        data_file(backup_prefix(stopped_run)).stat().st_size // 2


def digests(model_dir):
    return {path: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in model_dir.rglob('*') if path.is_file()}


@pytest.mark.slow
@pytest.mark.long
def test_when_nothing_restores_the_error_lists_what_was_tried(stopped_run,
                                                              tmp_path):
    model_dir = copy_of(stopped_run, tmp_path)
    checkpoint_dir = model_dir / 'checkpoints'
    truncate(data_file(backup_prefix(model_dir)))
    for step in (8, 16, 24):
        corrupt(data_file(checkpoint_dir / f'ckpt-{step}'))
    before = digests(model_dir)
    code, output = run_py.finish(run_py.start(model_dir, BINDINGS))
    assert code == os.EX_DATAERR, output[-3000:]
    assert f'No backup or checkpoint of {model_dir} can be restored' in output
    assert f'the backup {backup_prefix(model_dir)}: ' in output
    for step in (24, 16, 8):
        assert f'{checkpoint_dir / f"ckpt-{step}"}: ' in output
    after = digests(model_dir)
    assert {p: d for p, d in after.items() if p.name != 'flags.txt'} == {
        p: d for p, d in before.items() if p.name != 'flags.txt'}


@pytest.mark.slow
@pytest.mark.long
def test_evaluation_reads_the_newest_checkpoint_that_restores(
        stopped_run, tmp_path, run_main, capsys, caplog):
    """`--mode=evaluate_nn` (`cli.main` in this process) of a run whose
    newest checkpoint is damaged evaluates the one before it. Fails if the
    evaluation reads the directory's latest checkpoint (the damaged
    ckpt-24) after the model was restored from ckpt-16."""
    model_dir = copy_of(stopped_run, tmp_path)
    checkpoint_dir = model_dir / 'checkpoints'
    corrupt(data_file(checkpoint_dir / 'ckpt-24'))
    code, output = run_py.in_process(run_main, capsys, run_py.command(
        model_dir, BINDINGS, mode='evaluate_nn'))
    assert code == 0, output[-3000:]
    assert f'{checkpoint_dir / "ckpt-24"}: ' in caplog.text
    assert (f'Reading {checkpoint_dir / "ckpt-16"} (step 16)'
            in caplog.text), caplog.text[-3000:]
    results = json.loads((model_dir / 'eval' / 'paws_nn.json').read_text())
    assert results['source_path'] == str(checkpoint_dir / 'ckpt-16')
