"""ResNet feature extractors: images [B, H, W, C] -> features [B, F]."""

import collections
import functools
import inspect
import math
import os

import gin
import tensorflow as tf
import tf_keras
# The query tf.sysconfig does not offer: are oneDNN kernels on?
from tensorflow.python.util import _pywrap_util_port

from paws_tf import checkpoints

# Input channels a strided 1x1 convolution needs under oneDNN (see below).
_ONEDNN_MIN_CHANNELS = 8

RESNET50_STAGE_BLOCKS = (3, 4, 6, 3)
RESNET50_WIDTH_MULTIPLIERS = (1, 2, 4)
BOTTLENECK_EXPANSION = 4
WIDE_RESNET_STEM_WIDTH = 16
# Keras decay of the official WideResNet's last batch norm (PyTorch
# momentum 0.99).
WIDE_RESNET_FINAL_BN_MOMENTUM = 0.01
_MAX_NAMES_SHOWN = 20


def batch_norm(name, *, sync_bn, momentum, epsilon, zero_init=False):
    """Returns a BatchNormalization layer over the last (channel) axis.

    Args:
        name: layer name; its variables end in `gamma`, `beta`,
            `moving_mean` and `moving_variance`.
        sync_bn: if True, normalise with the statistics of the global batch
            across all replicas (a `GlobalBatchNormalization`). Outside a
            replica context it falls back to the local batch. If False, a
            tf_keras layer on the local batch (fused kernels).
        momentum: moving-average decay (Keras convention: 0.9 keeps 90% of
            the old statistic, i.e. PyTorch momentum 0.1).
        epsilon: added to the variance.
        zero_init: initialise gamma to zero instead of one.

    Returns:
        A `tf_keras.layers.BatchNormalization`.
    """
    layer_cls = (GlobalBatchNormalization if sync_bn
                 else tf_keras.layers.BatchNormalization)
    return layer_cls(momentum=momentum, epsilon=epsilon,
                     gamma_initializer='zeros' if zero_init else 'ones',
                     name=name)


def _sum_over_replicas(replica_context, x):
    """All-reduced sum of `x`, with no gradient through the sum: the batch
    norms' custom gradients below account for it.

    Stopping the gradient at `x` also bounds the walk that the replica
    context's all-reduce makes when traced, looking for variables between
    its inputs and outputs. Where the replicas sum on one device
    (`dist.make_strategy` on logical CPUs) that walk would otherwise cross
    into the other replicas' graphs at every batch norm, which makes
    tracing the step several times slower.
    """
    return replica_context.all_reduce(tf.distribute.ReduceOp.SUM,
                                      tf.stop_gradient(x))


def _global_normalise(x, gamma, beta, epsilon, replica_context,
                      relu=False):
    """Batch norm of this replica's `x` [B, H, W, C] on the statistics of
    the global batch across replicas, with one all-reduce (and the ReLU of
    it if `relu`).

    TensorFlow's fused training kernel normalises `x` on its own statistics
    (as one replica's layer does); the replicas' counts, sums and sums of
    squares per channel, all-reduced as one vector, give the global mean
    and variance (without Bessel's correction), and one XLA-compiled pass
    turns the local normalisation into the global one, a per-channel affine
    map. A replica with an empty batch adds nothing.

    Returns:
        (output in x's dtype, mean [C], variance [C], count): float32
        statistics; count is the global number of values per channel.
    """
    channels = x.shape[-1]
    x_hat, local_mean, corrected, _, _, _ = tf.raw_ops.FusedBatchNormV3(
        x=x, scale=tf.ones([channels]), offset=tf.zeros([channels]),
        mean=tf.zeros([0]), variance=tf.zeros([0]), epsilon=epsilon,
        data_format='NHWC', is_training=True)
    local_count = tf.cast(tf.reduce_prod(tf.shape(x)[:-1]), tf.float32)
    # The kernel's batch variance has Bessel's correction; the statistics
    # of fewer than two values may be NaN, and are weighed by zero.
    local_variance = tf.math.multiply_no_nan(corrected, tf.maximum(
        local_count - 1.0, 0.0) / tf.maximum(local_count, 1.0))
    sums = _sum_over_replicas(replica_context, tf.concat([
        tf.math.multiply_no_nan(local_mean, local_count),
        tf.math.multiply_no_nan(local_variance + tf.square(local_mean),
                                local_count),
        local_count[None]], 0))
    total, squares, count = tf.split(sums, [channels, channels, 1])
    count = count[0]
    mean = tf.math.divide_no_nan(total, count)
    # E[x^2] - E[x]^2 can round below zero.
    variance = tf.maximum(
        tf.math.divide_no_nan(squares, count) - tf.square(mean), 0.0)
    scale = gamma * tf.math.rsqrt(variance + epsilon)
    z = _scale_shift(x_hat, scale * tf.sqrt(local_variance + epsilon),
                     scale * (local_mean - mean) + beta, relu)
    return z, mean, variance, count


def _global_norm_grads(dz, x, gamma, mean, variance, count, epsilon,
                       replica_context):
    """Gradients (x, gamma, beta) of batch norm on the global batch's
    statistics (from `_global_normalise`), given this replica's `x` and the
    gradient `dz` of its output, with one all-reduce.

    The fused gradient kernel gives them with the statistics held constant:
    dz * gamma * inv_std, and this replica's dgamma = sum of dz * x_hat and
    dbeta = sum of dz (x_hat = (x - mean) * inv_std). The statistics' share
    of x's gradient reads these sums over all replicas (one all-reduce):

        - gamma * inv_std / count * (sum dbeta + x_hat * sum dgamma),

    computed as -(x * k + c) with k and c per channel. Gamma's and beta's
    gradients stay this replica's sums (the optimizer sums the replicas').
    """
    dx, dgamma, dbeta, _, _ = tf.raw_ops.FusedBatchNormGradV3(
        y_backprop=dz, x=x, scale=gamma, reserve_space_1=mean,
        reserve_space_2=variance,
        # Read by the training-mode gradient only.
        reserve_space_3=tf.zeros([0]), epsilon=epsilon, data_format='NHWC',
        is_training=False)
    global_dbeta, global_dgamma = tf.split(_sum_over_replicas(
        replica_context, tf.concat([dbeta, dgamma], 0)), 2)
    inv_std = tf.math.rsqrt(variance + epsilon)
    scale = gamma * inv_std / count
    k = scale * global_dgamma * inv_std
    c = scale * global_dbeta - k * mean
    return _minus_affine(dx, x, k, c), dgamma, dbeta


@tf.function(jit_compile=True)
def _scale_shift(x, scale, shift, relu=False):
    """x * scale + shift per channel (and its ReLU if `relu`), in float32,
    returned in x's dtype.

    Compiled with XLA: one pass (`_global_normalise`'s map from the local
    normalisation to the global one; `NormReLUThen`'s recomputation).
    """
    y = tf.cast(x, tf.float32) * scale + shift
    return tf.cast(tf.nn.relu(y) if relu else y, x.dtype)


@tf.function(jit_compile=True)
def _minus_affine(dx, x, k, c):
    """dx - (x * k + c) per channel, in float32, returned in x's dtype.

    Compiled with XLA, one pass over dx and x: TensorFlow's kernels take
    three, each writing a tensor of x's size (2.7-3.1 times faster on a
    2-core CPU, [24, 24, 24, 256] and [24, 48, 48, 64] in float32;
    `_global_norm_grads` runs it for every synchronised batch norm).
    """
    return tf.cast(tf.cast(dx, tf.float32) - (tf.cast(x, tf.float32) * k + c),
                   x.dtype)


@tf_keras.saving.register_keras_serializable(package='paws_tf')
class GlobalBatchNormalization(tf_keras.layers.BatchNormalization):
    """Batch norm on the statistics of the global batch across replicas,
    with one all-reduce each way.

    tf_keras' `BatchNormalization(synchronized=True)` makes three
    all-reduces in the forward pass (sum, sum of squares, count) and two in
    the backward pass, and runs unfused ops. Training in a replica context,
    this layer normalises the local batch with TensorFlow's fused kernel,
    all-reduces [sum, sum of squares, count] per channel as one vector and
    maps the local normalisation to the global one in one XLA-compiled pass
    (`_global_normalise`); in the backward pass it all-reduces [sum of dz,
    sum of dz * x_hat] once (z the output, x_hat the normalised input) and
    takes the rest from the fused gradient kernel and one XLA-compiled pass
    (`_global_norm_grads`). Values, gradients and moving statistics are
    tf_keras': the moving variance takes the global batch's variance without
    Bessel's correction. Where `global_replica_context` says so, tf_keras'
    layer runs instead. Channels-last only; inputs of rank 2 or 4.

    Takes `BatchNormalization`'s keyword arguments; `synchronized` is
    always True.
    """

    def __init__(self, **kwargs):
        kwargs.pop('synchronized', None)  # From `layer_config`.
        super().__init__(synchronized=True, **kwargs)

    def build(self, input_shape):
        super().build(input_shape)
        if self.axis != [len(input_shape) - 1] or len(input_shape) not in (
                2, 4):
            raise ValueError(
                f'{self.name}: GlobalBatchNormalization needs [B, C] or '
                f'[B, H, W, C] inputs normalised over C, got shape '
                f'{tuple(input_shape)} and axis {self.axis}.')

    def global_replica_context(self, training, mask=None):
        """The replica context whose replicas this layer's own path (one
        all-reduce each way) synchronises, or None where tf_keras' layer
        runs: not training, frozen, a cross-replica context, a mask, a
        compute dtype the fused kernels lack (float64), and the options the
        path does not implement (no center or scale, renorm, virtual
        batches, adjustment)."""
        replica_context = tf.distribute.get_replica_context()
        if (training is not True or not self.trainable
                or replica_context is None or mask is not None
                or self.compute_dtype not in ('float16', 'bfloat16',
                                              'float32')
                or not (self.center and self.scale) or self.renorm
                or self.virtual_batch_size or self.adjustment):
            return None
        return replica_context

    def call(self, inputs, training=None, mask=None):
        replica_context = self.global_replica_context(training, mask)
        if replica_context is None:
            return super().call(inputs, training=training, mask=mask)
        shape = tf.shape(inputs)
        x = tf.reshape(inputs, [-1, 1, 1, inputs.shape[-1]]) if (
            inputs.shape.rank == 2) else inputs
        epsilon = self.epsilon

        @tf.custom_gradient
        def op(x, gamma, beta):
            z, mean, variance, count = _global_normalise(
                x, gamma, beta, epsilon, replica_context)

            def grad(dz, *unused):
                del unused  # The statistics take no gradient.
                return _global_norm_grads(dz, x, gamma, mean, variance,
                                          count, epsilon, replica_context)

            return (z, mean, variance, count), grad

        z, mean, variance, count = op(x, self.gamma, self.beta)
        self.update_moving_statistics(mean, variance, count)
        return tf.reshape(z, shape)

    def update_moving_statistics(self, mean, variance, count):
        """Moves the moving statistics towards the global batch's `mean`
        and `variance` (without Bessel's correction), as tf_keras'
        synchronised layer does; not when the global batch is empty
        (`count` 0)."""
        decay = (1.0 - self.momentum) * tf.cast(count > 0, tf.float32)
        for moving, value in ((self.moving_mean, mean),
                              (self.moving_variance, variance)):
            moving.assign_sub((moving - value) * decay)


def layer_config(layer):
    """`layer.get_config()`, with what tf_keras 2.21 leaves out of a
    BatchNormalization's config (`synchronized`), so that `from_config`
    rebuilds the same layer."""
    config = layer.get_config()
    if isinstance(layer, tf_keras.layers.BatchNormalization):
        config['synchronized'] = layer.synchronized
    return config


def onednn_enabled():
    """Whether TensorFlow runs its oneDNN CPU kernels in this process."""
    return _pywrap_util_port.IsMklEnabled()


def _check_onednn_safe(x, kernel_size, stride, name):
    """Refuses a layer shape whose gradient oneDNN computes wrongly.

    On AVX2 CPUs oneDNN's weight gradient of a strided 1x1 convolution with
    fewer than 8 input channels is wrong by 30-140% (uxlfoundation/oneDNN
    #6035; reproduced here for every C in 1..7). GPUs do not run it.
    """
    channels = x.shape[-1]
    if (kernel_size == 1 and stride > 1 and channels < _ONEDNN_MIN_CHANNELS
            and onednn_enabled()
            and not tf.config.list_physical_devices('GPU')):
        raise ValueError(
            f'{name}: a strided 1x1 convolution on {channels} input channels '
            "gets wrong weight gradients from TensorFlow's oneDNN CPU "
            'kernels (oneDNN issue #6035). Give the layer at least '
            f'{_ONEDNN_MIN_CHANNELS} input channels (e.g. wider widths), or '
            'set TF_ENABLE_ONEDNN_OPTS=0 before importing paws_tf.')


def _symmetric_padding(pad):
    """`tf.nn` explicit padding of `pad` pixels on each side of H and W."""
    return [[0, 0], [pad, pad], [pad, pad], [0, 0]]


def _padded_shape(input_shape, pad):
    """[B, H, W, C] grown by `pad` pixels on each side of H and W."""
    shape = tf.TensorShape(input_shape).as_list()
    for axis in (1, 2):
        if shape[axis] is not None:
            shape[axis] += 2 * pad
    return tf.TensorShape(shape)


class _InLayerPadding:
    """What `PaddedConv2D` and `PaddedMaxPool2D` share: their base layer is
    built 'valid' and they pad their input by `pad` (>= 1) on each side of H
    and W themselves."""

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
        return super().compute_output_shape(
            _padded_shape(input_shape, self.pad))

    def get_config(self):
        return {**super().get_config(), 'pad': self.pad}

    def _padded_op(self, forward, backward, x, *weights, pad_value=0.0):
        """`forward(padded x, *weights)`, with the padded copy of `x` made
        again for the backward pass rather than held until it.

        Args:
            forward: `(padded, *weights) -> y`, a 'valid' op.
            backward: `(padded, y, dy, *weights) -> (d padded, *d weights)`.
            x: [B, H, W, C] input.
            *weights: tensors `forward` also differentiates.
            pad_value: what the border holds.

        Returns:
            y.
        """
        pad = self.pad

        def padded(t):
            return tf.pad(t, _symmetric_padding(pad),
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
    convolution, but the padded copy of the input is made again in the
    backward pass instead of being held from the forward pass to the weight
    gradient (169 MiB of a `cifar_small` step). Both passes run the 'valid'
    convolution kernels, which oneDNN accelerates; TensorFlow's kernels for
    explicit padding compute the input gradient of a strided convolution
    several times slower.

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

    Takes MaxPool2D's arguments and `pad` (keyword): -inf pixels on each side
    of H and W, >= 1.
    """

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


@tf_keras.saving.register_keras_serializable(package='paws_tf')
class NormReLUThen(tf_keras.layers.Layer):
    """`layer(relu(norm(x)))` that holds only `x` for the backward pass.

    Composed of tf_keras layers, the ReLU output `a` is held from the
    forward pass until the gradient of `layer` reads it (a convolution's
    weight gradient, a max pool's input gradient), beside `x`, which the
    batch norm's gradient reads. Here, when the batch norm trains on its
    local batch, the three run inside one custom gradient that recomputes
    `a` from `x` in the backward pass, at the cost of one more batch-norm
    pass over `x`: ResNet-50's bottleneck blocks hold 10 activations of P
    channels instead of 12, the WideResNet blocks 2 of 4.

    A `GlobalBatchNormalization` (synchronised across replicas) is
    recomputed too, with its one all-reduce each way.

    Values, gradients and moving statistics are those of the composition,
    which runs instead when `recompute` is False, or the batch norm is
    frozen or in inference mode, or synchronised where
    `GlobalBatchNormalization.global_replica_context` refuses, or is
    tf_keras' `synchronized=True` layer.

    Args:
        norm: a `tf_keras.layers.BatchNormalization` over the last axis,
            with `center` and `scale` (as `batch_norm` makes it).
        layer: a `tf_keras.layers.Conv2D` (or `PaddedConv2D`) without
            activation, or a `tf_keras.layers.MaxPool2D` (or
            `PaddedMaxPool2D`).
        recompute: False holds `a` as the composition does (the same
            values; faster, more memory).
        **kwargs: passed to `tf_keras.layers.Layer`.

    Raises:
        ValueError: `norm` or `layer` is not of that kind.
    """

    def __init__(self, norm, layer, recompute=True, **kwargs):
        super().__init__(**kwargs)
        if not (isinstance(norm, tf_keras.layers.BatchNormalization)
                and norm.center and norm.scale
                and norm.axis in (-1, [-1], [3])):
            raise ValueError(f'NormReLUThen needs a channels-last batch norm '
                             f'with center and scale, got {norm!r}.')
        is_conv = (isinstance(layer, tf_keras.layers.Conv2D)
                   and layer.activation is tf_keras.activations.linear)
        if not (is_conv or isinstance(layer, tf_keras.layers.MaxPool2D)):
            raise ValueError(f'NormReLUThen needs a Conv2D without '
                             f'activation or a MaxPool2D, got {layer!r}.')
        self.norm = norm
        self.layer = layer
        self.recompute = recompute

    def build(self, input_shape):
        for sublayer in (self.norm, self.layer):
            # Variables named `<this layer>/<sublayer>/gamma`, as a
            # sublayer's own call would name them.
            with tf.name_scope(sublayer.name):
                sublayer.build(input_shape)
        super().build(input_shape)

    def compute_output_shape(self, input_shape):
        return self.layer.compute_output_shape(input_shape)

    def get_config(self):
        norm = {**tf_keras.layers.serialize(self.norm),
                'config': layer_config(self.norm)}
        return {**super().get_config(), 'norm': norm,
                'layer': tf_keras.layers.serialize(self.layer),
                'recompute': self.recompute}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in ('norm', 'layer'):
            config[key] = tf_keras.layers.deserialize(config[key])
        return cls(**config)

    def _apply_layer(self, a, *weights):
        """`self.layer(a)` with its weights given as tensors."""
        if not weights:
            return self.layer.call(a)  # The max pool.
        y = self.layer.convolution_op(a, weights[0])
        return tf.nn.bias_add(y, weights[1]) if len(weights) > 1 else y

    def call(self, inputs, training=None):
        norm = self.norm
        replica_context = (norm.global_replica_context(training)
                           if isinstance(norm, GlobalBatchNormalization)
                           else None)
        if (not self.recompute or training is not True or not norm.trainable
                or (norm.synchronized and replica_context is None)):
            return self.layer(tf.nn.relu(norm(inputs, training=training)))
        if replica_context is not None:
            return self._global_call(inputs, replica_context)

        def norm_relu(x, gamma, beta, moving_mean, moving_variance):
            # As tf_keras' fused batch norm: the moving statistics come back
            # updated, the variance's with Bessel's correction.
            y, mean, variance = tf.compat.v1.nn.fused_batch_norm(
                x, gamma, beta, mean=moving_mean, variance=moving_variance,
                epsilon=norm.epsilon, is_training=True,
                exponential_avg_factor=1.0 - norm.momentum)
            return tf.nn.relu(y), mean, variance

        @tf.custom_gradient
        def op(x, gamma, beta, moving_mean, moving_variance, *weights):
            a, mean, variance = norm_relu(x, gamma, beta, moving_mean,
                                          moving_variance)

            def grad(dy, *unused):
                del unused  # The moving statistics take no gradient.
                sources = [x, gamma, beta, *weights]
                with tf.GradientTape() as tape:
                    tape.watch(sources)
                    # Made after dy exists, so that graph optimisation
                    # cannot merge it with the forward pass's `a`.
                    with tf.control_dependencies([dy]):
                        a_again, _, _ = norm_relu(x, gamma, beta, moving_mean,
                                                  moving_variance)
                    # A convolution recomputed here has no consumer (its
                    # gradients do not read its output) and is pruned.
                    y_again = self._apply_layer(a_again, *weights)
                dx, dgamma, dbeta, *dweights = tape.gradient(
                    y_again, sources, output_gradients=dy)
                return (dx, dgamma, dbeta, None, None, *dweights)

            return (self._apply_layer(a, *weights), mean, variance), grad

        y, mean, variance = op(inputs, norm.gamma, norm.beta, norm.moving_mean,
                               norm.moving_variance,
                               # In the compute dtype (autocast), as tensors.
                               *map(tf.convert_to_tensor, self.layer.weights))
        norm.moving_mean.assign(mean)
        norm.moving_variance.assign(variance)
        return y

    def _global_call(self, inputs, replica_context):
        """The training call with a `GlobalBatchNormalization`: its one
        all-reduce each way, and `a` recomputed as in `call`."""
        norm = self.norm
        epsilon = norm.epsilon

        @tf.custom_gradient
        def op(x, gamma, beta, *weights):
            # The ReLU in the normalisation's pass.
            a, mean, variance, count = _global_normalise(
                x, gamma, beta, epsilon, replica_context, relu=True)

            def grad(dy, *unused):
                del unused  # The statistics take no gradient.
                scale = gamma * tf.math.rsqrt(variance + epsilon)
                # Made after dy exists, so that graph optimisation cannot
                # merge it with the forward pass's (see `op` in `call`).
                with tf.control_dependencies([dy]):
                    a = _scale_shift(x, scale, beta - mean * scale,
                                     relu=True)
                with tf.GradientTape() as tape:
                    tape.watch([a, *weights])
                    y_again = self._apply_layer(a, *weights)
                da, *dweights = tape.gradient(y_again, [a, *weights],
                                              output_gradients=dy)
                # a > 0 where the normalised x is.
                dz = tf.raw_ops.ReluGrad(gradients=da, features=a)
                return (*_global_norm_grads(dz, x, gamma, mean, variance,
                                            count, epsilon, replica_context),
                        *dweights)

            return (self._apply_layer(a, *weights), mean, variance,
                    count), grad

        y, mean, variance, count = op(
            inputs, norm.gamma, norm.beta,
            *map(tf.convert_to_tensor, self.layer.weights))
        norm.update_moving_statistics(mean, variance, count)
        return y


def torch_default_init(fan_in):
    """Initializers of PyTorch's default `nn.Conv2d` / `nn.Linear`.

    `reset_parameters` draws the weights with `kaiming_uniform_(a=sqrt(5))`,
    i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the bias from the same
    range. Fresh instances: an unseeded initializer instance repeats its
    values.

    Args:
        fan_in: inputs of one output unit (kernel area x input channels).

    Returns:
        dict of `kernel_initializer` and `bias_initializer`.
    """
    bound = 1 / math.sqrt(fan_in)
    return dict(
        kernel_initializer=tf_keras.initializers.VarianceScaling(
            scale=1 / 3, mode='fan_in', distribution='uniform'),
        bias_initializer=tf_keras.initializers.RandomUniform(-bound, bound))


def _conv_layer(x, filters, kernel_size, stride, name, torch_default=False):
    """Conv2D for input `x` with PyTorch's symmetric `kernel_size // 2`
    padding.

    By default without bias, initialised as torchvision's (and the official
    PAWS) ResNets are (kaiming_normal_, fan_out); with `torch_default`, with
    a bias and PyTorch's default initialisation (`torch_default_init`), as
    the official WideResNet leaves its convolutions.
    """
    _check_onednn_safe(x, kernel_size, stride, name)
    if torch_default:
        init = torch_default_init(kernel_size * kernel_size * x.shape[-1])
    else:
        # A fresh instance per layer: an unseeded one repeats its values.
        init = dict(kernel_initializer=tf_keras.initializers.VarianceScaling(
            scale=2.0, mode='fan_out', distribution='untruncated_normal'))
    kwargs = dict(strides=stride, use_bias=torch_default, name=name, **init)
    if stride > 1 and kernel_size > 1:
        # Keras 'same' pads asymmetrically for strided convs on even sizes;
        # explicit padding keeps the torchvision output grid and sizes.
        return PaddedConv2D(filters, kernel_size, pad=kernel_size // 2,
                            **kwargs)
    padding = 'same' if stride == 1 else 'valid'  # 1x1: no padding.
    return tf_keras.layers.Conv2D(filters, kernel_size, padding=padding,
                                  **kwargs)


def _conv(x, *args, **kwargs):
    """`_conv_layer(x, ...)` applied to `x`."""
    return _conv_layer(x, *args, **kwargs)(x)


class _Norms:
    """Makes a backbone's batch norms: `norms(name)` alone, or
    `norms.relu_then(x, name, layer, name=...)` as a `NormReLUThen`."""

    def __init__(self, recompute, **batch_norm_args):
        self.recompute = recompute
        self.batch_norm_args = batch_norm_args

    def __call__(self, name, zero_init=False, momentum=None):
        """A batch norm; `momentum` overrides the backbone's."""
        args = dict(self.batch_norm_args)
        if momentum is not None:
            args['momentum'] = momentum
        return batch_norm(name, zero_init=zero_init, **args)

    def relu_then(self, x, bn_name, layer, name):
        """`layer(relu(batch norm bn_name(x)))` as one `NormReLUThen`."""
        return NormReLUThen(self(bn_name), layer, recompute=self.recompute,
                            name=name)(x)


def _norm_relu_conv(x, norm, block, bn, conv, *args, **kwargs):
    """Applies `NormReLUThen` named `{block}_{bn}_{conv}` to `x`; its batch
    norm and convolution are named `{block}_{bn}` and `{block}_{conv}`.
    `*args, **kwargs`: the `_conv_layer` arguments after `x`, but `name`."""
    conv_layer = _conv_layer(x, *args, name=f'{block}_{conv}', **kwargs)
    return norm.relu_then(x, f'{block}_{bn}', conv_layer,
                          name=f'{block}_{bn}_{conv}')


def _relu(name):
    return tf_keras.layers.ReLU(name=name)


def _features_model(inputs, x, name):
    """Pools [B, h, w, F] to [B, F] and wraps the graph into a Model."""
    features = tf_keras.layers.GlobalAveragePooling2D(name='avg_pool')(x)
    model = tf_keras.Model(inputs, features, name=name)  # [B, F]
    model.output_dim = int(features.shape[-1])
    return model


def _bottleneck_block(x, planes, stride, name, norm, zero_init_residual):
    """ResNet v1.5 bottleneck: stride on the 3x3 conv, expansion 4."""
    out_channels = planes * BOTTLENECK_EXPANSION
    shortcut = x
    if stride != 1 or x.shape[-1] != out_channels:
        shortcut = _conv(x, out_channels, 1, stride, name + '_proj_conv')
        shortcut = norm(name + '_proj_bn')(shortcut)
    y = _conv(x, planes, 1, 1, name + '_conv1')
    # BN1 -> ReLU -> conv2 (strided): [B, h/s, w/s, P].
    y = _norm_relu_conv(y, norm, name, 'bn1', 'conv2', planes, 3, stride)
    y = _norm_relu_conv(y, norm, name, 'bn2', 'conv3', out_channels, 1, 1)
    y = norm(name + '_bn3', zero_init=zero_init_residual)(y)
    y = tf_keras.layers.Add(name=name + '_add')([y, shortcut])
    return _relu(name + '_out')(y)  # [B, h/s, w/s, 4P]


def _resnet50(inputs, norm, width_multiplier=1, zero_init_residual=False):
    """ResNet-50 (torchvision / SimCLR layout), F = 2048 * width_multiplier.

    `zero_init_residual` defaults to False because the official PAWS code
    (and torchvision) leave it off; SimCLR's TF code turns it on.
    """
    if width_multiplier not in RESNET50_WIDTH_MULTIPLIERS:
        raise ValueError(
            f'resnet50 width_multiplier must be one of '
            f'{RESNET50_WIDTH_MULTIPLIERS}, got {width_multiplier!r}')
    width = 64 * width_multiplier
    x = _conv(inputs, width, 7, 2, 'stem_conv')  # [B, H/2, W/2, 64w]
    x = norm.relu_then(x, 'stem_bn',
                       PaddedMaxPool2D(3, 2, pad=1, name='stem_pool'),
                       name='stem_bn_pool')  # [B, H/4, W/4, 64w]
    for stage, num_blocks in enumerate(RESNET50_STAGE_BLOCKS, start=1):
        planes = width * 2 ** (stage - 1)
        for block in range(1, num_blocks + 1):
            stride = 2 if stage > 1 and block == 1 else 1
            x = _bottleneck_block(x, planes, stride,
                                  f'stage{stage}_block{block}', norm,
                                  zero_init_residual)
    return _features_model(inputs, x, f'resnet50_{width_multiplier}x')


def _wide_block(x, filters, stride, name, norm):
    """Pre-activation wide block of the official PAWS WideResNet."""
    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
        # The official code projects the raw block input, not the
        # pre-activated one (suncet src/wide_resnet.py).
        shortcut = _conv(x, filters, 1, stride, name + '_proj_conv',
                         torch_default=True)
    y = _norm_relu_conv(x, norm, name, 'bn1', 'conv1', filters, 3, 1,
                        torch_default=True)
    y = _norm_relu_conv(y, norm, name, 'bn2', 'conv2', filters, 3, stride,
                        torch_default=True)
    return tf_keras.layers.Add(name=name + '_add')([y, shortcut])


def _wide_resnet(inputs, norm, depth=28, width=2,
                 final_bn_momentum=WIDE_RESNET_FINAL_BN_MOMENTUM):
    """WideResNet-depth-width without dropout, F = 64 * width.

    The official network (suncet src/wide_resnet.py) gives its last batch
    norm `momentum=0.99` in PyTorch's convention, where momentum is the
    weight of the new batch: its moving statistics are almost the last
    batch's. `final_bn_momentum` is Keras' decay, 1 - 0.99.
    """
    if depth < 10 or (depth - 4) % 6:
        raise ValueError(f'wide_resnet depth must be 6n + 4 with n >= 1, '
                         f'got {depth!r}')
    if width < 1:
        raise ValueError(f'wide_resnet width must be >= 1, got {width!r}')
    x = _conv(inputs, WIDE_RESNET_STEM_WIDTH, 3, 1, 'stem_conv',
              torch_default=True)
    for group, stride in enumerate((1, 2, 2), start=1):
        filters = WIDE_RESNET_STEM_WIDTH * 2 ** (group - 1) * width
        for block in range(1, (depth - 4) // 6 + 1):
            x = _wide_block(x, filters, stride if block == 1 else 1,
                            f'group{group}_block{block}', norm)
    x = norm('final_bn', momentum=final_bn_momentum)(x)
    x = _relu('final_relu')(x)  # [B, H/4, W/4, 64k]
    return _features_model(inputs, x, f'wide_resnet{depth}_{width}')


def _basic_block(x, filters, stride, name, norm):
    """Post-activation basic block: two 3x3 convs."""
    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
        shortcut = _conv(x, filters, 1, stride, name + '_proj_conv')
        shortcut = norm(name + '_proj_bn')(shortcut)
    y = _conv(x, filters, 3, stride, name + '_conv1')
    y = _norm_relu_conv(y, norm, name, 'bn1', 'conv2', filters, 3, 1)
    y = norm(name + '_bn2')(y)
    y = tf_keras.layers.Add(name=name + '_add')([y, shortcut])
    return _relu(name + '_out')(y)


def _small_resnet(inputs, norm, widths=(32, 64, 128),
                  blocks_per_stage=(1, 1, 1), stem_stride=1,
                  stage_strides=(2, 2, 2)):
    """Small ResNet for CPU runs; the first stage may already downsample."""
    widths, blocks_per_stage = tuple(widths), tuple(blocks_per_stage)
    stage_strides = tuple(stage_strides)
    if not (len(widths) == len(blocks_per_stage) == len(stage_strides) > 0):
        raise ValueError(
            f'small_resnet widths, blocks_per_stage and stage_strides must be '
            f'non-empty and of equal length, got {widths!r}, '
            f'{blocks_per_stage!r}, {stage_strides!r}')
    if stem_stride < 1 or min(widths + blocks_per_stage + stage_strides) < 1:
        raise ValueError(
            f'small_resnet sizes and strides must be >= 1, got widths='
            f'{widths!r}, blocks_per_stage={blocks_per_stage!r}, '
            f'stem_stride={stem_stride!r}, stage_strides={stage_strides!r}')
    x = _conv(inputs, widths[0], 3, stem_stride, 'stem_conv')
    x = _relu('stem_relu')(norm('stem_bn')(x))
    stages = zip(widths, blocks_per_stage, stage_strides)
    for stage, (filters, num_blocks, stride) in enumerate(stages, start=1):
        for block in range(1, num_blocks + 1):
            x = _basic_block(x, filters, stride if block == 1 else 1,
                             f'stage{stage}_block{block}', norm)
    return _features_model(inputs, x, 'small_resnet')  # F = widths[-1]


_BUILDERS = {
    'resnet50': _resnet50,
    'wide_resnet': _wide_resnet,
    'small_resnet': _small_resnet,
}


def downsampling(name, *, stem_stride=1, stage_strides=(2, 2, 2)):
    """How many times backbone `name` shrinks an image side: the product of
    its strides (`stem_stride` and `stage_strides` are small_resnet's).

    Raises:
        ValueError: unknown `name`.
    """
    if name not in _BUILDERS:
        raise ValueError(f'unknown backbone {name!r}; valid choices: '
                         f'{sorted(_BUILDERS)}')
    if name == 'resnet50':
        return 32  # Stem conv and max pool, stages 2-4: five strides of 2.
    if name == 'wide_resnet':
        return 4  # Its second and third groups stride by 2.
    return stem_stride * math.prod(stage_strides)


@gin.configurable
def build_backbone(name, *, input_channels=3, sync_bn=False, bn_momentum=0.9,
                   bn_epsilon=1e-5, recompute_bn_relu=True, **kwargs):
    """Builds a channels-last feature extractor that accepts any image size.

    Args:
        name: one of
            'resnet50': torchvision ResNet-50 v1.5, F = 2048 * w. kwargs:
                `width_multiplier` w in {1, 2, 4} (default 1; PAWS Table 2),
                `zero_init_residual` (default False, as in the official
                PAWS code: zero gamma in the last BN of each block).
            'wide_resnet': pre-activation WideResNet of the official PAWS
                code, no dropout, F = 64 * width, convolutions with biases
                and PyTorch's default initialisation. kwargs: `depth` (6n +
                4, default 28), `width` (default 2; App. C, 1.47M params),
                `final_bn_momentum` (0.01, the official last batch norm).
            'small_resnet': basic-block ResNet for CPU runs, F =
                widths[-1]. kwargs: `widths` (default (32, 64, 128)),
                `blocks_per_stage` ((1, 1, 1)), `stem_stride` (1),
                `stage_strides` ((2, 2, 2)); all tuples of equal length.
        input_channels: C of the [B, H, W, C] input images.
        sync_bn: synchronise batch-norm statistics across replicas (global
            BN, PAWS Sec. 5); use False with a single replica (fusable BN).
        bn_momentum: batch-norm moving-average decay (Keras convention).
        bn_epsilon: batch-norm epsilon.
        recompute_bn_relu: where a batch norm and ReLU feed a convolution or
            max pool alone, recompute the ReLU output in the backward pass
            instead of holding it (`NormReLUThen`; local batch norm only):
            measured on 2 CPU cores, the ResNet-50 step's tensor peak 13%
            lower and WRN-28-2's 48%, at ~5% more CPU time. False: the
            same values, held.
        **kwargs: architecture arguments of the chosen backbone.

    Returns:
        A `tf_keras.Model` mapping [B, H, W, C] float images to [B, F]
        features (in the compute dtype of the global mixed-precision
        policy), with the int attribute `output_dim` = F.

    Raises:
        ValueError: unknown `name` or architecture argument, or a bad value.
    """
    if name not in _BUILDERS:
        raise ValueError(f'unknown backbone {name!r}; valid choices: '
                         f'{sorted(_BUILDERS)}')
    builder = _BUILDERS[name]
    valid = list(inspect.signature(builder).parameters)[2:]
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise ValueError(f'unknown argument(s) {unknown} for backbone '
                         f'{name!r}; valid choices: {valid}')
    if input_channels < 1:
        raise ValueError(
            f'input_channels must be >= 1, got {input_channels!r}')
    if not 0.0 <= bn_momentum < 1.0:
        raise ValueError(f'bn_momentum must be in [0, 1), got {bn_momentum!r}')
    norm = _Norms(recompute_bn_relu, sync_bn=sync_bn, momentum=bn_momentum,
                  epsilon=bn_epsilon)
    inputs = tf_keras.Input(shape=(None, None, input_channels), name='images')
    return builder(inputs, norm, **kwargs)


def _unmatched_checkpoint_variables(root, prefix):
    """Names of the variables under `root` that have no value at `prefix`.

    Follows the breadth-first, first-path-wins naming that TF's object-based
    checkpoints use for their keys.
    """
    stored = {key for key, _ in tf.train.list_variables(prefix)}
    view = tf.train.TrackableView(root)
    seen = {id(root)}
    queue = collections.deque([(root, ())])
    missing = []
    while queue:
        parent, path = queue.popleft()
        for child_name, child in view.children(parent).items():
            if id(child) in seen:
                continue
            seen.add(id(child))
            child_path = path + (child_name,)
            if isinstance(child, tf.Variable):
                key = '/'.join(child_path + ('.ATTRIBUTES', 'VARIABLE_VALUE'))
                if key not in stored:
                    missing.append(child.name)
            else:
                queue.append((child, child_path))
    return missing


def _restore_checkpoint(backbone, prefix):
    root = tf.train.Checkpoint(backbone=backbone)
    missing = _unmatched_checkpoint_variables(root, prefix)
    if missing:
        shown = ', '.join(missing[:_MAX_NAMES_SHOWN])
        more = len(missing) - _MAX_NAMES_SHOWN
        raise ValueError(
            f'{len(missing)} of {len(backbone.variables)} variables have no '
            f'value under the "backbone" key of the checkpoint (written by '
            f'another architecture, or not with tf.train.Checkpoint('
            f'backbone=...)?): {shown}' + (f' and {more} more' if more > 0
                                          else ''))
    # Extra stored values (heads, optimizer slots) are fine.
    root.read(prefix).assert_existing_objects_matched()


def load_backbone_weights(backbone, path):
    """Loads pretrained weights into a backbone, all or nothing.

    Args:
        backbone: a built model from `build_backbone`.
        path: a weights file written by `backbone.save_weights` (`.h5`:
            matched by layer order; `.weights.h5`: matched by object
            structure), or a TF checkpoint prefix or directory written by
            `tf.train.Checkpoint(backbone=backbone)` (matched by the object
            graph under the `backbone` key).

    Raises:
        FileNotFoundError: `path` does not exist or holds no checkpoint.
        ValueError: the stored weights do not fit the backbone (a variable
            without a stored value, a shape or layer-count mismatch). The
            message names the unrestored variables as far as the loader
            reports them; the backbone is left unchanged.
    """
    path = os.fspath(path)
    if path.endswith('.h5'):
        if not tf.io.gfile.exists(path):
            raise FileNotFoundError(f'weights file {path!r} does not exist')
        load = functools.partial(backbone.load_weights, path)
    else:
        load = functools.partial(_restore_checkpoint, backbone,
                                 checkpoints.resolve_prefix(path))
    snapshot = [variable.numpy() for variable in backbone.variables]
    try:
        load()
    except (AssertionError, KeyError, ValueError,
            tf.errors.OpError) as error:
        for variable, value in zip(backbone.variables, snapshot):
            variable.assign(value)
        raise ValueError(
            f'could not load {path!r} into backbone {backbone.name!r} '
            f'({len(snapshot)} variables); none were restored, the backbone '
            f'is unchanged. Architecture mismatch? Cause: '
            f'{type(error).__name__}: {error}') from error
