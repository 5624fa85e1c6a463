"""A shipped config of each data kind on a two-worker cluster, as README
launches it: the same run.py command on two loopback workers, each with its
TF_CONFIG, `--mode=train_and_evaluate` (train, export, PAWS-NN).

The kinds: image folders (image_folders_small.gin), a TFDS dataset held in
memory (cifar10_wrn28_2_4000.gin on a tiny CIFAR-10 archive prepared by the
real TFDS builder) and ImageNet streamed from TFDS (imagenet_rn50_1pct.gin on
a tiny manual_dir prepared by the real imagenet2012 builders). Bindings only
shrink sizes and steps. Beside each cluster, the same command runs in one
process with the same two replicas (MirroredStrategy over two logical CPUs):
the same per-replica batches, supports and global batch norm, so the same
weights up to float32 rounding.

What each pair of runs must show (`run_beside_two_replicas`): both workers
print one fingerprint of their final weights, which the chief alone records
in the run history; the checkpoint of the last step holds those weights,
and the chief's export computes what they compute; the chief writes the
files one process writes, the worker nothing (no leftovers either), and
only the chief evaluates PAWS-NN; where both runs read the same batches,
the cluster's export is the one process's within the test's tolerance.
"""

import ast
import json
import re

import numpy as np
from PIL import Image
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from paws_tf import checkpoints
from paws_tf import run_dir
from paws_tf.runner import building
from paws_tf.runner import train
from tests.helpers import cluster
from tests.helpers import debug_gin
from tests.helpers import image_folders
from tests.helpers import run_py
from tests.helpers import tfds_archives

# What stays of a config's run: 2 epochs of a few steps of small images,
# a small backbone of the config's kind; no TensorBoard images of the first
# step's views, which build the input a second time in every process; no
# epoch-end PAWS-NN, which every worker takes part in, nor PAWS-NN's
# pictures, which the chief and the one process render twice: the final
# PAWS-NN stays (tests/test_cluster_runs.py checks all three on a
# cluster).
SHRINK = ('train.num_epochs = 2', 'train.verbose = 0',
          'train.view_images = False', 'train.eval_every_epochs = 0',
          'evaluate_nn.pictures = False')


def run_beside_two_replicas(root, gin_file, bindings, steps, image_size,
                            export_atol=None):
    """`--mode=train_and_evaluate` of `gin_file` with `bindings` on a
    two-worker cluster (`root/cluster`) and in one process with two
    replicas (`root/one_process`), side by side; checks what either run
    must show.

    Args:
        steps: the run's steps (its epochs times its unlabeled images
            over its global batch, counted by hand).
        image_size: the exported embedder's input size.
        export_atol: how far the cluster's exported embeddings may be
            from the one process's; None when the two runs read other
            batches, so that their exports are not compared.

    Returns:
        The workers' `[(returncode, output)]`, by task index.
    """
    config = dict(gin_file=gin_file, base_bindings=SHRINK + tuple(bindings))
    one_process = run_py.start(
        root / 'one_process', bindings=[cluster.ONE_PROCESS_TWO_REPLICAS],
        flags=['--strategy=mirrored'], mode='train_and_evaluate',
        script=cluster.TWO_CPUS, **config)
    workers = cluster.start_cluster([cluster.REPO / 'run.py'] + run_py.command(
        root / 'cluster', flags=['--strategy=multi_worker'],
        mode='train_and_evaluate', **config))
    results = cluster.finish_all(workers, timeout=900)
    cluster.check_ran(results)
    code, output = run_py.finish(one_process, timeout=900)
    assert code == 0, output[-4000:]
    # Both workers end with the same weights, and the chief alone records
    # them in the run history.
    prints = [cluster.fingerprints([out]) for _, out in results]
    assert len(prints[0]) == len(prints[1]) == 1, prints
    assert prints[0] == prints[1]
    history = open(run_dir.RunDir(root / 'cluster').history).read()
    assert history.count('finished at step') == 1, history
    assert f'finished at step {steps}; weights SHA-256 {prints[0][0]}' \
        in history
    assert checkpoints.latest(str(root / 'cluster' / 'checkpoints'))[1] \
        == steps
    # The chief writes what one process writes, the worker nothing.
    assert (cluster.written(root / 'cluster') ==
            cluster.written(root / 'one_process'))
    assert not cluster.worker_leftovers(root / 'cluster')
    assert 'PAWS-NN' in results[0][1] and 'PAWS-NN' not in results[1][1]
    images = tf.random.stateless_normal([6, image_size, image_size, 3],
                                        seed=[4, 4])
    embeddings = [cluster.exported_embeddings(root / run, images)
                  for run in ('cluster', 'one_process')]
    # The last checkpoint holds the weights the workers ended with, and
    # the export computes what they compute.
    with debug_gin.parsed(config['base_bindings'], gin_file=gin_file):
        model = building.build_local_model(input_channels=3)
        model(tf.zeros([1, image_size, image_size, 3]), training=False)
        checkpoints.load(root / 'cluster' / 'checkpoints' / f'ckpt-{steps}',
                         model)
    assert train.weights_fingerprint(model) == prints[0][0]
    restored = model(images, training=False)[
        'prediction' if model.nn_embedding == 'prediction'
        else 'embeddings'].numpy()
    np.testing.assert_allclose(embeddings[0], restored, rtol=1e-4,
                               atol=1e-5 * np.abs(restored).max())
    if export_atol is not None:
        np.testing.assert_allclose(embeddings[0], embeddings[1],
                                   atol=export_atol)
        assert np.abs(embeddings[1]).max() > 0.1  # Not a degenerate output.
    return results


# The line of each worker that computes NORMALIZATION = 'data'.
COMPUTED = re.compile(r'Normalisation computed from (\d+) labeled images'
                      r'.*: mean (\(.*\)), std (\(.*\))')


@pytest.mark.slow
@pytest.mark.long
def test_image_folders_small_on_a_cluster(tmp_path):
    """image_folders_small.gin: 48 unlabeled images of 3 classes in
    folders, a global batch of 16: 3 steps per epoch; NORMALIZATION =
    'data': every worker computes the labeled images' statistics (exact
    integer sums: the same numbers on every machine), the chief records
    them; both equal NumPy's of the images PIL reads.

    Fails if a worker normalises with other statistics than the chief's
    (tried: the ImageNet preset on the workers that record nothing, in
    `normalization.resolve_normalization`: the exports 0.97 apart), if
    the std is not the pixels' population std (tried: over count - 1 in
    `normalization.channel_statistics`, 2.6e-5 off), and as the CIFAR-10
    run does on what it shares."""
    paths = image_folders.write_experiment(tmp_path / 'data', unlabeled=16,
                                           test=2)
    # The exports measured up to 1.7e-4 apart on a 2-core AVX-512 Xeon and
    # 1.6e-3 on a 2-core AMD EPYC (values near 1): atol = 1e-2, about 100
    # times below the workers' normalising with the preset.
    results = run_beside_two_replicas(
        tmp_path, 'gin_configs/image_folders_small.gin',
        image_folders.SMALL + paths, steps=6, image_size=32, export_atol=1e-2)
    computed = [COMPUTED.findall(output) for _, output in results]
    assert len(computed[0]) == len(computed[1]) == 1, computed
    assert computed[0] == computed[1]
    count, mean, std = computed[0][0]
    recorded = json.loads(
        (tmp_path / 'cluster' / 'normalization.json').read_text())
    assert (recorded['images'], recorded['mean'], recorded['std']) == (
        int(count), list(ast.literal_eval(mean)),
        list(ast.literal_eval(std)))
    pixels = np.concatenate([
        np.asarray(Image.open(path)).reshape(-1, 3) / 255.0
        for path in sorted((tmp_path / 'data' / 'labeled').rglob('*.png'))])
    assert len(pixels) == int(count) * 40 * 40  # 12 images of 40 x 40.
    np.testing.assert_allclose(recorded['mean'], pixels.mean(0), rtol=1e-12)
    np.testing.assert_allclose(recorded['std'], pixels.std(0), rtol=1e-9)


@pytest.mark.slow
@pytest.mark.long
def test_cifar10_from_tfds_on_a_cluster(tmp_path, monkeypatch):
    """cifar10_wrn28_2_4000.gin on a CIFAR-10 of 80 training images
    prepared by TFDS' cifar10 builder (held in memory by `load_tfds`), 2
    labels per class, a global batch of 16: 5 steps per epoch; WRN-10-1
    in float32.

    Both sides bind `train.deterministic_ops` (bit-identical reruns: on a
    2-core AVX-512 Xeon two runs of this test measured the same
    1.1019707e-3 between the exports, values up to 4.8; without it they
    differ by 4.3e-2). The weights differ after the first step already (by
    up to 9e-6 of a variable's largest value) and more at each step (3.4e-3
    after 10). An all-reduce of two replicas adds two terms, alike in
    either order, so the replicas' own float32 computations differ between
    the two processes (not traced further; one intra-op thread per process
    does not remove it). On a 2-core AMD EPYC the exports end 8.8e-2
    apart. atol = 0.25: 2.8 times that, 3.3 times below what both workers
    training on one shard gives on the Xeon (0.82; 1.72 on the EPYC).

    Fails if both workers train on the first worker's shard (tried in
    `pipeline`'s replica slice), if a worker records
    the run history too (two "finished" lines), if the export is from
    another checkpoint than the last (tried: `checkpoints._saved` oldest
    first), if the worker evaluates too (it writes its own TensorBoard
    events), if the workers do not sum their gradients (the fingerprints
    differ; tried: `skip_gradients_aggregation=True` in
    `PAWSModel.train_step`), or if the worker keeps its copy of the
    checkpoints (`RunState.save` not deleting it). The workers training
    on each other's shard is the same run but for the order of the
    gathered supports: its export was 6.9e-3 off on the Xeon, not
    caught."""
    archive = tmp_path / 'served' / 'cifar-10-binary.tar.gz'
    archive.parent.mkdir()
    _, labels, _ = tfds_archives.cifar10_archive(
        archive, np.random.default_rng(5), per_batch=16, test=6)
    assert np.bincount(labels, minlength=10).min() >= 2
    tfds_archives.serve(monkeypatch, 'cifar10',
                        {tfds_archives.CIFAR10_URL: archive})
    data_dir = tmp_path / 'tfds'
    tfds.builder('cifar10', data_dir=str(data_dir)).download_and_prepare()
    run_beside_two_replicas(tmp_path, 'gin_configs/cifar10_wrn28_2_4000.gin', (
        f"load_tfds.data_dir = '{data_dir}'",
        'select_labeled.labels_per_class = 2',
        'make_pretrain_dataset_fn.global_batch_size = 16',
        'make_pretrain_dataset_fn.images_per_class = 1',
        'cifar10_multicrop.num_local = 2',
        'WarmupCosineDecay.warmup_epochs = 1',
        # float16 is emulated on a CPU: many times slower than float32.
        "train.precision = 'float32'",
        'wide_resnet.depth = 10', 'wide_resnet.width = 1',
        'ProjectionHead.hidden_dim = 16', 'ProjectionHead.output_dim = 16',
        'train.deterministic_ops = True',
    ), steps=10, image_size=32, export_atol=0.25)


@pytest.mark.slow
@pytest.mark.long
def test_imagenet_streamed_on_a_cluster(tmp_path):
    """imagenet_rn50_1pct.gin on a manual_dir of 2 classes x 12 images
    prepared by TFDS' imagenet2012 and imagenet2012_subset/1pct builders:
    the unlabeled images streamed from TFDS (each worker reads its shard
    file),
    the labeled subset's 4 cached as files; a global batch of 8: 3 steps
    per epoch; one support class per replica, a small ResNet instead of
    ResNet-50, mixed float16 as the config. The exports are not compared
    with one process's: that process reads both shard files in one
    pipeline, so its replicas get other batches than the workers.

    Fails as the CIFAR-10 run does on what it shares (fingerprints,
    history, checkpoint and export, written files). Not caught: each
    worker reading both shard files (tried: no `input_context` given to
    TFDS in `tfds_sources._open_tfds`), as nothing reads the same batches
    to compare with."""
    rng = np.random.default_rng(6)
    # In shards, as ImageNet's (1024 and 64): each worker reads its own.
    data_dir = tfds_archives.prepare_imagenet(
        tmp_path, per_class=12, subsets={'1pct': (0, 1)}, num_shards=2,
        images=lambda k, i: rng.integers(0, 256, (40, 48, 3), np.uint8))
    run_beside_two_replicas(tmp_path, 'gin_configs/imagenet_rn50_1pct.gin', (
        f"imagenet_sources.cache_dir = '{tmp_path / 'cache'}'",
        f"DATA_DIR = '{data_dir}'",
        'make_pretrain_dataset_fn.global_batch_size = 8',
        'make_pretrain_dataset_fn.classes_per_step = 2',
        'WarmupCosineDecay.warmup_epochs = 1',
        'make_pretrain_dataset_fn.images_per_class = 2',
        'imagenet_multicrop.global_size = 32',
        'imagenet_multicrop.local_size = 16',
        'imagenet_multicrop.num_local = 2',
        'eval_preprocessing.image_size = 32',
        "build_backbone.name = 'small_resnet'",
        'small_resnet.widths = (8, 16)',
        'small_resnet.blocks_per_stage = (1, 1)',
        'small_resnet.stage_strides = (2, 2)',
        'ProjectionHead.hidden_dim = 16', 'ProjectionHead.output_dim = 16',
        'PredictionHead.hidden_dim = 8',
    ), steps=6, image_size=32)
