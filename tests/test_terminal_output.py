"""What a person sees of run.py: a few lines before the progress, then
only the project's own lines (`unaccounted`: none of TensorFlow's logs, at
start or after), and each mistake as one message naming the binding or
folder and the fix, with the exit code of its kind.

Bugs tried, each caught here: the start-up logs with file descriptor 2 left
in place; the gin config logged again; the input's whole summary logged;
`evaluate.embedder_from_model` traced for each batch size (TensorFlow's
retracing warning, through its logger and absl's, during the demo's
fine-tuning); evaluate_nn's result line logged as well as printed (twice
on the terminal); tf_keras' "Callback method `on_train_batch_end` is slow"
warning (through its logger and absl's, when a step's hooks wait for it or
back it up).
"""

import logging as pylogging
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

from absl import logging
import numpy as np
import pytest
import tf_keras

from paws_tf import cli
from tests.helpers import image_folders
from tests.helpers import run_py

REPO = pathlib.Path(__file__).resolve().parents[1]

# TensorFlow's start-up logs (each printed twice without cli._quiet_start).
STARTUP_LOGS = ('absl::InitializeLog', 'oneDNN custom operations',
                'cudart_stub', 'cuInit', 'cpu_feature_guard')
# What absl prints with a usage error: the program's --help.
HELP = ('USAGE:', 'flags:', 'Try --helpfull')
PROGRESS = 'epoch 1/1  step '
# An absl log record: its module's file and its message.
RECORD = re.compile(r'[IWEF]\d{4} [\d:.]+ +\d+ ([\w.]+):\d+\] (.*)')
# The project's records that a run of train, evaluate_nn, fine_tune or demo
# logs, by module.
OWN_RECORDS = {
    'cli.py': [r'gin config: \S+'],
    'start.py': [
        r'gin config: \S+',
        r'PAWS input: .*; the sizes per replica and step: \S+',
        r'Training steps \d+\.\.\d+: (1 epoch|\d+ epochs) of \d+ steps\.'],
    'train.py': [r'Final weights fingerprint \(SHA-256\): [0-9a-f]{64}'],
    'callbacks.py': [r'epoch \d+/\d+: loss=\S+( \w+=\S+)* \| \d+ views/s, '
                     r'[\d.]+ s'],
    'evaluate.py': [
        r'PAWS-NN: embedded \d+ [\w ]+ (in [\d.]+ s|\(\d+ images/s\))',
        r'PAWS-NN: classified \d+ / \d+ queries \(\d+ queries/s\)',
        r'(Fine-tuning )?epoch \d+(/\d+)?: PAWS-NN top-1 [\d.]+%'],
    'checkpoints.py': [r'Restored the model from \S+\.'],
    'modes.py': [r'Exported the embedder and the classifier under \S+\.'],
    'evaluate_nn.py': [r'PAWS-NN: the labeled set matches \S+'],
    'suncet_fine_tune.py': [
        r'PAWS-NN before fine-tuning: \{.*\}',
        r'PAWS-NN after fine-tuning: top-1 [\d.]+% \(best epoch \d+: '
        r'[\d.]+%, selected on the test set\)'],
    'supervised.py': [r'Supervised baseline: top-1 [\d.]+% on \d+ test '
                      r'images, trained on \d+ labeled images in \d+ s\.'],
}
# The lines the project prints: progress (a log's whole lines), evaluate_nn's
# result, the demo's table and its last line.
PRINTED = [
    r'epoch \d+/\d+  step \d+/\d+(  [\w-]+ -?[\d.e+-]+)*  (ETA )?\d+ s',
    r'PAWS-NN \(saved_model \S+, \w+ embedding\): top-1 [\d.]+%(, top-5 '
    r'[\d.]+%)?; support = the \d+ labeled images, \d+ queries',
    r'method +top-1 +wall time +images/s *', r'[- ]+',
    r'(PAWS-NN|PAWS-NN, fine-tuned|supervised only) +[\d.]+% +\d+ s.*',
    r'total wall time \d+ s; results in \S+, figure in \S+']


def _start(model_dir, bindings, flags=(), gin_file='gin_configs/debug.gin'):
    return run_py.start(model_dir, bindings, flags, gin_file=gin_file,
                        base_bindings=(), env={'TF_CPP_MIN_LOG_LEVEL': None})


def _lines(output):
    return [line for line in output.splitlines() if line.strip()]


def unaccounted(output):
    """The lines of `output` that are neither the project's own records
    (`OWN_RECORDS`) nor its printed lines (`PRINTED`)."""
    left = []
    for line in _lines(output):
        record = RECORD.fullmatch(line)
        if record:
            module, message = record.groups()
            if any(re.fullmatch(pattern, message)
                   for pattern in OWN_RECORDS.get(module, ())):
                continue
        elif any(re.fullmatch(pattern, line) for pattern in PRINTED):
            continue
        left.append(line)
    return left


@pytest.mark.slow
@pytest.mark.long
def test_a_run_prints_a_few_lines_before_its_progress(tmp_path):
    """Fails if cli._quiet_start leaves file descriptor 2 in place (the
    start-up logs show, twice), if the cli logs the gin config again, or if
    train logs the input's whole summary."""
    run = tmp_path / 'run'
    code, output = run_py.finish(_start(run, [
        'train.num_epochs = 1', 'train/synthetic_source.num_images = 128',
        'train.view_images = False', 'ProgressBar.log_every_seconds = 0']))
    assert code == 0, output[-3000:]
    lines = _lines(output)
    first = next(i for i, line in enumerate(lines)
                 if line.startswith(PROGRESS))
    assert first <= 5, '\n'.join(lines[:first + 1])
    assert not unaccounted(output), output
    for text in STARTUP_LOGS:
        assert text not in output, output[:3000]
    assert f'gin config: {run / "config.gin"}' in output
    config = (run / 'config.gin').read_text()
    assert 'small_resnet.widths = (8, 16)' in config
    assert '# Parameters for' not in output
    assert (f'PAWS input: 128 unlabeled images, 4 steps/epoch of 32; 64 '
            f'labeled in 4 classes; 160 views per step; the sizes per '
            f'replica and step: {run / "input.txt"}') in output
    assert (run / 'input.txt').read_text().startswith(
        'PAWS input on 1 replica(s), the same classes on every replica:\n'
        '  unlabeled: 128 images, global batch 32 = 1 x 32, 4 steps/epoch')


@pytest.mark.slow
@pytest.mark.long
def test_the_demo_then_evaluate_nn_and_fine_tune_print_only_own_lines(
        tmp_path_factory, tmp_path):
    """--mode=demo on debug.gin (`run_py.demo`, shared: 2 epochs of 16
    steps, training with its epoch-end PAWS-NN, export, PAWS-NN,
    fine-tuning, the baseline, the report), then --mode=evaluate_nn and
    --mode=fine_tune on a copy of its run side by side: every line of each,
    start to end, is the project's (`unaccounted`), TensorFlow's C++ logs
    not filtered by level."""
    demo, output = run_py.demo(tmp_path_factory)
    run = shutil.copytree(demo, tmp_path / 'run', symlinks=True)
    outputs = {'demo': output}
    procs = {mode: _start(run, run_py.DEMO_BINDINGS, [f'--mode={mode}'])
             for mode in ('evaluate_nn', 'fine_tune')}
    for mode, proc in procs.items():
        code, outputs[mode] = run_py.finish(proc, timeout=900)
        assert code == 0, outputs[mode][-3000:]
    for mode, output in outputs.items():
        assert not unaccounted(output), (mode, unaccounted(output))
    # Each mode's own lines are there, once.
    for mode, text, count in (
            ('demo', 'epoch 2/2  step 16/16  loss ', 1),
            ('demo', 'Final weights fingerprint', 1),
            ('demo', 'PAWS-NN (saved_model ', 1),
            ('demo', 'Supervised baseline: top-1', 1),
            ('demo', 'total wall time', 1),
            ('evaluate_nn', 'PAWS-NN (saved_model ', 1),
            ('fine_tune', 'PAWS-NN after fine-tuning', 1)):
        assert outputs[mode].count(text) == count, (mode, text)


@pytest.mark.slow
@pytest.mark.long
def test_verbose_shows_the_start_up_logs_and_the_traceback(tmp_path):
    """--verbose and PAWS_TF_VERBOSE=1 bring back TensorFlow's logs and a
    mistake's traceback (for a bug report). Fails if cli._quiet_start
    ignores them, or if the cli prints the message alone with --verbose."""
    bad = ["train.num_epochs = 'ten'"]
    procs = [_start(tmp_path / 'flag', bad, ['--verbose']),
             run_py.start(tmp_path / 'env', bad, base_bindings=(),
                          env={'TF_CPP_MIN_LOG_LEVEL': None,
                               'PAWS_TF_VERBOSE': '1'})]
    for proc in procs:
        code, output = run_py.finish(proc)
        assert code != 0
        assert 'oneDNN custom operations' in output, output[-3000:]
        assert 'Traceback' in output and 'ConfigError: train.num_epochs' \
            in output, output[-3000:]


def _mistakes(root):
    """{name: (bindings, exit code, message)} of mistakes in the folders
    under `root`, each made on a copy of `image_folders.write_experiment`'s
    three folders."""
    bindings = image_folders.write_experiment(root, unlabeled=6, test=2)
    labeled, unlabeled, test = (root / name for name in
                                ('labeled', 'unlabeled', 'test'))

    def copy(source, name):
        shutil.copytree(source, root / name)
        return root / name

    (root / 'empty').mkdir()
    renamed = copy(test, 'test_renamed')
    (renamed / 'up').rename(renamed / 'upward')
    few = copy(labeled, 'few')
    for path in sorted((few / 'up').iterdir())[1:]:
        path.unlink()
    with_empty = copy(labeled, 'with_empty')
    (with_empty / 'zebra').mkdir()
    corrupt = copy(labeled, 'corrupt')
    (corrupt / 'up' / 'broken.jpg').write_bytes(b'\xff\xd8\x00')
    one = copy(labeled, 'one')
    for name in ('left', 'diagonal'):
        shutil.rmtree(one / name)
    data, config = os.EX_DATAERR, os.EX_CONFIG
    return bindings, {
        'empty unlabeled folder': (
            [f"UNLABELED_DIR = '{root / 'empty'}'"], data,
            f'No .jpg/.jpeg/.png/.bmp/.gif images under {root / "empty"}.'),
        'test classes differ': (
            [f"TEST_DIR = '{renamed}'"], data,
            f"The test set (TEST_DIR = '{renamed}') has classes ['diagonal',"
            f" 'left', 'upward'] but the labeled set (LABELED_DIR = "
            f"'{labeled}') has ['diagonal', 'left', 'up']: both need the "
            'same class folder names'),
        'too few images': (
            [f"LABELED_DIR = '{few}'"], data,
            "1 class(es) have fewer labeled images than a step draws without "
            "replacement (2 = images_per_class 2 x 1 replicas sharing the "
            "classes): 'up' (id 2) has 1. Lower "
            'make_pretrain_dataset_fn.images_per_class, label more images, '
            'or use unique_classes_per_replica=True.'),
        'empty class folder': (
            [f"LABELED_DIR = '{with_empty}'"], data,
            f"Class folders under {with_empty} hold no usable images: "
            "['zebra']. Add images or remove the folders."),
        'bad image': (
            [f"LABELED_DIR = '{corrupt}'",
             "image_folder.on_bad_image = 'fail'"],
            data, f'1 of 13 files under {corrupt} cannot be decoded as '
            "images: up/broken.jpg. Remove or repair them, or set "
            "on_bad_image='skip'."),
        'epochs in words': (
            ["train.num_epochs = 'ten'"], config,
            "train.num_epochs must be a positive integer, got 'ten'."),
        'negative tau': (
            ['PAWSModel.tau = -0.1'], config,
            'PAWSModel.tau must be positive, got -0.1.'),
        'misspelled macro': (
            ['CHANNEL = 1'], config,
            'CHANNEL is bound but nothing in the config reads %CHANNEL: did '
            'you mean CHANNELS? '),
        'misspelled parameter': (
            ['train.num_epoch = 3'], config,
            "--gin_bindings='train.num_epoch = 3' is not valid gin: "
            "Configurable 'train' doesn't have a parameter named "
            "'num_epoch'. Did you mean train.num_epochs?"),
        'misspelled backbone argument': (
            ['small_resnet.widht = (8, 16)'], config,
            "--gin_bindings='small_resnet.widht = (8, 16)' is not valid gin: "
            "Configurable 'small_resnet' doesn't have a parameter named "
            "'widht'. Did you mean small_resnet.widths?"),
        'one class': (
            [f"LABELED_DIR = '{one}'"], data,
            f"LABELED_DIR = '{one}' holds one class folder ('up'): PAWS "
            'needs labeled images of at least two classes'),
    }


# The mistakes shown by run.py processes of their own, one for each way an
# error reaches the cli: a data error, a config check's, gin's own. The
# others run through run.py's `cli` in the test's process.
IN_PROCESSES = ('empty unlabeled folder', 'epochs in words',
                'misspelled parameter')


def _check_message(name, mistake, code, output):
    """`output` of the mistake `name` ends with its one message, after at
    most two lines, with its exit code: no traceback, no --help, none of
    TensorFlow's start-up logs."""
    _, exit_code, message = mistake
    lines = _lines(output)
    assert code == exit_code, (name, output[-3000:])
    assert message in lines[-1], (name, lines[-1])
    assert len(lines) <= 3, (name, output)
    assert 'Traceback' not in output
    for text in HELP + STARTUP_LOGS:
        assert text not in output, (name, output)


@pytest.mark.slow
@pytest.mark.long
def test_each_mistake_is_one_message_with_its_exit_code(tmp_path, run_main,
                                                        capsys):
    """Each of a new user's mistakes ends run.py with one error line that
    names the folder or binding and the fix: no traceback, no --help, the
    exit code of a config or data error (in processes of their own for
    `IN_PROCESSES`, through run.py's `cli` in this process for the
    others). Fails if the cli lets a checks.ConfigError travel as a
    traceback or logs gin's str() of a DataError (its 'In call to
    configurable' lines), if ConfigError's exit code is not 78, if
    load_data's class check names no binding, if the config checks let one
    labeled class through or do not check the backbone's arguments, or if
    configurables lets a macro that nothing reads pass or names no close
    parameter."""
    paths, mistakes = _mistakes(tmp_path)

    def arguments(name):
        bindings, _, _ = mistakes[name]
        overridden = {b.split(' =')[0] for b in bindings}
        common = [b for b in paths if b.split(' =')[0] not in overridden]
        return (tmp_path / 'runs' / name.replace(' ', '_'),
                image_folders.SMALL + common + bindings)

    procs = {name: _start(*arguments(name),
                          gin_file='gin_configs/image_folders_small.gin')
             for name in IN_PROCESSES}
    for name in mistakes:
        if name not in IN_PROCESSES:
            _check_message(name, mistakes[name], *run_py.in_process(
                run_main, capsys, run_py.command(
                    *arguments(name),
                    gin_file='gin_configs/image_folders_small.gin',
                    base_bindings=())))
    for name, proc in procs.items():
        _check_message(name, mistakes[name], *run_py.finish(proc))
    for name in ('misspelled_macro', 'misspelled_parameter',
                 'misspelled_backbone_argument', 'epochs_in_words'):
        assert not os.path.exists(tmp_path / 'runs' / name)


@pytest.mark.slow
@pytest.mark.long
def test_pytest_in_two_processes_ends_with_its_summary():
    """`make test`'s pytest with two xdist processes, on a short module:
    its output ends with pytest's summary, none of TensorFlow's start-up
    logs anywhere. Fails if conftest loads TensorFlow without cli's quiet
    start (tried: the controller's start-up logs, the failed cuInit of a
    machine without a GPU among them, printed after "73 passed" of
    tests/test_checks.py)."""
    proc = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-n', '2', '-p',
         'no:cacheprovider', 'tests/test_files.py'],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert re.fullmatch(r'\d+ passed in [\d.]+s( \(.*\))?',
                        _lines(output)[-1]), output[-3000:]
    for text in STARTUP_LOGS:
        assert text not in output, output[-3000:]


class _SlowHook(tf_keras.callbacks.Callback):
    """A batch hook slower than a tiny model's step, as a backup is."""

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.05)


@pytest.fixture
def tensorflow_logs():
    """The records that reach the 'tensorflow' logger's handlers: with no
    filter on that logger (an earlier `cli.main` in this process added
    `cli.quiet_tensorflow_logs`'), and its filters restored afterwards."""
    tf_logger = pylogging.getLogger('tensorflow')
    absl_handler = logging.get_absl_handler().python_handler
    saved = (tf_logger.level, list(tf_logger.filters),
             list(absl_handler.filters))
    tf_logger.filters[:] = []
    records = []
    collector = pylogging.Handler()
    collector.emit = records.append
    tf_logger.addHandler(collector)
    yield records
    tf_logger.removeHandler(collector)
    tf_logger.setLevel(saved[0])
    tf_logger.filters[:] = saved[1]
    absl_handler.filters[:] = saved[2]


@pytest.mark.parametrize('quiet', [False, True])
def test_a_slow_batch_hook_is_not_reported(tensorflow_logs, quiet):
    """Fails if cli.quiet_tensorflow_logs lets tf_keras' slow-callback
    warning through (a run's only TensorFlow line, when a backup falls in
    its first steps); without it, the warning is there."""
    if quiet:
        cli.quiet_tensorflow_logs()
    model = tf_keras.Sequential([tf_keras.layers.Dense(1)])
    model.compile(loss='mse', optimizer='sgd')
    model.fit(np.zeros((8, 2)), np.zeros((8, 1)), batch_size=1, epochs=1,
              verbose=0, callbacks=[_SlowHook()])
    slow = [record for record in tensorflow_logs
            if 'is slow compared to the batch time' in record.getMessage()]
    assert len(slow) == (0 if quiet else 1)
