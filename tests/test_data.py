"""Input pipelines: support sampler, unlabeled stream, distribution, eval."""

import dataclasses

import gin
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from paws_tf.data import augment
from paws_tf.data import pipeline
from paws_tf.data import sampling
from paws_tf.data import sources
from paws_tf.data import tfds_sources

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


def _multicrop(num_local=2):
    return augment.MultiCropConfig(
        global_size=12, global_scale=(0.5, 1.0), local_size=6,
        local_scale=(0.2, 0.5), num_local=num_local, color_strength=0.5,
        blur_prob=0.5, mean=MEAN, std=STD)


def _source(num_images=48, num_classes=6, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, [num_images, 16, 16, 3], np.uint8)
    return sources.from_arrays(images, np.arange(num_images) % num_classes)


def _build(num_replicas=2, unlabeled=None, labeled=None, **kwargs):
    kwargs = {'global_batch_size': 8, 'classes_per_step': 2,
              'images_per_class': 3, 'multicrop': _multicrop(),
              'support_views': 2, **kwargs}
    labeled = labeled or _source()
    return pipeline.make_pretrain_dataset_fn(
        unlabeled or labeled, labeled, num_replicas=num_replicas, **kwargs)


def _elements(pretrain, count, pipelines=1, pipeline_id=0, replicas=2):
    context = tf.distribute.InputContext(pipelines, pipeline_id, replicas)
    dataset = pretrain.dataset_fn(context).take(count)
    return [{k: v.numpy() for k, v in element.items()} for element in dataset]


def test_pipeline_errors():
    with pytest.raises(ValueError, match='make_pretrain_dataset_fn[.]'
                       'global_batch_size=9 is not '
                       'divisible by the 2 replicas'):
        _build(global_batch_size=9)
    with pytest.raises(ValueError, match='48 images, fewer than '
                       'global_batch_size=64'):
        _build(global_batch_size=64)
    with pytest.raises(ValueError, match='labeled set is empty'):
        _build(labeled=_source().subset([]), unlabeled=_source())
    gray = sources.from_arrays(np.zeros([48, 4, 4], np.uint8))
    with pytest.raises(ValueError, match='labeled images have 3 channels, '
                       'the unlabeled ones 1'):
        _build(unlabeled=gray)
    with pytest.raises(ValueError, match='strategy has 4 replicas'):
        _build().dataset_fn(tf.distribute.InputContext(1, 0, 4))


def test_pipeline_replicas_are_each_pipelines_contiguous_share():
    # Pipeline p of P holds replicas p R / P to (p + 1) R / P - 1.
    for pipelines, pipeline_id, replicas, expected in (
            (1, 0, 2, (0, 2)), (2, 1, 4, (2, 2)), (4, 3, 4, (3, 1))):
        context = tf.distribute.InputContext(pipelines, pipeline_id,
                                             replicas)
        assert pipeline.pipeline_replicas(context, replicas) == expected
    assert pipeline.pipeline_replicas(None, 3) == (0, 3)
    with pytest.raises(ValueError, match='num_replicas=3 is not divisible '
                       'by the 2 input pipelines'):
        pipeline.pipeline_replicas(tf.distribute.InputContext(2, 0, 3), 3)


@pytest.mark.slow
def test_element_spec_and_summary():
    pretrain = _build(unique_classes_per_replica=True)
    spec = pretrain.dataset_fn(None).element_spec
    assert spec == {
        'global_views': tf.TensorSpec([8, 12, 12, 3], tf.float32),
        'local_views': tf.TensorSpec([8, 6, 6, 3], tf.float32),
        'support_views': tf.TensorSpec([6, 12, 12, 3], tf.float32),
        'support_labels': tf.TensorSpec([6], tf.int32),
        'support_one_hot': tf.TensorSpec([6, 2], tf.float32),
        'support_view_index': tf.TensorSpec([6], tf.int32)}
    assert pretrain.steps_per_epoch == 6
    assert '2 label columns' in pretrain.summary
    assert '1 classes x 3 images x 2 view(s)' in pretrain.summary
    assert pretrain.views_per_step == 8 * (2 + 2) + 2 * (2 * 1 * 3)
    no_local = _build(multicrop=_multicrop(num_local=0), support_views=1,
                      support_view_size=8)
    spec = no_local.dataset_fn(None).element_spec
    assert 'local_views' not in spec
    assert spec['support_views'].shape == (6, 8, 8, 3)


@pytest.fixture(scope='module')
def unique_stream():
    """A pipeline of 4 classes per step, disjoint over its 2 replicas, 2
    images each, and its first 6 elements (3 steps), read once for the
    tests that read them."""
    pretrain = _build(unique_classes_per_replica=True, classes_per_step=4,
                      images_per_class=2)
    return pretrain, _elements(pretrain, 6)


def test_pipeline_support_labels_follow_sampler_round_robin(unique_stream):
    sampler = sampling.SupportSampler(
        np.arange(48) % 6, classes_per_step=4, images_per_class=2,
        num_replicas=2, unique_classes_per_replica=True, seed=0)
    for i, element in enumerate(unique_stream[1]):
        _, class_ids, _ = sampler(i // 2, i % 2)
        np.testing.assert_array_equal(element['support_labels'],
                                      np.tile(class_ids.numpy(), 2))


@pytest.mark.parametrize('unique', [False, True])
def test_support_rows_carry_their_columns_and_views(unique, request):
    # 4 classes per step over 2 replicas, 2 images, 2 views: replica r's
    # rows are [view 0 | view 1] blocks of class-major slots, slot k in
    # column r*2 + k (disjoint classes) or k (shared classes).
    if unique:
        elements = request.getfixturevalue('unique_stream')[1][:4]
    else:
        elements = _elements(_build(unique_classes_per_replica=False,
                                    classes_per_step=4, images_per_class=2),
                             4)
    # Steps 0 and 1 of replicas 0, 1.
    k = 2 if unique else 4
    for i, element in enumerate(elements):
        first = (i % 2) * k if unique else 0
        columns = np.tile(np.repeat(first + np.arange(k), 2), 2)
        np.testing.assert_array_equal(element['support_one_hot'],
                                      np.eye(4)[columns])
        np.testing.assert_array_equal(element['support_view_index'],
                                      np.repeat([0, 1], 2 * k))
    for step in range(2):  # One class per column over the two replicas.
        pairs = {(c, label) for e in elements[2 * step:2 * step + 2]
                 for c, label in zip(e['support_one_hot'].argmax(1),
                                     e['support_labels'])}
        assert len(pairs) == len({c for c, _ in pairs}) == 4


def test_each_view_setting_is_traced_once_per_process():
    """The views of one size and scale run one traced function, which a
    rebuild (a resumed run) reuses: tracing and optimising every view
    again cost seconds of each training process's start-up. Bugs caught:
    `multicrop_views` or `_support` calling `make_view` inline (a
    function never traced), `view_function` not cached (a new one each
    build)."""
    # A colour strength of its own: no other test traced these functions.
    multicrop = dataclasses.replace(_multicrop(), color_strength=0.25)
    for start_step in (0, 3):
        _build(multicrop=multicrop, support_view_size=10,
               start_step=start_step).dataset_fn(None)
    for size, scale in ((12, (0.5, 1.0)), (6, (0.2, 0.5)), (10, (0.5, 1.0))):
        view = multicrop.view_function(size, scale)
        assert view.experimental_get_tracing_count() == 1, (size, scale)


@pytest.mark.slow
def test_support_layout_survives_nondeterministic_runs():
    pretrain = _build(deterministic=False, images_per_class=4)
    for element in _elements(pretrain, 8):
        slots = element['support_labels'].reshape(2, 2, 4)  # [V, K, n]
        assert (slots == slots[:, :, :1]).all()
        np.testing.assert_array_equal(slots[0], slots[1])


def _assert_same(elements, others):
    assert len(elements) == len(others)
    for element, other in zip(elements, others):
        assert element.keys() == other.keys()
        for key in element:
            np.testing.assert_array_equal(element[key], other[key])


@pytest.fixture(scope='module')
def default_stream():
    """The first 16 elements of `_build()`'s pipeline (2 replicas: 8
    steps), built once for the tests that read that stream."""
    return _elements(_build(), 16)


@pytest.mark.slow
def test_same_seed_same_stream_other_seed_differs(default_stream):
    first, again = default_stream[:4], _elements(_build(), 4)
    _assert_same(first, again)
    other = _elements(_build(seed=1), 4)
    for key in ('global_views', 'local_views', 'support_views'):
        assert not np.array_equal(first[0][key], other[0][key])


@pytest.mark.slow
def test_start_step_resumes_exactly_across_an_epoch_boundary(default_stream):
    # 48 images / 8 = 6 steps per epoch; steps 4..7 cross into epoch 1.
    resumed = _elements(_build(start_step=4), 8)
    _assert_same(resumed, default_stream[8:])


def _global_batch(elements, step, replicas):
    """Step's global views as [2, G, ...] from its per-replica elements."""
    parts = [elements[step * replicas + r]['global_views']
             for r in range(replicas)]
    return np.concatenate([np.stack(np.split(p, 2)) for p in parts], axis=1)


@pytest.mark.slow
def test_global_unlabeled_batch_is_replica_count_invariant(default_stream):
    one = _elements(_build(num_replicas=1, classes_per_step=2), 3, replicas=1)
    two = default_stream[:6]  # `_build(num_replicas=2)`'s.
    four = _elements(_build(num_replicas=4, images_per_class=2), 12,
                     replicas=4)
    for step in range(3):
        expected = _global_batch(one, step, 1)
        np.testing.assert_array_equal(_global_batch(two, step, 2), expected)
        np.testing.assert_array_equal(_global_batch(four, step, 4), expected)


@pytest.mark.slow
def test_each_pipeline_serves_its_own_replicas():
    pretrain = _build(num_replicas=4, unique_classes_per_replica=True,
                      classes_per_step=4, images_per_class=2)
    single = _elements(pretrain, 8, replicas=4)
    second = _elements(pretrain, 4, pipelines=2, pipeline_id=1, replicas=4)
    _assert_same(second, [single[i] for i in (2, 3, 6, 7)])


@pytest.mark.slow
def test_mirrored_strategy_hands_elements_round_robin(two_replicas,
                                                     unique_stream):
    strategy = two_replicas
    pretrain, expected = unique_stream
    iterator = iter(strategy.distribute_datasets_from_function(
        pretrain.dataset_fn))

    @tf.function
    def step(batch):
        return strategy.run(
            lambda x: (x['support_labels'], x['global_views']), args=(batch,))

    for s in range(3):
        labels, views = step(next(iterator))
        labels = strategy.experimental_local_results(labels)
        views = strategy.experimental_local_results(views)
        for replica in range(2):
            element = expected[2 * s + replica]
            np.testing.assert_array_equal(labels[replica],
                                          element['support_labels'])
            np.testing.assert_array_equal(views[replica],
                                          element['global_views'])


@pytest.mark.slow
def test_streamed_unlabeled_source(tmp_path):
    data_dir = str(tmp_path / 'tfds')
    with tfds.testing.mock_data(num_examples=20, data_dir=data_dir):
        labeled, unlabeled = tfds_sources.imagenet_sources(
            labeled_subset='1pct', cache_dir=str(tmp_path / 'cache'),
            data_dir=data_dir, shuffle_buffer=8)
        pretrain = pipeline.make_pretrain_dataset_fn(
            unlabeled, labeled, num_replicas=2, global_batch_size=4,
            classes_per_step=2, images_per_class=1, multicrop=_multicrop(),
            unique_classes_per_replica=True)
        first = _elements(pretrain, 4)
        again = _elements(pretrain, 4)
    assert pretrain.steps_per_epoch == 5
    assert first[0]['global_views'].shape == (4, 12, 12, 3)
    assert first[0]['support_views'].shape == (1, 12, 12, 3)
    _assert_same(first, again)


def test_eval_dataset_in_order_with_remainder():
    images = np.random.default_rng(0).integers(0, 256, [10, 9, 7, 3],
                                                np.uint8)
    source = sources.from_arrays(images, labels=np.arange(10))
    kwargs = {'crop_fraction': 0.875, 'mean': MEAN, 'std': STD}
    batches = list(pipeline.make_eval_dataset(source, batch_size=4,
                                              image_size=5, **kwargs))
    assert [len(labels) for _, labels in batches] == [4, 4, 2]
    labels = np.concatenate([labels for _, labels in batches])
    np.testing.assert_array_equal(labels, np.arange(10))
    views = np.concatenate([views for views, _ in batches])
    assert views.shape == (10, 5, 5, 3) and views.dtype == np.float32
    for image, view in zip(images, views):
        np.testing.assert_allclose(
            augment.center_view(image, 5, **kwargs), view, atol=1e-6)
    labeled = source.subset([7, 2, 9])
    batches = list(pipeline.make_eval_dataset(labeled, batch_size=2,
                                              image_size=5, **kwargs))
    np.testing.assert_array_equal(
        np.concatenate([labels for _, labels in batches]), [7, 2, 9])


def test_eval_dataset_refuses_a_normalisation_off_the_0_1_scale():
    """Fails if ImageNet's 0-255 statistics are taken as given: every view
    then came out about 255 times too small, with no error."""
    source = sources.from_arrays(np.zeros([2, 6, 6, 3], np.uint8), [0, 1])
    with pytest.raises(ValueError, match="make_eval_dataset's mean and "
                                         "std: .* not on the pixels' 0-1"):
        pipeline.make_eval_dataset(
            source, batch_size=2, image_size=4, crop_fraction=1.0,
            mean=(123.675, 116.28, 103.53), std=(58.395, 57.12, 57.375))


def test_the_input_takes_its_sizes_from_gin():
    gin.clear_config()
    try:
        gin.parse_config([
            'make_pretrain_dataset_fn.global_batch_size = 16',
            'make_pretrain_dataset_fn.classes_per_step = 3',
            'make_pretrain_dataset_fn.images_per_class = 2',
        ])
        source = _source()
        pretrain = pipeline.make_pretrain_dataset_fn(
            source, source, num_replicas=1, multicrop=_multicrop())
        spec = pretrain.dataset_fn(None).element_spec
    finally:
        gin.clear_config()
    assert pretrain.steps_per_epoch == 3
    assert spec['support_labels'].shape == (6,)

