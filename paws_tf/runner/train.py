"""PAWS pre-training: strategy, data, model, fit, checkpoints, resume."""

import functools
import hashlib

from absl import logging
import gin
import numpy as np
import tensorflow as tf
import tf_keras

from paws_tf import bindings
from paws_tf import checkpoints
from paws_tf import checks
from paws_tf import cluster
from paws_tf import determinism
from paws_tf.data import data_fingerprint
from paws_tf.data import pipeline
from paws_tf.evaluation import evaluate
from paws_tf import lars
from paws_tf import progress
from paws_tf import run_dir
from paws_tf.runner import building
from paws_tf.runner import callbacks
from paws_tf.runner import experiment
from paws_tf.runner import start
from paws_tf import schedules

class Preempted(RuntimeError):
    """Training stopped on SIGTERM after backing up."""
    EXIT_CODE = 143  # run.py's: what a job killed by SIGTERM reports.


def weights_fingerprint(model):
    """SHA-256 of the model's weights, which every worker of a cluster
    computes (reading a batch-norm moving statistic is a collective)."""
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()


@gin.configurable(denylist=['model_dir', 'strategy', 'overwrite',
                            'owner_check', 'claim'])
def train(model_dir, strategy, *, overwrite=False, owner_check=None,
          claim=None, num_epochs=gin.REQUIRED, optimizer_cls=lars.LARS,
          schedule_cls=schedules.WarmupCosineDecay, precision='float32',
          jit_compile=False, steps_per_execution=1, seed=0,
          deterministic_ops=False, checkpoint_every_steps=1000,
          keep_checkpoints=3, backup_every_steps=100, log_every_steps=50,
          view_images=True, evaluators=(evaluate.PawsNN,),
          eval_every_epochs=1, eval_max_queries=10_000,
          pretrained_backbone=None, pretrained_model=None,
          on_data_change='stop', verbose='auto'):
    """PAWS pre-training into `model_dir`.

    Called again on the same `model_dir`, it resumes an interrupted run
    from its last backup (the same global step and input stream, on the
    same data) and returns a finished run's model without training it.

    Args:
        model_dir, strategy: the run's directory (a path or its `RunDir`),
            the strategy to train under.
        overwrite: when the data differs from what the run started on,
            delete the run and start again (run.py's --overwrite).
        owner_check: called before every save; raises when this run no
            longer owns `model_dir` (`run_lock.RunLock.check`).
        claim: called once the start has checked the pretrained weights,
            before anything is written (`start.start`): run.py's takes
            the run lock and stages its config and flags.
        num_epochs: epochs, one pass over the unlabeled set each.
        optimizer_cls: called with `learning_rate=schedule` (`@LARS`).
        schedule_cls: called with `steps_per_epoch` and `num_epochs`
            (`@WarmupCosineDecay`).
        precision: one of `building.PRECISIONS` (`mixed_float16` adds
            dynamic loss scaling).
        jit_compile, steps_per_execution: XLA, train steps per tf.function.
        seed: seed of initialisation, data order and augmentations.
        deterministic_ops: bit-identical reruns on the same machine
            (`determinism.enable`); slower.
        checkpoint_every_steps: also checkpoint every this many steps (0:
            epoch ends only), keeping `keep_checkpoints` of them.
        backup_every_steps: steps between backups, the most a crash loses.
        log_every_steps, view_images: TensorBoard's scalar interval, the
            augmented views of the first step.
        evaluators: the evaluator classes run on the test split at epoch
            ends (`evaluate.PawsNN`; gin: `[@PawsNN, ...]`), every
            `eval_every_epochs` (0: never), on `eval_max_queries` test
            images (None: all).
        pretrained_backbone: weights file or checkpoint (a run's too) to
            start the backbone from; the heads start fresh.
        pretrained_model: an existing model to start from, backbone and
            heads (the optimizer starts fresh): a run directory (a paws_tf
            run or an import of a published model; its newest checkpoint)
            or a checkpoint, read when the run starts, not when it resumes.
        on_data_change: resuming on other data than the run started on:
            `'stop'` naming what changed, or `'continue'` (recording it).
        verbose: progress bar verbosity (`progress.ProgressBar`).

    Returns:
        The trained `PAWSModel`.
    """
    # Every parameter, by name, to the steps of the run.
    return _train(**locals())


def _train(model_dir, strategy, *, overwrite, owner_check, claim,
           num_epochs, optimizer_cls, schedule_cls, precision, jit_compile,
           steps_per_execution, seed, deterministic_ops,
           checkpoint_every_steps, keep_checkpoints, backup_every_steps,
           log_every_steps, view_images, evaluators, eval_every_epochs,
           eval_max_queries, pretrained_backbone, pretrained_model,
           on_data_change, verbose):
    """`train`: config -> data -> model -> checkpoints -> loop."""
    num_epochs = check_arguments(
        num_epochs=num_epochs, keep_checkpoints=keep_checkpoints,
        backup_every_steps=backup_every_steps,
        steps_per_execution=steps_per_execution,
        checkpoint_every_steps=checkpoint_every_steps,
        log_every_steps=log_every_steps, eval_every_epochs=eval_every_epochs,
        eval_max_queries=eval_max_queries, seed=seed, precision=precision,
        on_data_change=on_data_change)
    run = run_dir.RunDir(model_dir)
    if deterministic_ops:
        determinism.enable()
    chief = cluster.is_chief(strategy)
    build = functools.partial(
        _build, strategy=strategy, seed=seed, num_epochs=num_epochs,
        optimizer_cls=optimizer_cls, schedule_cls=schedule_cls,
        precision=precision, jit_compile=jit_compile,
        steps_per_execution=steps_per_execution)
    history = run.record_event if chief else (lambda event: event)
    # The bindings name the user's, for messages.
    names = bindings.arguments(train)
    bundle, pretrain, model, start_step, finished = start.start(
        run, strategy, build, num_epochs=num_epochs, history=history,
        seed=seed, claim=claim, overwrite=overwrite,
        on_data_change=on_data_change,
        pretrained_backbone=(pretrained_backbone,
                             names['pretrained_backbone'][1]),
        pretrained_model=(pretrained_model, names['pretrained_model'][1]))
    if finished:
        return model
    saver = callbacks.Saver(
        checkpoints.RunState(run, model, strategy,
                             keep_checkpoints=keep_checkpoints,
                             before_save=owner_check),
        backup_every=backup_every_steps,
        checkpoint_every=checkpoint_every_steps)
    fit_callbacks = _callbacks(
        run, bundle, pretrain, saver, tau=model.tau, chief=chief,
        num_epochs=num_epochs, log_every_steps=log_every_steps,
        view_images=view_images and chief and start_step == 0,
        evaluators=evaluators, eval_every_epochs=eval_every_epochs,
        eval_max_queries=eval_max_queries)
    _fit(model, pretrain,
         functools.partial(_input_at, bundle, strategy=strategy, seed=seed),
         fit_callbacks, saver, strategy=strategy, start_step=start_step,
         num_epochs=num_epochs, history=history, verbose=verbose)
    _finish(model, saver, history, num_epochs * pretrain.steps_per_epoch)
    return model


def _input_at(bundle, start_step, *, strategy, seed):
    """The PAWS input of the data `bundle` from global `start_step`."""
    return pipeline.make_pretrain_dataset_fn(
        bundle.unlabeled, bundle.labeled,
        num_replicas=strategy.num_replicas_in_sync, seed=seed,
        normalization=bundle.normalization, start_step=start_step)


def _build(bundle, start_step, *, strategy, seed, num_epochs,
           **compile_args):
    """`start.start`'s `build`: `(pretrain, model)`, the input of `bundle`
    at `start_step` and the model `building.build_compiled_model` compiles
    with `compile_args`."""
    pretrain = _input_at(bundle, start_step, strategy=strategy, seed=seed)
    return pretrain, building.build_compiled_model(
        strategy, input_channels=bundle.labeled.channels,
        steps_per_epoch=pretrain.steps_per_epoch, num_epochs=num_epochs,
        **compile_args)


def _finish(model, saver, history, total_steps):
    """Records the end of the run and deletes its backup; raises
    `Preempted` when SIGTERM stopped it."""
    state = saver.state
    if saver.preempted_at is not None:
        history(f'stopped by SIGTERM at step {saver.preempted_at}, backed '
                f'up in {state.backup_dir}')
        raise Preempted(
            f'Stopped by SIGTERM after step {saver.preempted_at} of '
            f'{total_steps}, backed up in {state.backup_dir}: run the same '
            'command again to resume.')
    fingerprint = weights_fingerprint(model)
    logging.info('Final weights fingerprint (SHA-256): %s', fingerprint)
    state.delete_backup()
    history(f'finished at step {checkpoints.global_step(model)}; weights '
            f'SHA-256 {fingerprint}')


def check_arguments(*, num_epochs, keep_checkpoints, backup_every_steps,
                    steps_per_execution, checkpoint_every_steps,
                    log_every_steps, eval_every_epochs, eval_max_queries,
                    seed, precision, on_data_change, names=None):
    """Returns `num_epochs` as an int; raises `checks.ConfigError` naming
    a bad argument of `train` (`names`: as `checks.namer`'s)."""
    name = checks.namer(names, 'train.')
    for key, value, minimum in (
            ('num_epochs', num_epochs, 1),
            ('keep_checkpoints', keep_checkpoints, 1),
            ('backup_every_steps', backup_every_steps, 1),
            ('steps_per_execution', steps_per_execution, 1),
            ('checkpoint_every_steps', checkpoint_every_steps, 0),
            ('log_every_steps', log_every_steps, 0),
            ('eval_every_epochs', eval_every_epochs, 0), ('seed', seed, 0)):
        checks.integer(name(key), value, minimum=minimum)
    if eval_max_queries is not None:  # None: every test image.
        checks.integer(name('eval_max_queries'), eval_max_queries)
    checks.one_of(name('precision'), precision, building.PRECISIONS)
    checks.one_of(name('on_data_change'), on_data_change,
                  data_fingerprint.ON_CHANGE)
    if checkpoint_every_steps and checkpoint_every_steps < backup_every_steps:
        raise checks.ConfigError(
            f'{name("checkpoint_every_steps")} = {checkpoint_every_steps} '
            f'is smaller than {name("backup_every_steps")} = '
            f'{backup_every_steps}: back up at least as often as you '
            'checkpoint, so that a resumed run always starts from the '
            'newest state.')
    return int(num_epochs)


def _fit(model, pretrain, input_at, fit_callbacks, saver, *, strategy,
         start_step, num_epochs, history, verbose):
    """`callbacks.fit_from` global `start_step`; a failure of the cluster
    becomes a `cluster.ClusterFailed` naming where a relaunch resumes."""
    def dataset_at(step):
        return tf_keras.utils.experimental.DatasetCreator(
            (pretrain if step == start_step else
             input_at(start_step=step)).dataset_fn)

    # One worker cannot save alone under MultiWorkerMirroredStrategy.
    on_sigterm = not isinstance(strategy,
                                tf.distribute.MultiWorkerMirroredStrategy)
    try:
        with saver.handling_sigterm(on_sigterm):
            callbacks.fit_from(
                model, dataset_at, start_step, epochs=num_epochs,
                steps_per_epoch=pretrain.steps_per_epoch,
                callbacks=fit_callbacks, verbose=verbose)
    except BaseException as error:
        step = checkpoints.global_step(model)
        why = ': '.join([type(error).__name__] + str(error).splitlines()[:1])
        history(f'stopped at step {step} by {why}')
        failure = cluster.cluster_failure(
            strategy, error, what='training', step=step,
            resume=saver.state.saved()[1])
        if failure is None:
            raise
        raise failure from error


def _callbacks(run, bundle, pretrain, saver, *, tau, chief, num_epochs,
               log_every_steps, view_images, evaluators, eval_every_epochs,
               eval_max_queries):
    """`fit`'s callbacks, in order: the saver after the loss check, the
    evaluation and the summaries of its step (so that the logs reach the
    backup's step), the progress bar last."""
    preprocessing = experiment.eval_preprocessing(bundle)
    fit_callbacks = [
        callbacks.StopOnNonFiniteLoss(run.checkpoints),
        callbacks.ProgressLog(run.train_logs,
                              views_per_step=pretrain.views_per_step,
                              every_steps=log_every_steps,
                              num_epochs=num_epochs, is_chief=chief),
        saver,
    ]
    if eval_every_epochs and evaluators and bundle.test is not None:
        fit_callbacks.insert(1, callbacks.epoch_end_evaluation(
            evaluators, bundle, log_dir=run.eval_logs,
            tau=tau, chief=chief, every_epochs=eval_every_epochs,
            max_queries=eval_max_queries))
    if chief:
        fit_callbacks.append(callbacks.OperativeConfig(run))
    if view_images:
        fit_callbacks.append(callbacks.ViewImages(
            run.train_logs, pretrain.dataset_fn,
            mean=preprocessing['mean'], std=preprocessing['std']))
    return fit_callbacks + [progress.ProgressBar()]
