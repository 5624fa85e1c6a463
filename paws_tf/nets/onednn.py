"""Guard against a oneDNN CPU kernel that computes wrong gradients."""

import tensorflow as tf
# The query tf.sysconfig does not offer: are oneDNN kernels on?
from tensorflow.python.util import _pywrap_util_port

# Input channels a strided 1x1 convolution needs under oneDNN (see below).
MIN_CHANNELS = 8


def onednn_enabled():
    """Whether TensorFlow runs its oneDNN CPU kernels in this process."""
    return _pywrap_util_port.IsMklEnabled()


def check_conv_safe(x, kernel_size, stride, name):
    """Refuses a layer shape whose gradient oneDNN computes wrongly.

    On AVX2 CPUs oneDNN's weight gradient of a strided 1x1 convolution with
    fewer than 8 input channels is wrong by 30-140% (uxlfoundation/oneDNN
    #6035; reproduced here for every C in 1..7). GPUs do not run it.

    Args:
        x, kernel_size, stride, name: the convolution's input [B, H, W, C],
            (square) kernel size, stride and name (for the message).

    Raises:
        ValueError: oneDNN is on, without a GPU, for such a convolution.
    """
    channels = x.shape[-1]
    if (kernel_size == 1 and stride > 1 and channels < MIN_CHANNELS
            and onednn_enabled()
            and not tf.config.list_physical_devices('GPU')):
        raise ValueError(
            f'{name}: a strided 1x1 convolution on {channels} input channels '
            "gets wrong weight gradients from TensorFlow's oneDNN CPU "
            'kernels (oneDNN issue #6035). Give the layer at least '
            f'{MIN_CHANNELS} input channels (e.g. wider widths), or '
            'set TF_ENABLE_ONEDNN_OPTS=0 before importing paws_tf.')
