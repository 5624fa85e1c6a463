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
import functools
import logging as pylogging
import os
import re
import signal
import sys
import tempfile

from absl import app
from absl import flags
from absl import logging
import gin

import paws_tf  # noqa: F401  (selects tf_keras before TensorFlow is used)
from paws_tf import checks

# The environment variable that asks for TensorFlow's logs and tracebacks.
VERBOSE_ENV = 'PAWS_TF_VERBOSE'
_TRUE = ('1', 'true', 't', 'yes', 'y')
_VERBOSE_IN_ENV = os.environ.get(VERBOSE_ENV, '').lower() in _TRUE


def _verbose_requested(argv):
    """Whether `argv` (before absl parses it) or the environment asks for
    TensorFlow's start-up logs."""
    for arg in argv[1:]:
        name, _, value = arg.partition('=')
        if name == '--verbose':
            return not value or value.lower() in _TRUE
        if name == '--noverbose':
            return False
    return _VERBOSE_IN_ENV


@contextlib.contextmanager
def _quiet_start(argv):
    """Runs the block (which loads TensorFlow) and lists the devices with
    file descriptor 2 in a temporary file, written to stderr if the block
    raises; sets TF_CPP_MIN_LOG_LEVEL=3 unless it is set (TensorFlow's C++
    error logs, such as a lost cluster peer's `StartAbort UNAVAILABLE`
    lines, repeat what the error line says). Nothing is hidden
    when --verbose or TensorFlow is loaded already. TensorFlow's C++
    start-up notes come before absl's C++ logging is initialised, and twice
    (its profiler plugin has its own logging): no log level filters them
    (abseil/abseil-cpp#1957)."""
    if _verbose_requested(argv) or 'tensorflow' in sys.modules:
        yield
        return
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
            import tensorflow as tf  # pylint: disable=import-outside-toplevel
            tf.config.list_physical_devices()
        except BaseException:
            sys.stderr.flush()
            held.seek(0)
            os.write(saved, held.read())
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


# TensorFlow loads here, its start-up logs held back.
with _quiet_start(sys.argv):
    # pylint: disable=g-import-not-at-top,wrong-import-position
    from paws_tf import cluster
    from paws_tf import configurables
    from paws_tf import run_dir
    from paws_tf.runner import config_checks
    from paws_tf.runner import modes
    from paws_tf.runner import run_lock
    from paws_tf.runner import train


def _demo(run, strategy, options):
    # Loaded when it runs: the library never imports the demo, and the
    # program loads its mode, report and plotting for --mode=demo alone.
    # pylint: disable-next=import-outside-toplevel
    from paws_tf.demo import run_demo
    return run_demo.demo(run, strategy, options)


# run.py's --mode: the library's modes, and the demo.
MODES = dict(modes.MODES, demo=modes.Mode(_demo, trains=True))

_GIN_FILES = flags.DEFINE_multi_string(
    'gin_file', [], 'Gin config file: a path, or the name of a shipped config '
    '(--list_configs). Repeatable; later files override.')
_GIN_BINDINGS = flags.DEFINE_multi_string(
    'gin_bindings', [], "Gin binding such as 'train.num_epochs = 2' "
    '(repeatable; applied after the files).')
# Checked in main rather than by absl (required=True), so that
# --list_configs runs without it.
_MODEL_DIR = flags.DEFINE_string('model_dir', None, 'Run directory.')
_MODE = flags.DEFINE_enum('mode', 'train', list(MODES), 'What to run.')
_STRATEGY = flags.DEFINE_enum('strategy', 'auto', cluster.STRATEGY_KINDS,
                              'Distribution strategy.')
_OVERWRITE = flags.DEFINE_bool(
    'overwrite', False, 'Start training again in a model_dir that holds a '
    'run with a different config or different data (its checkpoints, '
    'backup and logs are deleted).')
_OFFICIAL_CHECKPOINT = flags.DEFINE_string(
    'official_checkpoint', None, 'With --mode=import_official: an official '
    'PAWS .pth.tar checkpoint (pre-trained or fine-tuned), or a DINO, MSN or '
    'DINOv2 ViT file, to import into --model_dir.')
_VERBOSE = flags.DEFINE_bool(
    'verbose', _VERBOSE_IN_ENV, 'Show TensorFlow\'s start-up and C++ '
    'logs, the gin config and the traceback of a config or data error (for '
    f'a bug report); {VERBOSE_ENV}=1 does the same.')
_LIST_CONFIGS = flags.DEFINE_bool(
    'list_configs', False, 'Print the names of the shipped gin configs, '
    'which --gin_file accepts from any directory, and exit.')


def _check_flags(mode):
    """The flags every mode needs, and those that go with one mode;
    --model_dir a directory or a path where one can be created."""
    if not _GIN_FILES.value:
        raise checks.ConfigError(
            '--gin_file is required: it names the experiment, e.g. '
            '--gin_file=debug.gin (an install check); --list_configs names '
            'the shipped configs.')
    if _MODEL_DIR.value is None:
        raise checks.ConfigError(
            '--model_dir is required: the run directory, e.g. '
            '--model_dir=runs/mine.')
    if mode.imports != bool(_OFFICIAL_CHECKPOINT.value):
        raise checks.ConfigError(
            '--official_checkpoint=FILE.pth.tar goes with '
            '--mode=import_official, and only with it.')
    path = os.path.abspath(_MODEL_DIR.value)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        what = ('is a file' if path == os.path.abspath(_MODEL_DIR.value)
                else f'is inside {path}, which is a file')
        raise checks.ConfigError(
            f'--model_dir={_MODEL_DIR.value} {what}: give a directory (it '
            'is created if missing), e.g. --model_dir=runs/mine.')


# tf_keras' warning when a callback's batch hook takes longer than the step
# (`CallbackList._call_batch_end_hook`). Its premise does not hold here: the
# first hook that reads a logged value waits for the step (on a GPU the whole
# step, as dispatch is asynchronous), and the Saver's backups and the
# operative config are written in batch hooks on purpose.
_SLOW_CALLBACK = 'is slow compared to the batch time'


def quiet_tensorflow_logs():
    """Drops TensorFlow's INFO records (by absl's python_handler, which
    applies filters, not absl's handler, and by the 'tensorflow' logger) and
    tf_keras' slow-callback warning, which would be a run's only
    TensorFlow line."""
    logging.get_absl_handler().python_handler.addFilter(
        lambda record: record.levelno >= pylogging.WARNING or
        f'{os.sep}tensorflow{os.sep}' not in record.pathname)
    tf_logger = pylogging.getLogger('tensorflow')
    tf_logger.setLevel(pylogging.WARNING)
    tf_logger.addFilter(
        lambda record: _SLOW_CALLBACK not in record.getMessage())


def main(argv):
    """Parses the gin config, checks it and runs --mode in --model_dir.

    Args:
        argv: the arguments absl left after parsing the flags.
    """
    if len(argv) > 1:
        raise checks.ConfigError(
            f'Unexpected arguments: {argv[1:]}: flags are --name=value.')
    if _LIST_CONFIGS.value:
        print('\n'.join(configurables.shipped_configs()))
        return
    mode = MODES[_MODE.value]
    _check_flags(mode)
    quiet_tensorflow_logs()
    # A typo, then a config that cannot work (normalisation, warm-up,
    # support, image sizes) fails here, before any data or device is used.
    try:
        configurables.parse(_GIN_FILES.value, _GIN_BINDINGS.value)
        existing_model = config_checks.check_config(
            pretraining=mode.trains, mode=_MODE.value)
    except checks.UserError:
        raise
    except ValueError as error:
        # gin's own errors (an unknown configurable or parameter) and the
        # value checks config_checks calls name the binding already.
        raise checks.ConfigError(str(error)) from error
    run = run_dir.RunDir(_MODEL_DIR.value)
    config = gin.config_str()
    if _VERBOSE.value:
        logging.info('gin config:\n%s', config)
    strategy = cluster.make_strategy(_STRATEGY.value)
    cluster.check_same_config(strategy, f'--mode={_MODE.value}\n{config}')
    lock = run_lock.for_process(run, strategy, training=mode.trains)
    with contextlib.ExitStack() as held:
        claim = functools.partial(_claim, run, strategy, mode, config,
                                  lock=lock, held=held)
        # A training run's start claims the run directory once nothing
        # refused its pretrained weights (`start.start`).
        if not mode.trains:
            claim()
        mode.run(run, strategy, modes.Options(
            overwrite=_OVERWRITE.value,
            owner_check=getattr(lock, 'check', None),
            claim=claim if mode.trains else None,
            existing_model=existing_model,
            official_checkpoint=_OFFICIAL_CHECKPOINT.value,
            mode=_MODE.value))
        # The other modes read the run's records and write none: what one
        # ran with is kept under its own name, once it has run.
        if not (mode.trains or mode.imports) and cluster.is_chief(strategy):
            run.write(run.mode_config(_MODE.value), config)
            logging.info('gin config: %s', run.mode_config(_MODE.value))


def _main_with_messages(argv):
    """`main`, an error with an `EXIT_CODE` (a config or data mistake, a
    lost cluster, ...) or Ctrl-C printed as one plain line, `Error:
    <message>`, unless --verbose; every other error, a bug, keeps its
    traceback."""
    try:
        main(argv)
    except KeyboardInterrupt:
        if _VERBOSE.value:
            raise
        sys.stderr.flush()
        print('Error: interrupted (Ctrl-C). The same command resumes a '
              'training run from its newest backup or checkpoint.',
              file=sys.stderr, flush=True)
        sys.exit(128 + signal.SIGINT)
    except Exception as error:  # pylint: disable=broad-except
        code = getattr(error, 'EXIT_CODE', None)
        if code is None or _VERBOSE.value:
            raise
        message = _GIN_CALL.sub('', getattr(error, 'message', str(error)))
        sys.stderr.flush()
        print(message if isinstance(error, train.Preempted) else
              f'Error: {message}', file=sys.stderr, flush=True)
        sys.exit(code)


# The line gin appends to an error raised in a configurable.
_GIN_CALL = re.compile(r"\n\s*In call to configurable '[^']*' \(<[^>]*>\)")


def _claim(run, strategy, mode, config, *, lock, held):
    """Takes the run directory's `lock`, `held` until `main` ends, and
    makes the directory; a training run stages its config and flags.
    `checks.ConfigError` if the directory cannot be written."""
    try:
        held.enter_context(lock)
        # The importer creates model_dir only once the checkpoint fits;
        # the modes that read a run, as they write.
        if mode.trains:
            os.makedirs(run.path, exist_ok=True)
    except OSError as error:
        raise checks.ConfigError(
            f'--model_dir={run} cannot be written ({error.strerror}: '
            f'{error.filename}): give a directory this user can write, '
            'e.g. --model_dir=runs/mine.') from None
    # A training run's config and flags are the run's records (train
    # compares a resumed run's config with them): staged, they replace the
    # run's once the start has passed its checks.
    if mode.trains and cluster.is_chief(strategy):
        run.staging.write(run.staging.flags, _flags_record())
        run.staging.write(run.staging.config, config)


def _flags_record():
    """run.py's own flags as given or defaulted, one `--name=value` a line:
    flags.txt (absl's and TensorFlow's flags left out)."""
    return ''.join(f'{flag.serialize()}\n'
                   for flag in flags.FLAGS.get_key_flags_for_module(__name__)
                   if flag.serialize())


def run(argv=None):
    """The `paws-tf` console script and run.py: absl parses the flags
    (`argv`, default `sys.argv`), then calls `main`."""
    # absl's --help prints the docstring of __main__ and the flags of the
    # module named sys.argv[0]: the console script and run.py define neither.
    sys.modules['__main__'].__doc__ = __doc__
    for flag in flags.FLAGS.get_key_flags_for_module(__name__):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    app.run(_main_with_messages, argv=argv)
