"""fine_tune: classifier, Nesterov SGD, sweep, SuNCEt protocol, outputs."""

import json
import math
import os

import gin
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from paws_tf import checks
from paws_tf.data import augment
from paws_tf.data import sources
from paws_tf.evaluation import fine_tune
from paws_tf.evaluation import linear_fine_tune
from paws_tf.evaluation import suncet_fine_tune
from paws_tf.evaluation import tuning
from paws_tf import lars
from paws_tf.nets import vit
from paws_tf import run_dir
from paws_tf.runner import vit_import
from tests.helpers import tiny_model

SIZE = 8
HID = 16  # Projection width: narrower heads often collapse under SuNCEt.
PRE = dict(image_size=SIZE, crop_fraction=1.0, mean=(0.5,) * 3,
           std=(0.25,) * 3)


def build_model(sync_bn=False, seed=None, init_seed=0, activation='relu'):
    """A tiny PAWSModel: Keras' seeded initialisation, or with `seed`, every
    weight random (BN statistics too); `activation`: the heads'."""
    tf_keras.utils.set_random_seed(init_seed)
    model = tiny_model.make(sync_bn=sync_bn, hidden=HID, width=HID,
                            activation=activation)
    model._encode(tf.zeros([1, SIZE, SIZE, 3]), training=False)
    if seed is None:
        return model
    rng = np.random.default_rng(seed)
    model.set_weights([
        rng.uniform(0.5, 2.0, w.shape) if 'variance' in v.name
        else rng.normal(0.0, 0.5, w.shape)
        for v, w in zip(model.weights, model.get_weights())])
    return model


def clustered(num_classes, per_class, seed, noise=40):
    """Images of one noisy colour per class: flip and crop invariant."""
    rng = np.random.default_rng(seed)
    colours = np.random.default_rng(123).uniform(
        40, 215, (num_classes, 1, 1, 3))
    labels = np.repeat(np.arange(num_classes), per_class)
    images = colours[labels] + rng.normal(
        0, noise, (len(labels), SIZE, SIZE, 3))
    return sources.from_arrays(np.clip(images, 0, 255).astype(np.uint8),
                               labels)


def calibrate_batch_norm(model, source, passes=40):
    """Moving statistics of the data, as pre-training would leave them."""
    images = np.stack([source.read(i) for i in range(source.num_examples)])
    images = (images / 255 - PRE['mean'][0]) / PRE['std'][0]
    encode = tf.function(lambda x: model._encode(x, training=True))
    for _ in range(passes):
        encode(tf.constant(images, tf.float32))


def weights_by_name(network):
    return {v.name: v.numpy() for v in network.weights}


# The heads' activations by hand: ReLU, and GELU's erf form.
ACTIVATIONS = {
    'relu': lambda x: np.maximum(x, 0),
    'gelu': lambda x: 0.5 * x * (
        1 + np.vectorize(math.erf)(x / math.sqrt(2))),
}


@pytest.mark.parametrize('activation', sorted(ACTIVATIONS))
def test_classifier_is_zero_initialised_on_fc1_bn1_and_activation(
        activation):
    """Fails if the GELU heads of the ViT recipe are refused (a check of
    the layer names for 'relu1' only), or if the classifier skips their
    activation."""
    model = build_model(seed=0, activation=activation)
    classifier = linear_fine_tune.build_classifier(model, 3)
    images = tf.random.stateless_normal([5, SIZE, SIZE, 3], [1, 2])
    logits = classifier(images, training=False)
    np.testing.assert_array_equal(logits, np.zeros([5, 3]))
    np.testing.assert_allclose(tf.nn.softmax(logits), 1 / 3, rtol=1e-7)

    # Its input is fc1 -> bn1 -> activation of the backbone features, by
    # hand.
    fc1, bn1 = model.projection_head.mlp_layers[:2]
    kernel, bias = fc1.get_weights()
    gamma, beta, mean, variance = bn1.get_weights()
    features = model.backbone(images, training=False).numpy()
    hidden = ACTIVATIONS[activation](
        gamma * (features @ kernel + bias - mean) /
        np.sqrt(variance + bn1.epsilon) + beta)
    rng = np.random.default_rng(0)
    head = [rng.normal(size=(HID, 3)), rng.normal(size=3)]
    classifier.get_layer('classifier').set_weights(head)
    np.testing.assert_allclose(classifier(images, training=False),
                               hidden @ head[0] + head[1],
                               rtol=1e-4, atol=1e-5)

    # Everything is trainable; the rest of the heads is not part of it.
    trainable = [v.name for v in classifier.trainable_weights]
    assert all('moving' in v.name for v in classifier.non_trainable_weights)
    assert trainable == [v.name for v in model.backbone.trainable_weights] + [
        'fc1/kernel:0', 'fc1/bias:0', 'bn1/gamma:0', 'bn1/beta:0',
        'classifier/kernel:0', 'classifier/bias:0']
    model_vars = {id(v) for v in model.weights}
    assert not any(id(v) in model_vars for v in classifier.weights)


def test_nesterov_step_matches_numpy_formula():
    """tf_keras SGD(nesterov=True) documents v <- mu v - lr g, w <- w + mu v
    - lr g; the optimizer has no weight decay; lr follows the cosine."""
    model = build_model()
    classifier = linear_fine_tune.build_classifier(model, 3)
    total, lr0, mu = 4, 0.1, 0.9
    optimizer = linear_fine_tune._optimizer(lr0, total, momentum=mu)
    assert optimizer.weight_decay is None and optimizer.nesterov
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    classifier.compile(optimizer=optimizer, loss=loss_fn)
    rng = np.random.default_rng(1)
    images = rng.normal(size=(6, SIZE, SIZE, 3)).astype(np.float32)
    labels = np.array([0, 1, 2, 0, 1, 2])
    weights = [v.numpy() for v in classifier.trainable_variables]
    velocity = [np.zeros_like(w) for w in weights]
    for step in range(2):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, classifier(images, training=True))
        grads = tape.gradient(loss, classifier.trainable_variables)
        lr = lr0 * 0.5 * (1 + math.cos(math.pi * step / total))
        for i, g in enumerate(grads):
            velocity[i] = mu * velocity[i] - lr * g.numpy()
            weights[i] = weights[i] + mu * velocity[i] - lr * g.numpy()
        classifier.fit(images, labels, batch_size=6, epochs=1, shuffle=False,
                       verbose=0)
        for w, v in zip(weights, classifier.trainable_variables):
            np.testing.assert_allclose(v.numpy(), w, rtol=1e-5, atol=1e-6,
                                       err_msg=f'step {step} {v.name}')
    # Step 0 moves only the zero-initialised layer; step 1 moves the rest.
    assert not np.allclose(classifier.trainable_variables[0].numpy(),
                           model.backbone.trainable_variables[0].numpy())


def test_classifier_of_an_imported_backbone_is_a_linear_layer_on_it():
    """An imported ViT backbone (`vit_import.BackboneEmbedder`, no heads):
    the ImageNet protocol's classifier is a copy of the backbone and a
    zero-initialised linear layer, whose logits are the features times
    its kernel plus its bias, by hand. Fails if the classifier wants the
    projection head the import does not have (tried: AttributeError)."""
    backbone = vit.build_vit('vit_tiny', patch_size=4, image_size=SIZE,
                             depth=1)
    classifier = linear_fine_tune.build_classifier(
        vit_import.BackboneEmbedder(backbone), 3)
    images = tf.random.stateless_normal([5, SIZE, SIZE, 3], [1, 2])
    np.testing.assert_array_equal(classifier(images), np.zeros([5, 3]))
    rng = np.random.default_rng(0)
    head = [rng.normal(size=(192, 3)), rng.normal(size=3)]
    classifier.get_layer('classifier').set_weights(head)
    features = backbone(images).numpy()  # [5, 192]
    np.testing.assert_allclose(classifier(images),
                               features @ head[0] + head[1],
                               rtol=1e-4, atol=1e-5)
    assert [v.name for v in classifier.trainable_weights] == [
        v.name for v in backbone.trainable_weights] + [
        'classifier/kernel:0', 'classifier/bias:0']
    backbone_vars = {id(v) for v in backbone.weights}
    assert not any(id(v) in backbone_vars for v in classifier.weights)


def test_split_holdout_is_stratified_disjoint_seeded():
    labels = np.repeat([0, 1, 2], [10, 20, 30])
    train, held = linear_fine_tune.split_holdout(labels, 12, seed=3)
    np.testing.assert_array_equal(np.bincount(labels[held]), [2, 4, 6])
    assert not set(train) & set(held)
    np.testing.assert_array_equal(np.sort(np.concatenate([train, held])),
                                  np.arange(60))
    _, again = linear_fine_tune.split_holdout(labels, 12, seed=3)
    _, other = linear_fine_tune.split_holdout(labels, 12, seed=4)
    np.testing.assert_array_equal(held, again)
    assert not np.array_equal(held, other)
    _, half = linear_fine_tune.split_holdout(labels, 0.5, seed=0)
    np.testing.assert_array_equal(np.bincount(labels[half]), [5, 10, 15])
    for bad in (0, 60, 1.0):
        with pytest.raises(ValueError, match='held-out images'):
            linear_fine_tune.split_holdout(labels, bad, seed=0)
    # Class 0 has one image; rounding would hold it out.
    with pytest.raises(ValueError, match=r'class\(es\) \[0\]'):
        linear_fine_tune.split_holdout(np.repeat([0, 1], [1, 9]), 5, seed=0)


@pytest.mark.slow
def test_sweep_selects_best_setting_and_writes_outputs(tmp_path):
    model = build_model()
    labeled, test = clustered(2, 16, seed=0), clustered(2, 6, seed=1)
    calibrate_batch_norm(model, labeled)
    before = weights_by_name(model)
    output_dir = str(tmp_path / 'fine_tune')
    log_dir = str(tmp_path / 'tensorboard')
    classifier, results = linear_fine_tune.fine_tune_linear(
        model, labeled, test, output_dir=output_dir, log_dir=log_dir, seed=5,
        learning_rates=(0.0, 0.1), epochs=(4,), holdout=0.25,
        global_batch_size=8, eval_batch_size=16, **PRE)
    # lr 0 keeps the zero classifier: every prediction is class 0.
    lr0, lr_pos = results['sweep']
    held = linear_fine_tune.split_holdout(labeled.labels, 0.25, seed=5)[1]
    assert lr0['top1'] == np.mean(labeled.labels[held] == 0) == 0.5
    assert lr_pos['top1'] >= 0.875
    assert results['best'] == {'learning_rate': 0.1, 'epochs': 4}
    assert results['top1'] >= 0.875 and results['num_train'] == 24
    assert results['holdout']['per_class'].tolist() == [4, 4]
    with open(os.path.join(output_dir,
                           linear_fine_tune.HOLDOUT_FILENAME)) as f:
        assert f.read().split() == [labeled.names[p] for p in held]
    with open(os.path.join(output_dir, run_dir.RESULTS_FILE)) as f:
        written = json.load(f)
    assert written['sweep'] == results['sweep']
    assert written['top1'] == results['top1']
    assert written['holdout']['per_class'] == [4, 4]
    assert sorted(os.listdir(log_dir)) == ['final', 'sweep']
    assert sorted(os.listdir(os.path.join(log_dir, 'sweep'))) == [
        'lr0.1_ep4', 'lr0_ep4']
    assert os.path.isdir(os.path.join(log_dir, 'final', 'train'))
    restored = linear_fine_tune.build_classifier(model, 2)
    restored.load_weights(os.path.join(output_dir,
                                       linear_fine_tune.CLASSIFIER_WEIGHTS))
    images = tf.random.stateless_normal([4, SIZE, SIZE, 3], [0, 1])
    np.testing.assert_allclose(restored(images), classifier(images),
                               rtol=1e-6)
    for name, value in weights_by_name(model).items():
        np.testing.assert_array_equal(value, before[name])


@pytest.mark.slow
def test_two_replica_steps_match_one_device(two_replicas):
    """Sync BN, global batch split over 2 replicas, Keras loss scaling."""
    model = build_model(sync_bn=True)
    source = clustered(2, 4, seed=2)
    train = dict(num_classes=2, learning_rate=0.2, epochs=2,
                 global_batch_size=8, image_size=SIZE, mean=PRE['mean'],
                 std=PRE['std'], crop_scale=(0.08, 1.0), momentum=0.9,
                 seed=1)
    one = linear_fine_tune._train_classifier(
        model, source, strategy=tf.distribute.get_strategy(), **train)
    two = linear_fine_tune._train_classifier(
        model, source, strategy=two_replicas, **train)
    assert two.optimizer.iterations.numpy() == 2
    start = linear_fine_tune.build_classifier(model, 2).get_weights()
    for v, w1, w2, w0 in zip(one.weights, one.get_weights(),
                             two.get_weights(), start):
        # Two steps, so the backbone moves too (step 0 has zero gradients
        # below the zero classifier). Same global batch, but float32 sums
        # in another order (two halves + all-reduce, in the sync-BN moments
        # and the gradients): measured differences are <= 2.4e-7, 2 ulp at
        # 1.0; the tolerance leaves 4x room.
        np.testing.assert_allclose(w2, w1, rtol=1e-5, atol=1e-6,
                                   err_msg=v.name)
        if v.trainable and v.name.endswith('kernel:0'):
            assert np.abs(w1 - w0).max() > 1e-4, v.name


def _identity_source(num_classes, per_class):
    """Image i is filled with value i, so a batch tells which images it has."""
    count = num_classes * per_class
    images = np.broadcast_to(np.arange(count, dtype=np.uint8)[:, None, None,
                                                               None],
                             (count, SIZE, SIZE, 3))
    labels = np.random.default_rng(0).permutation(
        np.repeat(np.arange(num_classes), per_class))
    return sources.from_arrays(np.ascontiguousarray(images), labels)


def test_suncet_batches_are_class_balanced_and_unique_within_a_step():
    labeled = _identity_source(5, 6)
    common = dict(num_steps=6, classes_per_step=3, images_per_class=4,
                  views=1, flip=False, image_size=SIZE, crop_fraction=1.0,
                  mean=(0.0,) * 3, std=(1.0,) * 3, seed=0)

    def batches(num_replicas, **overrides):
        dataset_fn = suncet_fine_tune._suncet_dataset_fn(
            labeled, num_replicas=num_replicas, **dict(common, **overrides))
        return [(np.round(x[:, 0, 0, 0] * 255).astype(int), y)
                for x, y in dataset_fn(tf.distribute.InputContext(
                    num_replicas_in_sync=num_replicas)).as_numpy_iterator()]

    seen = []
    for ids, classes in batches(1):
        assert len(ids) == 12 and len(set(ids)) == 12  # 3 classes x 4
        np.testing.assert_array_equal(classes, labeled.labels[ids])
        np.testing.assert_array_equal(classes, np.repeat(classes[::4], 4))
        assert len(set(classes)) == 3
        seen.extend(ids)
    assert len(set(seen)) < len(seen)  # With replacement across steps.
    # Two views: the same 12 images again, view-major, labels tiled.
    for (ids, classes), (two_ids, two_classes) in zip(batches(1),
                                                      batches(1, views=2)):
        np.testing.assert_array_equal(two_ids, np.tile(ids, 2))
        np.testing.assert_array_equal(two_classes, np.tile(classes, 2))
    # Two replicas: the same 3 classes, 2 images each per replica.
    per_replica = batches(2)
    assert len(per_replica) == 12
    for (ids_0, classes_0), (ids_1, classes_1) in zip(per_replica[::2],
                                                      per_replica[1::2]):
        np.testing.assert_array_equal(classes_0, classes_1)
        assert len(set(ids_0) | set(ids_1)) == 12
    with pytest.raises(ValueError, match='not divisible by the 2 replicas'):
        suncet_fine_tune._suncet_dataset_fn(
            labeled, num_replicas=2, **dict(common, images_per_class=3))
    with pytest.raises(ValueError,
                       match=r'fine_tune_suncet\.images_per_class'):
        suncet_fine_tune._suncet_dataset_fn(
            labeled, num_replicas=1, **dict(common, images_per_class=7))


def test_suncet_views_are_flipped_centre_crops():
    """suncet cifar10_fine_tune: CenterCrop + RandomHorizontalFlip, each
    view on its own coin."""
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (8, 12, 10, 3), np.uint8)
    labeled = sources.from_arrays(images, np.arange(8) % 2)
    kwargs = dict(image_size=SIZE, crop_fraction=0.75, mean=(0.5,) * 3,
                  std=(0.25,) * 3)
    dataset_fn = suncet_fine_tune._suncet_dataset_fn(
        labeled, num_steps=20, classes_per_step=2, images_per_class=2,
        views=2, flip=True, num_replicas=1, seed=0, **kwargs)
    centre = [augment.center_view(image, SIZE, **{
        k: kwargs[k] for k in ('crop_fraction', 'mean', 'std')}).numpy()
        for image in images]
    flips = []
    for views, classes in dataset_fn(None).as_numpy_iterator():
        assert views.shape == (8, SIZE, SIZE, 3)
        step = []
        for view, label in zip(views, classes):
            matches = [i for i, c in enumerate(centre)
                       if np.allclose(view, c, atol=1e-6)
                       or np.allclose(view, c[:, ::-1], atol=1e-6)]
            assert len(matches) == 1
            assert labeled.labels[matches[0]] == label
            step.append((matches[0], np.allclose(
                view, centre[matches[0]][:, ::-1], atol=1e-6)))
        # Rows 4-7 are the second views of the images of rows 0-3.
        assert [i for i, _ in step[:4]] == [i for i, _ in step[4:]]
        flips.append([flipped for _, flipped in step])
    flips = np.array(flips)  # [20 steps, 8 rows]
    assert 0.3 < flips.mean() < 0.7  # 160 coins of p = 0.5
    # The two views of an image are flipped independently.
    assert 0.3 < np.mean(flips[:, :4] != flips[:, 4:]) < 0.7


def test_suncet_optimizer_is_lars_wrapped_sgd_with_cosine_to_final_lr():
    """snn_fine_tune.py: SGD(momentum 0.9, no Nesterov, wd 0) in LARS(trust
    0.001, bias and BN excluded), lr 0.1 cosine to 0.01 over the run."""
    optimizer = suncet_fine_tune._suncet_optimizer(
        learning_rate=0.1, final_learning_rate=0.01, steps_per_epoch=6,
        num_epochs=30, momentum=0.9, lars=True, trust_coefficient=0.001)
    assert isinstance(optimizer, lars.LARS)
    assert (optimizer.momentum, optimizer.l2_weight_decay,
            optimizer.trust_coefficient) == (0.9, 0.0, 0.001)
    assert optimizer.exclude_from_adaptation('bn1/gamma:0')
    assert optimizer.exclude_from_adaptation('conv/bias:0')
    assert not optimizer.exclude_from_adaptation('conv/kernel:0')
    schedule = optimizer._learning_rate
    for step in (0, 45, 90, 179, 180):
        np.testing.assert_allclose(
            float(schedule(step)),
            0.01 + 0.09 * 0.5 * (1 + math.cos(math.pi * step / 180)),
            rtol=1e-5)
    plain = suncet_fine_tune._suncet_optimizer(
        learning_rate=0.1, final_learning_rate=0.01, steps_per_epoch=6,
        num_epochs=30, momentum=0.9, lars=False, trust_coefficient=0.001)
    assert isinstance(plain, tf_keras.optimizers.SGD)
    assert not plain.nesterov and plain.weight_decay is None


def _leaf_layers(model):
    """The layers of `model` that hold no other layer (a NormReLUThen of the
    backbone holds a batch norm and a convolution), in a fixed order."""
    return [layer for layer in model.submodules
            if isinstance(layer, tf_keras.layers.Layer)
            and not layer.submodules]


def test_suncet_protocol_through_the_entry_point(tmp_path, eval_batches):
    """Also fails if its PAWS-NN embeds at another batch than
    `PawsNN.batch_size` bound in gin (it passed its own 256 over it)."""
    model = build_model()
    before = weights_by_name(model)
    labeled = clustered(3, 8, seed=3)
    test = clustered(3, 8, seed=4)
    epochs, per_epoch = 3, 4
    with gin.unlock_config():
        gin.parse_config([
            f'fine_tune_suncet.num_epochs = {epochs}',
            f'fine_tune_suncet.steps_per_epoch = {per_epoch}',
            'fine_tune_suncet.classes_per_step = 3',
            'fine_tune_suncet.images_per_class = 4',
            'PawsNN.batch_size = 16'])
    try:
        results = fine_tune.fine_tune(run_dir.RunDir(tmp_path), model,
                                      labeled=labeled, test=test,
                                      protocol='cifar10', **PRE)
    finally:
        gin.clear_config()
    assert eval_batches == [16, 16]  # PawsNN's support and queries.
    steps = epochs * per_epoch
    assert results['steps'] == steps == len(results['loss'])
    np.testing.assert_allclose(
        results['learning_rate'],
        [0.01 + 0.09 * 0.5 * (1 + math.cos(math.pi * i / steps))
         for i in range(steps)], rtol=1e-5)  # float32 cosine
    loss = results['loss']
    assert np.mean(loss[-3:]) < np.mean(loss[:3])
    # PAWS-NN before (epoch 0) and after every epoch; the final model's is
    # the result, the best epoch is reported apart, as selected on test.
    by_epoch = results['paws_nn_by_epoch']
    assert [entry['epoch'] for entry in by_epoch] == [0, 1, 2, 3]
    assert results['top1'] == by_epoch[-1]['top1']
    assert results['paws_nn_before']['top1'] == by_epoch[0]['top1']
    best = max(entry['top1'] for entry in by_epoch)
    assert results['best_epoch_top1_selected_on_test'] == best
    assert by_epoch[results['best_epoch']]['top1'] == best
    # Noisy clusters that SuNCEt tightens: 0.42-0.75 -> 1.0 measured for
    # init seeds 0-5.
    assert (results['paws_nn_after']['top1']
            > results['paws_nn_before']['top1'])
    output_dir = tmp_path / 'fine_tune'
    with open(output_dir / run_dir.RESULTS_FILE) as f:
        written = json.load(f)
    assert written['paws_nn_after'] == results['paws_nn_after']
    assert written['paws_nn_by_epoch'] == by_epoch
    trunk = tuning.build_trunk(model)
    trunk.load_weights(str(output_dir / tuning.TRUNK_WEIGHTS))
    _, backbone, head = trunk.layers
    pairs = (list(zip(_leaf_layers(model.backbone),
                      _leaf_layers(backbone))) +
             list(zip(model.projection_head.mlp_layers, head.mlp_layers)))
    changed = []
    for original, tuned in pairs:
        for w0, w1, variable in zip(original.get_weights(),
                                    tuned.get_weights(), tuned.weights):
            if 'moving' in variable.name:
                # Batch norm in inference mode: statistics used, not moved.
                np.testing.assert_array_equal(w1, w0)
            else:  # Kernels, biases, and BN's gamma and beta: trained.
                changed.append((variable.name, not np.allclose(w1, w0)))
    assert len(changed) > 8 and all(moved for _, moved in changed), changed
    assert any('gamma' in name for name, _ in changed)
    for name, value in weights_by_name(model).items():
        np.testing.assert_array_equal(value, before[name])


def test_trunk_follows_the_nn_embedding():
    """With nn_embedding 'prediction' the trunk ends in the prediction
    head (snn_fine_tune.py with use_pred_head), else in the projection."""
    model = build_model(seed=1)
    images = tf.random.stateless_normal([3, SIZE, SIZE, 3], [4, 5])
    outputs = model(images, training=False)
    np.testing.assert_allclose(tuning.build_trunk(model)(images),
                               outputs['projection'], rtol=1e-5, atol=1e-6)
    model.nn_embedding = 'prediction'
    np.testing.assert_allclose(tuning.build_trunk(model)(images),
                               model(images)['prediction'], rtol=1e-5,
                               atol=1e-6)


def test_clear_errors_before_training(tmp_path, two_replicas):
    model = build_model()
    empty = sources.from_arrays(np.zeros([0, SIZE, SIZE, 3], np.uint8),
                                np.zeros([0], np.int64))
    labeled, test = clustered(2, 4, seed=0), clustered(2, 2, seed=1)
    kwargs = dict(run=run_dir.RunDir(tmp_path), model=model, test=test, **PRE)
    with pytest.raises(ValueError, match='labeled set is empty'):
        fine_tune.fine_tune(labeled=empty, **kwargs)
    with pytest.raises(ValueError, match='labeled set is empty'):
        fine_tune.fine_tune(labeled=empty, protocol='cifar10', **kwargs)
    with pytest.raises(ValueError,
                       match=r'fine_tune\.protocol must be one of'):
        fine_tune.fine_tune(labeled=labeled, protocol='x', **kwargs)
    with pytest.raises(ValueError, match='held-out images'):
        linear_fine_tune.fine_tune_linear(model, labeled, test, holdout=8,
                                          output_dir=str(tmp_path), **PRE)
    with pytest.raises(ValueError, match='not divisible by the 2 replicas'):
        linear_fine_tune.fine_tune_linear(
            model, labeled, test, holdout=2, global_batch_size=3,
            strategy=two_replicas, output_dir=str(tmp_path), **PRE)
    with pytest.raises(ValueError, match='fewer labeled images'):
        suncet_fine_tune.fine_tune_suncet(
            model, labeled, test, classes_per_step=2, images_per_class=8,
            output_dir=str(tmp_path), **PRE)
    with pytest.raises(ValueError, match=r'fine_tune_suncet\.views'):
        suncet_fine_tune.fine_tune_suncet(model, labeled, test, views=0,
                                          output_dir=str(tmp_path), **PRE)
    assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_best_epoch_keeps_the_epoch_of_best_validation_top1(tmp_path):
    """The official selection: one setting, validation after every epoch,
    the weights of the first epoch of best top-1 tested; a call without a
    validation set or with several settings is refused before its output
    directory is made.

    Fails if the refusal comes after `os.makedirs(output_dir)`."""
    model = build_model()
    labeled, test = clustered(2, 16, seed=0), clustered(2, 6, seed=1)
    validation = clustered(2, 5, seed=2)
    calibrate_batch_norm(model, labeled)
    output_dir = str(tmp_path / 'fine_tune')
    log_dir = str(tmp_path / 'tensorboard')
    classifier, results = linear_fine_tune.fine_tune_linear(
        model, labeled, test, output_dir=output_dir, log_dir=log_dir, seed=5,
        selection='best_epoch', validation=lambda: validation,
        learning_rates=(0.1,), epochs=(3,), global_batch_size=8,
        eval_batch_size=16, **PRE)
    by_epoch = results['validation_top1_by_epoch']
    assert len(by_epoch) == 3
    assert results['best_epoch'] == 1 + int(np.argmax(by_epoch))
    # The classifier left is the best epoch's: its validation top-1 is the
    # best, counted here by hand.
    images = np.stack([validation.read(i) for i in range(10)])
    images = (images / 255 - PRE['mean'][0]) / PRE['std'][0]
    predicted = np.argmax(classifier(images.astype(np.float32)), 1)
    assert np.mean(predicted == validation.labels) == max(by_epoch)
    assert results['num_train'] == 32 and results['num_validation'] == 10
    with open(os.path.join(output_dir, run_dir.RESULTS_FILE)) as f:
        assert json.load(f)['best_epoch'] == results['best_epoch']
    for kwargs, match in (
            (dict(validation=None), 'needs a validation set'),
            (dict(validation=lambda: validation, epochs=(3, 4)),
             'trains one setting')):
        with pytest.raises(ValueError, match=match):
            linear_fine_tune.fine_tune_linear(
                model, labeled, test, output_dir=str(tmp_path / 'refused'),
                selection='best_epoch', **{'learning_rates': (0.1,),
                                           'epochs': (3,), **kwargs}, **PRE)
        assert not os.path.exists(tmp_path / 'refused')


def test_linear_global_batch_the_replicas_do_not_divide_is_named(
        two_replicas):
    """fine_tune_linear.global_batch_size = 3 on 2 replicas is refused
    before any image is read, as a ConfigError naming that binding and a
    value that works. Caught: the checks.per_replica call dropped from
    `_checked_classes` (no error: each replica would take 1 of 3)."""
    with pytest.raises(checks.ConfigError, match=(
            r'^fine_tune_linear\.global_batch_size=3 is not divisible by '
            r'the 2 replicas: use a multiple of 2\.$')):
        linear_fine_tune._checked_classes(
            clustered(2, 4, seed=0), two_replicas, 3, (0.1,), (1,), 'sweep',
            None)


def test_suncet_images_per_class_the_replicas_do_not_divide_is_named():
    """fine_tune_suncet.images_per_class = 3 on 2 replicas is refused when
    the input is built, as a ConfigError naming that binding and a value
    that works. Caught: the checks.per_replica call replaced by
    `images_per_class // num_replicas` (no error: 2 of the 3 images a
    class)."""
    with pytest.raises(checks.ConfigError, match=(
            r'^fine_tune_suncet\.images_per_class=3 is not divisible by '
            r'the 2 replicas: use a multiple of 2\.$')):
        suncet_fine_tune._suncet_dataset_fn(
            _identity_source(5, 6), num_steps=1, classes_per_step=2,
            images_per_class=3, views=1, flip=False, num_replicas=2,
            image_size=SIZE, crop_fraction=1.0, mean=(0.0,) * 3,
            std=(1.0,) * 3, seed=0)


def test_fine_tuning_views_are_traced_once_per_setting():
    """The fine-tuning views of one setting run one traced
    `augment.view_function`, however many pipelines and fine-tunings take
    them (each trace is seconds of start-up). Caught: `views_dataset_fn`
    calling `augment.make_view` inline (the cached function never traced,
    every pipeline tracing its own)."""
    setting = dict(size=SIZE, scale=(0.5, 1.0), mean=(0.5,) * 3,
                   std=(0.25,) * 3, color_strength=0.3, blur_prob=0.0)
    for seed in (0, 1):
        dataset_fn = tuning.views_dataset_fn(
            clustered(2, 4, seed=0), 4, 2, seed, (7, 8),
            **dict(setting, scale=list(setting['scale'])))
        for replica in range(2):
            next(iter(dataset_fn(tf.distribute.InputContext(
                2, replica, 2))))
    # Keyed by value, not by the keywords' order nor list against tuple.
    view = augment.view_function(distortion='simclr', **dict(
        reversed(setting.items()), mean=list(setting['mean'])))
    assert view.experimental_get_tracing_count() == 1
