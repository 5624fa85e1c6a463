"""The package selects the Keras 2 API for the whole process and does not
load the demo."""

import os
import pathlib
import subprocess
import sys

import pytest
import tensorflow as tf
import tf_keras


def test_tf_keras_is_tf_keras():
    assert tf.keras.Model is tf_keras.Model


def _python(code):
    """Runs `code` in a fresh Python that imports this checkout."""
    env = dict(os.environ,
               PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[1]))
    return subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=300, env=env)


def test_import_after_keras3_resolved_fails_clearly():
    code = ('import os; os.environ["TF_USE_LEGACY_KERAS"] = "0"\n'
            'import tensorflow as tf; tf.keras.Model\n'
            'import paws_tf\n')
    proc = _python(code)
    assert proc.returncode != 0
    assert 'TF_USE_LEGACY_KERAS=1' in proc.stderr



@pytest.mark.slow
def test_the_library_does_not_load_the_demo():
    # Every name of the package's face and the modules that train,
    # evaluate, fine-tune, export and run the modes; then the program,
    # which registers the demo's gin configurables (configs bind them) but
    # loads its mode, report and plotting only when --mode=demo runs.
    code = (
        'import sys\n'
        'def loaded():\n'
        '    print(" ".join(m for m in sys.modules if "paws_tf" in m))\n'
        'import paws_tf\n'
        'for name in paws_tf.__all__: getattr(paws_tf, name)\n'
        'from paws_tf.evaluation import fine_tune\n'
        'from paws_tf.runner import modes, official_import, train\n'
        'loaded()\n'
        'from paws_tf import cli\n'
        'loaded()\n')
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    library, program = (set(line.split())
                        for line in proc.stdout.splitlines()[-2:])
    assert {'paws_tf.model', 'paws_tf.runner.modes',
            'paws_tf.evaluation.fine_tune'} <= library
    assert not {name for name in library if name.startswith('paws_tf.demo')}
    assert 'paws_tf.demo.supervised' in program
    assert 'paws_tf.demo.run_demo' not in program
    assert 'paws_tf.demo.report' not in program
