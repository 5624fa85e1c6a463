"""Batch norm synchronised across replicas with one all-reduce each way."""

import tensorflow as tf
import tf_keras

from paws_tf import checks
from paws_tf import nets


def batch_norm(name, *, sync_bn, momentum, epsilon, zero_init=False,
               impl=nets.KERAS):
    """Returns a BatchNormalization layer over the last (channel) axis.

    Args:
        name: layer name; its variables end in `gamma`, `beta`,
            `moving_mean` and `moving_variance`.
        sync_bn: if True, normalise with the statistics of the global batch
            across all replicas (outside a replica context, of the local
            batch). If False, a tf_keras layer on the local batch.
        momentum: moving-average decay (Keras convention: 0.9 keeps 90% of
            the old statistic, i.e. PyTorch momentum 0.1).
        epsilon: added to the variance.
        zero_init: initialise gamma to zero instead of one.
        impl: with `sync_bn`, `KERAS` (default) for
            `tf_keras.layers.BatchNormalization(synchronized=True)`, `CUSTOM`
            for a `GlobalBatchNormalization`: the same values and variables.

    Returns:
        A `tf_keras.layers.BatchNormalization`.

    Raises:
        ValueError: `impl` is not one of `nets.IMPLEMENTATIONS`.
    """
    checks.one_of('impl', impl, nets.IMPLEMENTATIONS)
    kwargs = dict(momentum=momentum, epsilon=epsilon,
                  gamma_initializer='zeros' if zero_init else 'ones',
                  name=name)
    if sync_bn and impl == nets.CUSTOM:
        return GlobalBatchNormalization(**kwargs)
    return tf_keras.layers.BatchNormalization(synchronized=sync_bn, **kwargs)


def _sum_over_replicas(replica_context, x):
    """All-reduced sum of `x`, with no gradient through the sum: the batch
    norms' custom gradients below account for it. Stopping the gradient
    also bounds the all-reduce's trace-time walk for variables between its
    inputs and outputs, which, where the replicas sum on one device
    (`cluster.make_strategy` on logical CPUs), would otherwise cross into
    the other replicas' graphs at every batch norm and make tracing the
    step several times slower."""
    return replica_context.all_reduce(tf.distribute.ReduceOp.SUM,
                                      tf.stop_gradient(x))


def global_normalise(x, gamma, beta, epsilon, replica_context, relu=False):
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
    z = scale_shift(x_hat, scale * tf.sqrt(local_variance + epsilon),
                     scale * (local_mean - mean) + beta, relu)
    return z, mean, variance, count


def global_norm_grads(dz, x, gamma, mean, variance, count, epsilon,
                       replica_context):
    """Gradients (x, gamma, beta) of batch norm on the global batch's
    statistics (from `global_normalise`), given this replica's `x` and the
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


@tf.function(jit_compile=True, autograph=False)
def scale_shift(x, scale, shift, relu=False):
    """x * scale + shift per channel (and its ReLU if `relu`), in float32,
    returned in x's dtype, in one XLA-compiled pass (`global_normalise`'s
    map to the global normalisation; `NormReLUThen`'s recomputation)."""
    y = tf.cast(x, tf.float32) * scale + shift
    return tf.cast(tf.nn.relu(y) if relu else y, x.dtype)


@tf.function(jit_compile=True, autograph=False)
def _minus_affine(dx, x, k, c):
    """dx - (x * k + c) per channel, in float32, returned in x's dtype.

    Compiled with XLA, one pass over dx and x: TensorFlow's kernels take
    three, each writing a tensor of x's size (2.7-3.1 times faster on a
    2-core CPU, [24, 24, 24, 256] and [24, 48, 48, 64] in float32;
    `global_norm_grads` runs it for every synchronised batch norm).
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
    this layer runs TensorFlow's fused kernels around one all-reduce each
    way (`global_normalise`, `global_norm_grads`). Values, gradients and
    moving statistics are tf_keras': the moving variance takes the global
    batch's variance without Bessel's correction. Where
    `global_replica_context` says so, tf_keras' layer runs instead.
    Channels-last only; inputs of rank 2 or 4.

    docs/performance.md compares the CPU time of a step with each layer,
    measured on 2 CPU cores (two replicas on logical devices), not on GPUs.
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
        all-reduce each way) synchronises, or None where tf_keras' layer runs
        (float64: the fused kernels lack it; the options the path does not
        implement)."""
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
            z, mean, variance, count = global_normalise(
                x, gamma, beta, epsilon, replica_context)

            def grad(dz, *unused):
                del unused  # The statistics take no gradient.
                return global_norm_grads(dz, x, gamma, mean, variance,
                                          count, epsilon, replica_context)

            return (z, mean, variance, count), grad

        z, mean, variance, count = op(x, self.gamma, self.beta)
        self.update_moving_statistics(mean, variance, count)
        return tf.reshape(z, shape)

    def update_moving_statistics(self, mean, variance, count):
        """Moves the moving statistics towards the global batch's `mean` and
        `variance` (without Bessel's correction), as tf_keras' synchronised
        layer does; not when the global batch is empty (`count` 0)."""
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
