"""run.py on gin_configs/debug.gin in a subprocess, for fault tests."""

import contextlib
import hashlib
import os
import pathlib
import subprocess
import sys
import time

import gin
import tensorflow as tf

from paws_tf import checkpoints
from paws_tf import run_dir
from tests.helpers import once

REPO = pathlib.Path(__file__).resolve().parents[2]
# debug.gin: 16 steps per epoch; 2 epochs, backups every 4 steps,
# checkpoints every 8.
BINDINGS = ('train.num_epochs = 2', 'train.backup_every_steps = 4',
            'train.checkpoint_every_steps = 8', 'train.eval_every_epochs = 0',
            'train.view_images = False', 'train.verbose = 0')


def command(model_dir, bindings=(), flags=(), *, mode='train',
            gin_file='gin_configs/debug.gin', base_bindings=BINDINGS):
    """run.py's argument list: `base_bindings` (default `BINDINGS`), then
    `bindings`, then `flags`."""
    return ([f'--gin_file={gin_file}', f'--model_dir={model_dir}',
             f'--mode={mode}'] +
            [f'--gin_bindings={b}'
             for b in tuple(base_bindings) + tuple(bindings)] +
            list(flags))


def start(model_dir, bindings=(), flags=(), *, mode='train', env=None,
          script=None, script_args=(), gin_file='gin_configs/debug.gin',
          base_bindings=BINDINGS):
    """Starts run.py (or `script script_args run.py-arguments`) on
    `model_dir`, output captured; `env` adds to the environment (a None
    value removes the variable).

    Returns:
        The `subprocess.Popen`.
    """
    program = ([str(script)] + [str(a) for a in script_args] if script
               else [str(REPO / 'run.py')])
    environment = dict(os.environ, PYTHONPATH=str(REPO),
                       TF_CPP_MIN_LOG_LEVEL='2')
    environment.update(env or {})
    return subprocess.Popen(
        [sys.executable] + program + command(
            model_dir, bindings, flags, mode=mode, gin_file=gin_file,
            base_bindings=base_bindings),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # A variable given as None is left out.
        env={k: v for k, v in environment.items() if v is not None})


def in_process(run_main, capsys, args):
    """run.py's `args` (`command`'s) run by `cli.main` in this process, as
    run.py runs it from the repository (`run_main` and `capsys` are the
    tests' fixtures): a user's error is printed as one line and exits with
    its code.

    Returns:
        `(exit code, what it printed on stderr)`; the code is 0 when it
        returned.
    """
    gin.clear_config()  # Unlocked: an earlier call leaves it locked.
    capsys.readouterr()
    try:
        with contextlib.chdir(REPO):  # run.py's working directory.
            run_main(*args, printed=True)
    except SystemExit as exited:
        return exited.code, capsys.readouterr().err
    return 0, capsys.readouterr().err


def finish(proc, timeout=600):
    """`(returncode, output)` of `proc` once it ends."""
    try:
        output = proc.communicate(timeout=timeout)[0]
    finally:
        proc.kill()
    return proc.returncode, output


def backup_step(model_dir):
    """The step of the run's backup; 0 while there is none or while it is
    being written."""
    try:
        return checkpoints.backup_step(run_dir.RunDir(model_dir))
    except (tf.errors.OpError, ValueError):
        return 0


def wait_for_backup(model_dir, proc, min_step, timeout=600):
    """Waits until `proc`'s run has a backup of step `min_step` or later;
    returns that step."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, 'the run ended before it was interrupted'
        step = backup_step(model_dir)
        if step >= min_step:
            return step
        time.sleep(0.2)
    raise TimeoutError('no backup appeared')


def files(root):
    """Every file under `root`, by relative path, with its bytes."""
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, 'rb') as f:
                found[os.path.relpath(path, root)] = f.read()
    return found


def trained(tmp_path_factory, bindings):
    """A finished training run of debug.gin with `bindings`, trained once
    per pytest run (`once.made`; test_records' took 14 s in each test
    process); a test that changes the run works on a copy."""
    def train(directory):
        code, output = finish(start(directory / 'run',
                                    base_bindings=bindings))
        assert code == 0, output[-3000:]

    directory, _ = once.made(tmp_path_factory, 'trained-' + hashlib.sha256(
        '\n'.join(bindings).encode()).hexdigest()[:12], train)
    return directory / 'run'


# The debug.gin demo that tests share: 2 epochs of 16 steps (debug.gin's
# 512 images in batches of 32), each step's TensorBoard points, the
# diagnostics every 8 steps, PAWS-NN and a backup at each epoch end, a
# baseline of 20 steps (10 epochs of 2).
DEMO_STEPS_PER_EPOCH, DEMO_EPOCHS, DEMO_DIAGNOSTICS_EVERY = 16, 2, 8
DEMO_BINDINGS = (
    f'train.num_epochs = {DEMO_EPOCHS}', 'train.log_every_steps = 1',
    f'PAWSModel.diagnostics_every = {DEMO_DIAGNOSTICS_EVERY}',
    'train.eval_every_epochs = 1',
    f'train.backup_every_steps = {DEMO_STEPS_PER_EPOCH}',
    'train_supervised.steps = 20')


def demo(tmp_path_factory):
    """`(model_dir, output)`: run.py --mode=demo of debug.gin with
    `DEMO_BINDINGS`, TensorFlow's C++ logs not filtered by level, run once
    per pytest run (`once.made`); a test that changes the run works on a
    copy."""
    def run(directory):
        code, output = finish(start(
            directory / 'run', mode='demo', base_bindings=DEMO_BINDINGS,
            env={'TF_CPP_MIN_LOG_LEVEL': None}), timeout=900)
        assert code == 0, output[-3000:]
        return output

    directory, output = once.made(tmp_path_factory, 'demo', run)
    return directory / 'run', output
