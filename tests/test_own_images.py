"""PAWS on a user's own image folders, through run.py: both recipes, the
normalisation computed from the images, the early errors."""

import json
import pathlib
import re
import subprocess
import sys

import numpy as np
from PIL import Image
import pytest
import tensorflow as tf

from paws_tf.data import augment
from paws_tf.data import pipeline
from paws_tf.runner import experiment
from tests.helpers import idx
from tests.helpers import image_folders
from tests.helpers import run_py as run_py_here  # run_py: this module's own.

REPO = pathlib.Path(__file__).resolve().parents[1]


def _assert_normalises_raw_images(embedder, test, mean, std):
    """The SavedModel normalises raw images with `mean` and `std`: 28 x 28
    test images go through it whole (crop_fraction 1), so its raw signature
    equals the preprocessed one fed (x / 255 - mean) / std."""
    raw = np.stack([i for i in test if i.shape[:2] == (28, 28)])
    by_hand = ((raw / 255 - mean) / std).astype(np.float32)
    np.testing.assert_allclose(
        embedder(tf.constant(raw))['embeddings'].numpy(),
        embedder.signatures['embed_preprocessed'](
            images=tf.constant(by_hand))['embeddings'].numpy(),
        rtol=1e-4, atol=1e-5)


def _read_classes(root):
    """Class name -> the images of `root/<class>/` (PIL, file order)."""
    return {d.name: [np.asarray(Image.open(f).convert('RGB'))
                     for f in sorted(d.iterdir())]
            for d in sorted(root.iterdir())}


def _assert_paws_nn_by_hand(embedder, results, supports, queries):
    """`results` (paws_nn.json) against a NumPy soft nearest-neighbour over
    the export's embeddings of `supports` and `queries`, dicts of class
    name -> raw images (class ids: the names in sorted order)."""
    def embed(images):
        return np.concatenate([
            embedder(tf.constant(i[None]))['embeddings'].numpy()
            for i in images])

    def normalized(x):
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    names = sorted(supports)
    sup = normalized(np.concatenate([embed(supports[n]) for n in names]))
    sup_labels = np.repeat(np.arange(len(names)),
                           [len(supports[n]) for n in names])
    query = normalized(np.concatenate([embed(queries[n]) for n in names]))
    query_labels = np.repeat(np.arange(len(names)),
                             [len(queries[n]) for n in names])
    logits = query @ sup.T / results['tau']
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities = weights @ np.eye(len(names))[sup_labels]
    hits = probabilities.argmax(axis=1) == query_labels
    assert results['top1'] == pytest.approx(hits.mean(), abs=1e-9)
    assert results['per_class_accuracy'] == pytest.approx(
        [hits[query_labels == c].mean() for c in range(len(names))],
        abs=1e-9)


@pytest.mark.slow
@pytest.mark.long
def test_demo_on_image_folders(tmp_path):
    """Fails if PAWS-NN pairs the supports with labels shifted by one
    class (`np.roll(support_labels, 4)` in evaluate.paws_nn)."""
    paths = image_folders.write_experiment(tmp_path, unlabeled=20, test=5)
    (tmp_path / 'unlabeled' / 'broken.jpg').write_bytes(b'')
    bindings = image_folders.SMALL + paths + ['SEED = 5',
                                              'train.seed = %SEED']
    proc = subprocess.run(
        [sys.executable, str(REPO / 'run.py'),
         '--gin_file=gin_configs/image_folders.gin',
         f'--model_dir={tmp_path / "run"}', '--mode=demo'] +
        [f'--gin_bindings={b}' for b in bindings],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # 60 images + broken, read twice: by training, then once by the demo
    # for PAWS-NN, the export, fine-tuning and the baseline.
    assert proc.stderr.count('Skipping 1 of 61 files') == 2
    # Output to a pipe: progress in whole lines, one at each epoch end at
    # least: fine-tuning's 2 epochs of 2 steps, the baseline's 20 steps in
    # 10 Keras epochs (pre-training's is off: train.verbose = 0).
    assert '\r' not in proc.stdout
    lines = re.findall(r'^epoch \d+/\d+  step \d+/\d+  loss ', proc.stdout,
                       re.M)
    for end in ('epoch 1/2  step 2/2', 'epoch 2/2  step 2/2',
                'epoch 10/10  step 2/2'):
        assert f'{end}  loss ' in lines, proc.stdout[-3000:]
    results = json.loads((tmp_path / 'run' / 'results.json').read_text())
    assert results['num_labeled'] == 12 and results['num_test'] == 15
    assert results['num_unlabeled'] == 60 + 12  # Labeled ones included.
    assert results['seed'] == 5  # Through a macro.
    paws = json.loads((tmp_path / 'run' / 'eval' / 'paws_nn.json')
                      .read_text())
    assert results['paws_nn_top1'] == paws['top1']
    _assert_paws_nn_by_hand(
        tf.saved_model.load(str(tmp_path / 'run' / 'export' / 'embedder')),
        paws, _read_classes(tmp_path / 'labeled'),
        _read_classes(tmp_path / 'test'))
    # 4 steps per epoch, fewer than the every-50-steps throughput: the
    # figure is the median of the two epochs' logged ones.
    logged = [float(line.rsplit('| ', 1)[1].split(' views/s')[0])
              for line in proc.stderr.splitlines()
              if re.search(r'epoch \d/2: .* views/s', line)]
    assert len(logged) == 2
    assert abs(results['images_per_second'] - np.median(logged)) <= 1
    assert f'{results["images_per_second"]:.0f} views/s' in proc.stdout
    # The fine-tuning stage ran: 2 epochs of 12 // (3 x 2) = 2 SuNCEt steps,
    # PAWS-NN before and after each.
    tuned = json.loads((tmp_path / 'run' / 'fine_tune' / 'results.json')
                       .read_text())
    assert tuned['steps'] == 4 and len(tuned['paws_nn_by_epoch']) == 3
    assert results['paws_finetune_top1'] == tuned['top1']
    assert results['finetune_seconds'] > 0
    assert (tmp_path / 'run' / 'results.png').stat().st_size > 10_000
    assert (tmp_path / 'run' / 'export' / 'classifier' / 'saved_model.pb'
            ).exists()


def write_class_images(root, classes, per_class, channels, seed):
    """PNGs of 28 x 28 or 30 x 26 pixels in `root/<class>/` (grayscale or
    RGB files); returns them as uint8 [H, W, channels] arrays."""
    rng = np.random.default_rng(seed)
    images = []
    for c, name in enumerate(classes):
        for i in range(per_class):
            size = (28, 28) if i % 2 else (30, 26)
            # Classes differ in brightness; channels in their range.
            low = 40 * c + 10 * np.arange(channels)
            image = rng.integers(low, low + 100, size=size + (channels,),
                                 dtype=np.uint8)
            path = root / name / f'{i}.png'
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image[..., 0] if channels == 1 else image).save(
                path)
            images.append(image)
    return images


def run_py(gin_file, model_dir, bindings, mode='train_and_evaluate'):
    return subprocess.run(
        [sys.executable, str(REPO / 'run.py'), f'--gin_file={gin_file}',
         f'--model_dir={model_dir}', f'--mode={mode}'] +
        [f'--gin_bindings={b}' for b in bindings],
        cwd=REPO, capture_output=True, text=True, timeout=900)


# What shrinks the small recipe to seconds; the data and code paths are the
# real ones. No TensorBoard images of the first step's views: they build
# the input a second time (a tenth of a run's CPU time); tests/test_train.py
# and tests/test_tensorboard.py check them.
SECONDS = ['train.num_epochs = 1', 'SUPPORT_CLASSES = 3',
           'make_pretrain_dataset_fn.global_batch_size = 16',
           'make_pretrain_dataset_fn.images_per_class = 2',
           'small_resnet.widths = (8, 8, 16)',
           'ProjectionHead.hidden_dim = 16', 'ProjectionHead.output_dim = 16',
           'train.eval_every_epochs = 0', 'train.verbose = 0',
           'train.view_images = False']


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize('channels', [1, 3])
def test_small_recipe_normalises_with_the_images(tmp_path, channels):
    """The small recipe trains, exports and evaluates with the images' own
    normalisation; its PAWS-NN figures are the export's by hand.

    Fails if PAWS-NN pairs the supports with labels shifted by one class
    (`np.roll(support_labels, 4)` in evaluate.paws_nn: top-1 1/6, not 4/6).
    """
    classes = ['dark', 'mid', 'light']
    labeled = write_class_images(tmp_path / 'labeled', classes, 4, channels,
                                 seed=0)
    write_class_images(tmp_path / 'unlabeled', [''], 32, channels, seed=1)
    test = write_class_images(tmp_path / 'test', classes, 2, channels, seed=2)
    # Grayscale is CHANNELS alone.
    bindings = image_folders.path_bindings(tmp_path) + SECONDS + (
        ['CHANNELS = 1'] if channels == 1 else [])
    run = tmp_path / 'run'
    proc = run_py('gin_configs/image_folders_small.gin', run, bindings)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run / 'checkpoints').is_dir()

    pixels = np.concatenate([i.reshape(-1, channels) for i in labeled]) / 255
    mean, std = pixels.mean(axis=0), pixels.std(axis=0)
    recorded = json.loads((run / 'normalization.json').read_text())
    np.testing.assert_allclose(recorded['mean'], mean, rtol=1e-9)
    np.testing.assert_allclose(recorded['std'], std, rtol=1e-9)
    for name in ('embedder', 'classifier'):
        stored = json.loads(
            (run / 'export' / name / 'preprocessing.json').read_text())
        assert stored['channels'] == channels
        np.testing.assert_allclose(stored['mean'], mean, rtol=1e-6)
        np.testing.assert_allclose(stored['std'], std, rtol=1e-6)
    embedder = tf.saved_model.load(str(run / 'export' / 'embedder'))
    np.testing.assert_allclose(embedder.mean.numpy(), mean, rtol=1e-6)
    np.testing.assert_allclose(embedder.std.numpy(), std, rtol=1e-6)
    _assert_normalises_raw_images(embedder, test, mean, std)
    results = json.loads((run / 'eval' / 'paws_nn.json').read_text())
    assert results['num_support'] == 12 and results['num_queries'] == 6
    _assert_paws_nn_by_hand(
        embedder, results,
        {n: labeled[4 * c:4 * c + 4] for c, n in enumerate(classes)},
        {n: test[2 * c:2 * c + 2] for c, n in enumerate(classes)})


@pytest.mark.parametrize('bindings,message', [
    (["NORMALIZATION = 'imagenett'"], "'imagenett' is unknown"),
    (['SUPPORT_CLASSES = 10'], 'bind SUPPORT_CLASSES = 3'),
])
def test_errors_come_before_any_image_is_read(run_main, capsys, tmp_path,
                                              bindings, message):
    """run.py's command in this process. Fails if config_checks leaves out
    the check of the normalisation (another message comes) or of the
    support classes."""
    # Every file is broken: reading one would fail differently.
    for folder in ('labeled/a', 'labeled/b', 'labeled/c', 'unlabeled',
                   'test/a'):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / 'broken.png').write_bytes(b'')
    run = tmp_path / 'run'
    run.mkdir()
    (run / 'notes.txt').write_text('kept')
    code, stderr = run_py_here.in_process(run_main, capsys, [
        '--gin_file=gin_configs/image_folders_small.gin',
        f'--model_dir={run}', '--mode=train_and_evaluate',
        *[f'--gin_bindings={b}' for b in
          image_folders.path_bindings(tmp_path) + bindings]])
    assert code != 0
    assert message in stderr, stderr[-2000:]
    assert 'cannot be decoded' not in stderr
    assert sorted(p.name for p in run.iterdir()) == ['notes.txt']
    assert (run / 'notes.txt').read_text() == 'kept'


def test_fashion_mnist_folders_script(tmp_path):
    rng = np.random.default_rng(0)
    splits = {'train': 30, 't10k': 5}
    images, labels = {}, {}
    for prefix, count in splits.items():
        images[prefix] = rng.integers(0, 256, [count, 4, 3], np.uint8)
        labels[prefix] = np.arange(count, dtype=np.uint8) % 10
        idx.write_idx(tmp_path / f'{prefix}-images-idx3-ubyte.gz',
                      images[prefix])
        idx.write_idx(tmp_path / f'{prefix}-labels-idx1-ubyte.gz',
                      labels[prefix])
    out = tmp_path / 'folders'
    proc = subprocess.run(
        [sys.executable, str(REPO / 'tools' / 'fashion_mnist_folders.py'),
         f'--output_dir={out}', f'--idx_dir={tmp_path}',
         '--labels_per_class=2'], capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    folders = sorted(p.name for p in (out / 'labeled').iterdir())
    assert folders[0] == '0_T-shirt_top' and folders[9] == '9_Ankle boot'
    labeled = sorted((out / 'labeled').glob('*/*.png'))
    unlabeled = sorted((out / 'unlabeled').glob('*.png'))
    test = sorted((out / 'test').glob('*/*.png'))
    assert (len(labeled), len(unlabeled), len(test)) == (20, 10, 5)
    # Every training image once, labeled or not; each file its IDX pixels
    # under its IDX label.
    assert sorted(int(p.stem) for p in labeled + unlabeled) == list(range(30))
    for prefix, paths in (('train', labeled), ('t10k', test)):
        for path in paths:
            index = int(path.stem)
            assert folders.index(path.parent.name) == labels[prefix][index]
            np.testing.assert_array_equal(np.asarray(Image.open(path)),
                                          images[prefix][index])
    for path in unlabeled:
        np.testing.assert_array_equal(np.asarray(Image.open(path)),
                                      images['train'][int(path.stem)])


@pytest.mark.slow
@pytest.mark.long
def test_a_trained_run_exports_its_embedder_without_the_images(
        tmp_path, run_main, capsys):
    """Restoring and exporting the embedder need only model_dir: the
    folders moved away, --mode=export writes the embedder with the recorded
    normalisation; the classifier and PAWS-NN (through run.py's `cli` in
    this process), which read the labeled images, name the binding.
    Fails if --mode=evaluate_nn reads the labeled folder unchecked (tried:
    `export_and_evaluate` going on without the labeled folder when it
    evaluates: an AttributeError)."""
    data = tmp_path / 'data'
    classes = ['dark', 'mid', 'light']
    labeled = write_class_images(data / 'labeled', classes, 4, 3, seed=0)
    write_class_images(data / 'unlabeled', [''], 32, 3, seed=1)
    test = write_class_images(data / 'test', classes, 2, 3, seed=2)
    bindings = image_folders.path_bindings(data) + SECONDS
    run = tmp_path / 'run'
    proc = run_py('gin_configs/image_folders_small.gin', run, bindings,
                  mode='train')
    assert proc.returncode == 0, proc.stderr[-3000:]
    data.rename(tmp_path / 'elsewhere')

    proc = run_py('gin_configs/image_folders_small.gin', run, bindings,
                  mode='export')
    assert proc.returncode == 0, proc.stderr[-3000:]
    missing = f"LABELED_DIR = '{data / 'labeled'}' is not a folder"
    assert f'not the classifier: {missing}' in proc.stderr
    assert not (run / 'export' / 'classifier').exists()
    # The normalisation of the labeled pixels, recorded when training
    # started, by NumPy.
    pixels = np.concatenate([i.reshape(-1, 3) for i in labeled]) / 255
    mean, std = pixels.mean(axis=0), pixels.std(axis=0)
    stored = json.loads(
        (run / 'export' / 'embedder' / 'preprocessing.json').read_text())
    assert stored['channels'] == 3 and stored['image_size'] == 28
    np.testing.assert_allclose(stored['mean'], mean, rtol=1e-6)
    np.testing.assert_allclose(stored['std'], std, rtol=1e-6)
    embedder = tf.saved_model.load(str(run / 'export' / 'embedder'))
    _assert_normalises_raw_images(embedder, test, mean, std)

    code, output = run_py_here.in_process(run_main, capsys, [
        '--gin_file=gin_configs/image_folders_small.gin',
        f'--model_dir={run}', '--mode=evaluate_nn',
        *[f'--gin_bindings={b}' for b in bindings]])
    assert code != 0
    assert (f'{missing}: bind it to the folder of labeled class subfolders '
            '(PAWS-NN compares the test images with them)') in output
    assert not (run / 'eval').exists()


def test_the_labeled_images_join_the_unlabeled_set(tmp_path):
    """docs/own_images.md: the unlabeled set is the unlabeled folder's
    files plus the labeled images, and the input summary counts both.

    Fails if image_folders stops adding the labeled images (or adds them
    twice), or if the summary's count is the folder's alone."""
    image_folders.write_experiment(tmp_path, unlabeled=5, test=1)
    labeled, unlabeled = experiment.image_folders(
        str(tmp_path / 'labeled'), str(tmp_path / 'unlabeled'))
    # Named by folder ('labeled/', 'unlabeled/'), as they lie here.
    on_disk = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob('*')
                     if p.suffix in ('.png', '.jpg')
                     and 'test' not in p.relative_to(tmp_path).parts)
    assert labeled.num_examples == 12
    assert unlabeled.num_examples == 15 + 12
    assert sorted(unlabeled.names) == on_disk
    pretrain = pipeline.make_pretrain_dataset_fn(
        unlabeled, labeled, num_replicas=1, global_batch_size=8,
        classes_per_step=3, images_per_class=2,
        multicrop=augment.MultiCropConfig(
            16, (0.5, 1.0), 8, (0.3, 0.5), num_local=1, color_strength=0.5,
            blur_prob=0.0, mean=(0.5,) * 3, std=(0.25,) * 3))
    assert '  unlabeled: 27 images, global batch 8 = 1 x 8, 3 steps/epoch' \
        in pretrain.summary
