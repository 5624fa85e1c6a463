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
