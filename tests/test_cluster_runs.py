"""run.py with a shipped config on a two-worker cluster, as README launches
it: the same command on two loopback workers, each with its TF_CONFIG.

The `trained` run of debug.gin keeps every default callback (epoch-end
PAWS-NN, view images, TensorBoard, checkpoints, backups, progress);
bindings only shorten it to 2 epochs of 8 steps.

Bugs tried beside those the tests' docstrings name: the fine-tuning's
reported top-1 taken before fine-tuning (the ViT test).
"""

import glob
import json
import os
import pathlib
import re
import shutil

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
import tensorflow as tf

from paws_tf.data import pipeline
from paws_tf.demo import run_demo
from paws_tf.evaluation import tuning
from paws_tf import run_dir
from paws_tf.runner import experiment
from paws_tf.runner import modes
from tests.helpers import cluster
from tests.helpers import debug_gin
from tests.helpers import once
from tests.helpers import run_py

REPO = pathlib.Path(__file__).resolve().parents[1]
# Deterministic kernels: runs of one command then differ only in the order
# of their all-reduces' sums. A warm-up of one epoch of the two: the
# comparisons' tolerances hold for this schedule (after a warm-up of a
# quarter epoch, debug.gin's share, the exports of one process and of the
# cluster differed by more than 1e-4).
SHRINK = ('train.num_epochs = 2', 'train/synthetic_source.num_images = 256',
          'train.deterministic_ops = True',
          'WarmupCosineDecay.warmup_fraction = 0.5')


def cluster_command(model_dir, mode, *, flags=(), **config):
    """run.py's command on every worker; `config`: `run_py.command`'s
    `gin_file` and `base_bindings` (default debug.gin, `SHRINK`)."""
    config.setdefault('base_bindings', SHRINK)
    return [REPO / 'run.py'] + run_py.command(
        model_dir, flags=['--strategy=multi_worker', *flags], mode=mode,
        **config)


def tensor_tags(log_dir):
    tags = set()
    for path in glob.glob(os.path.join(log_dir, 'events.out.tfevents.*')):
        events = event_accumulator.EventAccumulator(path)
        events.Reload()
        tags.update(events.Tags()['tensors'])
    return tags


def preprocessed_test_images():
    """debug.gin's test images (`SHRINK`), preprocessed for evaluation."""
    with debug_gin.parsed(SHRINK):
        bundle = experiment.load_data(None)
        preprocessing = experiment.eval_preprocessing(bundle)
    images, _ = next(iter(pipeline.make_eval_dataset(
        bundle.test, batch_size=bundle.test.num_examples, **preprocessing)))
    return images


def run_beside_one_process(runs, mode, *, flags=(), **config):
    """Runs `mode` on `runs[0]` by a two-worker cluster and on `runs[1]` by
    one process (default strategy), side by side, with the same `flags`
    and `config` (`cluster_command`'s). Checks that every process ended
    well, that the cluster wrote what the one process wrote, and that the
    worker left nothing.

    Returns:
        The relative paths written (`written`).
    """
    config.setdefault('base_bindings', SHRINK)
    one_process = run_py.start(runs[1], mode=mode, flags=flags, **config)
    cluster.check_ran(cluster.launch_cluster(
        cluster_command(runs[0], mode, flags=flags, **config), timeout=900))
    code, output = run_py.finish(one_process, timeout=900)
    assert code == 0, output[-4000:]
    paths = cluster.written(runs[0])
    assert paths == cluster.written(runs[1])
    assert not cluster.worker_leftovers(runs[0])
    return paths


def trained_copy(trained, model_dir, *remove):
    """A copy of the cluster's trained run without its `remove` outputs."""
    shutil.copytree(trained[0] / 'cluster', model_dir)
    for name in remove:
        shutil.rmtree(model_dir / name)
    return model_dir


def train_beside_two_replicas(root, env=None, **config):
    """`--mode=train_and_evaluate` on a two-worker cluster in
    `root/cluster`, and the same command in one process with the same two
    replicas (MirroredStrategy over two logical CPUs) in
    `root/one_process`, run side by side; `config`: `cluster_command`'s;
    `env`: added to every process's environment (None removes).

    Returns:
        `(root, [(returncode, output)] of the workers, the one process's
        output)`.
    """
    config.setdefault('base_bindings', SHRINK)
    one_process = run_py.start(
        root / 'one_process', bindings=[cluster.ONE_PROCESS_TWO_REPLICAS],
        flags=['--strategy=mirrored'], mode='train_and_evaluate',
        script=cluster.TWO_CPUS, env=env, **config)
    workers = cluster.start_cluster(
        cluster_command(root / 'cluster', 'train_and_evaluate', **config),
        env=env)
    results = cluster.finish_all(workers, timeout=900)
    cluster.check_ran(results)
    code, output = run_py.finish(one_process, timeout=900)
    assert code == 0, output[-4000:]
    return root, results, output


# TensorFlow's own thread pools, a thread per core, in place of the share
# of the cores tests/conftest.py gives each process: the comparisons of the
# `trained` runs hold to 1e-4 with them. With one intra-op thread in every
# process, the one process's export ended 0.023 from the cluster's, and its
# logged trust ratio 5% off (not traced further).
DEFAULT_THREADS = {'TF_NUM_INTRAOP_THREADS': None,
                   'TF_NUM_INTEROP_THREADS': None}


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """debug.gin trained by `train_beside_two_replicas`, with
    `DEFAULT_THREADS`."""
    root, (results, output) = once.made(
        tmp_path_factory, 'cluster_runs',
        lambda root: train_beside_two_replicas(root, DEFAULT_THREADS)[1:])
    return root, results, output


@pytest.mark.slow
@pytest.mark.long
def test_chief_writes_what_one_process_writes_and_the_worker_nothing(
        trained):
    """Fails if a worker's collective outside training runs eagerly
    (tried: `cluster.barrier` without `tf.function`, TensorFlow's warning
    of its overhead in both logs)."""
    root, results, _ = trained
    chief_log, worker_log = results[0][1], results[1][1]
    assert 'eagerly' not in chief_log + worker_log
    assert (cluster.written(root / 'cluster') ==
            cluster.written(root / 'one_process'))
    assert not cluster.worker_leftovers(root / 'cluster')
    # Every worker took part in both epoch-end evaluations; only the
    # chief evaluated and logged them.
    for epoch in (1, 2):
        assert f'epoch {epoch}: PAWS-NN top-1' in chief_log
        assert f'epoch {epoch}: PAWS-NN top-1' not in worker_log
    steps, top1 = run_demo.read_scalars(
        root / 'cluster' / 'tensorboard' / 'eval', 'paws_nn/top1')
    np.testing.assert_array_equal(steps, [8, 16])
    assert np.all(top1 > 0.5)  # 4 classes: chance is 0.25.
    train_tags = tensor_tags(root / 'cluster' / 'tensorboard' / 'train')
    assert {'views/global_views', 'views/support_views',
            'throughput/views_per_second'} <= train_tags
    for path in ('export/embedder/saved_model.pb',
                 'export/classifier/saved_model.pb', 'eval/paws_nn.json',
                 'checkpoints/checkpoint', 'operative_config.gin'):
        assert (root / 'cluster' / path).exists(), path


@pytest.mark.slow
@pytest.mark.long
def test_two_workers_end_where_one_process_with_two_replicas_ends(trained):
    """The cluster computes what MirroredStrategy computes in one process
    with the same two replicas: the same per-replica batches, supports and
    global batch norm. Both run with `train.deterministic_ops` (`SHRINK`):
    with TensorFlow's non-deterministic kernels the exports differed by up
    to 0.01 after 32 steps on a 2-core AVX-512 CPU, the cluster or not.
    With them the exports' embeddings (values up to 3.4) must agree to
    1e-4; the cause of what remains is not the all-reduce's order (a sum of
    two replicas' values is the same either way) but each process's own
    float32 kernels. The same command with one replica is another
    computation (each replica samples its own support), not compared
    here."""
    root = trained[0]
    images = preprocessed_test_images()
    embeddings = [cluster.exported_embeddings(root / run, images)
                  for run in ('cluster', 'one_process')]
    np.testing.assert_allclose(embeddings[0], embeddings[1], atol=1e-4)
    assert np.abs(embeddings[1]).max() > 1  # Not a degenerate output.
    results = [json.loads((root / run / 'eval' / 'paws_nn.json').read_text())
               for run in ('cluster', 'one_process')]
    assert results[0]['num_queries'] == results[1]['num_queries'] == 128
    # A query whose two best classes tie to 1e-4 may flip: at most one.
    assert abs(results[0]['top1'] - results[1]['top1']) <= 1 / 128
    curves = [run_demo.read_scalars(root / run / 'tensorboard' / 'eval',
                                  'paws_nn/top1')
              for run in ('cluster', 'one_process')]
    np.testing.assert_array_equal(curves[0][0], [8, 16])
    np.testing.assert_array_equal(curves[1][0], [8, 16])
    np.testing.assert_allclose(curves[0][1], curves[1][1], atol=1 / 128)


# A log line's `name=value` pairs (`callbacks.ProgressLog`), and a log's
# progress line at an epoch's last step (`progress.ProgressBar`: its
# labelled values, then the seconds).
EPOCH_LINE = re.compile(r'epoch (\d+)/\d+: (.*?) \|')
LAST_STEP_LINE = re.compile(r'^epoch (\d+)/\d+  step (\d+)/\2  (.*)  \d+ s$',
                            re.MULTILINE)


def logged_values(output):
    """{(where, epoch, name): value} of every value `output` prints in the
    epochs' log lines and their progress bars' last lines."""
    values = {}
    for epoch, pairs in EPOCH_LINE.findall(output):
        for pair in pairs.split():
            name, value = pair.split('=')
            values['log', int(epoch), name] = float(value)
    for epoch, _, fields in LAST_STEP_LINE.findall(output):
        for field in fields.split('  '):
            label, value = field.split(' ')
            values['progress', int(epoch), label] = float(value)
    return values


def train_scalars(model_dir):
    """{tag: (steps, values)} of the run's training TensorBoard scalars
    but the throughput (a time, not a result)."""
    log_dir = model_dir / 'tensorboard' / 'train'
    return {tag: run_demo.read_scalars(log_dir, tag)
            for tag in sorted(tensor_tags(log_dir))
            if not tag.startswith(('throughput/', 'views/'))}


@pytest.mark.slow
@pytest.mark.long
def test_the_cluster_logs_what_one_process_logs(trained):
    """What a person reads of the cluster's training (the chief's epoch
    log lines, its progress bar, its TensorBoard scalars) is what one
    process with the same two replicas shows: the same values (to 2e-3,
    the log's 4 digits; the runs compute the same steps,
    `test_two_workers_end_where_one_process_with_two_replicas_ends`).

    Fails if tf_keras adds up the workers' metric results, already
    reduced over every replica (its reduction "auto" under
    MultiWorkerMirroredStrategy, `training.reduce_per_replica`; tried:
    every value twice one process's, the learning rate 0.975 for 0.4875).
    """
    root, results, one_process = trained
    chief = logged_values(results[0][1])
    expected = logged_values(one_process)
    assert {name for _, _, name in expected} >= {
        'loss', 'me_max', 'target_confidence', 'learning_rate', 'lr',
        'conf', 'paws-nn'}
    assert chief.keys() == expected.keys()
    for key, value in expected.items():
        np.testing.assert_allclose(chief[key], value, rtol=2e-3, atol=1e-4,
                                   err_msg=str(key))
    scalars = [train_scalars(root / run) for run in ('cluster', 'one_process')]
    assert scalars[0].keys() == scalars[1].keys()
    assert {'optimizer/learning_rate', 'loss/me_max', 'epoch/loss',
            'paws/target_confidence'} <= scalars[1].keys()
    for tag, (steps, values) in scalars[1].items():
        np.testing.assert_array_equal(scalars[0][tag][0], steps, tag)
        np.testing.assert_allclose(scalars[0][tag][1], values, rtol=1e-3,
                                   atol=1e-5, err_msg=tag)


@pytest.mark.slow
@pytest.mark.long
def test_demo_on_the_cluster_exports_evaluates_and_fine_tunes(trained,
                                                               tmp_path):
    """--mode=demo on the trained run: training is done, so it exports,
    evaluates, fine-tunes (every worker: the steps are collectives; the
    chief alone writes the results), then the chief trains the supervised
    baseline and writes the report while the worker waits."""
    model_dir = trained_copy(trained, tmp_path / 'run', 'export')
    results = cluster.launch_cluster(cluster_command(model_dir, 'demo'),
                                     timeout=900)
    cluster.check_ran(results)
    assert 'not training it again' in results[0][1]
    demo = json.loads(open(run_dir.RunDir(model_dir).results).read())
    assert demo['paws_nn_top1'] > 0.5 and demo['supervised_top1'] > 0.25
    tuned = json.loads(
        (model_dir / 'fine_tune' / 'results.json').read_text())
    assert tuned['steps'] == 10  # 2 epochs of 5 steps (debug.gin).
    assert tuned['top1'] > 0.25  # 4 classes: chance is 0.25.
    assert demo['paws_finetune_top1'] == tuned['top1']
    assert (model_dir / 'export' / 'embedder' / 'saved_model.pb').exists()
    assert os.path.exists(run_dir.RunDir(model_dir).results_figure)
    assert not cluster.worker_leftovers(model_dir)


@pytest.mark.slow
@pytest.mark.long
def test_export_on_the_cluster_is_what_one_process_exports(trained,
                                                            tmp_path):
    """--mode=export on the trained run: the chief exports what one
    process exports from the same checkpoint (the same restore and the
    same float32 computation on plain variables: equal to 1e-6), and the
    worker leaves nothing."""
    runs = [trained_copy(trained, tmp_path / name, 'export')
            for name in ('cluster', 'one_process')]
    paths = run_beside_one_process(runs, 'export')
    assert 'export/classifier/saved_model.pb' in paths
    images = preprocessed_test_images()
    np.testing.assert_allclose(
        cluster.exported_embeddings(runs[0], images),
        cluster.exported_embeddings(runs[1], images), atol=1e-6)


@pytest.mark.slow
@pytest.mark.long
def test_evaluate_nn_on_the_cluster_repeats_the_training_run_figure(
        trained, tmp_path):
    """--mode=evaluate_nn on the trained run reads its exported embedder:
    the chief finds the figure train_and_evaluate found (the same embedder,
    the same queries) and writes it; the worker leaves nothing. No
    pictures: the figure is what is compared."""
    model_dir = trained_copy(trained, tmp_path / 'run', 'eval')
    results = cluster.launch_cluster(cluster_command(
        model_dir, 'evaluate_nn',
        base_bindings=SHRINK + ('evaluate_nn.pictures = False',)),
        timeout=900)
    cluster.check_ran(results)
    root = trained[0]
    figures = [json.loads((run / 'eval' / 'paws_nn.json').read_text())
               for run in (root / 'cluster', model_dir)]
    for key in ('top1', 'num_support', 'num_queries', 'source', 'tau'):
        assert figures[1][key] == figures[0][key], key
    assert 'PAWS-NN' in results[0][1]
    assert not cluster.worker_leftovers(model_dir)


# The variables of debug.gin's ViT (`debug_gin.VIT`) in whose directions
# the loss is flat: the projection head's biases that a batch norm
# subtracts again, the final LayerNorm's beta (fc1 then bn1 subtract it
# too), the keys' part of the attention's qkv bias (a softmax ignores
# what a query adds to all its logits), and the batch norms' moving
# statistics, which follow those biases. Their gradients are rounding
# noise, which AdamW, dividing each element's step by that element's
# gradient scale, turns into steps of the learning rate's size: after 16
# steps, measured up to 4e-3 apart between two runs whose other variables
# agreed within 1e-5.
FLAT = re.compile(r'projection_head/(fc[12]/bias|bn\d/moving_)|^norm/beta')


def compared_values(model):
    """The variables of `model` outside `FLAT`, by name without the
    model's prefix; of the qkv bias, the queries' and values' parts."""
    values = {}
    for variable in model.weights:
        name = variable.name.split('/', 1)[1] if variable.name.startswith(
            'paws_model') else variable.name
        if FLAT.search(name):
            continue
        value = variable.numpy()
        if name.endswith('qkv/bias:0'):
            queries, _, values_part = np.split(value, 3)
            value = np.concatenate([queries, values_part])
        values[name] = value
    return values


# The ViT run's callbacks: the last epoch's PAWS-NN of the two, no
# TensorBoard images of the first step's views, no pictures of the final
# PAWS-NN.
VIT_SHRINK = ('train.eval_every_epochs = 2', 'train.view_images = False',
              'evaluate_nn.pictures = False')


@pytest.mark.slow
@pytest.mark.long
def test_a_vit_trains_on_the_cluster_as_in_one_process_and_fine_tunes(
        tmp_path):
    """debug.gin's run with a ViT, GELU heads and AdamW (`debug_gin.VIT`)
    trained by `train_beside_two_replicas`: the cluster writes what the one
    process writes, and its checkpoint holds the one process's variables
    (to 1e-4, but where the loss is flat, `FLAT`); then --mode=fine_tune
    on the cluster's run (the CIFAR-10 protocol of debug.gin) with every
    worker, the chief alone writing.

    The fine-tuned top-1 is the PAWS-NN top-1, computed here in NumPy, of
    the trunk the cluster wrote.

    Fails if the workers' input pipelines read the same rows (tried: the
    first replica 0 for every pipeline in `pipeline.pipeline_replicas`:
    the patch embedding's kernel 1e-2 apart), or if the fine-tuning
    reports another figure than its trunk's (tried: the top-1 before
    fine-tuning, 0.602 against the written trunk's 0.633). Of the default
    callbacks (the `trained` run's tests check them all), only the last
    epoch's PAWS-NN (`VIT_SHRINK`).
    """
    config = dict(gin_file=debug_gin.write_vit_config(tmp_path / 'vit.gin'),
                  base_bindings=SHRINK + VIT_SHRINK)
    root, results, _ = train_beside_two_replicas(tmp_path, **config)
    assert 'epoch 2: PAWS-NN top-1' in results[0][1]
    assert (cluster.written(root / 'cluster') ==
            cluster.written(root / 'one_process'))
    assert not cluster.worker_leftovers(root / 'cluster')
    runs = []
    for run in ('cluster', 'one_process'):
        with debug_gin.parsed(SHRINK, gin_file=config['gin_file']):
            model, step = modes.load_trained_model(
                run_dir.RunDir(root / run), tf.distribute.get_strategy(),
                local=True)
        assert step == 16
        runs.append(compared_values(model))
    assert runs[0].keys() == runs[1].keys()
    for name, value in runs[1].items():
        np.testing.assert_allclose(runs[0][name], value, atol=1e-4,
                                   err_msg=name)
    figures = [json.loads((root / run / 'eval' / 'paws_nn.json').read_text())
               for run in ('cluster', 'one_process')]
    assert figures[0]['num_queries'] == figures[1]['num_queries'] == 128
    assert figures[0]['top1'] > 0.25  # 4 classes: chance is 0.25.
    cluster.check_ran(cluster.launch_cluster(
        cluster_command(root / 'cluster', 'fine_tune', **config),
        timeout=900))
    tuned = json.loads(
        (root / 'cluster' / 'fine_tune' / 'results.json').read_text())
    assert tuned['steps'] == 10  # 2 epochs of 5 steps (debug.gin).
    assert tuned['top1'] == pytest.approx(
        _fine_tuned_top1(root / 'cluster', config['gin_file']), abs=1e-9)
    assert not cluster.worker_leftovers(root / 'cluster')


def _fine_tuned_top1(model_dir, gin_file):
    """PAWS-NN top-1 of the trunk that --mode=fine_tune (the CIFAR-10
    protocol) wrote under `model_dir`: its embeddings of the labeled and
    test images, the soft nearest-neighbour rule in NumPy."""
    with debug_gin.parsed(SHRINK, gin_file=gin_file):
        run = run_dir.RunDir(model_dir)
        model, _ = modes.load_trained_model(
            run, tf.distribute.get_strategy(), local=True)
        bundle = experiment.load_data(run)
        preprocessing = experiment.eval_preprocessing(bundle)
    trunk = tuning.build_trunk(model)
    trunk.load_weights(str(model_dir / 'fine_tune' / tuning.TRUNK_WEIGHTS))

    def embed(source):
        images, labels = zip(*pipeline.make_eval_dataset(
            source, batch_size=64, **preprocessing).as_numpy_iterator())
        embeddings = trunk(np.concatenate(images), training=False).numpy()
        return (embeddings / np.linalg.norm(embeddings, axis=1,
                                            keepdims=True),
                np.concatenate(labels))

    supports, support_labels = embed(bundle.labeled)
    queries, query_labels = embed(bundle.test)
    logits = queries @ supports.T / model.tau
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    scores = weights @ np.eye(support_labels.max() + 1)[support_labels]
    return np.mean(scores.argmax(axis=1) == query_labels)


@pytest.mark.slow
@pytest.mark.long
def test_import_official_on_the_cluster_is_what_one_process_imports(
        tmp_path):
    """--mode=import_official of an official WRN-28-2 checkpoint (built in
    PyTorch with random weights): the chief imports what one process
    imports, and the worker writes nothing."""
    pytest.importorskip('torch')  # An optional extra, which this imports:
    from tests.helpers import official_torch
    encoder = official_torch.randomize(official_torch.add_pretraining_heads(
        official_torch.WideResNet(), 128, use_pred=False), seed=3)
    checkpoint = tmp_path / 'wrn.pth.tar'
    official_torch.save_official(encoder, checkpoint)
    # The config's data replaced by small synthetic images.
    config = dict(gin_file='gin_configs/cifar10_wrn28_2_4000.gin',
                  base_bindings=('load_data.train = @train/synthetic_source',
                                 'load_data.test = @test/synthetic_source',
                                 'synthetic_source.image_size = 32',
                                 'select_labeled.labels_per_class = 4'))
    flags = [f'--official_checkpoint={checkpoint}']
    runs = [tmp_path / name for name in ('cluster', 'one_process')]
    paths = run_beside_one_process(runs, 'import_official', flags=flags,
                                   **config)
    assert 'export/embedder/saved_model.pb' in paths
    records = [json.loads((run / 'imported.json').read_text())
               for run in runs]
    assert records[0] == records[1]
    images = tf.random.stateless_uniform([8, 32, 32, 3], seed=[0, 1])
    np.testing.assert_array_equal(
        cluster.exported_embeddings(runs[0], images),
        cluster.exported_embeddings(runs[1], images))
