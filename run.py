r"""Runs a paws_tf experiment described by gin files.

  python run.py --gin_file=gin_configs/debug.gin --model_dir=/tmp/paws \
      --mode=train_and_evaluate

Modes: train (PAWS pre-training; resumes an unfinished run), evaluate_nn
(PAWS-NN top-1/top-5 on the test split), fine_tune (the paper's ImageNet or
CIFAR-10 fine-tuning protocol, by gin), export (SavedModels),
train_and_evaluate (train, export, evaluate_nn), demo (train_and_evaluate,
then a supervised-only baseline on the same labels, results.json, a figure
and a table).
"""

import logging as pylogging
import os
import shutil
import sys

from absl import app
from absl import flags
from absl import logging
import gin

import paws_tf  # noqa: F401  (selects tf_keras before TensorFlow is used)
from paws_tf import checks
from paws_tf import configurables  # noqa: F401  (registers configurables)
from paws_tf import dist
from paws_tf import experiment
from paws_tf import modes
from paws_tf import train

CONFIG_FILE = 'config.gin'
OPERATIVE_CONFIG_FILE = 'operative_config.gin'
FLAGS_FILE = 'flags.txt'
# 128 + SIGTERM: what a job killed by SIGTERM would report.
PREEMPTED_EXIT_CODE = 143
# What a training run writes; --overwrite removes these.
_RUN_STATE = (train.CHECKPOINT_DIR, train.BACKUP_DIR, train.TENSORBOARD_DIR,
              'export', 'eval', 'fine_tune', CONFIG_FILE,
              OPERATIVE_CONFIG_FILE, experiment.NORMALIZATION_FILENAME)
_REPO_ROOT = os.path.dirname(os.path.abspath(__file__))

_GIN_FILES = flags.DEFINE_multi_string(
    'gin_file', [], 'Gin config file (repeatable; later files override).')
_GIN_BINDINGS = flags.DEFINE_multi_string(
    'gin_bindings', [], "Gin binding such as 'train.num_epochs = 2' "
    '(repeatable; applied after the files).')
_MODEL_DIR = flags.DEFINE_string('model_dir', None, 'Run directory.',
                                 required=True)
_MODE = flags.DEFINE_enum('mode', 'train', modes.MODES, 'What to run.')
_STRATEGY = flags.DEFINE_enum('strategy', 'auto', dist.STRATEGY_KINDS,
                              'Distribution strategy.')
_OVERWRITE = flags.DEFINE_bool(
    'overwrite', False, 'Start training again in a model_dir that holds a '
    'run with a different config (its checkpoints, backup and logs are '
    'deleted).')


def _check_model_dir(model_dir, config, overwrite):
    """Refuses to train over a run with another config unless asked to."""
    path = os.path.join(model_dir, CONFIG_FILE)
    if not os.path.exists(path):
        return
    with open(path) as f:
        previous = f.read()
    if previous == config:
        return
    if not overwrite:
        old, new = previous.splitlines(), config.splitlines()
        changed = [f'  - {line}' for line in old if line not in new][:5] + [
            f'  + {line}' for line in new if line not in old][:5]
        raise app.UsageError(
            f'{model_dir} holds a run with a different gin config:\n' +
            '\n'.join(changed) + '\nUse another --model_dir, undo the change '
            'to resume that run, or pass --overwrite to delete it and start '
            'again.')
    logging.warning('--overwrite: deleting the previous run in %s.',
                    model_dir)
    for name in _RUN_STATE:
        target = os.path.join(model_dir, name)
        if os.path.isdir(target):
            shutil.rmtree(target)
        elif os.path.exists(target):
            os.remove(target)


class _QuietTensorFlow:
    """Drops TensorFlow's own INFO records (checkpoint sharding timings and
    the like) from absl's log; its warnings and errors still show."""

    def filter(self, record):
        return (record.levelno >= pylogging.WARNING or
                f'{os.sep}tensorflow{os.sep}' not in record.pathname)


def _parse_gin(files, bindings):
    """Parses the gin files, then each binding, naming the one that fails
    (gin's own message does not say which --gin_bindings was wrong)."""
    gin.parse_config_files_and_bindings(files, None, finalize_config=False)
    for binding in bindings:
        try:
            gin.parse_config(binding)
        except (SyntaxError, ValueError) as error:
            raise app.UsageError(
                f'--gin_bindings={binding!r} is not valid gin: {error}') \
                from error
    gin.finalize()


def _write_text(path, text):
    tmp = f'{path}.tmp'
    with open(tmp, 'w') as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
    # absl's handler delegates to its python_handler, which applies filters;
    # TensorFlow's own INFO records go through the 'tensorflow' logger.
    logging.get_absl_handler().python_handler.addFilter(_QuietTensorFlow())
    pylogging.getLogger('tensorflow').setLevel(pylogging.WARNING)
    gin.add_config_file_search_path(_REPO_ROOT)
    # Parsing first: a typo fails here, with gin's message, before any data
    # is read or any TensorFlow device is set up.
    _parse_gin(_GIN_FILES.value, _GIN_BINDINGS.value)
    # Then the config as a whole (normalisation, warm-up, support, image
    # sizes): a run that cannot work fails in seconds, not after reading.
    try:
        checks.check_config()
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    model_dir = _MODEL_DIR.value
    config = gin.config_str()
    training = _MODE.value in ('train', 'train_and_evaluate', 'demo')
    if training:
        _check_model_dir(model_dir, config, _OVERWRITE.value)
    strategy = dist.make_strategy(_STRATEGY.value)
    os.makedirs(model_dir, exist_ok=True)
    if dist.is_chief(strategy):
        _write_text(os.path.join(model_dir, FLAGS_FILE),
                    flags.FLAGS.flags_into_string())
        if training:
            _write_text(os.path.join(model_dir, CONFIG_FILE), config)
    logging.info('gin config:\n%s', config)

    try:
        modes.run(model_dir, strategy, _MODE.value)
    except train.Preempted as stopped:
        logging.warning('%s', stopped)
        sys.exit(PREEMPTED_EXIT_CODE)
    if training and dist.is_chief(strategy):
        _write_text(os.path.join(model_dir, OPERATIVE_CONFIG_FILE),
                    gin.operative_config_str())


if __name__ == '__main__':
    app.run(main)
