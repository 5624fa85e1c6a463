"""Importing official PyTorch PAWS checkpoints: equal outputs in both
frameworks, PAWS-NN as snn_eval.py computes it, and clear errors.

The official side's normalisation (`OFFICIAL_CIFAR10`,
`OFFICIAL_IMAGENET`) is written here from the official code, so that a
wrong constant in `augment` cannot reach both sides. Bug tried there:
ImageNet's std (0.229, 0.224, 0.235) in `augment` (the fine-tuned
ResNet-50's raw-image logits differ; read from `augment` on the official
side too, they agreed).
"""

import contextlib
import json
import os
import pathlib
import sys

import gin
import numpy as np
import pytest
import tensorflow as tf

torch = pytest.importorskip('torch')

from paws_tf import checks  # noqa: E402
from paws_tf import cluster  # noqa: E402
from paws_tf import configurables  # noqa: E402,F401  (registers them)
from paws_tf import run_dir  # noqa: E402
from paws_tf.data import augment  # noqa: E402
from paws_tf.demo import run_demo  # noqa: E402
from paws_tf.runner import experiment  # noqa: E402
from paws_tf.runner import modes  # noqa: E402
from paws_tf.runner import official_import  # noqa: E402
from tests.helpers import official_torch  # noqa: E402
from tests.helpers import run_py  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
WRN_CONFIG = 'cifar10_wrn28_2_4000.gin'
RN50_CONFIG = 'imagenet_rn50_10pct.gin'
# ResNet-50 at 64 px (the architecture's 32x downsampling leaves 2 x 2):
# Resize(73) + CenterCrop(64), ImageNet's 0.875 crop fraction.
RN50_BINDINGS = ('eval_preprocessing.image_size = 64',)
RN50_RESIZE, RN50_CROP = 73, 64
# Relative tolerance of float32 outputs computed by two frameworks.
RTOL = 1e-4
# The official code's (mean, std): facebookresearch/suncet at 731547d,
# src/data_manager.py lines 519-521 (CIFAR-10) and 597-599 (ImageNet).
OFFICIAL_CIFAR10 = ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))
OFFICIAL_IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


@pytest.fixture(autouse=True)
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@contextlib.contextmanager
def _config(name, bindings=()):
    gin.clear_config()
    gin.add_config_file_search_path(str(REPO))
    try:
        gin.parse_config_files_and_bindings(
            [str(REPO / 'gin_configs' / name)], list(bindings))
        yield
    finally:
        gin.clear_config()


def _weight_count(encoder):
    """Tensors of a state dict, BatchNorm's update counters aside."""
    return sum(not key.endswith('num_batches_tracked')
               for key in encoder.state_dict())


def _strategy():
    return cluster.make_strategy('one_device')


def _import(model_dir, path, **kwargs):
    return modes.run(str(model_dir), _strategy(), 'import_official',
                     official_checkpoint=str(path), **kwargs)


def _images(seed, count, height, width):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (count, height, width, 3), dtype=np.uint8)


def _both_preprocessed(images, resize, crop, mean, std):
    """Each side's evaluation preprocessing of the same uint8 images:
    (paws_tf's NHWC, torchvision's NCHW as the official code runs it)."""
    ours = np.stack([augment.center_view(
        image, crop, crop_fraction=crop / resize if resize != crop else 1.0,
        mean=mean, std=std).numpy() for image in images])
    theirs = np.stack([official_torch.eval_transform(
        image, resize, crop, mean, std) for image in images])
    return ours, theirs


def _assert_close(ours, theirs, what):
    scale = np.abs(theirs).max()
    assert scale > 1e-3, f'{what}: degenerate reference'
    np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=RTOL * scale,
                               err_msg=what)


def _compare_embedder(export_dir, encoder, ours, theirs, keys):
    loaded = tf.saved_model.load(str(export_dir))
    got = loaded.signatures['embed_preprocessed'](images=tf.constant(ours))
    want = official_torch.outputs(encoder, torch.from_numpy(theirs))
    assert sorted(want) == sorted(keys)
    for key in keys:
        _assert_close(got[key].numpy(), want[key], key)
    return got, want


@pytest.mark.slow
def test_wide_resnet_import_gives_the_official_outputs(tmp_path):
    encoder = official_torch.randomize(official_torch.add_pretraining_heads(
        official_torch.WideResNet(), 128, use_pred=False), seed=1)
    official_torch.save_official(encoder, tmp_path / 'wrn.pth.tar')
    with _config(WRN_CONFIG):
        record = _import(tmp_path / 'run', tmp_path / 'wrn.pth.tar')
    assert record['kind'] == 'pretrained'
    assert record['network'] == 'wide_resnet28_2'
    assert record['epoch'] == 300
    assert record['tensors'] == _weight_count(encoder)
    images = _images(0, 6, 32, 32)  # CenterCrop(32): the whole image.
    ours, theirs = _both_preprocessed(images, 32, 32, *OFFICIAL_CIFAR10)
    np.testing.assert_allclose(ours, theirs.transpose(0, 2, 3, 1),
                               atol=1e-6)
    _compare_embedder(tmp_path / 'run/export/embedder', encoder, ours,
                      theirs, ['features', 'projection'])


@pytest.mark.slow
def test_resnet50_import_gives_the_official_outputs(tmp_path):
    encoder = official_torch.randomize(official_torch.add_pretraining_heads(
        official_torch.ResNet50(), 2048, use_pred=True), seed=2)
    official_torch.save_official(encoder, tmp_path / 'rn50.pth.tar')
    with _config(RN50_CONFIG, RN50_BINDINGS):
        record = _import(tmp_path / 'run', tmp_path / 'rn50.pth.tar')
    assert record['network'] == 'resnet50_1x'
    # 53 convolutions, 53 batch norms; 3 + 2 linear layers, 2 + 2 BNs.
    assert record['tensors'] == 53 + 53 * 4 + 5 * 2 + 4 * 4
    assert record['tensors'] == _weight_count(encoder)
    # The shorter side is already 73: Resize is the identity on both sides
    # (PIL rounds a resized image to uint8, TensorFlow does not), so the
    # two inputs agree exactly and the networks are compared alone.
    images = [*_images(3, 2, RN50_RESIZE, 90), *_images(4, 2, 81,
                                                        RN50_RESIZE)]
    ours, theirs = _both_preprocessed(images, RN50_RESIZE, RN50_CROP,
                                      *OFFICIAL_IMAGENET)
    np.testing.assert_allclose(ours, theirs.transpose(0, 2, 3, 1),
                               atol=1e-6)
    got, _ = _compare_embedder(
        tmp_path / 'run/export/embedder', encoder, ours, theirs,
        ['features', 'projection', 'prediction'])
    # The ImageNet configs compare the prediction head's output.
    np.testing.assert_array_equal(got['embeddings'], got['prediction'])


@pytest.mark.slow
def test_fine_tuned_resnet50_gives_the_official_logits(tmp_path):
    encoder = official_torch.randomize(official_torch.add_fine_tuned_head(
        official_torch.ResNet50(), num_classes=7), seed=5)
    official_torch.save_official(encoder, tmp_path / 'ft.pth.tar', epoch=50)
    with _config(RN50_CONFIG, RN50_BINDINGS):
        record = _import(tmp_path / 'run', tmp_path / 'ft.pth.tar')
        assert record['kind'] == 'fine_tuned'
        assert not os.path.exists(tmp_path / 'run/checkpoints')
        # Nothing to pre-train, export or evaluate with PAWS-NN: a clear
        # error names the import and what is needed.
        with pytest.raises(official_import.ImportFailed,
                           match='needs a pre-trained checkpoint'):
            modes.run(str(tmp_path / 'run'), _strategy(), 'evaluate_nn')
    images = _images(6, 3, RN50_RESIZE, 77)
    ours, theirs = _both_preprocessed(images, RN50_RESIZE, RN50_CROP,
                                      *OFFICIAL_IMAGENET)
    loaded = tf.saved_model.load(str(tmp_path / 'run/export/fine_tuned'))
    got = loaded.signatures['classify_preprocessed'](images=tf.constant(ours))
    want = official_torch.outputs(encoder, torch.from_numpy(theirs))
    _assert_close(got['logits'].numpy(), want['projection'], 'logits')
    np.testing.assert_array_equal(got['class_ids'],
                                  want['projection'].argmax(1))
    # The raw-image signature applies the same preprocessing inside.
    raw = loaded(tf.constant(images))
    _assert_close(raw['logits'].numpy(), want['projection'], 'raw logits')


def _official_snn_eval(encoder, support, support_labels, queries,
                       query_labels, num_classes, tau=0.1):
    """snn_eval.py: make_snn over the support embeddings, then top-1/top-5
    counts of its probabilities, as `evaluate_embeddings` computes them."""
    with torch.no_grad():
        embs = encoder.fc(encoder.features(torch.from_numpy(support)))
        z = encoder.fc(encoder.features(torch.from_numpy(queries)))
    labs = torch.nn.functional.one_hot(torch.from_numpy(support_labels),
                                       num_classes).float()
    embs = embs / embs.norm(dim=1, keepdim=True)
    z = z / z.norm(dim=1, keepdim=True)
    probs = torch.softmax(z @ embs.T / tau, dim=1) @ labs
    labels = torch.from_numpy(query_labels)
    top1 = float(probs.max(dim=1).indices.eq(labels).sum())
    top5 = float(probs.topk(min(5, num_classes), dim=1).indices.eq(
        labels.unsqueeze(1)).sum())
    return top1 / len(labels), top5 / len(labels), probs.argmax(1).numpy()


# CIFAR-10's config on small synthetic data at 32 px.
SYNTHETIC_BINDINGS = (
    'load_data.train = @train/synthetic_source',
    'load_data.test = @test/synthetic_source',
    'train/synthetic_source.num_images = 60',
    'test/synthetic_source.num_images = 40',
    'test/synthetic_source.seed = 1',
    'synthetic_source.image_size = 32',
    'synthetic_source.num_classes = 5',
    'select_labeled.labels_per_class = 4',
)


@pytest.mark.slow
def test_paws_nn_of_an_import_is_the_official_rule(tmp_path):
    encoder = official_torch.randomize(official_torch.add_pretraining_heads(
        official_torch.WideResNet(), 128, use_pred=False), seed=7)
    official_torch.save_official(encoder, tmp_path / 'wrn.pth.tar')
    with _config(WRN_CONFIG, SYNTHETIC_BINDINGS):
        _import(tmp_path / 'run', tmp_path / 'wrn.pth.tar')
        # export adds the PAWS-NN classifier, which bundles the supports.
        modes.run(str(tmp_path / 'run'), _strategy(), 'export')
        result = modes.run(str(tmp_path / 'run'), _strategy(), 'evaluate_nn')
        bundle = experiment.load_data(None)
    labeled, test = bundle.labeled, bundle.test

    def torch_views(source):
        images = np.stack([image for image, _ in
                           source.ordered_dataset().as_numpy_iterator()])
        return np.stack([official_torch.eval_transform(
            image, 32, 32, *OFFICIAL_CIFAR10)
            for image in images])

    top1, top5, predicted = _official_snn_eval(
        encoder, torch_views(labeled), labeled.labels.astype(np.int64),
        torch_views(test), test.labels.astype(np.int64), num_classes=5)
    assert result['num_support'] == 20 and result['num_queries'] == 40
    # Query by query, the exported classifier on the raw uint8 images.
    classifier = tf.saved_model.load(str(tmp_path / 'run/export/classifier'))
    images = np.stack([image for image, _ in
                       test.ordered_dataset().as_numpy_iterator()])
    np.testing.assert_array_equal(classifier(images)['class_ids'], predicted)
    assert result['top1'] == pytest.approx(top1, abs=1e-9)
    assert result['top5'] == pytest.approx(top5, abs=1e-9)
    assert 0 < top1 < 1  # A random network: neither all right nor wrong.


def _wrn_checkpoint(path, mutate=None, seed=0):
    encoder = official_torch.randomize(official_torch.add_pretraining_heads(
        official_torch.WideResNet(), 128, use_pred=False), seed=seed)
    official_torch.save_official(encoder, path)
    if mutate is not None:
        checkpoint = torch.load(path, weights_only=True)
        mutate(checkpoint['encoder'])
        torch.save(checkpoint, path)
    return path


def _refused(model_dir, path, match, config=WRN_CONFIG, bindings=()):
    with _config(config, bindings):
        with pytest.raises(official_import.ImportFailed, match=match):
            _import(model_dir, path)
    assert not os.path.exists(model_dir), 'a refused import wrote files'


def test_damaged_files_are_refused_naming_them(tmp_path):
    """Fails if a checkpoint with neither head is built as a fine-tuned
    classifier (or as the pre-trained model) rather than refused."""
    good = _wrn_checkpoint(tmp_path / 'good.pth.tar')
    data = good.read_bytes()
    (tmp_path / 'cut.pth.tar').write_bytes(data[:len(data) // 2])
    (tmp_path / 'text.pth.tar').write_text('not a checkpoint')
    torch.save({'state_dict': {}}, tmp_path / 'other.pth.tar')
    torch.save({'encoder': {'conv1.weight': torch.zeros(16, 3, 3, 3)}},
               tmp_path / 'headless.pth.tar')
    for name, match in (('cut', 'cut.pth.tar cannot be read'),
                        ('headless', 'headless.pth.tar has neither a '
                                     r'projection head \(fc\.fc3'),
                        ('text', 'text.pth.tar cannot be read'),
                        ('other', "other.pth.tar holds \\['state_dict'\\], "
                                  'not an official PAWS checkpoint'),
                        ('missing', 'missing.pth.tar: no such file')):
        _refused(tmp_path / name, tmp_path / f'{name}.pth.tar', match)


def test_missing_torch_says_how_to_install_it(tmp_path, monkeypatch):
    path = _wrn_checkpoint(tmp_path / 'wrn.pth.tar')
    monkeypatch.setitem(sys.modules, 'torch', None)  # import torch fails.
    _refused(tmp_path / 'run', path, r'pip install \.\[torch\]')


@pytest.mark.slow
def test_unmatched_and_misshaped_keys_are_listed(tmp_path):
    def mutate(state):
        del state['module.layer2.1.bn1.running_var']
        state['module.extra.weight'] = torch.zeros(3)
        state['module.fc.fc3.weight'] = torch.zeros(64, 128)
        state['module.fc.fc3.bias'] = torch.zeros(64)

    path = _wrn_checkpoint(tmp_path / 'bad.pth.tar', mutate)
    _refused(tmp_path / 'run', path,
             r'bad\.pth\.tar does not fit .*'
             r'1 key\(s\) the model needs are not in it: '
             r'layer2\.1\.bn1\.running_var; '
             r'1 key\(s\) in it have no place in the model: extra\.weight; '
             r'2 key\(s\) have another shape: fc\.fc3\.bias \[64\] '
             r'\(the model: \[128\]\), fc\.fc3\.weight \[64, 128\]')


def test_another_architecture_is_refused(tmp_path):
    path = _wrn_checkpoint(tmp_path / 'wrn.pth.tar')
    _refused(tmp_path / 'run', path,
             r'wrn\.pth\.tar holds wide_resnet28_2 .* but the gin config '
             r'builds small_resnet', config='debug.gin')


@pytest.mark.slow
def test_fine_tuned_linear_layout_and_refusals(tmp_path):
    """The single linear `fc` layout; a second import into the same
    directory is refused without --overwrite, and so are training and the
    demo over it.

    Fails if `run_demo.demo` trains over an import (its refusal removed)."""
    encoder = official_torch.WideResNet()
    encoder.fc = torch.nn.Linear(encoder.num_features, 3)
    encoder = official_torch.randomize(encoder, seed=9)
    official_torch.save_official(encoder, tmp_path / 'ft.pth.tar')
    with _config(WRN_CONFIG):
        record = _import(tmp_path / 'run', tmp_path / 'ft.pth.tar')
        assert record['kind'] == 'fine_tuned'
        assert record['tensors'] == _weight_count(encoder)
        with pytest.raises(official_import.ImportFailed,
                           match='already holds imported.json'):
            _import(tmp_path / 'run', tmp_path / 'ft.pth.tar')
        for train_over_it in (
                lambda: modes.run(str(tmp_path / 'run'), _strategy(), 'train'),
                lambda: run_demo.demo(run_dir.RunDir(tmp_path / 'run'),
                                      _strategy(), modes.Options())):
            with pytest.raises(official_import.ImportFailed,
                               match='not a paws_tf training run'):
                train_over_it()
    images = _images(10, 2, 32, 32)
    ours, theirs = _both_preprocessed(images, 32, 32, *OFFICIAL_CIFAR10)
    loaded = tf.saved_model.load(str(tmp_path / 'run/export/fine_tuned'))
    got = loaded.signatures['classify_preprocessed'](images=tf.constant(ours))
    want = official_torch.outputs(encoder, torch.from_numpy(theirs))
    _assert_close(got['logits'].numpy(), want['projection'], 'logits')
    info = json.loads((tmp_path / 'run/export/fine_tuned/'
                       'preprocessing.json').read_text())
    assert info['num_classes'] == 3 and info['image_size'] == 32


@pytest.mark.slow
@pytest.mark.long
def test_run_py_imports_then_fine_tunes(tmp_path):
    """run.py --mode=import_official: a truncated file exits with 65 and
    writes nothing; a good one gives a run that --mode=fine_tune (here
    in-process) works on."""
    path = _wrn_checkpoint(tmp_path / 'wrn.pth.tar', seed=3)
    data = path.read_bytes()
    (tmp_path / 'cut.pth.tar').write_bytes(data[:1000])
    # run_py's bindings shorten training, which the config's warm-up
    # refuses: the config's epochs again.
    bindings = SYNTHETIC_BINDINGS + ('train.num_epochs = 600',)
    bad, good = (run_py.start(
        tmp_path / name, bindings, gin_file=f'gin_configs/'
        f'{WRN_CONFIG}', mode='import_official',
        flags=[f'--official_checkpoint={tmp_path / checkpoint}'])
        for name, checkpoint in (('bad', 'cut.pth.tar'),
                                 ('run', 'wrn.pth.tar')))
    code, output = run_py.finish(bad)
    assert code == 65, output
    assert f'{tmp_path}/cut.pth.tar cannot be read by torch.load' in output
    assert not os.path.exists(tmp_path / 'bad')
    code, output = run_py.finish(good)
    assert code == 0, output
    assert os.path.isdir(tmp_path / 'run/export/embedder')
    fine_tuning = ('fine_tune_suncet.num_epochs = 1',
                   'fine_tune_suncet.steps_per_epoch = 1',
                   'fine_tune_suncet.classes_per_step = 5',
                   'fine_tune_suncet.images_per_class = 4')
    with _config(WRN_CONFIG, SYNTHETIC_BINDINGS + fine_tuning):
        results = modes.run(str(tmp_path / 'run'), _strategy(), 'fine_tune')
    assert len(results['paws_nn_by_epoch']) == 2  # Before and after.


def _recorded_import(root):
    """A run directory holding an import's records alone (imported.json,
    the embedder's preprocessing.json: RGB, ImageNet's statistics), what
    --mode=fine_tune reads before any weight or image."""
    run = run_dir.RunDir(str(root))
    run.write_json(run.imported, dict(kind=official_import.PRETRAINED,
                                      source='paws.pth.tar'))
    os.makedirs(run.embedder)
    run.write_json(os.path.join(run.embedder, 'preprocessing.json'), dict(
        channels=3, mean=list(augment.IMAGENET_MEAN),
        std=list(augment.IMAGENET_STD), image_size=16, crop_fraction=1.0))
    return run


def _files(root):
    return sorted(str(path) for path in pathlib.Path(root).rglob('*'))


def test_fine_tuning_an_import_on_grayscale_says_both_fixes_once(tmp_path):
    """Fine-tuning an import (RGB, ImageNet's normalisation) on a 1-channel
    source that is not a folder gets one message naming the source's
    channels binding and the normalisation together, exit 78, before
    anything is read or written; with both bindings made, the check
    passes. A source without a `channels` argument is refused once read,
    naming the RGB need and the normalisation to keep (exit 65).

    Caught: load_data asked for a 1-channel normalisation, then the import
    check refused it ('records the normalisation ...: bind 'imagenet''),
    the user sent between two messages."""
    run = _recorded_import(tmp_path / 'imported')
    before = _files(tmp_path)
    subset = ['load_data.train = @train/class_subset',
              'train/class_subset.source = @train/synthetic_source',
              'train/class_subset.classes = [0, 1, 2, 3]']
    for bindings, error, message in (
            (['load_data.normalization = ((0.5,), (0.25,))'],
             checks.ConfigError,
             'bind train/synthetic_source.channels = 3 (the images are '
             "decoded to that) and load_data.normalization = 'imagenet'"),
            (subset + ["load_data.normalization = 'imagenet'"],
             checks.DataError,
             'takes 3-channel images, but load_data.train gives 1-channel '
             'ones: bind it to a source of 3-channel images, keeping '
             "load_data.normalization = 'imagenet'")):
        with _config('debug.gin', ['train/synthetic_source.channels = 1']
                     + bindings):
            with pytest.raises(error) as refused:
                modes.run(run.path, _strategy(), 'fine_tune')
        assert refused.value.EXIT_CODE == error.EXIT_CODE
        assert message in str(refused.value), str(refused.value)
        assert _files(tmp_path) == before
    assert (checks.ConfigError.EXIT_CODE, checks.DataError.EXIT_CODE) == (
        os.EX_CONFIG, os.EX_DATAERR)
    with _config('debug.gin', ['train/synthetic_source.channels = 3',
                               "load_data.normalization = 'imagenet'"]):
        assert official_import.check_preprocessing(run) == (
            3, f'The model imported into {run}')


def test_a_one_channel_normalisation_asks_to_decode_only_what_is_not(
        tmp_path):
    """An RGB import fine-tuned with a 1-channel normalisation: the
    refusal names the normalisation to bind and, only where the source
    does not say it decodes 3 channels, how to get them: nothing more for
    synthetic_source's 3 channels, its `channels` binding where it is
    None, 'use a source of 3-channel images' for class_subset, which has
    no `channels` argument. Caught: 'and decode the images to 3' for
    every source, the 3-channel one included."""
    run = _recorded_import(tmp_path / 'imported')
    one_channel = ['load_data.normalization = ((0.5,), (0.25,))']
    subset = ['load_data.train = @train/class_subset',
              'train/class_subset.source = @train/synthetic_source',
              'train/class_subset.classes = [0, 1, 2, 3]']
    for bindings, end in (
            ([], "bind load_data.normalization = 'imagenet'."),
            (['train/synthetic_source.channels = None'],
             "bind load_data.normalization = 'imagenet' and "
             'train/synthetic_source.channels = 3.'),
            (subset, "bind load_data.normalization = 'imagenet' and use a "
                     'source of 3-channel images.')):
        with _config('debug.gin', one_channel + bindings):
            with pytest.raises(checks.ConfigError) as refused:
                official_import.check_preprocessing(run)
        assert str(refused.value).endswith(
            'not load_data.normalization = ((0.5,), (0.25,)): ' + end), (
                str(refused.value))
