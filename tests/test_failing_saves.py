"""A save that cannot be written (no space left, permission lost, a
read-only filesystem) stops training with an error naming the path and the
cause; what was saved before stays restorable, and running the same command
again once the fault is fixed resumes from it."""

import errno
import os
import pathlib

import pytest
import tensorflow as tf
import tf_keras

from tests.helpers import failing_saves
from tests.helpers import run_py
from paws_tf import checkpoints
from paws_tf import run_dir

HELPER = pathlib.Path(failing_saves.__file__)


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize(
    'subdir, succeed, name, cause, kept_checkpoint, kept_backup', [
        # ckpt-8 and ckpt-16 are written, ckpt-24 fails; the backup of
        # step 24 was written just before it.
        ('checkpoints', 2, 'ENOSPC', 'No space left on device', 16,
         24),
        # Backups of steps 4..20 are written, step 24's fails (before that
        # step's checkpoint).
        ('backup', 5, 'EROFS', 'Read-only file system', 16, 20),
    ], ids=['checkpoint-ENOSPC', 'backup-EROFS'])
def test_a_failing_save_loses_nothing_and_the_rerun_resumes(
        tmp_path, subdir, succeed, name, cause, kept_checkpoint, kept_backup,
        run_main, capsys, caplog):
    """The failing run is run.py with the fault injected; the rerun is
    `cli.main` in this process on the same arguments."""
    code, output = run_py.finish(run_py.start(
        tmp_path, script=HELPER, script_args=[subdir, succeed, name]))
    assert code == os.EX_IOERR, output[-3000:]
    assert 'Could not write the ' in output
    assert f'in {tmp_path / subdir}' in output and cause in output
    checkpoint_dir = tmp_path / 'checkpoints'
    backup_dir = tmp_path / 'backup'
    path, step = checkpoints.latest(str(checkpoint_dir))
    assert step == kept_checkpoint and checkpoints.damage(path) is None
    assert checkpoints.backup_step(run_dir.RunDir(tmp_path)) == kept_backup
    assert checkpoints.damage(
        tf.train.latest_checkpoint(str(backup_dir / 'chief'))) is None
    assert (f'unchanged: the checkpoint {path} (step {step}) and the backup '
            f'in {backup_dir} (step {kept_backup})') in output

    # The fault fixed (absl's INFO records, which run.py prints, kept for
    # `caplog`).
    code, output = run_py.in_process(run_main, capsys, run_py.command(
        tmp_path, flags=['--verbosity=0']))
    assert code == 0, output[-3000:]
    assert f'Training steps {kept_backup}..32' in caplog.text
    assert checkpoints.latest(str(checkpoint_dir))[1] == 32


def test_a_checkpoint_write_without_permission_names_path_and_cause(
        tmp_path):
    inputs = tf_keras.Input([3])
    model = tf_keras.Model(inputs, tf_keras.layers.Dense(2)(inputs))
    model.compile(optimizer=tf_keras.optimizers.SGD(0.1))
    model.optimizer.build(model.trainable_variables)
    state = checkpoints.RunState(run_dir.RunDir(tmp_path), model,
                                 tf.distribute.get_strategy(),
                                 keep_checkpoints=3)
    checkpoint_dir = tmp_path / 'checkpoints'
    with failing_saves.inject(str(checkpoint_dir), 1, errno.EACCES):
        model.optimizer.iterations.assign(1)
        state.save(checkpoints.CHECKPOINT)
        model.optimizer.iterations.assign(2)
        with pytest.raises(checkpoints.SaveFailed) as failed:
            state.save(checkpoints.CHECKPOINT)
    assert (f'Could not write the checkpoint ckpt-2 in {checkpoint_dir}: '
            in str(failed.value))
    assert 'Permission denied' in str(failed.value)
    assert f'the checkpoint {checkpoint_dir / "ckpt-1"} (step 1)' in str(
        failed.value)
    path, step = checkpoints.latest(str(checkpoint_dir))
    assert step == 1 and checkpoints.damage(path) is None
