"""PAWS semi-supervised learning in TensorFlow (tf_keras, the Keras 2 API).

Importing this package selects the Keras 2 API (`tf_keras`) for the whole
process, so that `tf.keras`, `tf_keras` and our code agree (Keras 3 cannot run
`Model.fit` under `MultiWorkerMirroredStrategy`), and turns on TensorFlow's
oneDNN CPU kernels unless TF_ENABLE_ONEDNN_OPTS says otherwise (see BUILD.md).
"""

import os

os.environ['TF_USE_LEGACY_KERAS'] = '1'
# TensorFlow leaves its oneDNN CPU kernels off on CPUs without AVX-512; on
# the AVX2 CPUs we measured they make training steps 1.4-2.4x faster (see
# BUILD.md, Performance). An explicit TF_ENABLE_ONEDNN_OPTS=0 wins.
os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '1')

import tensorflow as tf  # noqa: E402  (must follow the environment switch)
import tf_keras  # noqa: E402

if tf.keras.Model is not tf_keras.Model:
    raise ImportError(
        'tf.keras was already resolved to Keras 3 before paws_tf was '
        'imported. Import paws_tf before touching tf.keras, or start Python '
        'with TF_USE_LEGACY_KERAS=1 in the environment.')

__version__ = '0.1.0'
