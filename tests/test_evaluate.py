"""PAWS-NN: the chunked classifier against NumPy; evaluate_nn end to end."""

import json
import os

import gin
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from paws_tf import checkpoints
from paws_tf.data import augment
from paws_tf.data import pipeline
from paws_tf.data import sources
from paws_tf.data import splits
from paws_tf.evaluation import evaluate
from paws_tf.evaluation import evaluate_nn
from paws_tf.evaluation import export
from paws_tf import run_dir
from paws_tf.runner import experiment
from paws_tf.runner import modes
from tests.helpers import debug_gin
from tests.helpers import tiny_model

SIZE = 16
EVAL = dict(image_size=SIZE, crop_fraction=0.875, mean=augment.CIFAR10_MEAN,
            std=augment.CIFAR10_STD)


def numpy_snn(queries, supports, labels, num_classes, tau):
    """Brute-force SNN class probabilities in float64, `[N, K]`."""
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    s = supports / np.linalg.norm(supports, axis=1, keepdims=True)
    logits = q @ s.T / tau
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    return weights @ np.eye(num_classes)[labels]


def numpy_top_ids(queries, supports, labels, num_classes, tau):
    """`numpy_snn`'s classes, most probable first; ties broken towards the
    lower class id."""
    return np.argsort(-numpy_snn(queries, supports, labels, num_classes, tau),
                      axis=1, kind='stable')


def random_problem(seed, num_queries=37, num_supports=23, dim=5,
                   num_classes=7):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=[num_queries, dim]).astype(np.float32),
            rng.integers(0, num_classes, num_queries),
            rng.normal(size=[num_supports, dim]).astype(np.float32),
            rng.integers(0, num_classes, num_supports), num_classes)


@pytest.mark.parametrize('tau', [0.1, 0.5])
def test_classify_matches_numpy_for_every_chunk_size(tau):
    queries, _, supports, labels, num_classes = random_problem(0)
    expected = numpy_top_ids(queries, supports, labels, num_classes, tau)
    for chunk in (1, 5, 8, 36, 37, 100):  # 37 queries: most do not divide.
        top_ids = evaluate.classify(queries, supports, labels,
                                    num_classes=num_classes, tau=tau,
                                    query_chunk=chunk)
        np.testing.assert_array_equal(top_ids, expected[:, :5])


def as_dataset(embeddings, labels, batch):
    """Embeddings as 'images', so that the identity embeds them."""
    return tf.data.Dataset.from_tensor_slices(
        (embeddings, labels.astype(np.int32))).batch(batch)


def test_paws_nn_accuracies_match_numpy():
    queries, query_labels, supports, labels, num_classes = random_problem(1)
    top = numpy_top_ids(queries, supports, labels, num_classes, 0.1)
    hits = top == query_labels[:, None]
    results = evaluate.paws_nn(
        tf.identity, as_dataset(supports, labels, 4),
        as_dataset(queries, query_labels, 10), num_classes=num_classes,
        query_chunk=6)
    assert results['top1'] == pytest.approx(hits[:, 0].mean())
    assert results['top5'] == pytest.approx(hits[:, :5].any(axis=1).mean())
    assert results['num_support'] == 23 and results['num_queries'] == 37
    for c, accuracy in enumerate(results['per_class_accuracy']):
        members = query_labels == c
        if members.any():
            assert accuracy == pytest.approx(hits[members, 0].mean())
        else:
            assert accuracy is None


def test_top5_is_left_out_with_fewer_classes():
    queries, query_labels, supports, labels, _ = random_problem(
        2, num_classes=3)
    results = evaluate.paws_nn(
        tf.identity, as_dataset(supports, labels, 8),
        as_dataset(queries, query_labels, 8), num_classes=3)
    assert 'top1' in results and 'top5' not in results
    assert len(results['per_class_accuracy']) == 3


def test_queries_at_support_points_are_all_right():
    rng = np.random.default_rng(3)
    supports = rng.normal(size=[20, 8]).astype(np.float32)
    labels = np.arange(20) % 4
    results = evaluate.paws_nn(
        tf.identity, as_dataset(supports, labels, 6),
        as_dataset(supports[::-1], labels[::-1], 7), num_classes=4,
        tau=0.01, query_chunk=3)
    assert results['top1'] == 1.0
    assert results['per_class_accuracy'] == [1.0] * 4


def test_labels_outside_the_classes_are_rejected():
    queries, query_labels, supports, labels, _ = random_problem(4)
    with pytest.raises(ValueError, match=r'Query labels must be in \[0, 7\)'):
        evaluate.paws_nn(tf.identity, as_dataset(supports, labels, 8),
                         as_dataset(queries, query_labels + 7, 8),
                         num_classes=7)


@pytest.mark.parametrize('shift,message', [
    (5, r'Support labels must be in \[0, 3\), got \[5, 7\]'),
    (-1, r'Support labels must be in \[0, 3\), got \[-1, 1\]'),
    (0.5, 'Support labels must be integer class ids, got float64')])
def test_classify_refuses_support_labels_outside_the_classes(shift,
                                                             message):
    """Fails if `classify` takes them (tried: its one-hot rows of zeros
    for labels 5-7 classified every query alike, [0, 1, 2], and float
    labels were truncated)."""
    queries, _, supports, labels, _ = random_problem(4)
    with pytest.raises(ValueError, match=message):
        evaluate.classify(queries, supports, labels % 3 + shift,
                          num_classes=3)


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    """A tiny run: 400 training images of which 40 labeled, 60 test images,
    the recorded split and an embedder export."""
    model_dir = str(tmp_path_factory.mktemp('run'))
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, [460, 20, 18, 3], np.uint8)
    classes = rng.integers(0, 8, 460)
    train = sources.from_arrays(images[:400], classes[:400])
    test = sources.from_arrays(images[400:], classes[400:])
    split = splits.select_labeled(train, labels_per_class=5)
    labeled = split.labeled
    run_dir.RunDir(model_dir).write_split(labeled.names, split.header)
    model = tiny_model.build(size=SIZE)
    export.export_embedder(model, run_dir.RunDir(model_dir).embedder,
                           channels=3, **EVAL)
    return dict(model_dir=model_dir, train=train, labeled=labeled, test=test,
                model=model)


def reference_results(model, labeled, test):
    def dataset(source):
        return pipeline.make_eval_dataset(source, batch_size=64, **EVAL)

    return evaluate.paws_nn(evaluate.embedder_from_model(model),
                            dataset(labeled), dataset(test), num_classes=8)


def exported(run):
    """The `evaluate_nn.Embedder` of the run's embedder export."""
    return evaluate_nn.of_export(run_dir.RunDir(run['model_dir']).embedder)


def test_evaluate_nn_with_the_saved_model(run, capsys, eval_batches):
    """Also fails if `PawsNN.batch_size`, bound in gin, is not the batch of
    every image evaluate_nn embeds (it passed its own 256 over it); the
    pictures, which read images at their own batch, are drawn by
    test_pictures."""
    with gin.unlock_config():
        gin.parse_config('PawsNN.batch_size = 16')
    try:
        results = evaluate_nn.evaluate_nn(
            run_dir.RunDir(run['model_dir']), exported(run),
            labeled=run['labeled'], test=run['test'], pictures=False,
            **EVAL)
    finally:
        gin.clear_config()
    # The support (PawsNN's, and the one embedded), the queries.
    assert eval_batches == [16] * 3
    path = os.path.join(run['model_dir'], 'eval', 'paws_nn.json')
    assert results['results_file'] == path
    with open(path) as f:
        stored = json.load(f)
    assert stored['num_support'] == 40 and stored['num_queries'] == 60
    assert stored['source'] == 'saved_model' and 'results_file' not in stored
    assert stored['embedding'] == 'projection'
    assert stored['source_path'] == run_dir.RunDir(run['model_dir']).embedder
    assert stored['split_file'] == run_dir.RunDir(run['model_dir']).split
    expected = reference_results(run['model'], run['labeled'], run['test'])
    for key in ('top1', 'top5', 'per_class_accuracy'):
        assert stored[key] == pytest.approx(expected[key])
    assert 'support = the 40 labeled images' in capsys.readouterr().out
    events = tf.io.gfile.glob(os.path.join(
        run['model_dir'], 'tensorboard', 'eval', 'events.out.tfevents.*'))
    assert events


def test_the_classifier_export_embeds_at_the_bound_batch(run, tmp_path,
                                                        eval_batches):
    """--mode=export's classifier embeds its supports itself. Fails if it
    does not at `PawsNN.batch_size` bound in gin (it took 256)."""
    with gin.unlock_config():
        gin.parse_config('PawsNN.batch_size = 16')
    try:
        evaluate_nn.export_classifier(
            run_dir.RunDir(tmp_path), run['model'], run['labeled'], EVAL,
            channels=3, tau=0.1)
    finally:
        gin.clear_config()
    assert eval_batches == [16]


def test_evaluate_nn_refuses_a_support_other_than_the_split(run):
    with pytest.raises(ValueError, match='it lists 40 images, 0 of them not among the 400 selected'):
        evaluate_nn.evaluate_nn(run_dir.RunDir(run['model_dir']),
                                exported(run),
                                labeled=run['train'], test=run['test'],
                                **EVAL)


def test_evaluate_nn_refuses_an_export_with_other_preprocessing(run):
    with pytest.raises(ValueError, match='image_size: export 16, '
                                         'evaluation 12'):
        evaluate_nn.evaluate_nn(run_dir.RunDir(run['model_dir']),
                                exported(run),
                                labeled=run['labeled'], test=run['test'],
                                **dict(EVAL, image_size=12))


def test_evaluate_nn_refuses_an_export_of_another_embedding(run):
    with pytest.raises(ValueError, match='embedding: export projection, '
                                         'evaluation prediction'):
        evaluate_nn.evaluate_nn(run_dir.RunDir(run['model_dir']),
                                exported(run),
                                labeled=run['labeled'], test=run['test'],
                                embedding='prediction', **EVAL)


def test_evaluate_nn_from_a_training_checkpoint(run, tmp_path):
    """Fails if the checkpoint source evaluates another model than the
    restored one it is given, or records another path than its prefix."""
    optimizer = tf_keras.optimizers.SGD(momentum=0.9)
    optimizer.build(run['model'].trainable_variables)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=run['model'], optimizer=optimizer),
        str(tmp_path), max_to_keep=1)
    prefix = manager.save()
    fresh = tiny_model.build(size=SIZE, seed=1)
    checkpoints.load(prefix, fresh)  # As modes.load_trained_model does.
    eval_run = run_dir.RunDir(tmp_path / 'eval_run')
    results = evaluate_nn.evaluate_nn(
        eval_run, evaluate_nn.Embedder(fresh, 'checkpoint', prefix),
        labeled=run['labeled'], test=run['test'], **EVAL)
    assert results['source_path'] == prefix
    assert results['split_file'] is None
    with open(eval_run.nn_results) as f:
        stored = json.load(f)
    assert stored['source'] == 'checkpoint' and stored['num_support'] == 40
    expected = reference_results(run['model'], run['labeled'], run['test'])
    assert stored['top1'] == pytest.approx(expected['top1'])


# debug.gin's run at one epoch of 4 steps (128 unlabeled images, 64 of them
# labeled).
SHORT_RUN = ['train.num_epochs = 1', 'train/synthetic_source.num_images = 128']


@pytest.mark.slow
@pytest.mark.long
def test_train_and_evaluate_embeds_the_labeled_set_once(tmp_path,
                                                         monkeypatch):
    """`train_and_evaluate` of debug.gin (`SHORT_RUN`, no epoch-end
    PAWS-NN): the trained model in hand is exported and evaluated, its 64
    labeled images embedded once for PAWS-NN and the classifier export; the
    classifier's probabilities are the soft nearest-neighbour rule in
    NumPy over the exported embedder's outputs, and its top-1 on the test
    set is PAWS-NN's. Then `--mode=evaluate_nn` of the run reads its
    export alone, which records the step and temperature, and gives the
    same results. Seen failing on the code that reloaded the trained
    model from its checkpoint and embedded the labeled images twice, and
    on the evaluate_nn mode that restored the checkpoint before loading
    the export. An export older than the newest checkpoint, or that records
    no step, is not read: the checkpoint is (seen failing when the mode read
    any export, the second evaluated at the export's step, the third raised
    KeyError)."""
    embedded, loads = [], []
    embed_dataset, load_trained_model = (evaluate.embed_dataset,
                                         modes.load_trained_model)

    def counted_embed(*args, **kwargs):
        embeddings, labels = embed_dataset(*args, **kwargs)
        embedded.append(len(labels))
        return embeddings, labels

    def counted_load(*args, **kwargs):
        loads.append(args)
        return load_trained_model(*args, **kwargs)

    monkeypatch.setattr(evaluate, 'embed_dataset', counted_embed)
    monkeypatch.setattr(modes, 'load_trained_model', counted_load)
    model_dir = str(tmp_path / 'run')
    with debug_gin.parsed(SHORT_RUN + ['train.eval_every_epochs = 0',
                                       'train.view_images = False',
                                       'train.verbose = 0']):
        results = modes.run(model_dir, tf.distribute.get_strategy(),
                            'train_and_evaluate')
        bundle = experiment.load_data(run_dir.RunDir(model_dir))
        assert (embedded, loads) == ([64, 128], [])
        again = modes.run(model_dir, tf.distribute.get_strategy(),
                          'evaluate_nn')
    assert (embedded, loads) == ([64, 128, 64, 128], [])
    step = checkpoints.latest(run_dir.RunDir(model_dir).checkpoints)[1]
    assert (again['step'], again['source']) == (step, 'saved_model')
    for key in ('top1', 'tau', 'embedding', 'per_class_accuracy'):
        assert again[key] == results[key], key
    run = run_dir.RunDir(model_dir)
    assert (results['source'], results['source_path']) == ('saved_model',
                                                           run.embedder)
    # An export of other weights than the newest checkpoint's (the run
    # trained on since), or of no recorded step: the checkpoint is read.
    recorded = os.path.join(run.embedder, export.PREPROCESSING_FILENAME)
    preprocessing = export.read_preprocessing(run.embedder)
    for stale in ({**preprocessing, 'step': step - 1},
                  {k: v for k, v in preprocessing.items() if k != 'step'}):
        with open(recorded, 'w') as f:
            json.dump(stale, f)
        with debug_gin.parsed(SHORT_RUN):
            newest = modes.run(model_dir, tf.distribute.get_strategy(),
                               'evaluate_nn')
        assert (newest['step'], newest['source']) == (step, 'checkpoint')
        assert newest['top1'] == results['top1']
    assert len(loads) == 2

    def raw(source):
        return np.stack([source.read(i).numpy()
                         for i in range(source.num_examples)])

    embedder = tf.saved_model.load(run.embedder)
    supports, queries = (embedder(raw(source))['embeddings'].numpy()
                         for source in (bundle.labeled, bundle.test))
    num_classes = len(bundle.labeled.class_names)
    expected = numpy_snn(queries, supports, bundle.labeled.labels,
                         num_classes, results['tau'])
    outputs = tf.saved_model.load(run.classifier)(raw(bundle.test))
    np.testing.assert_allclose(outputs['probabilities'], expected,
                               rtol=1e-4, atol=1e-6)
    hits = outputs['class_ids'].numpy() == bundle.test.labels
    assert results['top1'] == pytest.approx(hits.mean(), abs=1e-9)


def test_an_embedder_refuses_raw_images():
    """`embedder_from_model` embeds preprocessed float images; uint8 pixels
    are refused naming the preprocessing and the export. Fails if they are
    embedded (tried: 0-255 values went through the network unnormalised,
    without a warning)."""
    embed = evaluate.embedder_from_model(lambda images, training: images)
    with pytest.raises(ValueError, match=(
            r'embed_fn takes preprocessed float images, got uint8: '
            r'preprocess them \(make_eval_dataset\)')):
        embed(np.zeros([2, 4], np.uint8))
    np.testing.assert_array_equal(embed(np.ones([2, 4], np.float32)),
                                  np.ones([2, 4]))
