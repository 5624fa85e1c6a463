r"""The paws-tf program: runs a paws_tf experiment described by gin files.

  paws-tf --gin_file=debug.gin --model_dir=/tmp/paws --mode=train_and_evaluate

(`python run.py` with the same flags in a checkout.) A --gin_file is a path,
or the name of a config shipped with the package (--list_configs names them).

Modes: train (PAWS pre-training; resumes an unfinished run), evaluate_nn
(PAWS-NN top-1/top-5 on the test split), fine_tune (the paper's ImageNet or
CIFAR-10 fine-tuning protocol, by gin), export (SavedModels),
train_and_evaluate (train, export, evaluate_nn), demo (train_and_evaluate,
the configured fine-tuning, then a supervised-only baseline on the same
labels; results.json, a figure and a table), import_official (an official
PyTorch checkpoint, --official_checkpoint, as a run of --model_dir).
"""

import contextlib
import json
import logging as pylogging
import os
import re
import sys

from absl import app
from absl import flags
from absl import logging
import gin

import paws_tf  # noqa: F401  (selects tf_keras before TensorFlow is used)
from paws_tf import checkpoints
from paws_tf import configurables  # noqa: F401  (registers configurables)
from paws_tf.data import data_fingerprint
from paws_tf.data import normalization as normalization_lib
from paws_tf.demo import run_demo
from paws_tf import dist
from paws_tf import files
from paws_tf.runner import config_checks
from paws_tf.runner import modes
from paws_tf.runner import official_import
from paws_tf.runner import run_lock
from paws_tf.runner import train

CONFIG_FILE = 'config.gin'
OPERATIVE_CONFIG_FILE = 'operative_config.gin'
FLAGS_FILE = 'flags.txt'
# 128 + SIGTERM: what a job killed by SIGTERM would report.
PREEMPTED_EXIT_CODE = 143
# Another live run trains in --model_dir: try again later (EX_TEMPFAIL).
LOCKED_EXIT_CODE = os.EX_TEMPFAIL
# Another run took this run's lock over while it trained: it stopped before
# saving (EX_TEMPFAIL too: the other run goes on with the run directory).
LOCK_LOST_EXIT_CODE = os.EX_TEMPFAIL
# A checkpoint or backup could not be written (EX_IOERR).
SAVE_FAILED_EXIT_CODE = os.EX_IOERR
# No backup or checkpoint of the run can be restored, or the data differs
# from what the run started on (EX_DATAERR).
# An official checkpoint that cannot be imported, likewise.
NONE_RESTORABLE_EXIT_CODE = DATA_CHANGED_EXIT_CODE = os.EX_DATAERR
IMPORT_FAILED_EXIT_CODE = os.EX_DATAERR
# A collective across the cluster's workers failed (EX_UNAVAILABLE).
CLUSTER_FAILED_EXIT_CODE = os.EX_UNAVAILABLE
# Faults that end a run with their message and an exit code of their own.
_FAULT_EXIT_CODES = {
    checkpoints.SaveFailed: SAVE_FAILED_EXIT_CODE,
    checkpoints.NoneRestorable: NONE_RESTORABLE_EXIT_CODE,
    data_fingerprint.Changed: DATA_CHANGED_EXIT_CODE,
    official_import.ImportFailed: IMPORT_FAILED_EXIT_CODE,
    dist.ClusterFailed: CLUSTER_FAILED_EXIT_CODE,
    run_lock.Lost: LOCK_LOST_EXIT_CODE,
}
# What a training run writes; --overwrite removes these.
_RUN_STATE = train.RUN_OUTPUTS + (CONFIG_FILE, OPERATIVE_CONFIG_FILE,
                                  data_fingerprint.FILENAME,
                                  normalization_lib.NORMALIZATION_FILENAME)
# Gin bindings that may change when a run resumes.
_RESUME_ONLY_BINDINGS = ('train.on_data_change',)
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# The shipped configs include each other as 'gin_configs/NAME.gin', so gin
# searches the directory that holds gin_configs/: the package once installed
# (pyproject.toml maps the repository's gin_configs/ into it), else the
# checkout the package is imported from (run.py, editable installs).
CONFIG_ROOT = next(
    (root for root in (_PACKAGE_DIR, os.path.dirname(_PACKAGE_DIR))
     if os.path.isdir(os.path.join(root, 'gin_configs'))), _PACKAGE_DIR)
CONFIG_DIR = os.path.join(CONFIG_ROOT, 'gin_configs')

_GIN_FILES = flags.DEFINE_multi_string(
    'gin_file', [], 'Gin config file: a path, or the name of a shipped config '
    '(--list_configs). Repeatable; later files override.')
_GIN_BINDINGS = flags.DEFINE_multi_string(
    'gin_bindings', [], "Gin binding such as 'train.num_epochs = 2' "
    '(repeatable; applied after the files).')
# Checked in main rather than by absl (required=True), so that
# --list_configs runs without it.
_MODEL_DIR = flags.DEFINE_string('model_dir', None, 'Run directory.')
_MODE = flags.DEFINE_enum('mode', 'train', modes.MODES + ('demo',),
                          'What to run.')
_STRATEGY = flags.DEFINE_enum('strategy', 'auto', dist.STRATEGY_KINDS,
                              'Distribution strategy.')
_OVERWRITE = flags.DEFINE_bool(
    'overwrite', False, 'Start training again in a model_dir that holds a '
    'run with a different config or different data (its checkpoints, '
    'backup and logs are deleted).')
_OFFICIAL_CHECKPOINT = flags.DEFINE_string(
    'official_checkpoint', None, 'With --mode=import_official: an official '
    'PAWS .pth.tar checkpoint (pre-trained or fine-tuned) to import into '
    '--model_dir.')
_LIST_CONFIGS = flags.DEFINE_bool(
    'list_configs', False, 'Print the names of the shipped gin configs, '
    'which --gin_file accepts from any directory, and exit.')


def shipped_configs():
    """The names of the gin configs shipped with the package.

    Returns:
        Sorted file names such as 'debug.gin'.
    """
    if not os.path.isdir(CONFIG_DIR):
        return []
    return sorted(name for name in os.listdir(CONFIG_DIR)
                  if name.endswith('.gin'))


def resolve_gin_file(name):
    """The file a --gin_file names: a path that exists, else a shipped
    config, by file name ('debug.gin') or as the repository spells it
    ('gin_configs/debug.gin').

    Args:
        name: the --gin_file value.

    Returns:
        A path gin can open.

    Raises:
        app.UsageError: `name` is neither.
    """
    for path in (name, os.path.join(CONFIG_DIR, name),
                 os.path.join(CONFIG_ROOT, name)):
        if os.path.isfile(path):
            return path
    raise app.UsageError(
        f'--gin_file={name}: no such file, and no shipped config of that '
        f'name. Shipped configs (in {CONFIG_DIR}): '
        f'{", ".join(shipped_configs()) or "none"}.')


def _experiment_lines(config):
    """The lines of a gin config that define the experiment: all but the
    bindings that only say how to resume it."""
    return [line for line in config.splitlines()
            if not line.startswith(_RESUME_ONLY_BINDINGS)]


def _check_model_dir(model_dir, config, overwrite, chief):
    """Refuses to train over a run with another config unless asked to;
    with --overwrite the chief deletes it. The config of a start that saved
    nothing is replaced, with the logs of its first steps."""
    path = os.path.join(model_dir, CONFIG_FILE)
    if not os.path.exists(path):
        return
    with open(path) as f:
        previous = f.read()
    old, new = _experiment_lines(previous), _experiment_lines(config)
    if old == new:
        return
    if not train.has_progress(model_dir):
        logging.info('%s holds the config of a start that saved no backup '
                     'or checkpoint: starting with this config.', model_dir)
        if chief:
            train.delete_outputs(model_dir, (train.TENSORBOARD_DIR,))
        return
    if not overwrite:
        changed = [f'  - {line}' for line in old if line not in new][:5] + [
            f'  + {line}' for line in new if line not in old][:5]
        raise app.UsageError(
            f'{model_dir} holds a run with a different gin config:\n' +
            '\n'.join(changed) + '\nUse another --model_dir, undo the change '
            'to resume that run, or pass --overwrite to delete it and start '
            'again.')
    if not chief:
        return
    logging.warning('--overwrite: deleting the previous run in %s.',
                    model_dir)
    train.delete_outputs(model_dir, _RUN_STATE)


class _QuietTensorFlow:
    """Drops TensorFlow's own INFO records (checkpoint sharding timings and
    the like) from absl's log; its warnings and errors still show."""

    def filter(self, record):
        return (record.levelno >= pylogging.WARNING or
                f'{os.sep}tensorflow{os.sep}' not in record.pathname)


def _parse_gin(files, bindings):
    """Parses the gin files, then each binding, naming the one that fails
    (gin's own message does not say which --gin_bindings was wrong), and a
    macro the config uses but nothing binds (gin's message prints the whole
    config after it)."""
    gin.parse_config_files_and_bindings(files, None, finalize_config=False)
    for binding in bindings:
        try:
            gin.parse_config(binding)
        except (SyntaxError, ValueError) as error:
            raise app.UsageError(
                f'--gin_bindings={binding!r} is not valid gin: {error}') \
                from error
    try:
        gin.finalize()
    except ValueError as error:
        macro = re.match(r"No bindings specified for '(\w+)/gin\.macro'",
                         str(error))
        if macro is None:
            raise
        name = macro.group(1)
        raise app.UsageError(
            f'{name} is not bound: the config uses %{name}. Bind it, e.g. '
            f'--gin_bindings="{name} = ..."') from None


def _check_model_dir_path(model_dir):
    """--model_dir must be a directory or a path one can be created at."""
    path = os.path.abspath(model_dir)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        what = ('is a file' if path == os.path.abspath(model_dir)
                else f'is inside {path}, which is a file')
        raise app.UsageError(
            f'--model_dir={model_dir} {what}: give a directory (it is '
            'created if missing), e.g. --model_dir=runs/mine.')


def _job(strategy):
    """What the processes of one job share and another job does not: the
    cluster spec under MultiWorkerMirroredStrategy, else None."""
    resolver = getattr(strategy, 'cluster_resolver', None)
    if resolver is None:
        return None
    return json.dumps(resolver.cluster_spec().as_dict(), sort_keys=True)


def _writer_lock(model_dir, strategy, training):
    """The lock this process holds while it runs (a no-op context but on a
    training chief), after the checks the other processes make.

    Raises:
        run_lock.Held: a training mode, and another live run holds it.
    """
    if training and dist.is_chief(strategy):
        return run_lock.RunLock(model_dir, job=_job(strategy))
    if training:
        # The chief holds the lock for the job's other workers.
        run_lock.check_held_by_job(model_dir, _job(strategy))
        return contextlib.nullcontext()
    holder = run_lock.read(model_dir)
    if holder is not None and run_lock.stale_reason(holder) is None:
        logging.warning(
            'A training run (%s) is writing %s: reading its newest complete '
            'checkpoint (the checkpoint state file names a checkpoint only '
            'once its files are written).', run_lock.describe(holder),
            model_dir)
    return contextlib.nullcontext()


def main(argv):
    """Parses the gin config, checks it and runs --mode in --model_dir.

    Args:
        argv: the arguments absl left after parsing the flags.
    """
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
    if _LIST_CONFIGS.value:
        print('\n'.join(shipped_configs()))
        return
    if not _GIN_FILES.value:
        raise app.UsageError(
            '--gin_file is required: it names the experiment, e.g. '
            '--gin_file=debug.gin (an install check); --list_configs names '
            'the shipped configs.')
    if _MODEL_DIR.value is None:
        raise app.UsageError('--model_dir is required.')
    if (_MODE.value == 'import_official') != bool(_OFFICIAL_CHECKPOINT.value):
        raise app.UsageError('--official_checkpoint=FILE.pth.tar goes with '
                             '--mode=import_official, and only with it.')
    _check_model_dir_path(_MODEL_DIR.value)
    # absl's handler delegates to its python_handler, which applies filters;
    # TensorFlow's own INFO records go through the 'tensorflow' logger.
    logging.get_absl_handler().python_handler.addFilter(_QuietTensorFlow())
    pylogging.getLogger('tensorflow').setLevel(pylogging.WARNING)
    gin.add_config_file_search_path(CONFIG_ROOT)
    # Parsing first: a typo fails here, with gin's message, before any data
    # is read or any TensorFlow device is set up.
    _parse_gin([resolve_gin_file(name) for name in _GIN_FILES.value],
               _GIN_BINDINGS.value)
    # Then the config as a whole (normalisation, warm-up, support, image
    # sizes): a run that cannot work fails in seconds, not after reading.
    try:
        config_checks.check_config(pretraining=_MODE.value in (
            'train', 'train_and_evaluate', 'demo'))
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    model_dir = _MODEL_DIR.value
    config = gin.config_str()
    training = _MODE.value in ('train', 'train_and_evaluate', 'demo')
    strategy = dist.make_strategy(_STRATEGY.value)
    try:
        dist.check_same_config(strategy, f'--mode={_MODE.value}\n{config}')
        lock = _writer_lock(model_dir, strategy, training)
        with lock:
            _run_in_model_dir(model_dir, strategy, config, training,
                              owner_check=getattr(lock, 'check', None))
    except run_lock.Held as held:
        logging.error('%s', held)
        sys.exit(LOCKED_EXIT_CODE)
    except dist.ClusterFailed as failed:
        logging.error('%s', failed)
        sys.exit(CLUSTER_FAILED_EXIT_CODE)


def _run_in_model_dir(model_dir, strategy, config, training, owner_check):
    """Everything `main` does under the run directory's lock;
    `owner_check` raises when another run took the lock over."""
    chief = dist.is_chief(strategy)
    if training:
        _check_model_dir(model_dir, config, _OVERWRITE.value, chief)
        if _OVERWRITE.value:
            # The other workers of a cluster wait for the chief to delete.
            dist.barrier(strategy)
    # The importer creates model_dir only once the checkpoint fits.
    importing = _MODE.value == 'import_official'
    if not importing:
        os.makedirs(model_dir, exist_ok=True)
    if chief and not importing:
        files.write_text(os.path.join(model_dir, FLAGS_FILE),
                         flags.FLAGS.flags_into_string())
        if training:
            files.write_text(os.path.join(model_dir, CONFIG_FILE), config)
    logging.info('gin config:\n%s', config)

    try:
        if _MODE.value == 'demo':
            run_demo.demo(model_dir, strategy, overwrite=_OVERWRITE.value,
                          owner_check=owner_check)
        else:
            modes.run(model_dir, strategy, _MODE.value,
                      overwrite=_OVERWRITE.value,
                      official_checkpoint=_OFFICIAL_CHECKPOINT.value,
                      owner_check=owner_check)
    except modes.MissingLabeledFolder as missing:
        raise app.UsageError(str(missing)) from missing
    except train.Preempted as stopped:
        logging.warning('%s', stopped)
        sys.exit(PREEMPTED_EXIT_CODE)
    except tuple(_FAULT_EXIT_CODES) as fault:
        logging.error('%s', fault)
        sys.exit(next(code for kind, code in _FAULT_EXIT_CODES.items()
                      if isinstance(fault, kind)))
    if training and chief:
        files.write_text(os.path.join(model_dir, OPERATIVE_CONFIG_FILE),
                         gin.operative_config_str())


def run():
    """The `paws-tf` console script and run.py: absl parses the flags, then
    calls `main`."""
    # absl's --help prints the docstring of __main__ and the flags of the
    # module named sys.argv[0]: the console script and run.py define neither.
    sys.modules['__main__'].__doc__ = __doc__
    for flag in flags.FLAGS.get_key_flags_for_module(__name__):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    app.run(main)
