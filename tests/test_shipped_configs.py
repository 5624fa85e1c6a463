"""Every shipped gin config through run.py, as a user runs it, on data of
its own source kind, shrunk only by the size and step bindings of `SHRINK`
(a config that then binds what its include binds runs as that include,
`SHRUNK_ALIKE`), outside the demo without what no check reads
(`_UNREAD`).

Which files run: every `gin_configs/*.gin` that binds `load_data.train`
(itself or through its includes); a file that binds no data (`base.gin`)
is an include only, never run alone. Each config runs
`--mode=train_and_evaluate` (train, export, evaluate_nn) then
`--mode=fine_tune` with its own protocol, or `--mode=demo` for the demo
configs (the demo's fine-tuning included), and its results are checked
against NumPy and against the logged figures, not only its exit code. A
config that binds, once shrunk, what another binds except pre-training's
objective and schedule and its data's selection (`FINE_TUNED_ALIKE`)
leaves its fine-tuning to that config's run; a config whose documented
commands a test runs with the same checks (`DOCUMENTED_RUN`) is left to
that test.

Bugs tried: support labels shifted by one class in `evaluate.classify`;
tau x10 there; the ImageNet fine-tuning rate's `final_lr` left to gin;
the subsets' images not excluded from the ImageNet validation draw; a ViT
built on 8-px images; `build_classifier` taking relu1 only; the transfer's
classes 4-8 instead of 5-9 (its counts unchanged); `start.start` not
loading `train.pretrained_model`; `PAWSModel.ropaws_prior_tau` renamed
(docs/ropaws.md's command line then stops).
"""

import gzip
import hashlib
import itertools
import json
import pathlib
import re
import shutil

import gin
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from paws_tf.data import pipeline
from paws_tf import run_dir
from paws_tf.runner import experiment
from paws_tf.runner import modes
from tests.helpers import debug_gin
from tests.helpers import idx
from tests.helpers import image_folders
from tests.helpers import once
from tests.helpers import run_py
from tests.helpers import tfds_archives
from tests.test_sources import FASHION_MNIST_NAMES

REPO = pathlib.Path(__file__).resolve().parents[1]


def _binds_data(name):
    """Whether gin_configs/`name` binds `load_data.train`, itself or
    through its includes."""
    text = (REPO / 'gin_configs' / name).read_text()
    return bool(re.search(r'^load_data\.train\s*=', text, re.M)) or any(
        _binds_data(pathlib.Path(include).name) for include in
        re.findall(r"^include '([^']+)'", text, re.M))


_CPU = ["train.precision = 'float32'", 'train.verbose = 0',
        'train.view_images = False']
# No warm-up, whether a config counts it in epochs or as a share of the run.
_NO_WARMUP = ['WarmupCosineDecay.warmup_epochs = 0',
              'WarmupCosineDecay.warmup_fraction = None']
_IMAGENET = _CPU + _NO_WARMUP + [
    'make_pretrain_dataset_fn.global_batch_size = 4',
    'make_pretrain_dataset_fn.classes_per_step = 2',
    'make_pretrain_dataset_fn.images_per_class = 1',
    'imagenet_multicrop.global_size = 32',
    'imagenet_multicrop.local_size = 32',
    'imagenet_multicrop.num_local = 2', 'eval_preprocessing.image_size = 32',
    'ProjectionHead.hidden_dim = 16', 'ProjectionHead.output_dim = 16',
    'PredictionHead.hidden_dim = 8', 'train.num_epochs = 1',
    'imagenet_validation.per_class = 2', 'fine_tune_linear.epochs = (3,)',
    'fine_tune_linear.global_batch_size = 2',
    'fine_tune_linear.eval_batch_size = 4']
# imagenet.gin's run trains its ResNet-50; the configs that include it
# bind their data and schedule, which a small ResNet runs too (the test of
# imagenet_rn50_10pct.gin: 84 s of CPU time with ResNet-50, 50 s with it).
_IMAGENET_SMALL = _IMAGENET + [
    "build_backbone.name = 'small_resnet'", 'small_resnet.widths = (16, 32)',
    'small_resnet.blocks_per_stage = (1, 1)',
    'small_resnet.stage_strides = (2, 2)']
_FASHION = _CPU + _NO_WARMUP + [
    'select_labeled.labels_per_class = 2',
    'make_pretrain_dataset_fn.global_batch_size = 16',
    'make_pretrain_dataset_fn.images_per_class = 1',
    'MultiCropConfig.num_local = 2', 'small_resnet.widths = (8, 8, 8)',
    'ProjectionHead.hidden_dim = 16', 'ProjectionHead.output_dim = 16',
    'train.num_epochs = 1', 'train_supervised.steps = 4',
    'train_supervised.batch_size = 16', 'fine_tune_suncet.num_epochs = 2',
    'fine_tune_suncet.steps_per_epoch = 2',
    'fine_tune_suncet.images_per_class = 1']
_FASHION_VALIDATION = _FASHION + ['held_out.size = 40']
# The demo's ViT at one block (the small ResNet's widths go unused).
_FASHION_VIT = _FASHION + ['vit.depth = 1']
_FOLDERS = [b for b in image_folders.SMALL
            if not b.startswith('train.num_epochs')] + _CPU + [
    'train.num_epochs = 1', 'fine_tune_suncet.steps_per_epoch = 2']
# One row per shipped config: the bindings that shrink it to seconds on a
# CPU (sizes and steps only; the data's paths come from its source kind).
SHRINK = {
    'cifar10_wrn28_2_4000.gin': _CPU + _NO_WARMUP + [
        'select_labeled.labels_per_class = 2',
        'make_pretrain_dataset_fn.global_batch_size = 16',
        'make_pretrain_dataset_fn.images_per_class = 1',
        'cifar10_multicrop.num_local = 2',
        'wide_resnet.depth = 10', 'wide_resnet.width = 1',
        'ProjectionHead.hidden_dim = 16', 'ProjectionHead.output_dim = 16',
        'train.num_epochs = 1', 'fine_tune_suncet.num_epochs = 2',
        'fine_tune_suncet.steps_per_epoch = 2',
        'fine_tune_suncet.images_per_class = 1'],
    # 4 steps, and 2048 queries: enough near a class boundary that PAWS-NN
    # at 10 times the config's tau classifies some of them otherwise
    # (`TAU_SENSITIVE`).
    'debug.gin': _CPU + _NO_WARMUP + [
        'train.num_epochs = 1', 'train/synthetic_source.num_images = 128',
        'test/synthetic_source.num_images = 2048'],
    'demo_fashion_mnist.gin': _FASHION,
    'demo_fashion_mnist_quick.gin': _FASHION + [
        'load_data.max_unlabeled = 64'],
    'demo_fashion_mnist_validation.gin': _FASHION_VALIDATION,
    'demo_fashion_mnist_vit.gin': _FASHION_VIT,
    'demo_fashion_mnist_vit_validation.gin': _FASHION_VIT + [
        'held_out.size = 40'],
    'image_folders.gin': _FOLDERS,
    'image_folders_small.gin': _FOLDERS,
    'imagenet.gin': _IMAGENET,
    'imagenet_rn50_10pct.gin': _IMAGENET_SMALL,
    'imagenet_rn50_10pct_8gpu.gin': _IMAGENET_SMALL,
    'imagenet_rn50_1pct.gin': _IMAGENET_SMALL,
    # ResNet-50 x2 and x4 (94M and 375M parameters) take minutes a step on
    # two cores; test_gin_configs builds them at full width. Shrunk, they
    # are imagenet_rn50_10pct.gin (`SHRUNK_ALIKE`).
    'imagenet_rn50x2_10pct.gin': _IMAGENET_SMALL + [
        'resnet50.width_multiplier = 1'],
    'imagenet_rn50x4_10pct.gin': _IMAGENET_SMALL + [
        'resnet50.width_multiplier = 1'],
    # ViT-S/16 at one block, with position embeddings for 32-px images.
    'imagenet_vits16_10pct.gin': _IMAGENET + [
        'vit.image_size = 32', 'vit.depth = 1'],
    'mismatch_fashion_mnist.gin': _FASHION,
    'mismatch_fashion_mnist_curated.gin': _FASHION,
    'mismatch_fashion_mnist_curated_ropaws.gin': _FASHION,
    'mismatch_fashion_mnist_ropaws.gin': _FASHION,
    'mismatch_fashion_mnist_validation.gin': _FASHION_VALIDATION,
    'transfer_fashion_mnist.gin': _FASHION,
    'transfer_fashion_mnist_source.gin': _FASHION,
    'transfer_fashion_mnist_validation.gin': _FASHION_VALIDATION,
}
# The configs whose test images are enough for PAWS-NN at 10 times tau to
# give other per-class accuracies than at tau: their runs must show it, so
# that their check of evaluate_nn's figures catches a wrong tau.
TAU_SENSITIVE = ('debug.gin',)
IMAGENET_PER_CLASS = 6
# The tiny archive's labeled subsets, as the SimCLR subset files list them.
SUBSETS = {'1pct': (0,), '10pct': (0, 1)}


def _imagenet_image(k, i):
    rng = np.random.default_rng(100 * k + i)
    image = rng.integers(0, 60, size=(20, 24, 3))
    image[..., k] += 150  # class k: a bright channel k
    return image.astype(np.uint8)


@pytest.fixture(scope='module')
def imagenet_data(tmp_path_factory):
    """ImageNet and both labeled subsets prepared once by the real TFDS
    builders from a tiny manual_dir: 2 classes of `IMAGENET_PER_CLASS`
    training images, the classes of the 2 validation images (one each), so
    that PAWS-NN's figures on them move with its labels."""
    _, data_dir = once.made(
        tmp_path_factory, 'shipped_imagenet',
        lambda root: str(tfds_archives.prepare_imagenet(
            root, per_class=IMAGENET_PER_CLASS, subsets=SUBSETS,
            images=_imagenet_image,
            synsets=tfds_archives.VALIDATION_SYNSETS)))
    return data_dir


def _imagenet_bindings(data_dir, cache_dir):
    return [f"DATA_DIR = '{data_dir}'",
            f"imagenet_sources.cache_dir = '{cache_dir}'",
            f"imagenet_validation.cache_dir = '{cache_dir}'"]


# What no check of a run outside `--mode=demo` reads (the demo's report
# shows the pictures, and prints its epoch-end PAWS-NN): the training's
# epoch-end PAWS-NN and the final PAWS-NN's pictures, left out of those
# runs.
_UNREAD = ['train.eval_every_epochs = 0', 'evaluate_nn.pictures = False']


def _run(gin_file, model_dir, bindings, mode):
    """run.py `--mode=mode` on `gin_file`, with `_UNREAD` unless it is
    the demo; its output."""
    code, output = run_py.finish(run_py.start(
        model_dir, bindings + ([] if mode == 'demo' else _UNREAD), mode=mode,
        gin_file=f'gin_configs/{gin_file}', base_bindings=()), timeout=900)
    assert code == 0, output[-4000:]
    return output


# How close a query's two best classes may be for it to count either way,
# as tau times the log of their scores' ratio (Eq. (1)), on the scale of a
# cosine similarity. The run's PAWS-NN embeds preprocessed batches with the
# model in hand, the check below raw images with the export, and the two
# round differently: on a 2-core AMD EPYC one query of 40 of
# demo_fashion_mnist_validation.gin flipped, its shrunk model's margins
# starting 0, 0, 0, 4.5e-8, 4.8e-8 (the transfer's 20 queries: 1.9e-6,
# 6.2e-6, 6.3e-6, 7.5e-6, 1.0e-5).
TIE = 1e-5


def _soft_nn_accuracy(support, support_labels, queries, query_labels, tau,
                      num_classes):
    """PAWS Eq. (1) by hand: softmax over cosine similarities / tau, summed
    per class; the least and the most `(top-1, per-class top-1)` of the
    argmax (None for a class without queries), a query whose two best
    classes tie (`TIE`) counted as a miss, then as a hit."""
    def normalise(x):
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    logits = normalise(queries) @ normalise(support).T / tau
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    scores = weights @ np.eye(num_classes)[support_labels]
    best_two = np.log(np.sort(scores, axis=1)[:, -2:])
    tied = tau * (best_two[:, 1] - best_two[:, 0]) < TIE
    hits = np.argmax(scores, axis=1) == query_labels

    def figures(hits):
        return np.mean(hits), [
            np.mean(hits[query_labels == c]) if np.any(query_labels == c)
            else None for c in range(num_classes)]

    return figures(hits & ~tied), figures(hits | tied)


def _within(results, bounds):
    """Whether the run's top-1 and per-class top-1 (`results`) lie within
    `_soft_nn_accuracy`'s `bounds`."""
    (low, low_per_class), (high, high_per_class) = bounds
    return low <= results['top1'] <= high and all(
        figure is None if least is None else least <= figure <= most
        for figure, least, most in zip(results['per_class_accuracy'],
                                       low_per_class, high_per_class,
                                       strict=True))


def _check_export_and_nn(gin_file, model_dir, bindings):
    """The exported embedder against the restored checkpoint on the same
    images, and evaluate_nn's top-1 and per-class top-1 against NumPy's
    soft nearest neighbour over the exported embeddings of the labeled and
    test images."""
    results = json.loads(
        (pathlib.Path(model_dir) / 'eval' / 'paws_nn.json').read_text())
    embedder = tf.saved_model.load(str(pathlib.Path(model_dir) / 'export' /
                                       'embedder'))
    with debug_gin.parsed(bindings, gin_file=f'gin_configs/{gin_file}'):
        run = run_dir.RunDir(model_dir)
        model, _ = modes.load_trained_model(
            run, tf.distribute.get_strategy(), local=True)
        bundle = experiment.load_data(run)
        preprocessing = experiment.eval_preprocessing(bundle)

    def embed(source):
        # Raw images in batches of one size (folders' sizes vary), in
        # source order.
        images, labels = zip(*source.ordered_dataset().as_numpy_iterator())
        embeddings = []
        for _, run in itertools.groupby(images, key=np.shape):
            run = list(run)
            embeddings += [embedder(np.stack(run[i:i + 256]))['embeddings']
                           .numpy() for i in range(0, len(run), 256)]
        return np.concatenate(embeddings), np.array(labels)

    support, support_labels = embed(bundle.labeled)
    queries, query_labels = embed(bundle.test)
    assert results['num_support'] == len(support_labels)
    assert results['num_queries'] == len(query_labels)
    num_classes = (len(bundle.labeled.class_names) or
                   int(support_labels.max()) + 1)
    bounds = _soft_nn_accuracy(support, support_labels, queries,
                               query_labels, model.tau, num_classes)
    assert _within(results, bounds), (results, bounds)
    if gin_file in TAU_SENSITIVE:
        # Else the figures above would pass at a wrong tau too.
        assert not _within(results, _soft_nn_accuracy(
            support, support_labels, queries, query_labels, 10 * model.tau,
            num_classes))
    if gin_file.startswith('imagenet'):
        # Else they would pass with the support labels shifted by a class
        # (tried: `(support_labels + 1) % num_classes` in
        # `evaluate.classify`, which queries of no trained class let pass).
        assert not _within(results, _soft_nn_accuracy(
            support, (support_labels + 1) % num_classes, queries,
            query_labels, model.tau, num_classes))
    # The checkpoint's model on the same images, preprocessed by the
    # config's evaluation pipeline.
    images, _ = next(iter(pipeline.make_eval_dataset(
        bundle.labeled, batch_size=len(support_labels), **preprocessing)))
    # Rounding errors scale with the summands, so with the largest value
    # of the output, not with each element (a row of values near 1e9 had
    # an element of 5e7 off by 1e-4 of itself).
    np.testing.assert_allclose(
        model(images, training=False)[
            'prediction' if model.nn_embedding == 'prediction'
            else 'embeddings'], support, rtol=1e-4,
        atol=1e-5 * np.abs(support).max())
    return results


def _validation_draw(per_class, seed=0):
    """The validation names by hand: per class, the `per_class` training
    images outside both subsets with the smallest SHA-256 of
    '<seed>:<file name>'."""
    labeled = {f'{synset}_{i}.JPEG'
               for synset in tfds_archives.VALIDATION_SYNSETS
               for indices in SUBSETS.values() for i in indices}
    chosen = set()
    for synset in tfds_archives.VALIDATION_SYNSETS:
        rest = [f'{synset}_{i}.JPEG' for i in range(IMAGENET_PER_CLASS)
                if f'{synset}_{i}.JPEG' not in labeled]
        chosen.update(sorted(rest, key=lambda name: hashlib.sha256(
            f'{seed}:{name}'.encode()).digest())[:per_class])
    return chosen, labeled


def _check_imagenet_fine_tune(model_dir, cache_dir, output):
    """The validation draw against the hand-drawn names, and the kept epoch
    against the per-epoch validation top-1 the run logged."""
    tuned = json.loads((pathlib.Path(model_dir) / 'fine_tune' /
                        'results.json').read_text())
    assert tuned['protocol'] == 'imagenet'
    logged = [float(v) for v in re.findall(
        r'Fine-tuning epoch \d+: validation top-1 ([0-9.]+)', output)]
    assert len(logged) == tuned['epochs'] == 3
    assert tuned['best_epoch'] == 1 + int(np.argmax(logged))
    manifest = next(pathlib.Path(cache_dir).glob(
        'imagenet2012_validation_2_per_class_seed_0/manifest.tsv'))
    names = {line.split('\t')[2] for line in
             manifest.read_text().splitlines()}
    expected, labeled = _validation_draw(per_class=2)
    assert names == expected and not names & labeled
    assert tuned['num_validation'] == len(expected)



def _check_imagenet_learning_rates(model_dir, epochs, learning_rate):
    """The rate TensorBoard logged after each fine-tuning epoch against the
    official cosine from the lr to 0 (suncet WarmupCosineSchedule with no
    warm-up and final_lr 0), at the step ending that epoch."""
    logged = {}
    for path in (pathlib.Path(model_dir) / 'tensorboard' / 'fine_tune' /
                 'final' / 'train').glob('events.out.tfevents.*'):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == 'epoch_learning_rate':
                    logged[event.step] = float(
                        tf.make_ndarray(value.tensor))
    np.testing.assert_allclose(
        [logged[epoch] for epoch in range(epochs)],
        [learning_rate * 0.5 * (1 + np.cos(np.pi * (epoch + 1) / epochs))
         for epoch in range(epochs)], atol=1e-7)


def _check_cifar10_fine_tune(model_dir, output):
    """The kept (best) epoch against the per-epoch PAWS-NN the run
    logged."""
    tuned = json.loads((pathlib.Path(model_dir) / 'fine_tune' /
                        'results.json').read_text())
    assert tuned['protocol'] == 'cifar10'
    logged = re.findall(
        r'Fine-tuning epoch (\d+)/\d+: PAWS-NN top-1 ([0-9.]+)%', output)
    assert logged and [e['epoch'] for e in tuned['paws_nn_by_epoch'][1:]] == [
        int(epoch) for epoch, _ in logged]
    figures = [tuned['paws_nn_before']['top1']] + [
        float(top1) / 100 for _, top1 in logged]
    np.testing.assert_allclose(
        [e['top1'] for e in tuned['paws_nn_by_epoch']], figures, atol=5e-5)
    best = int(np.argmax(np.round(figures, 4)))
    assert tuned['best_epoch'] == tuned['paws_nn_by_epoch'][best]['epoch']


@pytest.fixture(scope='module')
def fashion_mnist_dir(tmp_path_factory):
    """Fashion-MNIST's four IDX files as Debian installs them: 120
    training and 40 test images, every class alike often."""
    folder = tmp_path_factory.mktemp('fashion_mnist')
    rng = np.random.default_rng(0)
    for prefix, count in (('train', 120), ('t10k', 40)):
        labels = np.arange(count) % 10
        images = rng.integers(0, 80, size=(count, 28, 28))
        images += 17 * labels[:, None, None]
        idx.write_idx(folder / f'{prefix}-images-idx3-ubyte.gz', images)
        idx.write_idx(folder / f'{prefix}-labels-idx1-ubyte.gz', labels)
    return folder


@pytest.fixture(scope='module')
def cifar10_data_dir(tmp_path_factory):
    """CIFAR-10 prepared once by the real TFDS builder from a tiny archive
    in the real layout (100 training, 3 test images)."""
    def prepare(root):
        archive = root / 'cifar-10-binary.tar.gz'
        tfds_archives.cifar10_archive(archive, np.random.default_rng(0),
                                      per_batch=20)
        with pytest.MonkeyPatch.context() as monkeypatch:
            tfds_archives.serve(monkeypatch, 'cifar10',
                                {tfds_archives.CIFAR10_URL: archive})
            tfds.builder('cifar10', data_dir=str(root / 'tfds')
                         ).download_and_prepare()

    root, _ = once.made(tmp_path_factory, 'shipped_cifar10', prepare)
    return str(root / 'tfds')


def _fashion_bindings(request):
    folder = request.getfixturevalue('fashion_mnist_dir')
    return [f"fashion_mnist.idx_dir = '{folder}'"]


@pytest.fixture(scope='module')
def transfer_source(request, tmp_path_factory):
    """transfer_fashion_mnist_source.gin's `--mode=train_and_evaluate` run,
    shrunk (its `SHRINK` row, which is transfer_fashion_mnist.gin's): the
    run that its shipped-config test checks, and the source
    model of the documented transfer. Each takes a copy
    (`_copy_of_source`)."""
    gin_file = 'transfer_fashion_mnist_source.gin'
    assert SHRINK[gin_file] == SHRINK['transfer_fashion_mnist.gin']
    bindings = SHRINK[gin_file] + _fashion_bindings(request)

    def train(root):
        _run(gin_file, str(root / 'run'), bindings, 'train_and_evaluate')

    root, _ = once.made(tmp_path_factory, 'transfer_source', train)
    return root / 'run'


def _copy_of_source(request, model_dir):
    """A copy of `transfer_source`'s run at `model_dir`, its own to change
    (a fine-tuning, a continued run) whatever the order of the tests."""
    shutil.copytree(request.getfixturevalue('transfer_source'), model_dir)
    return str(model_dir)


def _data_bindings(gin_file, request, tmp_path):
    """The bindings that point `gin_file` at test data of its own source
    kind."""
    if gin_file.startswith('imagenet'):
        return _imagenet_bindings(request.getfixturevalue('imagenet_data'),
                                  str(tmp_path / 'cache'))
    if gin_file.startswith('image_folders'):
        return image_folders.write_experiment(tmp_path / 'images',
                                              unlabeled=4, test=2)
    if 'fashion_mnist' in gin_file:
        return _fashion_bindings(request)
    if gin_file.startswith('cifar10'):
        data_dir = request.getfixturevalue('cifar10_data_dir')
        return [f"train/load_tfds.data_dir = '{data_dir}'",
                f"test/load_tfds.data_dir = '{data_dir}'"]
    assert gin_file == 'debug.gin', (
        f'{gin_file}: give it test data of its source kind in '
        '_data_bindings.')
    return []  # Its own synthetic images.


# existing_model_folders.gin trains no model of its own: its documented
# command runs in tests/test_existing_model.py. image_folders_vit.gin
# continues an imported ViT: tests/test_vit_recipe.py runs its command.
CONFIGS = [name for name in sorted(
    path.name for path in (REPO / 'gin_configs').glob('*.gin'))
    if _binds_data(name) and name not in (
        'existing_model_folders.gin', 'image_folders_vit.gin')]
# Configs that bind, once shrunk, what the config they include binds: their
# run would repeat that config's (checked by
# `test_a_config_left_out_is_its_include_once_shrunk`).
SHRUNK_ALIKE = {'imagenet_rn50x2_10pct.gin': 'imagenet_rn50_10pct.gin',
                'imagenet_rn50x4_10pct.gin': 'imagenet_rn50_10pct.gin'}
# Configs that bind, once shrunk, what a stand-in binds except what
# pre-training alone reads or which images the sources hold: their
# `--mode=fine_tune` would run the stand-in's fine-tuning on data of the
# same source kind, which their own train_and_evaluate run reads (checked
# by `test_a_config_fine_tuned_as_another_differs_before_fine_tuning`).
FINE_TUNED_ALIKE = {
    'imagenet_rn50_10pct_8gpu.gin': 'imagenet_rn50_10pct.gin',
    'mismatch_fashion_mnist_curated.gin': 'mismatch_fashion_mnist.gin',
    'mismatch_fashion_mnist_curated_ropaws.gin': 'mismatch_fashion_mnist.gin',
    'mismatch_fashion_mnist_ropaws.gin': 'mismatch_fashion_mnist.gin',
    'mismatch_fashion_mnist_validation.gin': 'mismatch_fashion_mnist.gin',
    'transfer_fashion_mnist_source.gin': 'transfer_fashion_mnist.gin',
    'transfer_fashion_mnist_validation.gin': 'transfer_fashion_mnist.gin'}
# The bindings fine-tuning never reads: pre-training's objective and
# schedule, and which images the sources hold (the classes kept, a
# held-out split, an unlabeled source of its own).
_BEFORE_FINE_TUNING = re.compile(
    r'(PAWSModel\.(objective|me_max_weight)|WarmupCosineDecay\.\w+|'
    r'load_data\.(test|unlabeled)|(\w+/)?(class_subset|held_out)\.\w+|'
    r'CLASSES) = ')


def _config_text(gin_file, bindings):
    """Every binding of `gin_file` with `bindings`, as gin writes them."""
    with debug_gin.parsed(bindings, gin_file=f'gin_configs/{gin_file}'):
        return gin.config_str()


@pytest.mark.parametrize('gin_file', sorted(SHRUNK_ALIKE))
def test_a_config_left_out_is_its_include_once_shrunk(gin_file):
    """A config whose run is left out binds, with its `SHRINK` row, what
    its stand-in binds with that row (whose one binding beyond the
    stand-in's own row, ResNet-50's width 1, is the default): the
    stand-in's run is its run.

    Fails if a config left out binds anything of its own that its row
    does not shrink away (tried: `PAWSModel.me_max_weight = 0.0` added to
    imagenet_rn50x4_10pct.gin)."""
    stand_in = SHRUNK_ALIKE[gin_file]
    assert stand_in in CONFIGS and stand_in not in SHRUNK_ALIKE
    assert (_config_text(gin_file, SHRINK[gin_file]) ==
            _config_text(stand_in, SHRINK[gin_file]))


@pytest.mark.parametrize('gin_file', sorted(FINE_TUNED_ALIKE))
def test_a_config_fine_tuned_as_another_differs_before_fine_tuning(
        gin_file):
    """A config whose `--mode=fine_tune` is left out binds, with its
    `SHRINK` row, what its stand-in binds with its own row, except
    bindings that fine-tuning never reads (`_BEFORE_FINE_TUNING`).

    Fails if a config left out binds anything of its own that fine-tuning
    reads (tried: `fine_tune_suncet.tau = 0.2` added to
    mismatch_fashion_mnist_ropaws.gin)."""
    stand_in = FINE_TUNED_ALIKE[gin_file]
    assert stand_in in CONFIGS and stand_in not in FINE_TUNED_ALIKE

    def bound(name):
        return {line for line in _config_text(name, SHRINK[name])
                .splitlines() if ' = ' in line}

    differing = bound(gin_file) ^ bound(stand_in)
    assert differing and all(_BEFORE_FINE_TUNING.match(line)
                             for line in differing), sorted(differing)


# Configs that `test_the_documented_transfer_runs` runs through a documented
# command (the transfer's continued `--mode=demo`) and checks as the test
# below does: their run here would repeat that one.
DOCUMENTED_RUN = ('transfer_fashion_mnist.gin',)


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize('gin_file', [
    name for name in CONFIGS
    if name not in SHRUNK_ALIKE and name not in DOCUMENTED_RUN])
def test_shipped_config_runs_every_mode(gin_file, request, tmp_path):
    """train_and_evaluate then fine_tune (or demo, for the demo configs;
    train_and_evaluate alone for `FINE_TUNED_ALIKE`) through run.py, on
    data of the config's source kind.

    Fails if PAWS-NN is not Eq. (1) over the exported embeddings (tried,
    debug.gin: support labels shifted by one class in
    `evaluate.classify`; and tau x10 there, which debug.gin's run must
    show in its per-class figures, `TAU_SENSITIVE`), if the ImageNet
    fine-tuning rate is not the official cosine to 0 (with `final_lr` left
    to gin in
    `linear_fine_tune._optimizer`, imagenet_rn50_1pct.gin logged 0.031,
    0.053, 0.064 for 0.015, 0.005, 0), if the export differs from the
    checkpoint, if the ImageNet validation draw is not the hand-drawn one
    outside both subsets (tried, imagenet_rn50_1pct.gin: the subsets'
    images not excluded in `tfds_sources._validation_examples`), if the
    kept epoch is not the best logged one, or if a ViT config does not
    train or fine-tune (tried, imagenet_vits16_10pct.gin: the model built
    on 8-px images in `building.build_model`, not a multiple of its patch;
    `linear_fine_tune.build_classifier` taking relu1 only, not the GELU
    head's gelu1: both stop with a ValueError).
    """
    assert gin_file in SHRINK, (
        f'Add a row for {gin_file} to SHRINK in {pathlib.Path(__file__).name}'
        ' (size and step bindings that run it in seconds on a CPU).')
    model_dir = str(tmp_path / 'run')
    bindings = SHRINK[gin_file] + _data_bindings(gin_file, request, tmp_path)
    output = None
    if gin_file.startswith('demo_'):
        output = _run(gin_file, model_dir, bindings, 'demo')
    elif gin_file == 'transfer_fashion_mnist_source.gin':
        # Its train_and_evaluate run with these bindings, shared.
        _copy_of_source(request, model_dir)
    else:
        _run(gin_file, model_dir, bindings, 'train_and_evaluate')
    _check_export_and_nn(gin_file, model_dir, bindings)
    if gin_file in FINE_TUNED_ALIKE:
        return  # Its stand-in's test fine-tunes.
    if output is None:
        output = _run(gin_file, model_dir, bindings, 'fine_tune')
    if gin_file.startswith('imagenet'):
        _check_imagenet_fine_tune(model_dir, str(tmp_path / 'cache'), output)
        _check_imagenet_learning_rates(model_dir, 3, 0.02)
    else:
        _check_cifar10_fine_tune(model_dir, output)


# The transfer's classes, Fashion-MNIST's ids 5-9, by their names.
TRANSFER_CLASSES = FASHION_MNIST_NAMES[5:]


def _read_idx(path):
    """A gzipped IDX file of uint8 values, read here: its header's
    dimensions, then the values."""
    with gzip.open(path, 'rb') as f:
        data = f.read()
    ndim = data[3]
    shape = np.frombuffer(data[4:4 + 4 * ndim], '>u4')
    return np.frombuffer(data[4 + 4 * ndim:], np.uint8).reshape(shape)


def _split_rows(model_dir):
    """The training-image indices that a run's labeled split file lists."""
    text = (model_dir / 'labeled_split.txt').read_text()
    return [int(line) for line in text.splitlines()
            if line and not line.startswith('#')]


@pytest.mark.slow
@pytest.mark.long
def test_the_documented_transfer_runs(request, tmp_path):
    """docs/own_images.md's transfer commands, shrunk: the source model on
    five classes, PAWS-NN of it on the other five with no training, and
    PAWS continued from it in `--mode=demo`. Which classes and images each
    step holds is read here from the IDX files: PAWS-NN's support is 2
    training images of each of classes 5-9 (its split file), named as
    Fashion-MNIST names them in the exported classifier, and its queries
    every test image of those classes, its per-class figures those of
    NumPy's soft nearest neighbour over the source model's exported
    embeddings of these images; the continued
    run's labeled images are of classes 5-9 too, and it is checked as
    `test_shipped_config_runs_every_mode` checks a demo config's run.

    Fails if the transfer's support or test holds the source's classes
    (tried: `CLASSES = (4, 5, 6, 7, 8)` in transfer_fashion_mnist.gin: the
    counts stay 10 and 20), or if the continued run does
    not start from the source model (tried: `start.start` not loading
    `train.pretrained_model`)."""
    folder = request.getfixturevalue('fashion_mnist_dir')
    shrink = SHRINK['transfer_fashion_mnist.gin'] + _fashion_bindings(request)
    # transfer_fashion_mnist_source.gin's train_and_evaluate run on `shrink`.
    source = tmp_path / 'source'
    _copy_of_source(request, source)
    nn = tmp_path / 'nn'
    _run('transfer_fashion_mnist.gin', str(nn), shrink + [
        f"evaluate_nn.from_model = '{source}'"], 'evaluate_nn')
    figures = json.loads((nn / 'eval' / 'paws_nn.json').read_text())
    train_images = _read_idx(folder / 'train-images-idx3-ubyte.gz')
    train_labels = _read_idx(folder / 'train-labels-idx1-ubyte.gz')
    test_images = _read_idx(folder / 't10k-images-idx3-ubyte.gz')
    test_labels = _read_idx(folder / 't10k-labels-idx1-ubyte.gz')
    rows = _split_rows(nn)
    np.testing.assert_array_equal(
        np.bincount(train_labels[rows], minlength=10), [0] * 5 + [2] * 5)
    queries = np.flatnonzero(test_labels >= 5)  # fashion_mnist_dir: 4 each.
    embedder = tf.saved_model.load(str(source / 'export' / 'embedder'))

    def embed(images):
        return embedder(tf.constant(images[..., None]))['embeddings'].numpy()

    bounds = _soft_nn_accuracy(
        embed(train_images[rows]), train_labels[rows] - 5,
        embed(test_images[queries]), test_labels[queries] - 5,
        figures['tau'], 5)
    assert (figures['num_support'], figures['num_queries']) == (
        len(rows), len(queries)) == (10, 20)
    assert _within(figures, bounds), (figures, bounds)
    classifier = tf.saved_model.load(str(nn / 'export' / 'classifier'))
    assert [name.decode() for name in classifier.head.class_names.numpy()
            ] == list(TRANSFER_CLASSES)
    continued = tmp_path / 'continued'
    shrink.append(f"train.pretrained_model = '{source}'")
    output = _run('transfer_fashion_mnist.gin', str(continued), shrink,
                  'demo')
    history = (continued / 'run_history.txt').read_text()
    assert f'from the model of {source}' in history, history
    with open(continued / 'results.json') as f:
        assert json.load(f)['num_labeled'] == 10
    np.testing.assert_array_equal(
        np.bincount(train_labels[_split_rows(continued)], minlength=10),
        [0] * 5 + [2] * 5)
    # transfer_fashion_mnist.gin's run (`DOCUMENTED_RUN`); the check of the
    # export loads the data, which writes the split again.
    _check_export_and_nn('transfer_fashion_mnist.gin', str(continued),
                         shrink)
    _check_cifar10_fine_tune(continued, output)


@pytest.mark.slow
@pytest.mark.long
def test_the_documented_ropaws_validation_run(request, tmp_path):
    """docs/ropaws.md's RoPAWS run on the validation split, its two
    bindings given on the command line as the docs write them, shrunk:
    the run trains RoPAWS with the prior temperature bound (0.1, the
    config's is 3.0: its operative config and its logged in-domain share
    say so), and its PAWS-NN figures are NumPy's over its export.

    Fails if a documented binding is no longer the model's (tried:
    `PAWSModel.ropaws_prior_tau` renamed in `PAWSModel` and its configs,
    the docs left as they are: the run stops on the command line's
    binding)."""
    gin_file = 'mismatch_fashion_mnist_validation.gin'
    model_dir = tmp_path / 'run'
    bindings = (SHRINK[gin_file] + _data_bindings(gin_file, request, tmp_path)
                + ["PAWSModel.objective = 'ropaws'",
                   'PAWSModel.ropaws_prior_tau = 0.1'])
    output = _run(gin_file, str(model_dir), bindings, 'train_and_evaluate')
    operative = (model_dir / 'config.gin').read_text()
    assert "PAWSModel.objective = 'ropaws'" in operative
    assert 'PAWSModel.ropaws_prior_tau = 0.1' in operative
    assert 'in_domain=' in output, output[-3000:]
    _check_export_and_nn(gin_file, str(model_dir), bindings)
