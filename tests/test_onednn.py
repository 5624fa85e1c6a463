"""The CPU kernels of TensorFlow's oneDNN: on unless told not to, and kept
away from its strided 1x1 convolutions (uxlfoundation/oneDNN#6035)."""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

# The weight gradient of a shortcut's strided 1x1 convolution of 4, 8 and
# 12 input channels on 64-px inputs, relative to NumPy's, in a process of
# its own: under oneDNN's strided 1x1 kernel the process may die.
_SHORTCUT_GRADIENTS = textwrap.dedent('''
    import numpy as np
    import paws_tf  # noqa: F401  (oneDNN on)
    import tensorflow as tf
    from paws_tf.nets import resnets
    for channels in (4, 8, 12):
        x = tf.random.stateless_normal([4, 64, 64, channels], seed=[1, 2])
        make = resnets._Layers(recompute_bn_relu=False)
        before, conv = make.conv_layers(x, 16, 1, 2, 'proj_conv')
        with tf.GradientTape() as tape:
            y = conv(before(x))
            loss = tf.reduce_sum(y * y)
        grad = tape.gradient(loss, conv.kernel).numpy()[0, 0]
        kernel = conv.kernel.numpy()[0, 0].astype(np.float64)
        sampled = x.numpy()[:, ::2, ::2].astype(np.float64)
        # d/dW of sum((x W)^2) = 2 x^T (x W), over every sampled pixel.
        expected = 2 * np.einsum('bhwc,bhwo->co', sampled, sampled @ kernel)
        print(np.abs(grad - expected).max() / np.abs(expected).max())
''')


def _enabled(setting):
    """What TensorFlow says of its oneDNN kernels after `import paws_tf`
    in a process whose TF_ENABLE_ONEDNN_OPTS is `setting` (None: unset)."""
    code = ('import paws_tf; '
            'from tensorflow.python.util import _pywrap_util_port; '
            'print(_pywrap_util_port.IsMklEnabled())')
    env = {k: v for k, v in os.environ.items()
           if k != 'TF_ENABLE_ONEDNN_OPTS'}
    if setting is not None:
        env['TF_ENABLE_ONEDNN_OPTS'] = setting
    env['PYTHONPATH'] = str(REPO)
    out = subprocess.run([sys.executable, '-c', code], env=env,
                         capture_output=True, text=True, timeout=300)
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_importing_paws_tf_turns_onednn_on_unless_told_not_to():
    assert (_enabled(None), _enabled('0')) == ('True', 'False')


@pytest.mark.slow
def test_a_strided_shortcut_gets_numpys_weight_gradient():
    """The weight gradient of a ResNet shortcut's strided 1x1 convolution
    on 4, 8 and 12 input channels of 64-px inputs, with oneDNN on.

    Fails if the convolution runs as one strided 1x1 kernel (tried, on
    this 2-core AVX-512 Xeon: each of the three failed alone, the
    processes of 8 and 12 channels dying with 'free(): invalid next size'
    or a segmentation fault; on AVX2, 4 channels get gradients 30-140%
    off)."""
    out = subprocess.run([sys.executable, '-c', _SHORTCUT_GRADIENTS],
                         env={**os.environ, 'PYTHONPATH': str(REPO)},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    errors = [float(line) for line in out.stdout.split()]
    assert len(errors) == 3 and max(errors) < 1e-5, errors
