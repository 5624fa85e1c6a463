"""The package selects the Keras 2 API for the whole process."""

import os
import pathlib
import subprocess
import sys

import tensorflow as tf
import tf_keras


def test_tf_keras_is_tf_keras():
    assert tf.keras.Model is tf_keras.Model


def test_import_after_keras3_resolved_fails_clearly():
    code = ('import os; os.environ["TF_USE_LEGACY_KERAS"] = "0"\n'
            'import tensorflow as tf; tf.keras.Model\n'
            'import paws_tf\n')
    env = dict(os.environ,
               PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[1]))
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode != 0
    assert 'TF_USE_LEGACY_KERAS=1' in proc.stderr


def _loaded_after(code):
    """The paws_tf modules a fresh interpreter holds after running `code`."""
    env = dict(os.environ,
               PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[1]))
    proc = subprocess.run(
        [sys.executable, '-c', code + '\nimport sys\nprint(" ".join('
         'name for name in sys.modules if name.startswith("paws_tf")))'],
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return set(proc.stdout.split())


def test_the_library_does_not_load_the_demo():
    # Every name of the package's face, and the modules that train,
    # evaluate, fine-tune, export and run the modes.
    loaded = _loaded_after(
        'import paws_tf\n'
        'for name in paws_tf.__all__: getattr(paws_tf, name)\n'
        'from paws_tf.evaluation import fine_tune\n'
        'from paws_tf.runner import modes, official_import, train\n')
    assert {'paws_tf.model', 'paws_tf.runner.modes',
            'paws_tf.evaluation.fine_tune'} <= loaded
    assert not {name for name in loaded if name.startswith('paws_tf.demo')}


def test_the_program_loads_the_demo_mode_only_to_run_it():
    # The demo's gin configurables are registered (configs bind them); its
    # mode, report and plotting are loaded when --mode=demo runs.
    loaded = _loaded_after('from paws_tf import cli')
    assert 'paws_tf.demo.supervised' in loaded
    assert 'paws_tf.demo.run_demo' not in loaded
    assert 'paws_tf.demo.report' not in loaded
