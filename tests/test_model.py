"""PAWSModel: distributed equivalence, collapse, learning, inference."""

import gin
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from paws_tf import adamw
from paws_tf import lars
from paws_tf import losses
from paws_tf import model as model_lib
from paws_tf import nets
from paws_tf.nets import heads
from paws_tf import schedules
from tests.helpers import tiny_model
from tests.test_losses import np_labels


def _one_step_each(two_replicas, views, unique, optimizer_fn,
                   backbone='small_resnet', sync_bn_impl=nets.KERAS,
                   multicrop=2):
    """One train_step on 2 replicas and on one device, same global batch,
    the model's batch norms synchronised by `sync_bn_impl` (the custom
    one's two-replica step traces in about half the time of tf_keras').

    `multicrop` local views per image: each is another forward pass (and
    another synchronisation of every batch norm) to trace.

    Returns (names, before, distributed_after, single_after) weight lists.
    The weights are seeded: the float32 error against the callers'
    tolerances depends on the draw, most of all for the last bias before
    the L2 normalisation. One support view, unique classes: over seeds 0-29
    the worst error was 0.49 of the tolerance, 0.03 with seed 0; an unseeded
    run once reached 1.8.
    """
    tf_keras.utils.set_random_seed(0)
    batch, classes, images = 2, 2, 2
    rng = np.random.default_rng(0)
    per_replica = [tiny_model.random_step(rng, batch, classes, images, views,
                                          multicrop, replica=r, num_replicas=2,
                                          unique=unique) for r in range(2)]
    with two_replicas.scope():
        distributed = tiny_model.make(sync_bn=True, backbone=backbone,
                                      sync_bn_impl=sync_bn_impl)
        tiny_model.compile_and_build(distributed, optimizer=optimizer_fn())
    # Same BN math on one device (fused BN would apply Bessel's correction
    # to the moving variance, synchronised BN does not).
    single = tiny_model.make(sync_bn=True, backbone=backbone,
                             sync_bn_impl=sync_bn_impl)
    tiny_model.compile_and_build(single, optimizer=optimizer_fn())
    single.set_weights(distributed.get_weights())
    before = [w.copy() for w in single.get_weights()]

    data = two_replicas.experimental_distribute_values_from_function(
        lambda ctx: per_replica[ctx.replica_id_in_sync_group])
    tf.function(lambda d: two_replicas.run(distributed.train_step,
                                           args=(d,)))(data)
    tf.function(single.train_step)(tiny_model.single_device_batch(
        per_replica, views, classes, images, unique, multicrop))
    return ([w.name for w in single.weights], before,
            distributed.get_weights(), single.get_weights())


@pytest.mark.slow
@pytest.mark.parametrize('views,unique,backbone,sync_bn_impl,multicrop', [
    (1, True, 'small_resnet', nets.KERAS, 0),
    (2, False, 'small_resnet', nets.CUSTOM, 2),
    pytest.param(1, True, 'vit_tiny', nets.KERAS, 2,
                 marks=pytest.mark.long)])
def test_mirrored_gradient_equals_single_device_gradient(
        two_replicas, views, unique, backbone, sync_bn_impl, multicrop):
    """Sync BN (each implementation) + gathered supports + all-reduced
    me-max + loss / R: the summed replica gradients equal the one-device
    gradient of the global batch. Plain SGD (update = -lr * gradient) so a
    scale error shows. The ViT (layer norms, no batch norm in the trunk)
    with 4-px patches of the 8-px and 4-px views, its position embeddings
    resampled for the latter (12 s on 2 cores). tf_keras' batch norm
    without local views: each view's pass synchronises every batch norm
    again (two fifths of the case's time); the custom one's case has them.

    Fails if the replica's loss is not divided by the number of replicas
    (`PAWSModel.train_step`: the summed update doubles), and, for the ViT,
    if its attention's softmax runs across the batch (axis 0 in
    `vit.scaled_dot_product_attention`), which a replica's half of the
    batch computes otherwise."""
    names, before, got, want = _one_step_each(
        two_replicas, views, unique,
        lambda: tf_keras.optimizers.SGD(learning_rate=1.0), backbone,
        sync_bn_impl, multicrop)
    steps = [(new_d - old, new_s - old)
             for old, new_d, new_s in zip(before, got, want)]
    largest = max(np.abs(step_s).max() for _, step_s in steps)
    for name, (step_d, step_s) in zip(names, steps):
        scale = np.abs(step_s).max()
        # float32 sums in another order: ~1e-5 of a variable's step, up to
        # 1e-4 through the BN backward passes, and, for biases right before
        # a BN (true gradient 0), noise of ~1e-6 of the model's largest step.
        np.testing.assert_allclose(step_d, step_s, rtol=0,
                                   atol=2e-4 * scale + 1e-5 * largest,
                                   err_msg=name)
        if 'moving' not in name and name.endswith(('kernel:0', 'gamma:0')):
            assert scale > 1e-3, name  # Every layer got a real gradient.


@pytest.mark.slow
@pytest.mark.parametrize('views,unique', [(2, False)])
def test_mirrored_lars_update_equals_single_device_update(two_replicas, views,
                                                          unique):
    """LARS on 2 replicas updates as on one device. Batch norm is not
    what this checks: the custom synchronised one (the gradient test
    above checks both). Fails if the replica's loss is not divided by
    the number of replicas (the non-adapted biases and norms step twice
    as far)."""
    names, _, got, want = _one_step_each(
        two_replicas, views, unique,
        lambda: lars.LARS(learning_rate=0.05, trust_coefficient=0.1,
                          weight_decay=1e-3), sync_bn_impl=nets.CUSTOM)
    # Most weights agree to 1e-6; the last bias before the L2 normalisation
    # has gradients of ~1e4 at initialisation (|z| is small) and its update
    # carries float32 reduction-order noise of up to ~1e-4 relative.
    for name, new_d, new_s in zip(names, got, want):
        np.testing.assert_allclose(new_d, new_s, rtol=2e-4, atol=1e-5,
                                   err_msg=name)


def test_collapsed_encoder_gives_uniform_predictions_and_escapes_near_it():
    """Prop. 1 at the model level.

    With the prediction head's output collapsed to a constant vector b, every
    anchor prediction is exactly uniform while the (projection-based) targets
    are sharpened and not uniform. Exactly at collapse every cosine
    similarity is 1, where its derivative vanishes, so the gradient w.r.t.
    the representations is zero (measured: < 1e-5); Prop. 1's non-zero
    gradient is w.r.t. the predictions (tests/test_losses.py). From a nearly
    collapsed state (b plus 1e-3 of the input-dependent part) the gradient is
    non-zero, and descending it spreads the representations and lowers the
    loss: collapse is not an attractor.
    """
    batch, classes, images = 4, 3, 2
    tf_keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    data = tiny_model.random_step(rng, batch, classes, images, 1, 0)
    model = tiny_model.make(label_smoothing=0.0, me_max_weight=0.0)
    tiny_model.compile_and_build(model)
    final = model.prediction_head.mlp_layers[-1]
    kernel = final.kernel.numpy()
    final.bias.assign(rng.normal(size=final.bias.shape))

    def loss_and_grad():
        with tf.GradientTape() as tape:
            loss, terms, z_global, *_ = model._forward(data, training=True)
        return loss, terms, z_global, tape.gradient(loss, final.kernel)

    def min_cosine(z):
        z = tf.math.l2_normalize(z, axis=1)
        return float(tf.reduce_min(tf.matmul(z, z, transpose_b=True)))

    final.kernel.assign(tf.zeros_like(kernel))  # Exact collapse: z = b.
    _, terms, _, grad = loss_and_grad()
    np.testing.assert_allclose(tf.exp(terms.log_probs), 1.0 / classes,
                               rtol=1e-5)
    global_targets = terms.targets[:2 * batch].numpy()
    assert global_targets.max() > 1.0 / classes + 0.05  # Sharpened, not flat.
    assert float(tf.norm(grad)) < 1e-5

    final.kernel.assign(1e-3 * kernel)  # Nearly collapsed.
    start_loss, _, z_global, grad = loss_and_grad()
    assert min_cosine(z_global) > 0.9999
    assert float(tf.norm(grad)) > 1e-4
    step = 0.05 * float(tf.norm(kernel))
    for _ in range(30):
        loss, _, z_global, grad = loss_and_grad()
        final.kernel.assign_sub(step * grad / tf.norm(grad))
    loss, _, z_global, _ = loss_and_grad()
    # Over initialisation seeds 0-4: min cosine 0.94 .. -0.99, loss falls by
    # 0.02 .. 0.75 (from 1.0986 = log 3).
    assert min_cosine(z_global) < 0.99
    assert float(loss) < float(start_loss) - 0.01


@pytest.mark.parametrize('nn_embedding', ['projection', 'prediction'])
def test_call_returns_features_projection_prediction_and_nn_embeddings(
        nn_embedding):
    model = tiny_model.make(nn_embedding=nn_embedding)
    tiny_model.compile_and_build(model)
    images = np.random.default_rng(2).normal(size=(3, 8, 8, 3))
    out = model(images)
    assert set(out) == {'features', 'projection', 'prediction', 'embeddings'}
    assert out['features'].shape == (3, 16)
    features = model.backbone(images, training=False)
    projection = model.projection_head(features, training=False)
    np.testing.assert_allclose(out['features'], features, rtol=1e-6)
    np.testing.assert_allclose(out['projection'], projection, rtol=1e-6)
    np.testing.assert_allclose(
        out['prediction'], model.prediction_head(projection, training=False),
        rtol=1e-6)
    np.testing.assert_array_equal(out['embeddings'], out[nn_embedding])
    without_head = tiny_model.make(prediction_head=False)
    assert set(without_head(images)) == {'features', 'projection',
                                         'embeddings'}


def test_prediction_embedding_needs_a_prediction_head():
    with pytest.raises(ValueError, match=r'build_model\.prediction_head'):
        tiny_model.make(prediction_head=False,
                        nn_embedding='prediction')
    with pytest.raises(ValueError, match=r'PAWSModel\.nn_embedding'):
        tiny_model.make(nn_embedding='features')


def test_test_step_does_not_update_anything():
    model = tiny_model.make()
    tiny_model.compile_and_build(model)
    data = tiny_model.random_step(np.random.default_rng(3), 2, 2, 2, 1, 2)
    before = [w.copy() for w in model.get_weights()]
    logs = model.test_step(data)
    assert {'loss', 'cross_entropy', 'me_max', 'target_confidence'} <= set(logs)
    for old, new in zip(before, model.get_weights()):
        np.testing.assert_array_equal(old, new)
    assert int(model.optimizer.iterations) == 0


def test_train_step_metrics_match_the_objective():
    model = tiny_model.make(diagnostics_every=1)
    tiny_model.compile_and_build(model, learning_rate=0.3)
    data = tiny_model.random_step(np.random.default_rng(4), 2, 2, 2, 1, 2)
    loss, terms, z_global, z_support, _ = model._forward(data, training=True)
    stats_names = ('trust_ratio_mean', 'trust_ratio_min', 'trust_ratio_max')
    logs = tf.function(model.train_step)(data)
    np.testing.assert_allclose(logs['loss'], loss, rtol=1e-5)
    np.testing.assert_allclose(logs['cross_entropy'], terms.cross_entropy,
                               rtol=1e-5)
    np.testing.assert_allclose(logs['learning_rate'], 0.3)
    view_1, view_2 = tf.split(z_global, 2)
    np.testing.assert_allclose(
        logs['nt_xent'], losses.nt_xent_loss(view_1, view_2, 0.1), rtol=1e-5)
    np.testing.assert_allclose(
        logs['suncet'], losses.suncet_loss(
            z_support, np_labels(2, 2, smoothing=0.1), 0.1), rtol=1e-5)
    stats = model.optimizer.trust_ratio_stats()
    for name in stats_names:
        np.testing.assert_allclose(logs[name], stats[name.split('_')[-1]])
    assert logs['trust_ratio_min'] <= logs['trust_ratio_max']
    assert 'weight_decay' not in logs  # AdamW's.


def test_build_model_from_gin():
    gin.clear_config()
    try:
        gin.parse_config([
            "build_backbone.name = 'small_resnet'",
            'small_resnet.widths = (8, 16)',
            'small_resnet.blocks_per_stage = (1, 1)',
            'small_resnet.stage_strides = (2, 2)',
            'ProjectionHead.hidden_dim = 8',
            'ProjectionHead.output_dim = 6',
            'PredictionHead.hidden_dim = 3',
            'PAWSModel.tau = 0.2',
        ])
        model = model_lib.build_model(input_channels=1, sync_bn=False)
        h, z = model._encode(tf.zeros([2, 8, 8, 1]), training=False)
    finally:
        gin.clear_config()
    assert model.tau == 0.2
    assert h.shape == (2, 6) and z.shape == (2, 6)
    assert model.prediction_head.mlp_layers[1].units == 3


def test_logged_learning_rate_is_the_one_each_step_used():
    model = tiny_model.make()
    schedule = schedules.WarmupCosineDecay(steps_per_epoch=2, num_epochs=3,
                                           start_lr=0.1, ref_lr=1.0,
                                           final_lr=0.0, warmup_epochs=1)
    tiny_model.compile_and_build(model, learning_rate=schedule)
    data = tiny_model.random_step(np.random.default_rng(5), 2, 2, 2, 1, 2)
    step = tf.function(model.train_step)
    # Warm-up over 2 steps, then cosine over 4: closed-form values.
    want = [0.1, 0.55, 1.0, 0.5 * (1 + np.cos(np.pi / 4)),
            0.5 * (1 + np.cos(np.pi / 2))]
    for value in want:
        np.testing.assert_allclose(step(data)['learning_rate'], value,
                                   rtol=1e-5, atol=1e-7)


def test_the_step_logs_what_the_running_optimizer_has():
    """With AdamW and its cosine weight decay, the step logs the learning
    rate and the weight decay each update used (closed forms: warm-up then
    cosine; DINO's cosine from 0.04 to 0.4 over the 6 updates), and no
    trust ratios (LARS's: test_train_step_metrics_match_the_objective).

    Fails if the weight decay logged is the next update's (tried:
    `applied_weight_decay` at `iterations`, not `iterations - 1`), or if
    AdamW's log carries LARS's trust ratios (zeros)."""
    model = tiny_model.make()
    schedule = schedules.WarmupCosineDecay(steps_per_epoch=2, num_epochs=3,
                                           start_lr=0.1, ref_lr=1.0,
                                           final_lr=0.0, warmup_epochs=1)
    tiny_model.compile_and_build(model, optimizer=adamw.AdamW(
        schedule, weight_decay=0.04, final_weight_decay=0.4))
    data = tiny_model.random_step(np.random.default_rng(5), 2, 2, 2, 1, 2)
    step = tf.function(model.train_step)
    learning_rates = [0.1, 0.55, 1.0, 0.5 * (1 + np.cos(np.pi / 4))]
    for t, learning_rate in enumerate(learning_rates):
        logs = step(data)
        np.testing.assert_allclose(logs['learning_rate'], learning_rate,
                                   rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(
            logs['weight_decay'],
            0.4 + 0.5 * (0.04 - 0.4) * (1 + np.cos(np.pi * t / 6)),
            rtol=1e-6)
        assert not set(model_lib.TRUST_RATIOS) & set(logs)


def test_fit_refuses_a_dataset_that_keras_would_split_across_replicas(
        two_replicas):
    """Under two replicas, `fit` of a `tf.data.Dataset` of PAWS elements
    (each one replica's, global views ordered by view) is refused naming
    DatasetCreator; the DatasetCreator of the same element trains. Fails
    if the dataset is let through (tried: Keras split each element
    between the replicas, one holding the first views and the other the
    second, and training ran on wrong pairs without an error)."""
    data = tiny_model.random_step(np.random.default_rng(0), batch=2,
                                  classes=2, images=1, views=1, multicrop=0)
    with two_replicas.scope():
        model = tiny_model.make()
        tiny_model.compile_and_build(model)
    dataset = tf.data.Dataset.from_tensors(data).repeat()
    with pytest.raises(ValueError, match=(
            r'fit was given a tf\.data\.Dataset under a strategy of 2 '
            r'replicas, .*DatasetCreator\(pretrain\.dataset_fn\)')):
        model.fit(dataset, steps_per_epoch=1, verbose=0)
    model.fit(tf_keras.utils.experimental.DatasetCreator(
        lambda context: dataset), steps_per_epoch=1, verbose=0)
    assert model.optimizer.iterations.numpy() == 1


@pytest.mark.parametrize('backbone,got', [
    (lambda: tf_keras.Sequential([tf_keras.layers.Conv2D(4, 3)]),
     r'\(2, 6, 6, 4\)'),
    (lambda: tf_keras.Sequential([tf_keras.layers.Lambda(
        lambda x: {'features': tf.reduce_mean(x, [1, 2])})]), 'dict')])
def test_a_backbone_without_pooled_features_is_named(backbone, got):
    """A user's backbone that returns feature maps, or a dict, is refused
    naming the [N, F] it must return. Fails without the check (tried: the
    feature maps reached the projection head and the loss, whose error
    was TensorFlow's 'Dimension 0 in both shapes must be equal'; a dict
    ended in `KeyError: -1`)."""
    model = model_lib.PAWSModel(backbone(), heads.ProjectionHead(
        hidden_dim=4, output_dim=4))
    with pytest.raises(ValueError, match=(
            rf'The backbone must return \[N, F\] features, got {got}: end it '
            r'with a pooling layer')):
        model(np.zeros([2, 8, 8, 3], np.float32))


def test_fit_of_other_data_than_the_pretraining_input_is_named():
    """Fails if `fit` of an evaluation dataset's (images, labels) goes on
    into the step (tried: 'tuple indices must be integers or slices, not
    str' at `data['support_views']`)."""
    model = tiny_model.make()
    tiny_model.compile_and_build(model)
    dataset = tf.data.Dataset.from_tensors(
        (np.zeros([2, 8, 8, 3], np.float32), np.zeros([2], np.int32)))
    with pytest.raises(ValueError, match=(
            r'PAWSModel trains on the elements of make_pretrain_dataset_fn\('
            r'\.\.\.\)\.dataset_fn .*got tuple')):
        model.fit(dataset.repeat(), steps_per_epoch=1, verbose=0)
