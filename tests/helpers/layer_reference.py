"""NumPy references for the backbone layers, and a two-replica training
helper to check the synchronised ones against them."""

import numpy as np
import tensorflow as tf


def numpy_conv_and_grads(x, kernel, stride, pad, upstream):
    """Cross-correlation over symmetric zero padding (PyTorch's Conv2d), and
    the gradients of sum(y * upstream) w.r.t. x and the kernel, by hand."""
    kh, kw = kernel.shape[:2]
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    out_h = (xp.shape[1] - kh) // stride + 1
    out_w = (xp.shape[2] - kw) // stride + 1
    y = np.zeros((x.shape[0], out_h, out_w, kernel.shape[3]))
    d_xp, d_kernel = np.zeros_like(xp), np.zeros_like(kernel)
    for a in range(kh):
        for b in range(kw):
            window = xp[:, a:a + stride * out_h:stride,
                        b:b + stride * out_w:stride, :]  # [N, oh, ow, C]
            y += np.einsum('nijc,co->nijo', window, kernel[a, b])
            d_kernel[a, b] = np.einsum('nijc,nijo->co', window, upstream)
            d_xp[:, a:a + stride * out_h:stride,
                 b:b + stride * out_w:stride, :] += np.einsum(
                     'nijo,co->nijc', upstream, kernel[a, b])
    return y, d_xp[:, pad:pad + x.shape[1], pad:pad + x.shape[2]], d_kernel


def numpy_norm_relu(x, gamma, beta, mean, variance, epsilon):
    """Batch norm with the given statistics, then ReLU: (z, relu(z))."""
    z = gamma * (x - mean) / np.sqrt(variance + epsilon) + beta
    return z, np.maximum(z, 0.0)


def numpy_training_norm_grads(x, gamma, d_z, epsilon):
    """Gradients (x, gamma, beta) of batch norm on the batch's own statistics
    (over N, H, W), given the gradient d_z of its output."""
    mean, variance = x.mean((0, 1, 2)), x.var((0, 1, 2))
    x_hat = (x - mean) / np.sqrt(variance + epsilon)
    d_x = gamma / np.sqrt(variance + epsilon) * (
        d_z - d_z.mean((0, 1, 2)) - x_hat * (d_z * x_hat).mean((0, 1, 2)))
    return d_x, (d_z * x_hat).sum((0, 1, 2)), d_z.sum((0, 1, 2))


def numpy_norm_relu_conv(x, gamma, beta, conv, stride, pad, upstream,
                         epsilon):
    """Batch norm on x's own statistics -> ReLU -> `conv`, by hand: the
    output y, and the gradients of sum(y * upstream) w.r.t. x, gamma, beta,
    the kernel (and the bias)."""
    z, a = numpy_norm_relu(x, gamma, beta, x.mean((0, 1, 2)),
                           x.var((0, 1, 2)), epsilon)
    y, d_a, d_kernel = numpy_conv_and_grads(
        a, conv.kernel.numpy().astype(np.float64), stride, pad, upstream)
    grads = [*numpy_training_norm_grads(x, gamma, d_a * (z > 0), epsilon),
             d_kernel]
    if conv.use_bias:
        return y + conv.bias.numpy(), grads + [upstream.sum((0, 1, 2))]
    return y, grads


def numpy_training_norm(x, gamma, beta, epsilon):
    """Batch norm of x [N, H, W, C] on its own statistics."""
    z, _ = numpy_norm_relu(x, gamma, beta, x.mean((0, 1, 2)),
                           x.var((0, 1, 2)), epsilon)
    return z


def train_on_two_replicas(strategy, layer, x, upstream, weights,
                          first=None):
    """Trains `layer` on two replicas, the first on the first `first` rows
    of `x` (default: half), the second on the rest: the replicas' outputs
    y, and the gradients of sum(y * upstream) w.r.t. their inputs and
    `weights`, each as the tuple of the replicas' values."""
    bounds = (0, len(x) // 2 if first is None else first, len(x))

    def per_replica(array):
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: array[bounds[ctx.replica_id_in_sync_group]:
                              bounds[ctx.replica_id_in_sync_group + 1]])

    @tf.function
    def step(x, upstream):
        def replica_step(x, upstream):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x, training=True)
                loss = tf.reduce_sum(tf.cast(y, tf.float32) * upstream)
            return y, *tape.gradient(loss, [x, *weights])

        return strategy.run(replica_step, args=(x, upstream))

    return [strategy.experimental_local_results(t)
            for t in step(per_replica(x), per_replica(upstream))]
