"""Convolution and max pool with PyTorch's symmetric padding, made in the
layer and again for the backward pass."""

import tensorflow as tf
import tf_keras

from paws_tf import nets


class _InLayerPadding:
    """What `PaddedConv2D` and `PaddedMaxPool2D` share: a 'valid' base layer
    whose input they pad by `pad` (>= 1) on each side of H and W."""

    def __init__(self, *args, pad, **kwargs):
        kwargs.pop('padding', None)  # From get_config: always 'valid' here.
        super().__init__(*args, padding='valid', **kwargs)
        if self.data_format != 'channels_last':
            raise ValueError(f'{type(self).__name__} is channels-last only.')
        if pad < 1:
            raise ValueError(
                f'{type(self).__name__} needs pad >= 1, got {pad}; without '
                f"padding use the tf_keras layer with padding='valid'.")
        self.pad = pad

    def compute_output_shape(self, input_shape):
        shape = tf.TensorShape(input_shape).as_list()  # [B, H, W, C]
        for axis in (1, 2):
            if shape[axis] is not None:
                shape[axis] += 2 * self.pad
        return super().compute_output_shape(tf.TensorShape(shape))

    def get_config(self):
        return {**super().get_config(), 'pad': self.pad}

    def _padded_op(self, forward, backward, x, *weights, pad_value=0.0):
        """`forward(padded x, *weights)` (a 'valid' op, whose gradients
        `backward(padded, y, dy, *weights)` returns), with the copy of `x`
        padded by `pad_value` made again for the backward pass."""
        pad = self.pad

        def padded(t):
            return tf.pad(t, [[0, 0], [pad, pad], [pad, pad], [0, 0]],
                          constant_values=pad_value)

        @tf.custom_gradient
        def op(x, *weights):
            y = forward(padded(x), *weights)

            def grad(dy):
                # Made after dy exists, so that graph optimisation cannot
                # merge it with the forward pass's copy and keep that alive.
                with tf.control_dependencies([dy]):
                    padded_again = padded(x)
                d_padded, *d_weights = backward(padded_again, y, dy, *weights)
                return (d_padded[:, pad:-pad, pad:-pad, :], *d_weights)

            return y, grad

        return op(x, *weights)


@tf_keras.saving.register_keras_serializable(package='paws_tf')
class PaddedConv2D(_InLayerPadding, tf_keras.layers.Conv2D):
    """Conv2D with PyTorch's symmetric zero padding (channels-last).

    The same values as a `ZeroPadding2D` layer in front of a 'valid'
    convolution (`conv(..., impl=KERAS)`), but the padded copy of the input
    is made again in the backward pass instead of being held from the
    forward pass to the weight gradient (docs/performance.md). Both passes
    run the 'valid' convolution kernels, which oneDNN accelerates;
    TensorFlow's kernels for explicit padding compute the input gradient of
    a strided convolution several times slower.

    Takes Conv2D's arguments and `pad` (keyword): zero pixels on each side
    of H and W, >= 1.
    """

    def convolution_op(self, inputs, kernel):
        conv_args = dict(strides=[1, *self.strides, 1], padding='VALID',
                         dilations=[1, *self.dilation_rate, 1])

        def forward(padded, k):
            return tf.nn.conv2d(padded, k, **conv_args)

        def backward(padded, y, dy, k):
            del y  # A convolution's gradients do not need its output.
            return (tf.raw_ops.Conv2DBackpropInput(
                        input_sizes=tf.shape(padded), filter=k,
                        out_backprop=dy, **conv_args),
                    tf.raw_ops.Conv2DBackpropFilter(
                        input=padded, filter_sizes=tf.shape(k),
                        out_backprop=dy, **conv_args))

        return self._padded_op(forward, backward, inputs,
                               tf.convert_to_tensor(kernel))


@tf_keras.saving.register_keras_serializable(package='paws_tf')
class PaddedMaxPool2D(_InLayerPadding, tf_keras.layers.MaxPool2D):
    """MaxPool2D over PyTorch's symmetric -inf padding (channels-last); the
    padded input is made again for the backward pass (see `PaddedConv2D`).
    Takes MaxPool2D's arguments and `pad` (keyword, >= 1)."""

    def call(self, inputs):
        pool_args = dict(ksize=[1, *self.pool_size, 1],
                         strides=[1, *self.strides, 1], padding='VALID')

        def forward(padded):
            return tf.nn.max_pool2d(padded, **pool_args)

        def backward(padded, y, dy):
            return (tf.raw_ops.MaxPoolGrad(orig_input=padded, orig_output=y,
                                           grad=dy, **pool_args),)

        return self._padded_op(forward, backward, inputs,
                               pad_value=float('-inf'))


def conv(filters, kernel_size, stride, pad, *, impl=nets.CUSTOM, name,
         **kwargs):
    """A Conv2D over PyTorch's symmetric zero padding of `pad` (>= 1).

    Args:
        filters, kernel_size, stride, name, **kwargs: the Conv2D's.
        pad: zero pixels on each side of H and W.
        impl: `CUSTOM` for a `PaddedConv2D`, `KERAS` for a 'valid'
            `tf_keras.layers.Conv2D` behind a `ZeroPadding2D` named
            `{name}_pad` (the same values and variables).

    Returns:
        (padding, convolution): the ZeroPadding2D to apply first, or None.

    Raises:
        ValueError: `impl` is not one of `nets.IMPLEMENTATIONS`.
    """
    nets.check_impl(impl, 'padded layer impl')
    if impl == nets.CUSTOM:
        return None, PaddedConv2D(filters, kernel_size, strides=stride,
                                  pad=pad, name=name, **kwargs)
    return (tf_keras.layers.ZeroPadding2D(pad, name=f'{name}_pad'),
            tf_keras.layers.Conv2D(filters, kernel_size, strides=stride,
                                   padding='valid', name=name, **kwargs))


def max_pool(pool_size, stride, pad, *, impl=nets.CUSTOM, name):
    """A MaxPool2D over PyTorch's symmetric padding of `pad` (>= 1).

    Args:
        pool_size, stride, name: the max pool's.
        pad: pixels on each side of H and W.
        impl: `CUSTOM` for a `PaddedMaxPool2D` (-inf padding), `KERAS` for
            a 'valid' `tf_keras.layers.MaxPool2D` behind a `ZeroPadding2D`
            named `{name}_pad`. Zeros give the values and gradients of -inf
            padding on the non-negative inputs the backbones pool (ReLU
            outputs): a window holds a real value >= 0, and a real 0 that
            ties with the padding passes no gradient back through its ReLU.

    Returns:
        (padding, max pool): the ZeroPadding2D to apply first, or None.

    Raises:
        ValueError: `impl` is not one of `nets.IMPLEMENTATIONS`.
    """
    nets.check_impl(impl, 'padded layer impl')
    if impl == nets.CUSTOM:
        return None, PaddedMaxPool2D(pool_size, stride, pad=pad, name=name)
    return (tf_keras.layers.ZeroPadding2D(pad, name=f'{name}_pad'),
            tf_keras.layers.MaxPool2D(pool_size, stride, padding='valid',
                                      name=name))
