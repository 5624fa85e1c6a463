"""PAWS semi-supervised learning in TensorFlow (tf_keras, the Keras 2 API).

Importing this package selects the Keras 2 API (`tf_keras`) for the whole
process, so that `tf.keras`, `tf_keras` and our code agree (Keras 3 cannot run
`Model.fit` under `MultiWorkerMirroredStrategy`), and turns on TensorFlow's
oneDNN CPU kernels unless TF_ENABLE_ONEDNN_OPTS says otherwise (see BUILD.md).

The pieces a Keras user composes are attributes of the package, loaded on
first use; `import paws_tf` does not load TensorFlow:

    model = paws_tf.PAWSModel(paws_tf.build_backbone(...),
                              paws_tf.ProjectionHead(...))
    model.compile(optimizer=paws_tf.LARS(paws_tf.WarmupCosineDecay(...)))

README.md, "PAWS in your own Keras code", trains one on NumPy arrays.
"""

import importlib
import os
import sys

os.environ['TF_USE_LEGACY_KERAS'] = '1'
# TensorFlow leaves its oneDNN CPU kernels off on x86 CPUs without AVX-512
# VNNI/BF16 or AMX, and its Eigen kernels in the pip wheel are built without
# AVX2/FMA (docs/performance.md measures the difference). An explicit
# TF_ENABLE_ONEDNN_OPTS=0 wins.
os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '1')

# TensorFlow loaded later reads the switches above; one loaded already may
# have resolved tf.keras to Keras 3. The package itself does not load
# TensorFlow, so that the program can keep its start-up logs quiet
# (tf_logs.py).
if 'tensorflow' in sys.modules:
    import tensorflow as tf  # noqa: E402
    import tf_keras  # noqa: E402

    if tf.keras.Model is not tf_keras.Model:
        raise ImportError(
            'tf.keras was already resolved to Keras 3 before paws_tf was '
            'imported. Import paws_tf before touching tf.keras, or start '
            'Python with TF_USE_LEGACY_KERAS=1 in the environment.')

__version__ = '0.1.0'

# Public name -> the submodule that defines it.
_EXPORTS = {
    # The model and its parts.
    'PAWSModel': 'model',
    'build_model': 'model',
    'build_backbone': 'nets.backbones',
    'load_backbone_weights': 'nets.backbones',
    'ProjectionHead': 'nets.heads',
    'PredictionHead': 'nets.heads',
    # The objective.
    'paws_loss': 'losses',
    'paws_targets': 'losses',
    'ropaws_loss': 'losses',
    'ropaws_targets': 'losses',
    'snn': 'losses',
    'sharpen': 'losses',
    'label_matrix': 'losses',
    'target_confidence': 'losses',
    'nt_xent_loss': 'losses',
    'suncet_loss': 'losses',
    # Optimisation.
    'LARS': 'lars',
    'WarmupCosineDecay': 'schedules',
    # Data.
    'from_arrays': 'data.sources',
    'select_labeled': 'data.splits',
    'image_folder': 'data.folders',
    'MultiCropConfig': 'data.augment',
    'CIFAR10_MULTICROP': 'data.augment',
    'IMAGENET_MULTICROP': 'data.augment',
    'make_pretrain_dataset_fn': 'data.pipeline',
    'make_eval_dataset': 'data.pipeline',
    # Evaluation and export.
    'paws_nn': 'evaluation.evaluate',
    'classify': 'evaluation.evaluate',
    'embedder_from_model': 'evaluation.evaluate',
    'embedder_from_saved_model': 'evaluation.evaluate',
    'export_embedder': 'evaluation.export',
    'export_classifier': 'evaluation.export',
    # Training.
    'ProgressBar': 'progress',
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    """Loads an exported name's submodule on first access (PEP 562)."""
    if name not in _EXPORTS:
        # AttributeError also lets `from paws_tf import <submodule>` fall
        # back to importing the submodule.
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    value = getattr(importlib.import_module(f'{__name__}.{_EXPORTS[name]}'),
                    name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
