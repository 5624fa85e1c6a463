"""Wiring of the training input and step, checked against what the pixels
and a closed-form encoder say: same-image views, support rows against their
classes, epoch coverage of the unlabeled stream, the global-view target swap,
and `train()` in each shipped precision."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from paws_tf import model as model_lib
from paws_tf.data import augment
from paws_tf.data import pipeline
from paws_tf.data import sources
from paws_tf.runner import train
from tests.helpers import debug_gin

SIZE = 16  # Side of the synthetic images.
LABELED_BASE = 100  # Labeled image i shows id LABELED_BASE + i.


def _id_images(ids):
    """uint8 [N, 16, 16, 3]: channel 0 is the image's id everywhere (so
    every crop, flip and resize of it shows the id), channels 1 and 2 are
    horizontal and vertical ramps (so two crops of one image differ)."""
    ramp = np.linspace(0, 255, SIZE).round().astype(np.uint8)
    images = np.zeros([len(ids), SIZE, SIZE, 3], np.uint8)
    images[..., 0] = np.asarray(ids, np.uint8)[:, None, None]
    images[..., 1] = ramp[None, None, :]
    images[..., 2] = ramp[None, :, None]
    return images


def _multicrop(num_local=2):
    # No colour distortion or blur, mean 0 and std 1: a view's channel 0 is
    # its image's id / 255 exactly, up to float rounding.
    return augment.MultiCropConfig(
        global_size=8, global_scale=(0.3, 1.0), local_size=4,
        local_scale=(0.1, 0.3), num_local=num_local, color_strength=0.0,
        blur_prob=0.0, mean=(0.0,) * 3, std=(1.0,) * 3)


def _decode(views):
    """Image ids of views [N, h, w, 3] from their constant channel 0."""
    ids = views[..., 0] * 255.0
    assert np.abs(ids - ids[:, :1, :1]).max() < 1e-3
    return np.rint(ids[:, 0, 0]).astype(np.int64)


def _sources(num_unlabeled=48, labels=None):
    labels = (np.arange(48) * 5 % 6 if labels is None else
              np.asarray(labels))  # Classes interleaved with the ids.
    unlabeled = sources.from_arrays(_id_images(np.arange(num_unlabeled)))
    labeled = sources.from_arrays(
        _id_images(LABELED_BASE + np.arange(len(labels))), labels)
    return unlabeled, labeled


def _pretrain(num_replicas=2, num_unlabeled=48, **kwargs):
    kwargs = {'global_batch_size': 8, 'classes_per_step': 2,
              'images_per_class': 3, 'multicrop': _multicrop(),
              'support_views': 2, 'seed': 7, **kwargs}
    unlabeled, labeled = _sources(num_unlabeled)
    return pipeline.make_pretrain_dataset_fn(
        unlabeled, labeled, num_replicas=num_replicas, **kwargs)


def _elements(pretrain, count, pipelines=1, pipeline_id=0, replicas=2):
    """The first `count` elements one input pipeline hands out, as the
    trainer's DatasetCreator gets them (InputContext -> dataset)."""
    context = tf.distribute.InputContext(pipelines, pipeline_id, replicas)
    return [{k: v.numpy() for k, v in element.items()}
            for element in pretrain.dataset_fn(context).take(count)]


# --- the unlabeled views ----------------------------------------------------

@pytest.fixture(scope='module')
def default_stream():
    """`_pretrain()`'s first 24 elements on one input pipeline (2 epochs
    of 6 steps on 2 replicas), read once for the tests that read them."""
    return _elements(_pretrain(), 24)


@pytest.mark.slow
def test_global_and_local_views_of_a_row_come_from_one_image(default_stream):
    batch = 4  # 8 images per step on 2 replicas.
    for element in default_stream[:6]:
        first, second = np.split(element['global_views'], 2)
        ids = _decode(first)
        assert len(set(ids)) == batch
        np.testing.assert_array_equal(_decode(second), ids)
        for local in np.split(element['local_views'], 2):  # m = 2
            np.testing.assert_array_equal(_decode(local), ids)
        # Two crops of one image, not one view twice.
        assert not np.allclose(first[..., 1:], second[..., 1:])


@pytest.mark.slow
@pytest.mark.parametrize('pipelines,num_unlabeled', [(1, 48), (2, 50)])
def test_unlabeled_stream_covers_every_image_once_per_epoch(
        pipelines, num_unlabeled, request):
    """Over the replicas of every input pipeline (workers), an epoch's
    steps show each image once; 50 images in batches of 8 drop 2 per
    epoch, and the next epoch is another order."""
    replicas, steps_per_epoch = 2, num_unlabeled // 8
    pretrain = _pretrain(num_unlabeled=num_unlabeled)
    assert pretrain.steps_per_epoch == steps_per_epoch
    per_pipeline = replicas // pipelines
    if (pipelines, num_unlabeled) == (1, 48):  # `_pretrain()`'s 2 epochs.
        streams = [request.getfixturevalue('default_stream')]
    else:
        streams = [_elements(pretrain, 2 * steps_per_epoch * per_pipeline,
                             pipelines, p, replicas)
                   for p in range(pipelines)]
    epochs = []
    for epoch in range(2):
        ids = []
        for step in range(epoch * steps_per_epoch,
                          (epoch + 1) * steps_per_epoch):
            for stream in streams:
                for local in range(per_pipeline):
                    views = stream[step * per_pipeline + local]
                    ids.extend(_decode(np.split(views['global_views'],
                                                2)[0]))
        assert len(ids) == steps_per_epoch * 8
        assert len(set(ids)) == len(ids)  # Nothing twice in an epoch.
        assert set(ids) <= set(range(num_unlabeled))
        epochs.append(ids)
    if num_unlabeled % 8 == 0:  # Then every image, in each epoch.
        assert set(epochs[0]) == set(epochs[1]) == set(range(num_unlabeled))
    assert epochs[0] != epochs[1]


# --- the supports -----------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize('unique', [False, True])
def test_each_support_row_shows_an_image_of_its_class(unique):
    """The label a support row carries is its image's class; the rows a
    step gathers over the replicas share a label-matrix column exactly
    when their images share a class."""
    _, labeled = _sources()
    classes = labeled.labels
    replicas = 2
    pretrain = _pretrain(classes_per_step=4 if unique else 2,
                         unique_classes_per_replica=unique)
    elements = _elements(pretrain, 3 * replicas)
    for step in range(3):
        gathered, columns = [], []
        for replica in range(replicas):
            element = elements[step * replicas + replica]
            ids = _decode(element['support_views']) - LABELED_BASE
            np.testing.assert_array_equal(classes[ids],
                                          element['support_labels'])
            first, second = np.split(ids, 2)  # V = 2 views of each image
            np.testing.assert_array_equal(first, second)
            gathered.extend(ids)
            # The label-matrix column the row carries to the model.
            columns.extend(element['support_one_hot'].argmax(axis=1))
        assert len(set(gathered)) == len(gathered) // 2  # Distinct images.
        true_class = classes[np.asarray(gathered)]
        columns = np.asarray(columns)
        same_column = columns[:, None] == columns[None, :]
        np.testing.assert_array_equal(
            same_column, true_class[:, None] == true_class[None, :])


# --- the step ---------------------------------------------------------------

def _np_sharpen(p, temperature):
    p = p ** (1.0 / temperature)
    return p / p.sum(axis=1, keepdims=True)


def _np_snn(query, supports, labels, tau):
    query = query / np.linalg.norm(query, axis=1, keepdims=True)
    supports = supports / np.linalg.norm(supports, axis=1, keepdims=True)
    logits = query @ supports.T / tau
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    return weights / weights.sum(axis=1, keepdims=True) @ labels


def _np_paws_loss(anchors, targets, supports, labels, *, batch, multicrop,
                  tau, sharpen_temperature):
    """suncet `src/losses.py` `init_paws_loss` in float64: cross-entropy of
    the anchors' predictions against the sharpened targets (the local views
    against the mean of the two global targets) plus me-max."""
    probs = _np_snn(anchors, supports, labels, tau)
    sharp = _np_sharpen(_np_snn(targets, supports, labels, tau),
                        sharpen_temperature)
    local = 0.5 * (sharp[:batch] + sharp[batch:])
    sharp = np.concatenate([sharp] + [local] * multicrop)
    sharp[sharp < 1e-4] = 0.0
    cross_entropy = np.mean(np.sum(-sharp * np.log(probs), axis=1))
    average = _np_sharpen(probs, sharpen_temperature).mean(axis=0)
    return cross_entropy + np.sum(average * np.log(average))


def test_first_global_view_learns_from_the_second_views_targets():
    """PAWS Sec. 3 (suncet `paws_train.py`): the targets of view 1 are the
    sharpened predictions of view 2 and vice versa. A linear encoder
    (channel means times a fixed matrix, no prediction head: h = z) gives
    the embeddings in closed form; `train_step`'s loss must be the float64
    loss with swapped targets, which differs from the unswapped one."""
    batch, classes, images, multicrop = 3, 2, 2, 2
    tau, temperature, smoothing = 0.1, 0.25, 0.1
    rng = np.random.default_rng(0)
    kernel = rng.normal(size=[3, 4])
    model = model_lib.PAWSModel(
        tf_keras.layers.GlobalAveragePooling2D(),
        tf_keras.layers.Dense(4, use_bias=False,
                              kernel_initializer=tf_keras.initializers
                              .Constant(kernel)),
        tau=tau, sharpen_temperature=temperature,
        label_smoothing=smoothing, diagnostics_every=0)
    model.compile(optimizer=tf_keras.optimizers.SGD(learning_rate=0.0))
    f32 = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa
    data = {'global_views': f32(2 * batch, 4, 4, 3),
            'local_views': f32(multicrop * batch, 2, 2, 3),
            'support_views': f32(classes * images, 4, 4, 3)}
    embed = {key: views.astype(np.float64).mean(axis=(1, 2)) @ kernel
             for key, views in data.items()}
    data['support_one_hot'] = np.eye(classes, dtype=np.float32).repeat(
        images, axis=0)
    data['support_view_index'] = np.zeros(classes * images, np.int32)
    labels = np.full([classes * images, classes], smoothing / classes)
    labels[np.arange(classes * images),
           np.repeat(np.arange(classes), images)] += 1.0 - smoothing
    view_1, view_2 = np.split(embed['global_views'], 2)
    anchors = np.concatenate([embed['global_views'], embed['local_views']])
    settings = dict(supports=embed['support_views'], labels=labels,
                    batch=batch, multicrop=multicrop, tau=tau,
                    sharpen_temperature=temperature)
    swapped = _np_paws_loss(anchors, np.concatenate([view_2, view_1]),
                            **settings)
    unswapped = _np_paws_loss(anchors, embed['global_views'], **settings)
    assert abs(swapped - unswapped) > 0.05  # The test can tell them apart.

    logs = model.train_step(data)
    np.testing.assert_allclose(float(logs['loss']), swapped, rtol=1e-5)


# --- train() in each shipped precision --------------------------------------

# debug.gin on 96 images: 3 steps per epoch, 2 epochs, nothing but training.
_FEW_STEPS = ['train/synthetic_source.num_images = 96', 'train.num_epochs = 2',
              'train.verbose = 0', 'train.eval_every_epochs = 0',
              'train.view_images = False', 'train.backup_every_steps = 100',
              'train.checkpoint_every_steps = 0']


def _epoch_losses(model_dir, precision):
    try:
        with debug_gin.parsed(_FEW_STEPS +
                              [f"train.precision = '{precision}'"]):
            model = train.train(str(model_dir), tf.distribute.get_strategy())
    finally:
        tf_keras.mixed_precision.set_global_policy('float32')
    assert int(model.optimizer.iterations.numpy()) == 6
    assert model.backbone.compute_dtype == (
        'float16' if precision == 'mixed_float16' else 'float32')
    return {key: np.array(model.history.history[key])
            for key in ('loss', 'cross_entropy', 'me_max')}


@pytest.mark.slow
def test_train_in_mixed_float16_follows_float32(tmp_path):
    """The shipped configs train in float32 (demo, debug, own images) or
    mixed_float16 (CIFAR-10, ImageNet); the same six steps give epoch
    losses close to float32's.

    float16 rounds to 2^-11 relative; 1/tau = 10 on the similarities and
    1/T = 4 in the sharpening amplify that, and the updates then start from
    slightly different gradients. Measured: |difference| 2e-4 in the first
    epoch's losses and 1.3e-3 in the second's, on a cross-entropy of ~1.4
    and a me-max of ~-1.36. atol 5e-3 leaves ~4x of that, and is well below
    the 0.12 that one epoch of updates lowers the loss by, so skipped or
    wrong float16 steps fail.
    """
    reference = _epoch_losses(tmp_path / 'float32', 'float32')
    mixed = _epoch_losses(tmp_path / 'float16', 'mixed_float16')
    for key in reference:
        assert np.isfinite(mixed[key]).all()
        np.testing.assert_allclose(mixed[key], reference[key], rtol=0,
                                   atol=5e-3, err_msg=key)
