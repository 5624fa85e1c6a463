"""The one save/restore path of a run: when it saves, what it restores,
whole or in part, and where fit starts."""

import gc
import logging
import os
import signal

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from paws_tf import checkpoints
from paws_tf import run_dir
from paws_tf.runner import pretrained
from paws_tf.runner import callbacks
from tests.helpers import tiny_model


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
    state = checkpoints.RunState(run_dir.RunDir(tmp_path), model,
                                 tf.distribute.get_strategy(),
                                 keep_checkpoints=10)
    saver = callbacks.Saver(state, backup_every=4, checkpoint_every=8)
    saver.set_model(model)
    saver.on_train_begin()
    backups = []
    for step in range(3, 31, 3):
        model.optimizer.iterations.assign(step)
        saver.on_train_batch_end(0)
        backups.append(checkpoints.backup_step(run_dir.RunDir(tmp_path)))
    # Multiples of 4 first passed at 6 (4), 9 (8), 12, 18 (16), 21 (20),
    # 24, 30 (28); of 8 at 9, 18, 24.
    assert backups == [0, 6, 9, 12, 12, 18, 21, 24, 24, 30]
    assert saved_steps(state.checkpoint_dir) == [9, 18, 24]
    saver.on_epoch_end(0)  # Epoch ends always checkpoint, once per step.
    saver.on_epoch_end(0)
    assert saved_steps(state.checkpoint_dir) == [9, 18, 24, 30]
    state.delete_backup()  # Finished: the backup goes, checkpoints stay.
    assert not os.path.exists(state.backup_dir)
    assert saved_steps(state.checkpoint_dir) == [9, 18, 24, 30]


def test_a_preempted_epoch_saves_no_checkpoint_and_logs_no_epoch(tmp_path):
    """SIGTERM mid-epoch: the step is backed up and `fit` stops, which
    ends the epoch early. Fails if the epoch end then checkpoints the
    mid-epoch step (it pushed an epoch end's checkpoint out of the kept
    ones) or logs the part-epoch as an epoch."""
    model = small_model()
    state = checkpoints.RunState(run_dir.RunDir(tmp_path), model,
                                 tf.distribute.get_strategy(),
                                 keep_checkpoints=3)
    saver = callbacks.Saver(state, backup_every=0, checkpoint_every=0)
    log = callbacks.ProgressLog(str(tmp_path / 'logs'), views_per_step=4,
                                every_steps=1, num_epochs=3, is_chief=True)
    for callback in (saver, log):
        callback.set_model(model)
        callback.on_train_begin()
        callback.on_epoch_begin(0)
    with saver.handling_sigterm():
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # Its handler.
        model.optimizer.iterations.assign(3)
        saver.on_train_batch_end(0)
    assert saver.preempted_at == 3 and model.stop_training
    assert checkpoints.backup_step(run_dir.RunDir(tmp_path)) == 3
    saver.on_epoch_end(0)
    assert saved_steps(state.checkpoint_dir) == []
    log.on_epoch_end(0, {'loss': 1.0})
    assert not _points(tmp_path / 'logs', 'epoch/loss')


def _points(log_dir, tag):
    """`(step, value)` of every point of `tag` in `log_dir`'s event files,
    in the order written (a point written twice is there twice)."""
    return [(event.step, float(tf.make_ndarray(value.tensor)))
            for path in sorted(log_dir.iterdir())
            for event in tf.compat.v1.train.summary_iterator(str(path))
            for value in event.summary.value if value.tag == tag]


def test_progress_log_logs_when_the_step_reaches_or_passes_an_interval(
        tmp_path):
    """With 3 steps per call (`train.steps_per_execution = 3`) the
    TensorBoard points of every 4 steps land at the first step past each
    multiple, as the saver's (above). Fails if ProgressLog logs only at
    exact multiples (tried: `step % every_steps`, which logs 12 and 24)."""
    model = small_model()
    log = callbacks.ProgressLog(str(tmp_path), views_per_step=4,
                                every_steps=4, num_epochs=1, is_chief=True)
    log.set_model(model)
    log.on_train_begin()
    for step in range(3, 31, 3):
        model.optimizer.iterations.assign(step)
        log.on_train_batch_end(0)
    points = _points(tmp_path, 'throughput/views_per_second')
    assert [step for step, _ in points] == [6, 9, 12, 18, 21, 24, 30]


def test_diagnostics_are_logged_at_the_steps_that_computed_them(tmp_path):
    """Points every 4 steps, diagnostics computed every 10 (steps 1, 11,
    21, their values in the logs until the next): each reaches TensorBoard
    once, at its own step and with its value. Fails if a point writes them
    only when its step computed them (tried: `(step - 1) % every == 0`,
    which no multiple of 4 meets: no point at all, as with the shipped
    configs' points every 50 and diagnostics every 100)."""
    model = small_model()
    model.diagnostics_every = 10
    log = callbacks.ProgressLog(str(tmp_path), views_per_step=4,
                                every_steps=4, num_epochs=1, is_chief=True)
    log.set_model(model)
    log.on_train_begin()
    for step in range(1, 31):
        model.optimizer.iterations.assign(step)
        log.on_train_batch_end(0, {'nt_xent': float((step - 1) // 10 * 10)})
    points = _points(tmp_path, 'diagnostics/nt_xent')
    assert points == [(1, 0.0), (11, 10.0), (21, 20.0)]


def test_a_resumed_epochs_second_fit_keeps_the_diagnostics_due(tmp_path):
    """A resumed epoch is one `fit`, the epochs after it another, with one
    ProgressLog (`fit_from`): diagnostics computed every 3 steps (1, 4,
    7, 10, ...) and points every 4, the first fit ending at step 10: step
    10's diagnostics reach TensorBoard at the second fit's point of step
    12. Fails if `on_train_begin` forgets the last point (tried: step 10's
    value, computed after the point of step 8, was never written)."""
    model = small_model()
    model.diagnostics_every = 3
    log = callbacks.ProgressLog(str(tmp_path), views_per_step=4,
                                every_steps=4, num_epochs=2, is_chief=True)
    log.set_model(model)
    for steps in (range(1, 11), range(11, 13)):
        log.on_train_begin()
        for step in steps:
            model.optimizer.iterations.assign(step)
            log.on_train_batch_end(
                0, {'nt_xent': float((step - 1) // 3 * 3 + 1)})
    points = _points(tmp_path, 'diagnostics/nt_xent')
    assert points == [(4, 4.0), (7, 7.0), (10, 10.0)]


def test_throughput_points_leave_out_the_epoch_end(tmp_path, monkeypatch):
    """Steps of 1 s, a point every 3 steps, epochs of 4 steps whose ends
    (evaluation, saves) take 10 s: every point's throughput is 4 views a
    second. Fails if the first point of an epoch counts the time since the
    last point of the one before (tried: no restart in `on_epoch_begin`:
    the point of step 6 counted 13 s for 3 steps, 0.92 views a second)."""
    clock = [0.0]
    monkeypatch.setattr(callbacks.time, 'perf_counter', lambda: clock[0])
    model = small_model()
    log = callbacks.ProgressLog(str(tmp_path), views_per_step=4,
                                every_steps=3, num_epochs=2, is_chief=True)
    log.set_model(model)
    log.on_train_begin()
    for epoch in range(2):
        log.on_epoch_begin(epoch)
        for step in range(4 * epoch + 1, 4 * epoch + 5):
            clock[0] += 1.0
            model.optimizer.iterations.assign(step)
            log.on_train_batch_end(0)
        log.on_epoch_end(epoch)
        clock[0] += 10.0
    points = _points(tmp_path, 'throughput/views_per_second')
    assert points == [(3, 4.0), (6, 4.0)]


def test_restore_returns_weights_and_optimizer_of_the_step(tmp_path):
    model = small_model()
    state = checkpoints.RunState(run_dir.RunDir(tmp_path), model,
                                 tf.distribute.get_strategy(),
                                 keep_checkpoints=3)
    model.optimizer.iterations.assign(5)
    kernel = np.arange(6, dtype=np.float32).reshape(3, 2)
    model.layers[1].kernel.assign(kernel)
    state.save(checkpoints.BACKUP)
    other = small_model()
    checkpoints.load(str(tmp_path / 'backup' / 'chief' / 'ckpt-5'), other,
                     checkpoints.WHOLE)
    assert checkpoints.global_step(other) == 5
    np.testing.assert_array_equal(other.layers[1].kernel.numpy(), kernel)


def test_a_file_named_for_another_step_is_refused(tmp_path):
    model = small_model()
    state = checkpoints.RunState(run_dir.RunDir(tmp_path), model,
                                 tf.distribute.get_strategy(),
                                 keep_checkpoints=3)
    model.optimizer.iterations.assign(5)
    state.save(checkpoints.CHECKPOINT)
    prefix = tmp_path / 'checkpoints' / 'ckpt-5'
    for suffix in ('.index', '.data-00000-of-00001'):
        os.rename(f'{prefix}{suffix}', f'{tmp_path}/checkpoints/ckpt-7'
                  f'{suffix}')
    with pytest.raises(ValueError, match='holds the optimizer step 5, not 7'):
        checkpoints.load(str(tmp_path / 'checkpoints' / 'ckpt-7'), model,
                         checkpoints.WHOLE)


@pytest.mark.parametrize('width', [2, 4], ids=['extra-layer', 'other-shapes'])
def test_another_models_checkpoint_is_refused_naming_it(tmp_path, width):
    model = small_model()
    model.optimizer.iterations.assign(5)
    checkpoints.RunState(run_dir.RunDir(tmp_path), model,
                         tf.distribute.get_strategy(),
                         keep_checkpoints=3).save(checkpoints.CHECKPOINT)
    inputs = tf_keras.Input([3])
    wider = tf_keras.Model(inputs, tf_keras.layers.Dense(width)(
        tf_keras.layers.Dense(width)(inputs)))
    wider.compile(optimizer=tf_keras.optimizers.SGD(0.1, momentum=0.9))
    wider.optimizer.build(wider.trainable_variables)
    path = str(tmp_path / 'checkpoints' / 'ckpt-5')
    with pytest.raises(ValueError, match='does not hold this run'):
        checkpoints.load(path, wider, checkpoints.WHOLE)


def test_a_refused_checkpoint_leaves_no_restore_behind(tmp_path):
    """A model of other shapes is refused before TF reads the checkpoint:
    a read that fails part way logs every stored value when it is garbage
    collected, the noise of a pretrained model tried with 3 channels, then
    1.

    Fails if `load` reads before checking the shapes (tried: every stored
    value of the checkpoint logged, 4 lines)."""
    model = small_model()
    prefix = tf.train.Checkpoint(model=model).write(str(tmp_path / 'ckpt'))
    inputs = tf_keras.Input([3])
    wider = tf_keras.Model(inputs, tf_keras.layers.Dense(4)(
        tf_keras.layers.Dense(4)(inputs)))
    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    tf_logger = logging.getLogger('tensorflow')
    tf_logger.addHandler(handler)
    try:
        with pytest.raises(ValueError, match=r'of shape \[3, 4\], stored '
                                             r'\[3, 2\]'):
            checkpoints.load(prefix, wider)
        gc.collect()
    finally:
        tf_logger.removeHandler(handler)
    assert not [line for line in logged if 'checkpoint' in line], logged


def test_the_newest_that_restores_wins_whichever_its_directory(tmp_path):
    model = small_model()
    state = checkpoints.RunState(run_dir.RunDir(tmp_path), model,
                                 tf.distribute.get_strategy(),
                                 keep_checkpoints=3)
    for step, kind in ((8, checkpoints.CHECKPOINT), (12, checkpoints.BACKUP),
                       (16, checkpoints.CHECKPOINT), (16, checkpoints.BACKUP)):
        model.optimizer.iterations.assign(step)
        state.save(kind)
    backup = str(tmp_path / 'backup' / 'chief' / 'ckpt-16')
    checkpoint = str(tmp_path / 'checkpoints' / 'ckpt-16')
    run, elsewhere = run_dir.RunDir(tmp_path), run_dir.RunDir(
        tmp_path / 'elsewhere')
    assert checkpoints.newest_restorable(run) == (backup, 16)
    assert checkpoints.newest_restorable(run, backups=False) == (
        checkpoint, 16)
    assert checkpoints.has_progress(run)
    assert not checkpoints.has_progress(elsewhere)
    assert checkpoints.newest_restorable(elsewhere) == (None, 0)


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
    state = checkpoints.RunState(run_dir.RunDir(tmp_path), model,
                                 tf.distribute.get_strategy(),
                                 keep_checkpoints=3)
    for step, kind in ((8, checkpoints.CHECKPOINT), (12, checkpoints.BACKUP),
                       (16, checkpoints.CHECKPOINT)):
        model.optimizer.iterations.assign(step)
        state.save(kind)
    backup = tmp_path / 'backup' / 'chief' / 'ckpt-12'
    corrupt(backup)
    corrupt(tmp_path / 'checkpoints' / 'ckpt-16')
    # A worker of a cluster decides alike and moves nothing.
    assert checkpoints.newest_restorable(
        run_dir.RunDir(tmp_path), chief=False) == (
            str(tmp_path / 'checkpoints' / 'ckpt-8'), 8)
    assert backup.with_suffix('.index').exists()
    caplog.clear()
    with caplog.at_level('WARNING'):
        assert checkpoints.newest_restorable(run_dir.RunDir(tmp_path)) == (
            str(tmp_path / 'checkpoints' / 'ckpt-8'), 8)
    moved, = (tmp_path / 'damaged').iterdir()
    assert (moved / 'chief' / 'ckpt-12.index').exists()
    assert not (tmp_path / 'backup').exists()
    warning = caplog.text
    assert f'{tmp_path}/checkpoints/ckpt-16: ' in warning
    assert f'the backup {backup}: ' in warning
    assert f'(moved to {moved})' in warning.split(f'the backup {backup}')[1]
    assert f'Resuming from {tmp_path}/checkpoints/ckpt-8 (step 8)' in warning


def stored(prefix, scope):
    """The tensors of a checkpoint under `scope/`, as sorted bytes."""
    reader = tf.train.load_checkpoint(str(prefix))
    return sorted(reader.get_tensor(key).tobytes()
                  for key in reader.get_variable_to_shape_map()
                  if key.startswith(scope + '/') and
                  key.endswith('VARIABLE_VALUE'))


def values(variables):
    return sorted(variable.numpy().tobytes() for variable in variables)


def test_the_model_part_needs_no_optimizer(tmp_path):
    """A run's checkpoint gives an uncompiled model (evaluation, export)
    its weights. Fails if `load(..., MODEL)` reads the optimizer too (the
    model has none)."""
    model = small_model()
    model.optimizer.iterations.assign(5)
    model.layers[1].kernel.assign(np.ones([3, 2], np.float32))
    checkpoints.RunState(run_dir.RunDir(tmp_path), model,
                         tf.distribute.get_strategy(),
                         keep_checkpoints=3).save(checkpoints.CHECKPOINT)
    inputs = tf_keras.Input([3])
    other = tf_keras.Model(inputs, tf_keras.layers.Dense(2)(inputs))
    assert checkpoints.load(tmp_path / 'checkpoints', other) == str(
        tmp_path / 'checkpoints' / 'ckpt-5')
    assert values(other.layers[1].variables) == stored(
        tmp_path / 'checkpoints' / 'ckpt-5', 'model/layer_with_weights-0')


def test_the_backbone_part_leaves_the_heads_untouched(tmp_path):
    """A run's checkpoint of the model alone (as an import writes it) gives
    a model its backbone only. Fails if `load_backbone_weights` restores the
    whole model (the heads take the file's values)."""
    source = tiny_model.build(seed=0)
    tf.train.CheckpointManager(
        tf.train.Checkpoint(model=source), str(tmp_path / 'checkpoints'),
        max_to_keep=1, checkpoint_name=checkpoints.CHECKPOINT_PREFIX,
    ).save(checkpoint_number=0)
    prefix = tmp_path / 'checkpoints' / 'ckpt-0'
    target = tiny_model.build(seed=1)
    heads = [target.projection_head, target.prediction_head]
    before = [values(head.variables) for head in heads]
    pretrained.load_backbone_weights(target.backbone,
                                     tmp_path / 'checkpoints')
    assert values(target.backbone.variables) == stored(
        prefix, 'model/backbone')
    for head, was, scope in zip(heads, before, ('model/projection_head',
                                                'model/prediction_head')):
        assert values(head.variables) == was != stored(prefix, scope)


def test_the_newest_checkpoint_that_restores_is_loaded(tmp_path):
    """Fails if `load_newest` reads the newest checkpoint whatever its
    state (TF's latest_checkpoint: the corrupted ckpt-8)."""
    model = small_model()
    state = checkpoints.RunState(run_dir.RunDir(tmp_path), model,
                                 tf.distribute.get_strategy(),
                                 keep_checkpoints=3)
    for step in (4, 8):
        model.optimizer.iterations.assign(step)
        model.layers[1].kernel.assign(np.full([3, 2], step, np.float32))
        state.save(checkpoints.CHECKPOINT)
    corrupt(tmp_path / 'checkpoints' / 'ckpt-8')
    other = small_model()
    assert checkpoints.load_newest(run_dir.RunDir(tmp_path), other) == 4
    np.testing.assert_array_equal(other.layers[1].kernel.numpy(), 4)
    with pytest.raises(FileNotFoundError, match='No TF checkpoint at'):
        checkpoints.load_newest(run_dir.RunDir(tmp_path / 'elsewhere'), other)


def test_missing_or_foreign_checkpoints_are_reported(tmp_path):
    model = tiny_model.build(size=16)
    for path in (tmp_path, tmp_path / 'ckpt-7'):
        with pytest.raises(FileNotFoundError, match=str(path)):
            checkpoints.load(path, model)
    prefix = tf.train.Checkpoint(step=tf.Variable(3)).save(
        str(tmp_path / 'other'))
    with pytest.raises(ValueError, match='does not hold this run.s model '
                                         r'\(\d+ variables missing'):
        checkpoints.load(prefix, model)


class Positions(tf_keras.callbacks.Callback):
    """The global step of every step and epoch end `fit` runs; stops at
    `stop_at`."""

    def __init__(self, stop_at=None):
        super().__init__()
        self.steps, self.epoch_ends, self.stop_at = [], [], stop_at

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append(checkpoints.global_step(self.model))
        if self.steps[-1] == self.stop_at:
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_ends.append((epoch, checkpoints.global_step(self.model)))


def fit_from(model, start, callbacks_=(), stop_at=None):
    """3 epochs of 5 steps from global step `start`; (positions, the steps
    the input was asked to start at)."""
    model.optimizer.iterations.assign(start)
    positions, asked = Positions(stop_at), []

    def input_at(step):
        asked.append(step)
        return tf.data.Dataset.from_tensors(
            (tf.zeros([4, 3]), tf.zeros([4, 2]))).repeat()

    callbacks.fit_from(model, input_at, start, epochs=3, steps_per_epoch=5,
                       callbacks=[positions, *callbacks_], verbose=0)
    return positions, asked


@pytest.mark.parametrize('start', [0, 7, 10])
def test_fit_ends_epochs_at_the_steps_of_an_uninterrupted_run(start):
    """From global step `start`: mid-epoch (7: epoch 1, step 2) or at an
    epoch start (10). Fails if `fit_from` fits the rest of a resumed
    epoch as a whole epoch (its end at step 12, not 10)."""
    positions, asked = fit_from(small_model(), start)
    assert positions.steps == list(range(start + 1, 16))
    assert positions.epoch_ends == [(epoch, 5 * epoch + 5)
                                    for epoch in range(start // 5, 3)]
    assert asked == sorted({start, 5 * (start // 5 + 1)} - {15})[:2 - (
        start % 5 == 0)]


def test_a_stop_in_the_resumed_epoch_ends_the_fit():
    """Fails if `fit_from` goes on to the next epochs after a callback
    stopped the first (SIGTERM's backup, `Saver.preempted_at`)."""
    positions, asked = fit_from(small_model(), 7, stop_at=8)
    assert positions.steps == [8] and asked == [7]


def test_a_resumed_fit_logs_each_step_once_at_its_global_step(tmp_path):
    """`ProgressLog`'s per-step scalars of a run stopped at step 7 and
    resumed there carry steps 1, ..., 15, once each. Fails if `fit_from`
    fits the rest of the resumed epoch as a whole epoch (steps 8..17)."""
    model = small_model()

    def progress_log():
        return callbacks.ProgressLog(str(tmp_path), views_per_step=4,
                                     every_steps=1, num_epochs=3,
                                     is_chief=True)

    fit_from(model, 0, [progress_log()], stop_at=7)
    fit_from(model, 7, [progress_log()])
    assert sorted(step for step, _ in _points(
        tmp_path, 'throughput/views_per_second')) == list(range(1, 16))
