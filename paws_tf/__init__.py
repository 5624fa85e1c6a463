"""PAWS semi-supervised learning in TensorFlow (tf_keras, the Keras 2 API).

Importing it selects `tf_keras` for the whole process (Keras 3 cannot run
`Model.fit` under `MultiWorkerMirroredStrategy`) and turns on oneDNN CPU
kernels unless TF_ENABLE_ONEDNN_OPTS says otherwise. The public names load
on first use (README.md, "PAWS in your own Keras code")."""

import importlib
import os
import sys

os.environ['TF_USE_LEGACY_KERAS'] = '1'
# TensorFlow leaves its oneDNN CPU kernels off on x86 CPUs without AVX-512
# VNNI/BF16 or AMX, and its pip wheel's Eigen kernels lack AVX2/FMA
# (docs/performance.md); an explicit TF_ENABLE_ONEDNN_OPTS=0 wins.
os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '1')

# TensorFlow loaded already may have resolved tf.keras to Keras 3. The
# package does not load TensorFlow, so that cli.py can quiet its start-up.
if 'tensorflow' in sys.modules:
    import tensorflow as tf  # noqa: E402
    import tf_keras  # noqa: E402

    if tf.keras.Model is not tf_keras.Model:
        raise ImportError(
            'tf.keras was already resolved to Keras 3 before paws_tf was '
            'imported. Import paws_tf before touching tf.keras, or start '
            'Python with TF_USE_LEGACY_KERAS=1 in the environment.')

__version__ = '0.1.0'

# The submodule that defines each public name, relative to the package.
_EXPORTS = {name: module for module, names in {
    '.model': ('PAWSModel', 'build_model'),
    '.nets.backbones': ('build_backbone',),
    '.runner.pretrained': ('load_backbone_weights',),
    '.nets.heads': ('ProjectionHead', 'PredictionHead'),
    '.losses': ('paws_loss', 'paws_targets', 'ropaws_loss', 'ropaws_targets',
                'snn', 'sharpen', 'label_matrix', 'target_confidence',
                'nt_xent_loss', 'suncet_loss'),
    '.lars': ('LARS',),
    '.schedules': ('WarmupCosineDecay',),
    '.data.sources': ('from_arrays',),
    '.data.splits': ('select_labeled',),
    '.data.folders': ('image_folder',),
    '.data.augment': ('MultiCropConfig', 'CIFAR10_MULTICROP',
                      'IMAGENET_MULTICROP'),
    '.data.pipeline': ('make_pretrain_dataset_fn', 'make_eval_dataset'),
    '.evaluation.evaluate': ('paws_nn', 'classify', 'embedder_from_model',
                             'embedder_from_saved_model'),
    '.evaluation.export': ('export_embedder', 'export_classifier'),
    '.progress': ('ProgressBar',),
}.items() for name in names}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    """Loads an exported name's submodule on first access (PEP 562)."""
    if name not in _EXPORTS:
        # AttributeError also lets `from paws_tf import <submodule>` fall
        # back to importing the submodule.
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
