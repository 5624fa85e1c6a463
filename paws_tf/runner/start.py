"""How a training run starts, decided in one place and in order: refused,
overwritten, resumed, continued from a pretrained model or backbone, or
new."""

import os
import typing

from absl import logging
import tf_keras

from paws_tf import checkpoints
from paws_tf import checks
from paws_tf import cluster
from paws_tf.data import data_fingerprint
from paws_tf.runner import architecture
from paws_tf.runner import building
from paws_tf.runner import experiment
from paws_tf.runner import pretrained as pretrained_lib
from paws_tf.runner import records

# Gin bindings that may change when a run resumes: what to do on changed
# data, how often progress is logged, how long its cluster may take to form.
RESUME_ONLY_BINDINGS = ('train.on_data_change', 'ProgressBar.',
                        'make_strategy.start_timeout')
# Of the variables that do not fit, how many a message names.
_NAMES_SHOWN = 3


class Pretrained(typing.NamedTuple):
    """What a new run starts from, read once (`check_pretrained`): the
    `weights` of the backbone or of the whole model (`part`; None: from
    scratch) stored at `path`, read for `channels`-channel images;
    `binding` gives it, `name = bound` in messages."""
    part: typing.Optional[str] = None
    path: typing.Optional[str] = None
    binding: str = ''
    channels: int = 0
    weights: typing.Optional[list] = None

    def check_channels(self, channels):
        """Raises `checks.ConfigError` if the weights were read for other
        than `channels`-channel images (`start`'s step 3, before the run
        it replaces is deleted)."""
        if self.part is not None and channels != self.channels:
            raise checks.ConfigError(
                f'{self.binding} fits {self.channels}-channel images, but '
                f'the images have {channels}: start from a {self.part} of '
                f'{channels}-channel images.')

    def load_into(self, model):
        """Gives a new run's `model` these weights (`check_channels`
        passed); returns what the run history says of them."""
        if self.part is None:
            return ''
        target = (model.backbone if self.part == architecture.BACKBONE
                  else model)
        checkpoints.assign_weights(target, self.weights)
        return f' from the {self.part} of {self.path}'


def check_pretrained(run, backbone=(None, ''), model=(None, ''), *,
                     overwrite=False, channels=None):
    """The `Pretrained` weights a new run in the `RunDir` `run` starts
    from (no part when none is bound, or resuming), read before any data
    is read or anything written (`start`'s step 1); call it once the
    strategy exists (`MultiWorkerMirroredStrategy` must precede other
    TensorFlow ops). A run that resumes (its own checkpoint wins; with
    `overwrite`, run.py's --overwrite, it may start again) reads none.

    Args:
        backbone, model: `(path, binding)` of `train.pretrained_backbone`
            and `train.pretrained_model` (path None: not bound).
        channels: the images' channels, when the config gives them
            (`experiment.folder_channels`); None: 3, then 1 are tried.

    Raises:
        checks.ConfigError: both are bound, or the path lies in `run`, does
            not exist or does not fit: the architecture bindings of its
            run or import that this config binds otherwise (before any
            read, `architecture.refuse_another`), else its channels or
            the first variables that do not fit.
    """
    (path, name), part = ((backbone, architecture.BACKBONE) if backbone[0]
                          else (model, architecture.MODEL))
    if backbone[0] and model[0]:
        raise checks.ConfigError(
            f'{backbone[1]} and {model[1]} are both bound: bind one '
            '(the model includes its backbone).')
    if not path:
        return Pretrained()
    _check_outside(run, path, name)
    if checkpoints.has_progress(run) and not overwrite:
        return Pretrained()
    if not (os.path.exists(path) or os.path.exists(f'{path}.index')):
        raise checks.ConfigError(
            f'{name} = {path!r} does not exist: bind it to a run directory '
            'or a checkpoint' + (', or a weights file' if part ==
                                 architecture.BACKBONE else '') + '.')
    architecture.refuse_another(path, name, part)
    return _read_pretrained(path, name, part,
                            (channels,) if channels else (3, 1))


def _read_pretrained(path, name, part, tried):
    """The `Pretrained` `part` stored at `path` (bound to `name`), read
    into the configured model of the first channel count of `tried` it
    fits; else raises `checks.ConfigError` naming why it does not fit."""
    refused = []  # What each channel count tried gave, the first first.
    for channels in tried:
        model = building.build_local_model(input_channels=channels)
        try:
            if part == architecture.BACKBONE:
                pretrained_lib.load_backbone_weights(model.backbone, path)
                read, weights = path, model.backbone.get_weights()
            else:
                read = checkpoints.load(
                    pretrained_lib.model_checkpoint(path), model)
                weights = model.get_weights()
            return Pretrained(part, read, f'{name} = {path!r}', channels,
                              weights)
        except FileNotFoundError as error:
            raise checks.ConfigError(f'{name} = {path!r}: {error}') from error
        except ValueError as error:
            refused.append(error)
    why = architecture.channel_difference(path, tried)
    if why is None:
        unmatched = getattr(refused[0], 'unmatched', None)
        why = (f'{len(unmatched)} variables of the configured {part} have no '
               'value of their shape there: '
               f'{checks.listing(unmatched, _NAMES_SHOWN)}'
               if unmatched else
               str(refused[0].__cause__ or refused[0]).splitlines()[0])
    why = why.rstrip('.')
    raise checks.ConfigError(
        f'{name} = {path!r} does not fit the configured {part}: {why}. '
        f'Start from a {part} of this architecture, or bind its '
        'architecture.')


def _check_outside(run, path, name):
    """Refuses a pretrained `path` that is or lies inside the run `run`:
    --overwrite would delete it, and a run starts from another model."""
    inside, own = (os.path.realpath(p) for p in (path, run))
    if inside != own and not inside.startswith(own + os.sep):
        return
    raise checks.ConfigError(
        f'{name} = {path!r} {"is" if inside == own else "lies inside"} '
        f'--model_dir={run}, the run it would start: start from a model in '
        'another directory, or train in another --model_dir.')


class Started(typing.NamedTuple):
    """A run's start: its data, input and model, the global step it starts
    at, and whether it holds a finished run (not trained again)."""
    bundle: experiment.DataBundle
    pretrain: typing.Any  # pipeline.PretrainInput
    model: typing.Any  # model.PAWSModel, compiled
    step: int
    finished: bool


def start(run, strategy, build, *, num_epochs, history, seed,
          pretrained_backbone=(None, ''), pretrained_model=(None, ''),
          claim=None, overwrite=False, on_data_change='stop'):
    """Decides how the run in `run` starts: refused, overwritten, resumed,
    continued from a pretrained model or backbone, or new; each check once,
    in the order of the numbered steps; returns `Started`. A refusal
    (`checks.ConfigError`, `data_fingerprint.Changed`) up to step 5 leaves
    the run's files as they were.

    Args:
        run, strategy: the run's `RunDir`, the strategy it trains under.
        build: `build(bundle, start_step)` returns `(pretrain, model)`: the
            input (`pipeline.PretrainInput`) and the compiled model.
        num_epochs, seed, history: `train`'s; `history(event)` records one.
        pretrained_backbone, pretrained_model: `(path, binding)`, `train`'s.
        claim: called once the pretrained weights pass, before anything is
            written (run.py's takes the run lock and stages its records).
        overwrite, on_data_change: --overwrite, `train.on_data_change`.
    """
    chief = cluster.is_chief(strategy)
    # 1. Pretrained weights that lie in the run or do not fit: refused
    # before anything is written or read (a resumed run reads none).
    pretrained = check_pretrained(
        run, pretrained_backbone, pretrained_model, overwrite=overwrite,
        channels=experiment.folder_channels())
    if claim is not None:
        claim()
    tf_keras.utils.set_random_seed(seed)
    try:
        # 2. A run of another gin config: refused, or replaced
        # (`overwrite`, or it saved nothing).
        replace = _replaces_config(run, overwrite=overwrite)
        # 3. The data, its records staged; other data than the run started
        # on: refused, replaced (`overwrite`) or resumed (`on_data_change`).
        bundle = experiment.load_data(run.staging if chief else None)
        pretrained.check_channels(bundle.labeled.channels)
        fingerprint = data_fingerprint.fingerprint(bundle)
        restart = replace or data_fingerprint.check(
            run.read_json(run.fingerprint), fingerprint, model_dir=run.path,
            path=run.fingerprint,
            resuming=not replace and checkpoints.has_progress(run),
            on_change=on_data_change, overwrite=overwrite)
        # 4. Unless replaced, the run resumes from its newest restorable
        # backup or checkpoint; its input and model start at that step.
        resume_from, step = (None, 0) if restart else (
            checkpoints.newest_restorable(run, chief=chief))
        pretrain, model = build(bundle, step)
    except BaseException:
        if chief:
            run.accept_staged(False)
        raise
    # 5. Accepted: the replaced run deleted, the staged records moved in.
    _accept(run, strategy, pretrain, chief=chief, restart=restart,
            fingerprint=fingerprint, overwrite=overwrite)
    # 6. The model and optimizer restored, or the model starts from the
    # pretrained weights, or from scratch.
    finished = _restore_or_begin(
        model, resume_from, step, pretrain.steps_per_epoch,
        num_epochs=num_epochs, history=history, pretrained=pretrained)
    return Started(bundle, pretrain, model, step, finished=finished)


def _restore_or_begin(model, resume_from, step, steps_per_epoch, *,
                      num_epochs, history, pretrained):
    """Step 6 of `start`: `model` restored from `resume_from` (at `step`),
    else given the `pretrained` weights (if any); whether the run is
    finished."""
    total_steps = num_epochs * steps_per_epoch
    if resume_from:
        checkpoints.load(resume_from, model, checkpoints.WHOLE)
        if step >= total_steps:
            logging.info('%s holds a finished run (%d steps): not training '
                         'it again.',
                         checkpoints.describe(resume_from).capitalize(), step)
            return True
        epoch, batch = divmod(step, steps_per_epoch)
        logging.info('Run %s.', history(
            f'resumed at step {step} of {total_steps} (epoch {epoch + 1} of '
            f'{num_epochs}, step {batch} of it) from '
            f'{checkpoints.describe(resume_from)}'))
    else:
        origin = pretrained.load_into(model)
        history(f'started a new run of {total_steps} steps{origin}')
    logging.info('Training steps %d..%d: %d epoch%s of %d steps.', step,
                 total_steps, num_epochs, '' if num_epochs == 1 else 's',
                 steps_per_epoch)
    return False


def _replaces_config(run, *, overwrite):
    """Whether this gin config replaces the run in `run`: its config
    differs, and it saved nothing or `overwrite` says to; else raises
    `checks.ConfigError` naming the changed lines."""
    added, removed = records.config_changes(
        run, lambda line: not line.startswith(RESUME_ONLY_BINDINGS)) or (
            [], [])
    if not (added or removed):
        return False
    if not _holds_a_run(run):
        logging.info('%s holds the config of a start that saved no backup, '
                     'checkpoint or result: starting with this config.', run)
        return True
    if not overwrite:
        changed = ([f'  - {line}' for line in removed[:5]] +
                   [f'  + {line}' for line in added[:5]])
        raise checks.ConfigError(
            f'{run} holds a run with a different gin config:\n' +
            '\n'.join(changed) + '\nUse another --model_dir, undo the change '
            'to resume that run (for a binding of a parameter that no longer '
            f'exists: delete its line from {run.config}), or pass '
            '--overwrite to delete it and start again.')
    return True


def _holds_a_run(run):
    """Whether `run` holds more than a failed start's records: a backup or
    checkpoint, or what was derived from its model."""
    return checkpoints.has_progress(run) or run.holds_results()


def _accept(run, strategy, pretrain, *, chief, restart, fingerprint,
            overwrite):
    """Step 5 of `start`: the chief deletes the run it replaces
    (`restart`, `RunDir.overwritten`), then moves the staged records in
    and writes the summary of the input `pretrain`; under `overwrite`
    every worker waits for it, having read what it reads."""
    if overwrite:
        cluster.barrier(strategy)
    if chief:
        if restart:
            if _holds_a_run(run):
                logging.warning('--overwrite: deleting the previous run in '
                                '%s.', run)
            run.delete(run.overwritten)
        if os.path.exists(run.staging.config):
            logging.info('gin config: %s', run.config)
        run.accept_staged()
        if restart or run.read_json(run.fingerprint) != fingerprint:
            run.write_json(run.fingerprint, fingerprint)
        run.write(run.input_summary, pretrain.summary + '\n')
    logging.info('%s; the sizes per replica and step: %s',
                 pretrain.summary_line, run.input_summary)
    if overwrite:
        cluster.barrier(strategy)
