"""PAWS semi-supervised learning in TensorFlow (tf_keras, the Keras 2 API).

Importing this package selects the Keras 2 API (`tf_keras`) for the whole
process, so that `tf.keras`, `tf_keras` and our code agree. Keras 3 cannot run
`Model.fit` under `MultiWorkerMirroredStrategy` (see BUILD.md).
"""

import os

os.environ['TF_USE_LEGACY_KERAS'] = '1'

import tensorflow as tf  # noqa: E402  (must follow the environment switch)
import tf_keras  # noqa: E402

if tf.keras.Model is not tf_keras.Model:
    raise ImportError(
        'tf.keras was already resolved to Keras 3 before paws_tf was '
        'imported. Import paws_tf before touching tf.keras, or start Python '
        'with TF_USE_LEGACY_KERAS=1 in the environment.')

__version__ = '0.1.0'
