"""GPU-ready paths of PAWSModel.train_step, run on CPU: mixed precision with
loss scaling, XLA, prefetching to the replicas' devices, one support gather.

Tolerances. At initialisation the PAWS gradient is a small difference of
nearly equal terms (the anchor predictions are close to their targets, and
the me-max term nearly cancels the cross-entropy), so rounding errors grow:
the float32 gradients of these small models differ from float64 ones by
1e-5 to 3e-5 relative, 100-500 times float32's unit roundoff (6e-8). The
same growth bounds what one LARS step measured against float32 over seeds
0-3, as the cosine / relative error of the kernel update: float16 (roundoff
4.9e-4) 0.997-0.9999 / 0.015-0.073, bfloat16 (3.9e-3) 0.92-0.98 /
0.18-0.40. The test bounds leave about a factor two.
"""

import contextlib
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from paws_tf.data import augment
from paws_tf.data import pipeline
from paws_tf.data import sources
from paws_tf import lars
from paws_tf import nets
from tests.helpers import tiny_model

BATCH, CLASSES, IMAGES, MULTICROP = 4, 3, 2, 2


@contextlib.contextmanager
def precision(policy):
    """Sets the global mixed-precision policy for the block."""
    tf_keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        tf_keras.mixed_precision.set_global_policy('float32')


def _batch(seed=0):
    return tiny_model.random_step(np.random.default_rng(seed), BATCH,
                                  CLASSES, IMAGES, 1, MULTICROP)


def _build():
    """A small PAWSModel under the current policy.

    Wider than `tiny_model.make`'s default heads, whose embeddings can be so
    short at initialisation that the L2 normalisation's gradient (~1 / |z|)
    overflows float16 even at a loss scale of 2.
    """
    return tiny_model.make(hidden=16, width=16, prediction_hidden=8)


def _model(optimizer, weights=None, jit_compile=False):
    """A small compiled PAWSModel under the current policy."""
    model = _build()
    tiny_model.compile_and_build(model, optimizer=optimizer)
    if jit_compile:
        model.compile(optimizer=model.optimizer, jit_compile=True)
    if weights is not None:
        model.set_weights(weights)
    return model


def _kernels(model):
    return np.concatenate([v.numpy().ravel() for v in model.trainable_variables
                           if 'kernel' in v.name])


def _trainables(model):
    return [v.numpy() for v in model.trainable_variables]


def _float32_reference(batch):
    """Initial weights and the float32 kernel update of one LARS step."""
    tf_keras.utils.set_random_seed(0)
    model = _model(lars.LARS(learning_rate=0.1))
    weights = model.get_weights()
    before = _kernels(model)
    logs = tiny_model.run_steps(model, batch)
    return weights, _kernels(model) - before, logs


def _assert_close_update(update, reference, min_cosine, max_relative):
    """The direction within the bounds above; the size within bfloat16's
    unit roundoff, 2^-8: LARS sets each layer's step to about lr * eta *
    |w|, from the float32 weights the mixed policies keep, so the low
    precision rounds its direction but not its size (measured: 1e-5
    relative). A step 1.1 times too large fails by 25 times."""
    assert np.all(np.isfinite(update))
    cosine = update @ reference / (np.linalg.norm(update) *
                                   np.linalg.norm(reference))
    relative = np.linalg.norm(update - reference) / np.linalg.norm(reference)
    assert cosine > min_cosine and relative < max_relative, (cosine, relative)
    size = np.linalg.norm(update) / np.linalg.norm(reference)
    assert abs(size - 1) < 2 ** -8, size


@pytest.mark.parametrize('policy', ['mixed_float16', 'mixed_bfloat16'])
def test_loss_and_predictions_are_float32_under_mixed_precision(policy):
    with precision(policy):
        model = _build()
        features = model.backbone(tf.zeros([1, 8, 8, 3]))
        loss, terms, z_global, z_support, _ = model._forward(_batch(), True)
    assert features.dtype == tf.dtypes.as_dtype(policy.split('_')[1])
    for tensor in (loss, terms.cross_entropy, terms.me_max, terms.targets,
                   terms.log_probs, z_global, z_support):
        assert tensor.dtype == tf.float32
    assert np.isfinite(loss.numpy())


@pytest.mark.slow
def test_float16_loss_scaling_skips_overflows_then_updates_like_float32(
        request):
    """Dynamic loss scaling (what `train` adds for mixed_float16): a scale
    that overflows the float16 gradients (2^30 here: any gradient above
    6e-5 does) leaves the weights alone and halves the scale; the first
    applied update is finite and close to float32's.

    With float16 arithmetic as GPUs do it (float32 accumulation): TensorFlow's
    own CPU kernels, in a process with TF_ENABLE_ONEDNN_OPTS=0. oneDNN's
    float16 kernels on CPUs with AVX512-FP16 round far more (the update's
    cosine to float32's is 0.943 there, loss scaling or not)."""
    if os.environ.get('TF_ENABLE_ONEDNN_OPTS') != '0':
        out = subprocess.run(
            [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
             '-n', '0', request.node.nodeid], cwd=request.config.rootpath,
            capture_output=True, text=True, timeout=600,
            env=dict(os.environ, TF_ENABLE_ONEDNN_OPTS='0'))
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
        return
    batch = _batch()
    weights, reference, reference_logs = _float32_reference(batch)
    with precision('mixed_float16'):
        model = _model(tf_keras.mixed_precision.LossScaleOptimizer(
            lars.LARS(learning_rate=0.1), initial_scale=2 ** 30), weights)
        before = _trainables(model)
        kernels_before = _kernels(model)
        skipped = 0
        for _ in range(30):
            scale = float(model.optimizer.loss_scale)
            logs = tiny_model.run_steps(model, batch)
            if any(np.any(a != b) for a, b in
                   zip(before, _trainables(model))):
                break
            skipped += 1
            assert float(model.optimizer.loss_scale) == scale / 2
        update = _kernels(model) - kernels_before
    assert skipped >= 1
    assert logs['loss'].dtype == np.float32
    np.testing.assert_allclose(logs['cross_entropy'],
                               reference_logs['cross_entropy'], rtol=1e-2)
    _assert_close_update(update, reference, min_cosine=0.99,
                         max_relative=0.15)


def test_bfloat16_update_is_finite_and_close_to_float32():
    """Fails if the update under mixed_bfloat16 is 1.1 (or 1.6) times
    float32's: LARS's learning rate multiplied by 1.1 under that policy."""
    batch = _batch()
    weights, reference, reference_logs = _float32_reference(batch)
    with precision('mixed_bfloat16'):
        model = _model(lars.LARS(learning_rate=0.1), weights)
        before = _kernels(model)
        logs = tiny_model.run_steps(model, batch)
        update = _kernels(model) - before
    assert logs['loss'].dtype == np.float32
    np.testing.assert_allclose(logs['cross_entropy'],
                               reference_logs['cross_entropy'], rtol=3e-2)
    _assert_close_update(update, reference, min_cosine=0.85,
                         max_relative=0.6)


@pytest.mark.slow
def test_xla_train_step_equals_the_graph_train_step():
    """XLA fuses and reorders float32 arithmetic: ~1e-7 relative per op,
    grown ~150 times by the objective's conditioning (module docstring);
    batch-norm means near 0 get an absolute bound."""
    batch = _batch()
    results = []
    for jit_compile in (False, True):
        tf_keras.utils.set_random_seed(0)
        model = _model(lars.LARS(learning_rate=0.1), jit_compile=jit_compile)
        logs = tiny_model.run_steps(model, batch, steps=2)
        results.append((logs, model.get_weights()))
    (graph_logs, graph_weights), (xla_logs, xla_weights) = results
    for name in ('loss', 'cross_entropy', 'me_max', 'target_confidence'):
        np.testing.assert_allclose(xla_logs[name], graph_logs[name],
                                   rtol=1e-4, atol=1e-6, err_msg=name)
    for xla, graph in zip(xla_weights, graph_weights):
        np.testing.assert_allclose(xla, graph, rtol=1e-3, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize('policy', ['mixed_float16', 'mixed_bfloat16'])
def test_xla_mixed_precision_train_step_is_finite(policy):
    """The GPU setting (`--xla --precision bf16/fp16`) compiles and runs;
    float16 skips its first, overflowing steps (see above)."""
    with precision(policy):
        optimizer = lars.LARS(learning_rate=0.1)
        if policy == 'mixed_float16':
            optimizer = tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
        model = _model(optimizer, jit_compile=True)
        before = _kernels(model)
        logs = tiny_model.run_steps(model, _batch(), steps=4)
        after = _kernels(model)
    assert np.isfinite(logs['loss']) and np.all(np.isfinite(after))
    assert np.any(after != before)


@pytest.mark.slow
def test_two_replicas_without_prediction_head_gather_supports_once(
        two_replicas):
    """Without a prediction head h = z: the targets reuse the gathered
    z_S. The 2-replica update still equals the one-device update of the
    global batch (tolerance: tests/test_model.py). Fails if the targets
    read this replica's supports alone (tried: its z_S tiled in place of
    the gathered ones in `PAWSModel._forward`)."""
    batch, classes, images, views = 2, 2, 2, 2  # As tests/test_model.py.
    rng = np.random.default_rng(5)
    per_replica = [tiny_model.random_step(rng, batch, classes, images, views,
                                          MULTICROP, replica=r, num_replicas=2)
                   for r in range(2)]
    optimizer = lambda: tf_keras.optimizers.SGD(learning_rate=1.0)  # noqa
    # Batch norm is not what this checks: the CPU-tuned global one, whose
    # two-replica step traces in half the time of tf_keras' (tested
    # against it in tests/test_backbone_switches.py).
    make = lambda: tiny_model.make(  # noqa: E731
        sync_bn=True, prediction_head=False, sync_bn_impl=nets.CUSTOM)
    with two_replicas.scope():
        distributed = make()
        tiny_model.compile_and_build(distributed, optimizer=optimizer())
    single = make()
    tiny_model.compile_and_build(single, optimizer=optimizer())
    single.set_weights(distributed.get_weights())
    before = single.get_weights()
    values = two_replicas.experimental_distribute_values_from_function(
        lambda ctx: per_replica[ctx.replica_id_in_sync_group])
    tf.function(lambda d: two_replicas.run(distributed.train_step,
                                           args=(d,)))(values)
    tf.function(single.train_step)(tiny_model.single_device_batch(
        per_replica, views, classes, images, False, MULTICROP))
    for old, got, want in zip(before, distributed.get_weights(),
                              single.get_weights()):
        scale = np.abs(want - old).max()
        np.testing.assert_allclose(got - old, want - old, rtol=0,
                                   atol=2e-4 * scale + 1e-6)


def _tiny_pretrain_input(num_replicas):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, [32, 12, 12, 3], np.uint8)
    source = sources.from_arrays(images, np.arange(32) % 4)
    multicrop = augment.MultiCropConfig(
        global_size=8, global_scale=(0.5, 1.0), local_size=4,
        local_scale=(0.2, 0.5), num_local=MULTICROP, color_strength=0.5,
        blur_prob=0.0, mean=(0.5,) * 3, std=(0.25,) * 3)
    return pipeline.make_pretrain_dataset_fn(
        source, source, num_replicas=num_replicas,
        global_batch_size=BATCH * num_replicas, classes_per_step=CLASSES,
        images_per_class=IMAGES, multicrop=multicrop)


@pytest.mark.slow
def test_prefetch_to_device_feeds_each_replica_on_its_device(two_replicas):
    """`InputOptions(experimental_fetch_to_device=True)` (the default of
    `distribute_datasets_from_function` and of `DatasetCreator`) with a
    deeper per-replica buffer: every replica's batch sits on its device,
    and `fit` trains through it."""
    pretrain = _tiny_pretrain_input(num_replicas=2)
    options = tf.distribute.InputOptions(
        experimental_fetch_to_device=True,
        experimental_per_replica_buffer_size=2)
    element = next(iter(two_replicas.distribute_datasets_from_function(
        pretrain.dataset_fn, options)))
    for key in ('global_views', 'local_views', 'support_views'):
        devices = [tf.DeviceSpec.from_string(t.device)
                   for t in two_replicas.experimental_local_results(
                       element[key])]
        assert [(d.device_type, d.device_index) for d in devices] == [
            ('CPU', 0), ('CPU', 1)], key
    # The CPU-tuned global batch norm, as in the gather test above.
    with two_replicas.scope():
        model = tiny_model.make(sync_bn=True, sync_bn_impl=nets.CUSTOM)
        tiny_model.compile_and_build(model)
    history = model.fit(
        tf_keras.utils.experimental.DatasetCreator(pretrain.dataset_fn,
                                                   input_options=options),
        epochs=1, steps_per_epoch=2, verbose=0)
    assert np.all(np.isfinite(history.history['loss']))
