"""PAWS pre-training: strategy, data, model, fit, checkpoints, resume."""

import functools
import hashlib
import os
import shutil
import time

from absl import logging
import gin
import numpy as np
import tensorflow as tf
import tf_keras

from paws_tf import checkpoints
from paws_tf import checks
from paws_tf import determinism
from paws_tf.data import data_fingerprint
from paws_tf.data import normalization as normalization_lib
from paws_tf.data import pipeline
from paws_tf.data import splits
from paws_tf import dist
from paws_tf import lars
from paws_tf import model as model_lib
from paws_tf.nets import weights
from paws_tf import progress
from paws_tf.runner import callbacks
from paws_tf.runner import experiment
from paws_tf.runner import run_history
from paws_tf import schedules

PRECISIONS = ('float32', 'mixed_bfloat16', 'mixed_float16')
CHECKPOINT_DIR = 'checkpoints'
BACKUP_DIR = 'backup'
TENSORBOARD_DIR = 'tensorboard'
# Where a backup that cannot be restored is moved (BackupAndRestore would
# otherwise try it again), kept for inspection.
DAMAGED_DIR = 'damaged'
# What a training run writes besides its config and data records.
RUN_OUTPUTS = (CHECKPOINT_DIR, BACKUP_DIR, TENSORBOARD_DIR, DAMAGED_DIR,
               'export', 'eval', 'fine_tune', run_history.HISTORY_FILENAME,
               run_history.OPERATIVE_CONFIG_FILE)
_STAGING_DIR = '.data_staging'


class Preempted(RuntimeError):
    """Training stopped on SIGTERM after backing up."""
    EXIT_CODE = 143  # run.py's: what a job killed by SIGTERM reports.


def weights_fingerprint(model):
    """SHA-256 of the model's weights: equal fingerprints, equal weights."""
    digest = hashlib.sha256()
    for weight in dist.read_weights(model):
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()


def check_precision(precision):
    if precision not in PRECISIONS:
        raise ValueError(f'precision must be one of {PRECISIONS}, got '
                         f'{precision!r}.')


def set_precision(precision):
    """Sets the global tf_keras mixed-precision policy by name."""
    check_precision(precision)
    tf_keras.mixed_precision.set_global_policy(precision)


def build_model(strategy, *, input_channels):
    """Builds the PAWS model's variables in the strategy's scope.

    Batch norm is synchronised across replicas when there are several
    (global BN, PAWS Sec. 5) and fused otherwise.
    """
    with strategy.scope():
        model = model_lib.build_model(
            input_channels=input_channels,
            sync_bn=strategy.num_replicas_in_sync > 1)
        images = tf.zeros([1, 8, 8, input_channels])
        # `model(...)` sets Keras' `built` (BackupAndRestore checks it) and
        # builds every head.
        model(images)
    return model


def build_local_model(*, input_channels):
    """The PAWS model with plain variables, outside any strategy.

    What one process runs alone under MultiWorkerMirroredStrategy
    (evaluation, export) runs on such a copy: calling the distributed
    model there reads its sync-on-read variables (batch-norm moving
    statistics) through an all-reduce that the other workers never join,
    and a SavedModel cannot hold its distributed variables.

    Raises:
        RuntimeError: called inside a strategy's scope.
    """
    if tf.distribute.has_strategy():
        raise RuntimeError('build_local_model must be called outside any '
                           'tf.distribute strategy scope.')
    return build_model(tf.distribute.get_strategy(),
                       input_channels=input_channels)


def build_compiled_model(strategy, *, input_channels, steps_per_epoch,
                         num_epochs, optimizer_cls, schedule_cls, precision,
                         jit_compile, steps_per_execution,
                         pretrained_backbone=None):
    """Builds the PAWS model and its optimizer in the strategy's scope.

    Returns:
        The compiled, built `PAWSModel`.
    """
    if (jit_compile and strategy.num_replicas_in_sync > 1 and
            not tf.config.list_physical_devices('GPU')):
        raise ValueError(
            'jit_compile=True with several replicas on CPU devices fails in '
            'TensorFlow 2.21 (XLA cannot read the mirrored variables of the '
            'other CPU devices); use XLA with GPUs or with one replica.')
    set_precision(precision)
    model = build_model(strategy, input_channels=input_channels)
    with strategy.scope():
        if pretrained_backbone:
            weights.load_backbone_weights(model.backbone,
                                          pretrained_backbone)
        schedule = schedule_cls(steps_per_epoch=steps_per_epoch,
                                num_epochs=num_epochs)
        optimizer = optimizer_cls(learning_rate=schedule)
        if precision == 'mixed_float16':
            optimizer = tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
        model.compile(optimizer=optimizer, jit_compile=jit_compile,
                      steps_per_execution=steps_per_execution)
        optimizer.build(model.trainable_variables)
    return model


def _backup_damage(backup_dir):
    """`(step, why)` of the run's backup: `(step, None)` if it restores,
    `(0, None)` if there is none, `(0, 'path: why')` if it cannot."""
    chief_dir = os.path.join(backup_dir, 'chief')
    if not tf.io.gfile.exists(chief_dir):
        return 0, None
    try:
        path = tf.train.latest_checkpoint(chief_dir)
        why = checkpoints.damage(path) if path else None
        if path is None or why is not None:
            return 0, why and f'the backup {path}: {why}'
        return callbacks.backup_step(backup_dir), None
    # A state file that does not parse, an index that does not open: the
    # reasons vary, the backup cannot be restored.
    except Exception as error:  # pylint: disable=broad-except
        return 0, f'the backup in {chief_dir}: {error}'


def resume_point(model_dir, *, chief=True):
    """Where a run in `model_dir` starts: its backup (an interrupted run),
    else its newest checkpoint (a finished run, whose backup
    BackupAndRestore deleted, or one stopped before its first backup), else
    step 0 (a new run).

    A backup or checkpoint that cannot be restored (truncated, corrupted) is
    skipped with a warning naming it, for the newest one that can; the chief
    moves a damaged backup to `model_dir/DAMAGED_DIR`.

    Returns:
        `(step, checkpoint_path)`: `checkpoint_path` is None when resuming
        from the backup (BackupAndRestore restores it) or starting anew.

    Raises:
        checkpoints.NoneRestorable: there are backups or checkpoints, and
            none can be restored.
    """
    backup_dir = os.path.join(model_dir, BACKUP_DIR)
    step, backup_damage = _backup_damage(backup_dir)
    if step:
        return step, None
    path, step, skipped = checkpoints.newest_restorable(
        os.path.join(model_dir, CHECKPOINT_DIR))
    if backup_damage:
        skipped.insert(0, backup_damage)
    if path is None and skipped:
        raise checkpoints.NoneRestorable(
            f'No backup or checkpoint of {model_dir} can be restored; '
            'tried:\n  ' + '\n  '.join(skipped) + '\nRestore those files '
            'from a copy, move them away to start again, or use another '
            '--model_dir.')
    if backup_damage and chief:
        aside = os.path.join(model_dir, DAMAGED_DIR, time.strftime(
            f'{BACKUP_DIR}-%Y%m%dT%H%M%S', time.gmtime()))
        os.makedirs(os.path.dirname(aside), exist_ok=True)
        os.rename(backup_dir, aside)
        skipped[0] += f' (moved to {aside})'
    if skipped:
        logging.warning('Skipping what cannot be restored:\n  %s\n'
                        'Resuming from %s (step %d).', '\n  '.join(skipped),
                        path, step)
    return step, path


def has_progress(model_dir):
    """Whether `model_dir` holds a run: a backup or a checkpoint to resume
    from. A start that failed before its first save (a bad value, an empty
    class folder, a corrupt image) leaves neither."""
    return bool(
        tf.io.gfile.exists(os.path.join(model_dir, BACKUP_DIR, 'chief')) or
        checkpoints.all_checkpoints(os.path.join(model_dir, CHECKPOINT_DIR)))


def delete_outputs(model_dir, names=RUN_OUTPUTS):
    """Deletes the files and directories `names` of `model_dir`."""
    for name in names:
        target = os.path.join(model_dir, name)
        if os.path.isdir(target):
            shutil.rmtree(target)
        elif os.path.exists(target):
            os.remove(target)


def _load_data(model_dir, *, chief, resuming, on_change, overwrite):
    """The run's data, checked against what it started on.

    The labeled split and the normalisation are recorded in a staging
    directory and moved into `model_dir` only once the data is accepted, so
    that a refused run leaves the records as they were.

    Returns:
        `(bundle, restart)`: `restart` is True when the data changed and
        --overwrite says to start the run again.
    """
    staging = os.path.join(model_dir, _STAGING_DIR) if chief else None
    bundle = experiment.load_data(staging)
    try:
        restart = data_fingerprint.check(
            model_dir, bundle, resuming=resuming, on_change=on_change,
            overwrite=overwrite, write=chief)
        records = (splits.SPLIT_FILENAME,
                   normalization_lib.NORMALIZATION_FILENAME)
        for name in records if chief else ():
            if os.path.exists(os.path.join(staging, name)):
                os.replace(os.path.join(staging, name),
                           os.path.join(model_dir, name))
    finally:
        if chief:
            shutil.rmtree(staging, ignore_errors=True)
    return bundle, restart


@gin.configurable(denylist=['model_dir', 'strategy', 'overwrite',
                            'owner_check'])
def train(model_dir, strategy, *, overwrite=False, owner_check=None,
          num_epochs=gin.REQUIRED,
          optimizer_cls=lars.LARS, schedule_cls=schedules.WarmupCosineDecay,
          precision='float32', jit_compile=False, steps_per_execution=1,
          seed=0, deterministic_ops=False, checkpoint_every_steps=1000,
          keep_checkpoints=3, backup_every_steps=100, log_every_steps=50,
          view_images=True, eval_every_epochs=1, eval_max_queries=10_000,
          pretrained_backbone=None, on_data_change='stop', verbose='auto'):
    """PAWS pre-training into `model_dir`; resumes an unfinished run.

    Running it again on the same `model_dir` continues an interrupted run
    from its last backup (the same global step, the same input stream), and
    returns a finished run's model without training it again. A resumed
    run's data must be the data it started on (`data_fingerprint`).

    Args:
        model_dir: the run's directory (checkpoints, backup, TensorBoard
            logs, recorded labeled split and data fingerprint).
        strategy: the `tf.distribute.Strategy` to train under.
        overwrite: when the data differs from what the run started on,
            delete the run and start again (run.py's --overwrite).
        owner_check: called before every checkpoint and backup; raises
            when this run no longer owns `model_dir`
            (`run_lock.RunLock.check`).
        num_epochs: epochs, one pass over the unlabeled set each.
        optimizer_cls: optimizer class called with `learning_rate=schedule`
            (gin: `@LARS`, configured in gin).
        schedule_cls: schedule class called with `steps_per_epoch` and
            `num_epochs` (gin: `@WarmupCosineDecay`).
        precision: one of `PRECISIONS` (`mixed_float16` adds dynamic loss
            scaling).
        jit_compile: compile the train step with XLA.
        steps_per_execution: train steps per `tf.function` call.
        seed: seed of initialisation, data order and augmentations.
        deterministic_ops: bit-identical reruns on the same machine
            (`determinism.enable`: TF op determinism, and Grappler's
            arithmetic rewrites off); slower.
        checkpoint_every_steps: also checkpoint every this many steps (0:
            epoch ends only).
        keep_checkpoints: checkpoints kept in `model_dir/checkpoints`.
        backup_every_steps: BackupAndRestore interval, the most work a
            preemption can lose.
        log_every_steps: TensorBoard scalar interval.
        view_images: write augmented views of the first step to TensorBoard.
        eval_every_epochs: PAWS-NN on the test split every this many epochs
            when one is configured (0: never).
        eval_max_queries: test images used by that evaluation (None: all).
        pretrained_backbone: tf_keras weights file or checkpoint to start
            the backbone from.
        on_data_change: when resuming on data that differs from what the
            run started on: `'stop'` with an error naming what changed, or
            `'continue'` on the new data (recording it).
        verbose: progress bar verbosity (`progress.ProgressBar`).

    Returns:
        The trained `PAWSModel`.
    """
    num_epochs = checks.integer('num_epochs', num_epochs)
    for name, value in (('keep_checkpoints', keep_checkpoints),
                        ('backup_every_steps', backup_every_steps),
                        ('steps_per_execution', steps_per_execution)):
        checks.integer(name, value)
    for name, value in (('checkpoint_every_steps', checkpoint_every_steps),
                        ('log_every_steps', log_every_steps),
                        ('eval_every_epochs', eval_every_epochs),
                        ('seed', seed)):
        checks.integer(name, value, minimum=0)
    check_precision(precision)
    if checkpoint_every_steps and checkpoint_every_steps < backup_every_steps:
        raise ValueError(
            f'checkpoint_every_steps={checkpoint_every_steps} is smaller than '
            f'backup_every_steps={backup_every_steps}: back up at least as '
            'often as you checkpoint, so that a resumed run always starts '
            'from the newest state.')
    tf_keras.utils.set_random_seed(seed)
    if deterministic_ops:
        determinism.enable()
    data_fingerprint.check_on_change(on_data_change)
    backup_dir = os.path.join(model_dir, BACKUP_DIR)
    checkpoint_dir = os.path.join(model_dir, CHECKPOINT_DIR)
    chief = dist.is_chief(strategy)
    resuming = has_progress(model_dir)
    bundle, restart = _load_data(model_dir, chief=chief, resuming=resuming,
                                 on_change=on_data_change,
                                 overwrite=overwrite)
    if restart:
        if chief:
            delete_outputs(model_dir)
        start_step, checkpoint_path = 0, None
    else:
        start_step, checkpoint_path = resume_point(model_dir, chief=chief)
    if overwrite:
        # The other workers read the run's files only once the chief has
        # deleted what it deletes.
        dist.barrier(strategy)
    pretrain = pipeline.make_pretrain_dataset_fn(
        bundle.unlabeled, bundle.labeled,
        num_replicas=strategy.num_replicas_in_sync, start_step=start_step,
        seed=seed, normalization=bundle.normalization)
    logging.info('%s', pretrain.summary)
    steps_per_epoch = pretrain.steps_per_epoch
    total_steps = num_epochs * steps_per_epoch
    model = build_compiled_model(
        strategy, input_channels=bundle.labeled.channels,
        steps_per_epoch=steps_per_epoch, num_epochs=num_epochs,
        optimizer_cls=optimizer_cls, schedule_cls=schedule_cls,
        precision=precision,
        jit_compile=jit_compile, steps_per_execution=steps_per_execution,
        pretrained_backbone=pretrained_backbone)

    if checkpoint_path:
        tf.train.Checkpoint(model=model, optimizer=model.optimizer).restore(
            checkpoint_path).assert_existing_objects_matched()
        if start_step >= total_steps:
            logging.info('%s holds a finished run (%d steps): not training '
                         'it again.', model_dir, start_step)
            return model
    history = (functools.partial(run_history.record, model_dir) if chief
               else lambda event: event)
    if start_step:
        source = (f'the checkpoint {checkpoint_path}' if checkpoint_path else
                  'the backup ' + tf.train.latest_checkpoint(
                      os.path.join(backup_dir, 'chief')))
        logging.info('Run %s.', history(run_history.resumed(
            start_step, total_steps, steps_per_epoch, source)))
    else:
        history(f'started a new run of {total_steps} steps')
    logging.info('Training steps %d..%d: %d epochs of %d steps.', start_step,
                 total_steps, num_epochs, steps_per_epoch)

    log_dir = os.path.join(model_dir, TENSORBOARD_DIR)
    backup = callbacks.BackupAndRestore(
        backup_dir, save_freq=backup_every_steps, on_sigterm=not isinstance(
            strategy, tf.distribute.MultiWorkerMirroredStrategy),
        checkpoint_dir=checkpoint_dir,
        start_step=start_step if checkpoint_path else 0,
        steps_per_epoch=steps_per_epoch, owner_check=owner_check)
    fit_callbacks = [
        callbacks.StopOnNonFiniteLoss(checkpoint_dir),  # Before any save.
        backup,
        callbacks.Checkpointer(checkpoint_dir, strategy,
                               every_steps=checkpoint_every_steps,
                               keep=keep_checkpoints, backup_dir=backup_dir,
                               owner_check=owner_check),
        tf_keras.callbacks.TensorBoard(log_dir, update_freq=log_every_steps,
                                       write_graph=False, profile_batch=0),
        callbacks.ProgressLog(os.path.join(log_dir, 'train'),
                              views_per_step=pretrain.views_per_step,
                              every_steps=log_every_steps,
                              num_epochs=num_epochs, is_chief=chief),
        progress.ProgressBar(),  # After PawsNNEvaluation, inserted at 1.
    ]
    preprocessing = experiment.eval_preprocessing(bundle)
    if chief:
        fit_callbacks.append(run_history.OperativeConfig(model_dir))
    if view_images and chief and start_step == 0:
        fit_callbacks.append(callbacks.ViewImages(
            os.path.join(log_dir, 'train'), pretrain.dataset_fn,
            mean=preprocessing['mean'], std=preprocessing['std']))
    if eval_every_epochs and bundle.test is not None:
        # Every worker reads the weights at the epoch end (a collective);
        # the chief alone evaluates them, on a copy of its own.
        local_model = build_local_model(
            input_channels=bundle.labeled.channels) if chief else None
        fit_callbacks.insert(1, callbacks.PawsNNEvaluation(  # Before saves.
            os.path.join(log_dir, 'eval'), local_model,
            labeled=bundle.labeled, test=bundle.test,
            preprocessing=preprocessing, tau=model.tau,
            every_epochs=eval_every_epochs, max_queries=eval_max_queries))
    # BackupAndRestore sets the epoch and step fit starts at.
    try:
        model.fit(
            tf_keras.utils.experimental.DatasetCreator(pretrain.dataset_fn),
            epochs=num_epochs, steps_per_epoch=steps_per_epoch,
            callbacks=fit_callbacks, verbose=verbose)
    except BaseException as error:
        why = ': '.join([type(error).__name__] + str(error).splitlines()[:1])
        history(f'stopped at step {callbacks.global_step(model)} by {why}')
        failure = dist.cluster_failure(
            strategy, error, what='training',
            step=callbacks.global_step(model),
            resume=f'its backup in {backup_dir} (step '
            f'{callbacks.backup_step(backup_dir) or "none yet"}), else its '
            f'newest checkpoint in {checkpoint_dir}')
        if failure is None:
            raise
        raise failure from error
    fingerprint = weights_fingerprint(model)
    logging.info('Final weights fingerprint (SHA-256): %s', fingerprint)
    if backup.preempted_at is not None:
        history(f'stopped by SIGTERM at step {backup.preempted_at}, backed '
                f'up in {backup_dir}')
        raise Preempted(
            f'Stopped by SIGTERM after step {backup.preempted_at} of '
            f'{total_steps}, backed up in {backup_dir}: run the same command '
            'again to resume.')
    history(f'finished at step {callbacks.global_step(model)}; weights '
            f'SHA-256 {fingerprint}')
    return model
