"""SavedModel exports: reloaded here and in a TensorFlow-only subprocess."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from paws_tf.data import augment
from paws_tf.evaluation import export
from tests.helpers import tiny_model

SIZE, CROP = 16, 0.875
PREPROCESSING = dict(image_size=SIZE, crop_fraction=CROP,
                     mean=augment.CIFAR10_MEAN, std=augment.CIFAR10_STD,
                     channels=3)
CLASS_NAMES = ('cat', 'dog', 'emu', 'yak', 'ant', 'bee')


def raw_images(shape, seed=0):
    return np.random.default_rng(seed).integers(0, 256, shape, np.uint8)


def center_views(images, channels=3, mean=augment.CIFAR10_MEAN,
                 std=augment.CIFAR10_STD):
    """The evaluation preprocessing, one image at a time (the reference)."""
    return tf.stack([augment.center_view(image, SIZE, crop_fraction=CROP,
                                         mean=mean, std=std)
                     for image in images])


def numpy_snn(query, supports, labels, num_classes, tau):
    q = query / np.linalg.norm(query, axis=1, keepdims=True)
    s = supports / np.linalg.norm(supports, axis=1, keepdims=True)
    logits = q @ s.T / tau
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    return weights @ np.eye(num_classes)[labels]


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
    """A tiny model, its embedder and classifier exports and the supports."""
    root = tmp_path_factory.mktemp('exports')
    model = tiny_model.build(size=SIZE)
    support_images = center_views(raw_images([12, 20, 20, 3], seed=1))
    supports = model(support_images)['embeddings'].numpy()
    labels = np.arange(12) % len(CLASS_NAMES)
    export.export_embedder(model, str(root / 'embedder'), **PREPROCESSING)
    export.export_classifier(
        model, str(root / 'classifier'), support_embeddings=supports,
        support_labels=labels, class_names=CLASS_NAMES, tau=0.1,
        **PREPROCESSING)
    return dict(model=model, root=root, supports=supports, labels=labels,
                embedder=tf.saved_model.load(str(root / 'embedder')),
                classifier=tf.saved_model.load(str(root / 'classifier')))


@pytest.mark.slow
def test_embedder_takes_raw_images_of_any_size(exported):
    loaded = exported['embedder']
    images = raw_images([3, 40, 36, 3])  # Non-square, not the model size.
    expected = exported['model'](center_views(images))
    for outputs in (loaded.signatures['serving_default'](images=images),
                    loaded(images)):
        assert set(outputs) == {'features', 'projection', 'prediction',
                                'embeddings'}
        for key in outputs:
            np.testing.assert_allclose(outputs[key], expected[key],
                                       rtol=1e-5, atol=1e-5)
    assert outputs['features'].shape == [3, 16]
    assert outputs['embeddings'].shape == [3, 6]


def test_embed_preprocessed_equals_the_keras_model(exported):
    loaded = exported['embedder']
    views = center_views(raw_images([5, 17, 23, 3]))
    outputs = loaded.signatures['embed_preprocessed'](images=views)
    expected = exported['model'](views)
    np.testing.assert_allclose(outputs['embeddings'], expected['embeddings'],
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outputs['features'], expected['features'],
                               rtol=1e-5, atol=1e-5)


def test_preprocessing_is_stored_in_the_model_and_beside_it(exported):
    path = str(exported['root'] / 'embedder')
    loaded = exported['embedder']
    assert int(loaded.image_size.numpy()) == SIZE
    assert int(loaded.channels.numpy()) == 3
    np.testing.assert_allclose(loaded.crop_fraction.numpy(), CROP)
    np.testing.assert_allclose(loaded.mean.numpy(), augment.CIFAR10_MEAN)
    np.testing.assert_allclose(loaded.std.numpy(), augment.CIFAR10_STD)
    stored = export.read_preprocessing(path)
    with open(os.path.join(path, 'preprocessing.json')) as f:
        assert json.load(f) == stored
    assert stored['image_size'] == SIZE and stored['channels'] == 3
    np.testing.assert_allclose(stored['mean'], augment.CIFAR10_MEAN)
    assert stored['signatures'] == ['embed_preprocessed', 'serving_default']
    assert stored['embedding'] == 'projection'  # The model's nn_embedding.


def test_prediction_embedding_is_exported_and_classified(tmp_path):
    """With nn_embedding 'prediction' the exports' `embeddings` and the
    classifier's PAWS-NN use the prediction head's output (the official
    ImageNet PAWS-NN), and preprocessing.json says so."""
    model = tiny_model.build(size=SIZE)
    model.nn_embedding = 'prediction'
    support_views = center_views(raw_images([12, 20, 20, 3], seed=1))
    supports = model(support_views)['prediction'].numpy()
    labels = np.arange(12) % len(CLASS_NAMES)
    export.export_embedder(model, str(tmp_path / 'embedder'),
                           **PREPROCESSING)
    export.export_classifier(
        model, str(tmp_path / 'classifier'), support_embeddings=supports,
        support_labels=labels, class_names=CLASS_NAMES, tau=0.1,
        **PREPROCESSING)
    images = raw_images([4, 20, 20, 3], seed=2)
    expected = model(center_views(images))
    embedder = tf.saved_model.load(str(tmp_path / 'embedder'))
    outputs = embedder(images)
    np.testing.assert_allclose(outputs['embeddings'], expected['prediction'],
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outputs['projection'], expected['projection'],
                               rtol=1e-5, atol=1e-5)
    assert not np.allclose(expected['prediction'], expected['projection'])
    probabilities = tf.saved_model.load(str(tmp_path / 'classifier'))(
        images)['probabilities']
    np.testing.assert_allclose(
        probabilities, numpy_snn(expected['prediction'].numpy(), supports,
                                 labels, len(CLASS_NAMES), 0.1),
        rtol=1e-4, atol=1e-6)
    for name in ('embedder', 'classifier'):
        assert export.read_preprocessing(
            str(tmp_path / name))['embedding'] == 'prediction'


def test_classifier_is_paws_nn_over_the_bundled_supports(exported):
    loaded = exported['classifier']
    images = raw_images([7, 36, 40, 3], seed=2)
    queries = exported['model'](center_views(images))['embeddings'].numpy()
    expected = numpy_snn(queries, exported['supports'], exported['labels'],
                         len(CLASS_NAMES), tau=0.1)
    outputs = loaded.signatures['serving_default'](images=images)
    np.testing.assert_allclose(outputs['probabilities'], expected,
                               rtol=1e-4, atol=1e-6)
    class_ids = outputs['class_ids'].numpy()
    np.testing.assert_array_equal(class_ids, expected.argmax(axis=1))
    assert [n.decode() for n in outputs['class_names'].numpy()] == [
        CLASS_NAMES[i] for i in class_ids]
    np.testing.assert_array_equal(outputs['top5_class_ids'],
                                  np.argsort(-expected, axis=1)[:, :5])
    assert [n.decode() for n in loaded.head.class_names.numpy()] == list(
        CLASS_NAMES)
    info = export.read_preprocessing(str(exported['root'] / 'classifier'))
    assert info['num_support'] == 12 and info['num_classes'] == 6


_SUBPROCESS = textwrap.dedent('''
    import sys
    import numpy as np
    import tensorflow as tf
    root, images = sys.argv[1], np.load(sys.argv[2])
    embedder = tf.saved_model.load(root + '/embedder')
    classifier = tf.saved_model.load(root + '/classifier')
    np.savez(sys.argv[3], embeddings=embedder(images)['embeddings'].numpy(),
             probabilities=classifier.signatures['serving_default'](
                 images=images)['probabilities'].numpy())
    assert not [m for m in sys.modules if m.split('.')[0] in (
        'paws_tf', 'tf_keras')], 'imported paws_tf or tf_keras'
''')


def test_exports_load_in_a_fresh_process_with_tensorflow_only(exported,
                                                              tmp_path):
    images = raw_images([4, 40, 36, 3], seed=3)
    np.save(tmp_path / 'images.npy', images)
    env = {k: v for k, v in os.environ.items()
           if k not in ('PYTHONPATH', 'TF_USE_LEGACY_KERAS')}
    run = subprocess.run(
        [sys.executable, '-c', _SUBPROCESS, str(exported['root']),
         str(tmp_path / 'images.npy'), str(tmp_path / 'out.npz')],
        cwd=tmp_path, env=dict(env, TF_CPP_MIN_LOG_LEVEL='2'),
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    out = np.load(tmp_path / 'out.npz')
    queries = exported['model'](center_views(images))['embeddings'].numpy()
    np.testing.assert_allclose(out['embeddings'], queries, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(
        out['probabilities'],
        numpy_snn(queries, exported['supports'], exported['labels'],
                  len(CLASS_NAMES), tau=0.1), rtol=1e-4, atol=1e-6)


RAW_EXPECTED = 'images must be uint8 [N, H, W, C=3]'


@pytest.mark.parametrize('bad, problem', [
    (raw_images([40, 36, 3]), 'got shape] [40 36 3]'),
    (raw_images([2, 40, 36, 1]), 'got shape] [2 40 36 1]'),
    (raw_images([1, 2, 40, 36, 3]), 'got shape] [1 2 40 36 3]'),
])
@pytest.mark.parametrize('entry', ['signature', 'module'])
def test_bad_shapes_fail_with_a_readable_message(exported, bad, problem,
                                                 entry):
    loaded = exported['embedder']
    call = (loaded if entry == 'module' else
            lambda x: loaded.signatures['serving_default'](images=x))
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        call(bad)
    assert RAW_EXPECTED in str(error.value)
    assert problem in str(error.value)


@pytest.mark.parametrize('dtype', [np.float32, np.float64, np.int64])
def test_module_call_rejects_other_dtypes(exported, dtype):
    loaded = exported['embedder']
    images = raw_images([2, 20, 20, 3]).astype(dtype) / 255
    for bad in (images, tf.constant(images)):
        with pytest.raises(tf.errors.InvalidArgumentError) as error:
            loaded(bad)
        assert f'{RAW_EXPECTED}: a batch of raw images with pixel values ' \
            f'0-255; got {tf.as_dtype(images.dtype).name}' in str(error.value)


def test_signature_rejects_float_tensors(exported):
    """TF checks signature dtypes before our function runs; its message
    names the expected dtype. (TF converts NumPy arrays passed to a
    signature to uint8 first: `loaded(images)` rejects those.)"""
    loaded = exported['embedder']
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match='expected to be a uint8 tensor but is a float'):
        loaded.signatures['serving_default'](images=tf.zeros([2, 20, 20, 3]))


def test_embed_preprocessed_rejects_other_sizes(exported):
    loaded = exported['embedder']
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r'images must be float32 \[N, 16, 16, C=3\], '
                             r'preprocessed like pipeline.make_eval_dataset; '
                             r'got shape\] \[2 20 16 3\]'):
        loaded.signatures['embed_preprocessed'](images=tf.zeros([2, 20, 16,
                                                                   3]))


def test_grayscale_export_from_a_mirrored_model(two_replicas, tmp_path):
    with two_replicas.scope():
        model = tiny_model.build(channels=1, size=SIZE)
    export.export_embedder(model, str(tmp_path), image_size=SIZE,
                           crop_fraction=CROP, mean=[0.5], std=[0.25],
                           channels=1, strategy=two_replicas)
    loaded = tf.saved_model.load(str(tmp_path))
    images = raw_images([2, 28, 30, 1])
    expected = model(center_views(images, mean=[0.5], std=[0.25]))
    np.testing.assert_allclose(loaded(images)['embeddings'],
                               expected['embeddings'], rtol=1e-5, atol=1e-5)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r'uint8 \[N, H, W, C=1\]'):
        loaded(raw_images([2, 28, 30, 3]))


def test_inconsistent_arguments_are_rejected(exported, tmp_path):
    """Each refused before the save traces. Caught: the channels check made
    inside the traced `tf.map_fn`, whose error left `map_fn`'s caching device
    on the process's variable scope, so every later model built in that
    process failed ("Caching devices is not yet supported ...")."""
    model, supports = exported['model'], exported['supports']
    with pytest.raises(ValueError, match=r'gives 1 channel\(s\) .* '
                                         'decoded to 3'):
        export.export_embedder(model, str(tmp_path), image_size=SIZE,
                               crop_fraction=CROP, mean=[0.5], std=[0.5],
                               channels=3)
    # ImageNet's statistics on the 0-255 scale: the export then served
    # images normalised about 255 times too little, with no error.
    with pytest.raises(ValueError, match="preprocessing: mean .* not on "
                                         "the pixels' 0-1 scale"):
        export.export_embedder(
            model, str(tmp_path), image_size=SIZE, crop_fraction=CROP,
            mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
            channels=3)
    with pytest.raises(ValueError, match=r'must be in \[0, 6\)'):
        export.export_classifier(
            model, str(tmp_path), support_embeddings=supports,
            support_labels=np.full(12, 6), class_names=CLASS_NAMES, tau=0.1,
            **PREPROCESSING)
    with pytest.raises(ValueError, match='support_labels has shape'):
        export.export_classifier(
            model, str(tmp_path), support_embeddings=supports,
            support_labels=[0, 1], class_names=CLASS_NAMES, tau=0.1,
            **PREPROCESSING)
    assert tf.compat.v1.get_variable_scope().caching_device is None


def test_a_model_without_embeddings_is_refused_before_saving(tmp_path):
    """Fails if a model that returns a plain tensor (a backbone) is
    exported: its export returned a tensor where the signature promises
    a dict, and evaluate_nn failed on it later."""
    backbone = tf_keras.Sequential([tf_keras.layers.Flatten(),
                                    tf_keras.layers.Dense(4)])
    backbone.build((None, SIZE, SIZE, 3))
    with pytest.raises(ValueError, match="must return a dict with "
                                         "'embeddings'.* returns a tensor"):
        export.export_embedder(backbone, str(tmp_path / 'export'),
                               **PREPROCESSING)
    assert not (tmp_path / 'export').exists()
    assert tf.compat.v1.get_variable_scope().caching_device is None


def test_a_classifier_export_is_refused_as_an_embedder(exported):
    """Fails if `export.LoadedEmbedder` (what PAWS-NN of an existing model
    embeds with) takes a classifier export, whose outputs hold no
    embeddings (seen failing without its signature check)."""
    with pytest.raises(ValueError, match='not embed_preprocessed: it was '
                                         'not written by export_embedder'):
        export.LoadedEmbedder(str(exported['root'] / 'classifier'))
