"""Batch norm, ReLU and the layer they feed, with the ReLU output recomputed
in the backward pass instead of held."""

import tensorflow as tf
import tf_keras

from paws_tf import nets
from paws_tf.nets import sync_batch_norm


@tf_keras.saving.register_keras_serializable(package='paws_tf')
class NormReLUThen(tf_keras.layers.Layer):
    """`layer(relu(norm(x)))` that holds only `x` for the backward pass.

    Composed of tf_keras layers, the ReLU output `a` is held beside `x`
    until the gradient of `layer` reads it. Here one custom gradient
    recomputes `a` from `x` instead, at the cost of one more batch-norm
    pass (a `GlobalBatchNormalization`'s with its one all-reduce each way):
    ResNet-50's bottleneck blocks hold 10 activations of P channels instead
    of 12, the WideResNet blocks 2 of 4 (docs/performance.md).

    Values, gradients and moving statistics are those of the composition,
    which runs instead where the custom gradient does not apply (`call`).

    Args:
        norm: a `tf_keras.layers.BatchNormalization` over the last axis, with
            `center` and `scale` (as `sync_batch_norm.batch_norm` makes it).
        layer: a `tf_keras.layers.Conv2D` without activation, or a
            `tf_keras.layers.MaxPool2D`.
        recompute: False holds `a` as the composition does (the same
            values; faster, more memory).
        padding: None, or a `tf_keras.layers.ZeroPadding2D` that pads `a`
            before `layer`.
        **kwargs: passed to `tf_keras.layers.Layer`.

    Raises:
        ValueError: `norm`, `layer` or `padding` is not of that kind.
    """

    def __init__(self, norm, layer, recompute=True, padding=None, **kwargs):
        super().__init__(**kwargs)
        layers = tf_keras.layers
        if not (isinstance(norm, layers.BatchNormalization) and norm.center
                and norm.scale and norm.axis in (-1, [-1], [3])
                and (isinstance(layer, layers.MaxPool2D) or (
                    isinstance(layer, layers.Conv2D)
                    and layer.activation is tf_keras.activations.linear))
                and isinstance(padding, (type(None), layers.ZeroPadding2D))):
            raise ValueError(
                'NormReLUThen needs a channels-last batch norm with center '
                'and scale, a Conv2D without activation or a MaxPool2D, and '
                'pads with a ZeroPadding2D or not at all; got '
                f'{norm!r}, {layer!r}, {padding!r}.')
        self.norm = norm
        self.layer = layer
        self.recompute = recompute
        self.padding = padding

    def build(self, input_shape):
        nets.build_in_scope(self.norm, input_shape)
        nets.build_in_scope(self.layer, self._padded_shape(input_shape))
        super().build(input_shape)

    def _padded_shape(self, input_shape):
        return (input_shape if self.padding is None
                else self.padding.compute_output_shape(input_shape))

    def compute_output_shape(self, input_shape):
        return self.layer.compute_output_shape(self._padded_shape(input_shape))

    def get_config(self):
        norm = {**tf_keras.layers.serialize(self.norm),
                'config': sync_batch_norm.layer_config(self.norm)}
        padding = (None if self.padding is None
                   else tf_keras.layers.serialize(self.padding))
        return {**super().get_config(), 'norm': norm,
                'layer': tf_keras.layers.serialize(self.layer),
                'recompute': self.recompute, 'padding': padding}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in ('norm', 'layer', 'padding'):
            if config.get(key) is not None:
                config[key] = tf_keras.layers.deserialize(config[key])
        return cls(**config)

    def _apply_layer(self, a, *weights):
        """`self.layer(self.padding(a))` with its weights given as tensors."""
        if self.padding is not None:
            a = self.padding.call(a)
        if not weights:
            return self.layer.call(a)  # The max pool.
        y = self.layer.convolution_op(a, weights[0])
        return tf.nn.bias_add(y, weights[1]) if len(weights) > 1 else y

    def call(self, inputs, training=None):
        norm = self.norm
        replica_context = (
            norm.global_replica_context(training) if isinstance(
                norm, sync_batch_norm.GlobalBatchNormalization) else None)
        if (not self.recompute or training is not True or not norm.trainable
                or (norm.synchronized and replica_context is None)):
            a = tf.nn.relu(norm(inputs, training=training))
            return self.layer(a if self.padding is None else self.padding(a))
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
        """`call` in training with a `GlobalBatchNormalization`."""
        norm = self.norm
        epsilon = norm.epsilon

        @tf.custom_gradient
        def op(x, gamma, beta, *weights):
            # The ReLU in the normalisation's pass.
            a, mean, variance, count = sync_batch_norm.global_normalise(
                x, gamma, beta, epsilon, replica_context, relu=True)

            def grad(dy, *unused):
                del unused  # The statistics take no gradient.
                scale = gamma * tf.math.rsqrt(variance + epsilon)
                # Made after dy exists, so that graph optimisation cannot
                # merge it with the forward pass's (see `op` in `call`).
                with tf.control_dependencies([dy]):
                    a = sync_batch_norm.scale_shift(
                        x, scale, beta - mean * scale, relu=True)
                with tf.GradientTape() as tape:
                    tape.watch([a, *weights])
                    y_again = self._apply_layer(a, *weights)
                da, *dweights = tape.gradient(y_again, [a, *weights],
                                              output_gradients=dy)
                # a > 0 where the normalised x is.
                dz = tf.raw_ops.ReluGrad(gradients=da, features=a)
                return (*sync_batch_norm.global_norm_grads(
                    dz, x, gamma, mean, variance, count, epsilon,
                    replica_context), *dweights)

            return (self._apply_layer(a, *weights), mean, variance,
                    count), grad

        y, mean, variance, count = op(
            inputs, norm.gamma, norm.beta,
            *map(tf.convert_to_tensor, self.layer.weights))
        norm.update_moving_statistics(mean, variance, count)
        return y
