"""The one save/restore path of a run: when it saves, what it restores, and
where fit starts."""

import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from paws_tf import checkpoints
from paws_tf.runner import saving


def small_model():
    inputs = tf_keras.Input([3])
    model = tf_keras.Model(inputs, tf_keras.layers.Dense(2)(inputs))
    model.compile(optimizer=tf_keras.optimizers.SGD(0.1, momentum=0.9),
                  loss='mse')
    model.optimizer.build(model.trainable_variables)
    return model


def saved_steps(directory):
    return sorted(step for _, step in checkpoints.all_checkpoints(directory))


def test_saver_saves_when_the_step_reaches_or_passes_an_interval(tmp_path):
    """With 3 steps per call (steps_per_execution = 3) the step never
    lands on most multiples: each is saved at the first step past it."""
    model = small_model()
    state = saving.RunState(str(tmp_path), model,
                            tf.distribute.get_strategy(), keep_checkpoints=10)
    saver = saving.Saver(state, backup_every=4, checkpoint_every=8)
    saver.set_model(model)
    saver.on_train_begin()
    backups = []
    for step in range(3, 31, 3):
        model.optimizer.iterations.assign(step)
        saver.on_train_batch_end(0)
        backups.append(saving.backup_step(state.backup_dir))
    # Multiples of 4 first passed at 6 (4), 9 (8), 12, 18 (16), 21 (20),
    # 24, 30 (28); of 8 at 9, 18, 24.
    assert backups == [0, 6, 9, 12, 12, 18, 21, 24, 24, 30]
    assert saved_steps(state.checkpoint_dir) == [9, 18, 24]
    saver.on_epoch_end(0)  # Epoch ends always checkpoint, once per step.
    saver.on_epoch_end(0)
    assert saved_steps(state.checkpoint_dir) == [9, 18, 24, 30]
    saver.on_train_end()  # Finished: the backup goes, checkpoints stay.
    assert not os.path.exists(state.backup_dir)
    assert saved_steps(state.checkpoint_dir) == [9, 18, 24, 30]


def test_restore_returns_weights_and_optimizer_of_the_step(tmp_path):
    model = small_model()
    state = saving.RunState(str(tmp_path), model,
                            tf.distribute.get_strategy(), keep_checkpoints=3)
    model.optimizer.iterations.assign(5)
    kernel = np.arange(6, dtype=np.float32).reshape(3, 2)
    model.layers[1].kernel.assign(kernel)
    state.save(saving.BACKUP)
    other = small_model()
    saving.RunState(str(tmp_path), other, tf.distribute.get_strategy(),
                    keep_checkpoints=3).restore(
                        str(tmp_path / 'backup' / 'chief' / 'ckpt-5'))
    assert saving.global_step(other) == 5
    np.testing.assert_array_equal(other.layers[1].kernel.numpy(), kernel)


def test_a_file_named_for_another_step_is_refused(tmp_path):
    model = small_model()
    state = saving.RunState(str(tmp_path), model,
                            tf.distribute.get_strategy(), keep_checkpoints=3)
    model.optimizer.iterations.assign(5)
    state.save(saving.CHECKPOINT)
    prefix = tmp_path / 'checkpoints' / 'ckpt-5'
    for suffix in ('.index', '.data-00000-of-00001'):
        os.rename(f'{prefix}{suffix}', f'{tmp_path}/checkpoints/ckpt-7'
                  f'{suffix}')
    with pytest.raises(ValueError, match='holds the optimizer step 5, not 7'):
        state.restore(str(tmp_path / 'checkpoints' / 'ckpt-7'))


@pytest.mark.parametrize('width', [2, 4], ids=['extra-layer', 'other-shapes'])
def test_another_models_checkpoint_is_refused_naming_it(tmp_path, width):
    model = small_model()
    model.optimizer.iterations.assign(5)
    saving.RunState(str(tmp_path), model, tf.distribute.get_strategy(),
                    keep_checkpoints=3).save(saving.CHECKPOINT)
    inputs = tf_keras.Input([3])
    wider = tf_keras.Model(inputs, tf_keras.layers.Dense(width)(
        tf_keras.layers.Dense(width)(inputs)))
    wider.compile(optimizer=tf_keras.optimizers.SGD(0.1, momentum=0.9))
    wider.optimizer.build(wider.trainable_variables)
    path = str(tmp_path / 'checkpoints' / 'ckpt-5')
    with pytest.raises(ValueError, match='does not hold this run'):
        saving.RunState(str(tmp_path / 'other'), wider,
                        tf.distribute.get_strategy(),
                        keep_checkpoints=3).restore(path)


def test_the_newest_that_restores_wins_whichever_its_directory(tmp_path):
    model = small_model()
    state = saving.RunState(str(tmp_path), model,
                            tf.distribute.get_strategy(), keep_checkpoints=3)
    for step, kind in ((8, saving.CHECKPOINT), (12, saving.BACKUP),
                       (16, saving.CHECKPOINT), (16, saving.BACKUP)):
        model.optimizer.iterations.assign(step)
        state.save(kind)
    backup = str(tmp_path / 'backup' / 'chief' / 'ckpt-16')
    checkpoint = str(tmp_path / 'checkpoints' / 'ckpt-16')
    assert saving.newest_restorable(str(tmp_path)) == (backup, 16)
    assert saving.newest_restorable(str(tmp_path), backups=False) == (
        checkpoint, 16)
    assert saving.has_progress(str(tmp_path))
    assert not saving.has_progress(str(tmp_path / 'elsewhere'))
    assert saving.newest_restorable(str(tmp_path / 'elsewhere')) == (None, 0)


def corrupt(prefix):
    """Flips bytes mid-file, keeping its size (a checksum catches it)."""
    path = f'{prefix}.data-00000-of-00001'
    data = bytearray(open(path, 'rb').read())
    for i in range(len(data) // 2, len(data) // 2 + 8):
        data[i] ^= 0xFF
    open(path, 'wb').write(bytes(data))


def test_damaged_ones_are_skipped_and_a_damaged_backup_moved_aside(
        tmp_path, caplog):
    model = small_model()
    state = saving.RunState(str(tmp_path), model,
                            tf.distribute.get_strategy(), keep_checkpoints=3)
    for step, kind in ((8, saving.CHECKPOINT), (12, saving.BACKUP),
                       (16, saving.CHECKPOINT)):
        model.optimizer.iterations.assign(step)
        state.save(kind)
    backup = tmp_path / 'backup' / 'chief' / 'ckpt-12'
    corrupt(backup)
    corrupt(tmp_path / 'checkpoints' / 'ckpt-16')
    # A worker of a cluster decides alike and moves nothing.
    assert saving.newest_restorable(str(tmp_path), chief=False) == (
        str(tmp_path / 'checkpoints' / 'ckpt-8'), 8)
    assert backup.with_suffix('.index').exists()
    caplog.clear()
    with caplog.at_level('WARNING'):
        assert saving.newest_restorable(str(tmp_path)) == (
            str(tmp_path / 'checkpoints' / 'ckpt-8'), 8)
    moved, = (tmp_path / 'damaged').iterdir()
    assert (moved / 'chief' / 'ckpt-12.index').exists()
    assert not (tmp_path / 'backup').exists()
    warning = caplog.text
    assert f'{tmp_path}/checkpoints/ckpt-16: ' in warning
    assert f'the backup {backup}: ' in warning
    assert f'(moved to {moved})' in warning.split(f'the backup {backup}')[1]
    assert f'Resuming from {tmp_path}/checkpoints/ckpt-8 (step 8)' in warning


class Positions(tf_keras.callbacks.Callback):
    """The (epoch, batch) of every step fit runs."""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append((self.epoch, batch))


@pytest.mark.parametrize('start', [0, 7, 10])
def test_fit_starts_at_the_global_step(start):
    """3 epochs of 5 steps from global step `start`: mid-epoch (7: epoch 1,
    step 2) or at an epoch start (10)."""
    model = small_model()
    data = tf.data.Dataset.from_tensors(
        (tf.zeros([4, 3]), tf.zeros([4, 2]))).repeat()
    positions = Positions()
    positions.seen = []
    with saving.fit_starting_at(model, start):
        model.fit(data, epochs=3, steps_per_epoch=5, callbacks=[positions],
                  verbose=0)
    assert positions.seen == [divmod(step, 5) for step in range(start, 15)]
    assert model._training_state is None  # pylint: disable=protected-access


@pytest.mark.parametrize('start', [0, 7])
def test_fit_logs_per_step_summaries_at_the_global_step(start, tmp_path):
    """TensorBoard's per-step summaries of a fit from global step `start`
    carry steps start + 1, ..., 15, as those of an uninterrupted fit do.
    Fails if fit_starting_at leaves fit's step counter at 0 (a resumed run
    logs from step 1 again, over the first run's curves)."""
    model = small_model()
    data = tf.data.Dataset.from_tensors(
        (tf.zeros([4, 3]), tf.zeros([4, 2]))).repeat()
    positions = Positions()  # Per-step hooks run, as in training.
    positions.seen = []
    with saving.fit_starting_at(model, start):
        model.fit(data, epochs=3, steps_per_epoch=5, verbose=0,
                  callbacks=[positions, tf_keras.callbacks.TensorBoard(
                      str(tmp_path), update_freq=1, write_graph=False,
                      profile_batch=0)])
    steps = []
    for path in (tmp_path / 'train').iterdir():
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            steps += [event.step for value in event.summary.value
                      if value.tag == 'batch_loss']
    assert sorted(steps) == list(range(start + 1, 16))
