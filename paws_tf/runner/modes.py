"""run.py's modes (`MODES`) and what they share: restore, export, evaluate."""

import contextlib
import functools
import os
import typing

from absl import logging
import tensorflow as tf

from paws_tf import bindings
from paws_tf import checkpoints
from paws_tf import checks
from paws_tf import cluster
from paws_tf.evaluation import evaluate_nn
from paws_tf.evaluation import export
from paws_tf.evaluation import fine_tune
from paws_tf import model as model_lib
from paws_tf import run_dir
from paws_tf.runner import building
from paws_tf.runner import config_checks
from paws_tf.runner import experiment
from paws_tf.runner import official_import
from paws_tf.runner import train
from paws_tf.runner import vit_import


def _float32_model(run, strategy, *, local, imported):
    """The run's new float32 model: plain variables (`local`) or in the
    strategy's scope."""
    channels = (official_import.CHANNELS if imported else
                experiment.recorded_preprocessing(run)[1])
    return building.in_float32(
        building.build_local_model if local else
        functools.partial(building.build_model, strategy),
        input_channels=channels)


def load_trained_model(run, strategy, *, local=False, imported=False):
    """`(model, step)`: the `PAWSModel` of the `RunDir` `run` restored from
    its newest checkpoint that restores, and that checkpoint's step; in
    plain variables (`local`: what one process does alone, export and
    PAWS-NN) or in `strategy`'s scope (fine-tuning); RGB when `imported`.
    Raises `checks.ConfigError` (no checkpoint yet, or one of another
    architecture than the config builds) or `checkpoints.NoneRestorable`."""
    model = _float32_model(run, strategy, local=local, imported=imported)
    with contextlib.nullcontext() if local else strategy.scope():
        try:
            return model, checkpoints.load_newest(run, model)
        except FileNotFoundError:
            raise checks.ConfigError(
                f'--model_dir={run} holds no checkpoint: give the model_dir '
                'of a trained run, or train this one first (--mode=train '
                'resumes a run stopped before its first checkpoint).'
            ) from None
        except checkpoints.Mismatch as error:
            raise checks.ConfigError(
                f'{run} holds a model of another architecture than this '
                f'config builds ({len(error.unmatched)} variables missing '
                'or of other shapes: '
                f'{checks.listing(error.unmatched, 3)}): bind the '
                f'architecture its {run.config} binds.') from None


class MissingLabeledFolder(checks.DataError):
    """A mode that reads the labeled images finds no labeled folder."""


def load_labeled_data(run, what, *, trained=True, takes=None):
    """The run's data (`experiment.load_data`, which checks the images'
    channels against `takes`), for `what` that reads its labeled images: a
    `trained` run's, checked against its records and writing none, else
    recorded in `run`. Raises `MissingLabeledFolder` naming the binding
    and `what` when the config's labeled folder does not exist."""
    try:
        config_checks.check_labeled_folder(what)
    except ValueError as error:
        raise MissingLabeledFolder(str(error)) from None
    return experiment.load_data(run, trained=trained, takes=takes)


def evaluate_existing(run, strategy, embedder):
    """PAWS-NN, on the chief, of the existing model whose embedder export
    is `embedder` (`config_checks.existing_model`) on the config's data,
    with the preprocessing its export records, into `run` with its PAWS-NN
    classifier of these classes (`RunDir.classifier`); returns the results
    on the chief. Raises `checks.DataError` for labeled images of other
    channels than the model takes (`experiment.load_data`'s `takes`),
    `checks.ConfigError` for a `run` that holds a training run."""
    if checkpoints.has_progress(run):
        raise checks.ConfigError(
            f'--model_dir={run} holds a training run, whose eval/ and '
            'export/classifier the evaluation of evaluate_nn.from_model '
            'would replace: give another --model_dir (the same config '
            'draws the same labeled images there).')
    results = None
    if cluster.is_chief(strategy):
        stored = export.read_preprocessing(embedder)
        # The directory records the labeled images its classifier holds.
        bundle = load_labeled_data(
            run, 'PAWS-NN compares the test images with them',
            trained=False,
            takes=(stored['channels'], f'The model of {embedder}'))
        _check_test(bundle)
        results = evaluate_nn.evaluate_nn(
            run, labeled=bundle.labeled, test=bundle.test, classifier=True,
            from_model=embedder,
            **{key: stored[key] for key in (
                'image_size', 'crop_fraction', 'mean', 'std')})
        logging.info('Exported the PAWS-NN classifier of %s for these %d '
                     'classes under %s.', embedder,
                     len(bundle.labeled.class_names),
                     run.classifier)
    cluster.barrier(strategy)
    return results


def _check_test(bundle):
    if bundle.test is None:
        raise ValueError('No test split is configured (load_data.test): '
                         'nothing to evaluate PAWS-NN on.')


def _paws_nn(run, bundle, embedder, *, tau, embedding, step, classifier):
    """PAWS-NN of the `evaluate_nn.Embedder` `embedder` on the run's data
    `bundle`, with its classifier (`classifier`)."""
    _check_test(bundle)
    return evaluate_nn.evaluate_nn(
        run, embedder, labeled=bundle.labeled, test=bundle.test, tau=tau,
        embedding=embedding, step=step, classifier=classifier,
        **experiment.eval_preprocessing(bundle))


def export_and_evaluate(run, strategy, model=None, *, exports=True,
                        evaluates=True, imported=False, bundle=None):
    """What one process does alone with a trained run: export it
    (`exports`), then PAWS-NN (`evaluates`) of the run's data (`bundle`,
    else read here), on the chief, of `model` (the trained model in hand,
    given on every process), else of the run's embedder export when
    PAWS-NN alone is asked and it has one, else of the newest checkpoint
    (or the imported weights); the other workers wait for it. Returns the
    PAWS-NN results on the chief, else None."""
    # Every process reads the weights in hand: under
    # MultiWorkerMirroredStrategy, reading a batch-norm moving statistic is
    # a collective of all workers.
    weights = None if model is None else model.get_weights()
    results = None
    if cluster.is_chief(strategy):
        missing = None
        # Read, and checked against the run's records, before anything is
        # written.
        try:
            bundle = bundle or load_labeled_data(run, (
                'PAWS-NN compares the test images with them' if evaluates
                else 'the classifier bundles their embeddings'))
        except MissingLabeledFolder as error:
            if evaluates:
                raise
            missing = error  # An export without the classifier.
        # An export that records the step of the newest checkpoint holds its
        # weights: the model is read once, from it; the temperature and
        # embedding are the config's.
        if model is None and not exports and os.path.isdir(run.embedder) and (
                export.read_preprocessing(run.embedder).get('step')
                == checkpoints.latest(run.checkpoints)[1]):
            embedder = evaluate_nn.of_export(run.embedder)
            config = bindings.arguments(model_lib.PAWSModel)
            results = _paws_nn(
                run, bundle, embedder, tau=config['tau'][0],
                embedding=config['nn_embedding'][0],
                step=embedder.exported['step'], classifier=False)
        else:
            results = _export_and_evaluate(
                run, strategy, model, weights, bundle, exports=exports,
                evaluates=evaluates, imported=imported)
        if missing is not None:
            logging.warning('Exported the embedder under %s, not the '
                            'classifier: %s', run.export, missing)
        elif exports:
            logging.info('Exported the embedder and the classifier under '
                         '%s.', run.export)
    cluster.barrier(strategy)
    return results


def _export_and_evaluate(run, strategy, model, weights, bundle, *, exports,
                         evaluates, imported):
    """`export_and_evaluate` of a plain-variable float32 copy of `model`
    (its `weights`), else of the newest checkpoint: the embedder export,
    then PAWS-NN with the classifier of the same support embeddings, or
    the classifier alone (`bundle` not None)."""
    if model is None:
        local, step = load_trained_model(run, strategy, local=True,
                                         imported=imported)
    else:
        local = _float32_model(run, strategy, local=True, imported=imported)
        checkpoints.assign_weights(local, weights)
        step = checkpoints.global_step(model)
    if exports:
        preprocessing, channels = experiment.recorded_preprocessing(run)
        export.export_embedder(local, run.embedder, channels=channels,
                               step=step, **preprocessing)
    if evaluates:
        embedder = (evaluate_nn.Embedder(
            local, 'saved_model', run.embedder,
            export.read_preprocessing(run.embedder)) if exports else
            evaluate_nn.Embedder(local, 'checkpoint',
                                 checkpoints.at_step(run, step)))
        return _paws_nn(run, bundle, embedder, tau=local.tau,
                        embedding=local.nn_embedding, step=step,
                        classifier=exports)
    if exports and bundle is not None:
        evaluate_nn.export_classifier(run, local, bundle.labeled,
                                      preprocessing, channels=channels,
                                      tau=local.tau)
    return None


class Options(typing.NamedTuple):
    """What run.py gives a mode besides the run directory: its flags, and
    its hold on the run directory."""
    overwrite: bool = False  # --overwrite.
    owner_check: typing.Optional[typing.Callable[[], None]] = None
    # What a training run's start calls before it writes (`start.start`'s
    # `claim`).
    claim: typing.Optional[typing.Callable[[], None]] = None
    # The embedder export of the model evaluate_nn.from_model names
    # (`config_checks.check_config`), which --mode=evaluate_nn evaluates.
    existing_model: typing.Optional[str] = None
    official_checkpoint: typing.Optional[str] = None  # --official_checkpoint
    mode: str = 'train'  # --mode: named in the refusal of an import.


def trained_model(run, strategy, options):
    """The model `train.train` trains into `run` (a finished run's
    without training it), in `strategy`'s scope."""
    official_import.check_mode(run, options.mode, trains=True)
    return train.train(run, strategy, overwrite=options.overwrite,
                       owner_check=options.owner_check,
                       claim=options.claim)


def _train_and_evaluate(run, strategy, options):
    return export_and_evaluate(run, strategy,
                               trained_model(run, strategy, options))


def _export_or_evaluate(run, strategy, options, *, evaluates):
    if evaluates and options.existing_model is not None:
        return evaluate_existing(run, strategy, options.existing_model)
    imported = official_import.check_mode(run, options.mode)
    return export_and_evaluate(run, strategy, exports=not evaluates,
                               evaluates=evaluates, imported=imported)


def _fine_tune(run, strategy, options):
    imported = official_import.check_mode(run, options.mode, backbone=True)
    takes = official_import.check_preprocessing(run) if imported else None
    # An imported backbone's record is read whole before any image is;
    # its weights once the data is checked.
    vit_architecture = vit_import.imported_architecture(run)
    bundle = load_labeled_data(run, 'fine-tuning trains on them',
                               takes=takes)
    preprocessing = experiment.eval_preprocessing(bundle)
    if vit_architecture is not None:
        model = vit_import.imported_embedder(run, strategy, vit_architecture)
    else:
        model, _ = load_trained_model(run, strategy, imported=imported)
    return fine_tune.fine_tune(run, model, labeled=bundle.labeled,
                               test=bundle.test, strategy=strategy,
                               **preprocessing)


def _import_official(run, strategy, options):
    # One process's work: the chief imports into plain variables, the
    # other workers wait for it.
    record = None
    if cluster.is_chief(strategy):
        record = vit_import.import_file(
            run, options.official_checkpoint,
            strategy=tf.distribute.get_strategy(),
            overwrite=options.overwrite)
    cluster.barrier(strategy)
    return record


class Mode(typing.NamedTuple):
    """A run.py mode: `run(run, strategy, options)` (`run` a `RunDir`)
    returns its results (the trained model, PAWS-NN's, fine-tuning's, the
    import record) or None."""
    run: typing.Callable[[run_dir.RunDir, tf.distribute.Strategy, Options],
                         typing.Any]
    # Trains: takes the run lock and records the config in model_dir.
    trains: bool = False
    # Reads Options.official_checkpoint, and creates model_dir only once
    # the checkpoint fits.
    imports: bool = False


# The library's modes; run.py's --mode adds the demo's (`cli.MODES`).
MODES = dict(
    train=Mode(trained_model, trains=True),
    evaluate_nn=Mode(functools.partial(_export_or_evaluate, evaluates=True)),
    fine_tune=Mode(_fine_tune),
    export=Mode(functools.partial(_export_or_evaluate, evaluates=False)),
    train_and_evaluate=Mode(_train_and_evaluate, trains=True),
    import_official=Mode(_import_official, imports=True),
)


def run(model_dir, strategy, mode, **options):
    """Runs the mode named `mode` (a key of `MODES`) on `model_dir` under
    `strategy`, with the fields of `Options` as `**options`; returns what
    the mode returns."""
    checks.one_of('mode', mode, tuple(MODES))
    return MODES[mode].run(run_dir.RunDir(model_dir), strategy,
                           Options(mode=mode, **options))
