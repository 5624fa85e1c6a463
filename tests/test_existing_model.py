"""An existing model on your images: PAWS-NN of an imported official model
on image folders with the model's own preprocessing, and the classifier of
the folders' classes, as `gin_configs/existing_model_folders.gin` runs it.

The folders hold noise whose class is arbitrary, so that PAWS-NN's figures
depend on every embedding: folders any embedding separates give top-1 1.0
whichever output of the export is compared.

Bugs tried, each caught by the test named:
- PAWS-NN and the classifier's supports comparing the export's `features`
  instead of its `embeddings` (`export.LoadedEmbedder`, which
  `evaluate_nn.of_export` embeds with; top-1 and the per-class figures
  stay the same, the confusion matrix does not): the figures test.
- an export path as MODEL not taken (`evaluate_nn.embedder_of` trying the
  run directory's export only): the figures test.
- a MODEL without an export ending in a traceback (`embedder_of` raising
  FileNotFoundError): the refusal test.
"""

import json

import numpy as np
from PIL import Image
import pytest
import tensorflow as tf

torch = pytest.importorskip('torch')

from paws_tf import checkpoints  # noqa: E402
from paws_tf import lars  # noqa: E402
from paws_tf import run_dir  # noqa: E402
from paws_tf import schedules  # noqa: E402
from paws_tf.runner import building  # noqa: E402
from paws_tf.runner import start  # noqa: E402
from tests.helpers import image_folders  # noqa: E402
from tests.helpers import run_py  # noqa: E402
from tests.test_official_import import _config  # noqa: E402
from tests.test_official_import import _wrn_checkpoint  # noqa: E402
from tests.test_official_import import SYNTHETIC_BINDINGS  # noqa: E402
from tests.test_official_import import WRN_CONFIG  # noqa: E402

CONFIG = 'gin_configs/existing_model_folders.gin'


def _arguments(tmp_path, model, bindings, name):
    """run.py's arguments for PAWS-NN of `model` on the folders under
    `tmp_path / 'images'` into `tmp_path / name`."""
    folders = tmp_path / 'images'
    return dict(model_dir=tmp_path / name, bindings=(
        f"MODEL = '{model}'", f"LABELED_DIR = '{folders / 'labeled'}'",
        f"TEST_DIR = '{folders / 'test'}'") + bindings, gin_file=CONFIG,
        mode='evaluate_nn')


def _evaluate(tmp_path, model, *bindings, name='mine'):
    return run_py.finish(run_py.start(
        **_arguments(tmp_path, model, bindings, name)))


def _refused(run_main, capsys, tmp_path, model, *bindings, name):
    """`(exit code, output)` of `_evaluate`'s command run through run.py's
    `cli` in this process (`run_py.in_process`)."""
    return run_py.in_process(run_main, capsys, run_py.command(
        **_arguments(tmp_path, model, bindings, name)))


def _folder_images(root):
    """Every image under `root` in the order image_folder lists them, with
    its class index."""
    paths = sorted(root.rglob('*.png'))
    classes = sorted({path.parent.name for path in paths})
    return ([np.asarray(Image.open(path).convert('RGB')) for path in paths],
            np.array([classes.index(path.parent.name) for path in paths]),
            classes)


@pytest.fixture(scope='module')
def imported(tmp_path_factory):
    """An official WideResNet-28-2 checkpoint (random weights) imported
    with run.py, and labeled and test folders of three classes."""
    tmp_path = tmp_path_factory.mktemp('existing')
    path = _wrn_checkpoint(tmp_path / 'wrn.pth.tar', seed=5)
    code, output = run_py.finish(run_py.start(
        tmp_path / 'imported', SYNTHETIC_BINDINGS + ('train.num_epochs = 600',),
        gin_file=f'gin_configs/{WRN_CONFIG}', mode='import_official',
        flags=[f'--official_checkpoint={path}']))
    assert code == 0, output
    _write_noise(tmp_path / 'images/labeled', 4, seed=0)
    _write_noise(tmp_path / 'images/test', 5, seed=1)
    return tmp_path


def _write_noise(root, per_class, seed):
    """`per_class` PNG images of each of `image_folders.CLASSES` under
    `root/<class>`: uniform noise over a random colour, the class
    arbitrary."""
    rng = np.random.default_rng(seed)
    for name in image_folders.CLASSES:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = (rng.integers(0, 128, size=(40, 40, 3)) +
                      rng.integers(0, 128, size=3))
            Image.fromarray(pixels.astype(np.uint8)).save(
                root / name / f'{i}.png')


def numpy_paws_nn(embed_images, root, tau):
    """The soft nearest-neighbour rule in NumPy on the embeddings that
    `embed_images` (uint8 [N, H, W, 3] images -> [N, D]) gives the
    folders under `root`: `(probabilities [N, K], predictions [N], query
    labels [N], classes)`."""
    def embed(folder):
        images, labels, classes = _folder_images(folder)
        embeddings = embed_images(images)
        return embeddings / np.linalg.norm(embeddings, axis=1,
                                           keepdims=True), labels, classes

    supports, support_labels, classes = embed(root / 'labeled')
    queries, query_labels, _ = embed(root / 'test')
    logits = queries @ supports.T / tau
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities = (weights / weights.sum(axis=1, keepdims=True)
                     @ np.eye(len(classes))[support_labels])
    return (probabilities, probabilities.argmax(axis=1), query_labels,
            classes)


def _saved_model_outputs(embedder, output):
    """`embed_images` of the `output` of the `embedder` SavedModel (raw
    images in), image by image."""
    return lambda images: np.concatenate([
        embedder(tf.constant(image[None]))[output].numpy()
        for image in images])


def _confusion(labels, predictions):
    """[K, K] counts, row the true class, column the predicted one."""
    size = len(image_folders.CLASSES)
    return np.bincount(labels * size + predictions,
                       minlength=size * size).reshape(size, size)


@pytest.mark.slow
@pytest.mark.long
def test_paws_nn_of_an_import_on_folders_and_its_classifier(imported):
    """`MODEL` given as the import's embedder export itself (the form
    docs/own_images.md documents beside a run directory): PAWS-NN's
    figures (top-1, per class, the confusion matrix) and the exported
    classifier's per-image probabilities and classes equal the soft
    nearest-neighbour rule computed here in NumPy on the `embeddings` of
    that SavedModel (raw images in, its recorded preprocessing inside).
    The same rule on its `features` gives other figures on these folders.

    Fails if PAWS-NN or the classifier compare another output of the
    export than `embeddings` (tried: `features`, in
    `export.LoadedEmbedder`),
    if the folders are preprocessed with other values than the export's
    (e.g. the config's normalisation), if the classifier's supports are
    not every labeled image, or if an export path as MODEL is refused."""
    embedder_dir = imported / 'imported/export/embedder'
    code, output = _evaluate(imported, embedder_dir)
    assert code == 0, output[-3000:]
    results = json.loads(
        (imported / 'mine/eval/paws_nn.json').read_text())
    embedder = tf.saved_model.load(str(embedder_dir))
    images = imported / 'images'
    probabilities, predicted, labels, classes = numpy_paws_nn(
        _saved_model_outputs(embedder, 'embeddings'), images, results['tau'])
    _, other, _, _ = numpy_paws_nn(_saved_model_outputs(embedder, 'features'),
                                   images, results['tau'])
    assert (_confusion(labels, other) != _confusion(labels, predicted)).any()
    assert results['source_path'] == str(embedder_dir)
    assert (results['num_support'], results['num_queries']) == (12, 15)
    assert results['top1'] == pytest.approx(np.mean(predicted == labels))
    np.testing.assert_allclose(
        results['per_class_accuracy'],
        [np.mean(predicted[labels == k] == k) for k in range(3)])
    np.testing.assert_array_equal(results['confusion_matrix'],
                                  _confusion(labels, predicted))
    classifier = tf.saved_model.load(
        str(imported / 'mine/export/classifier'))
    test_images, _, _ = _folder_images(images / 'test')
    out = classifier(tf.constant(np.stack(test_images)))
    np.testing.assert_allclose(out['probabilities'].numpy(), probabilities,
                               atol=1e-5)
    assert [name.decode() for name in out['class_names'].numpy()] == [
        classes[k] for k in predicted]


@pytest.mark.slow
@pytest.mark.long
def test_a_model_of_other_channels_or_none_is_refused_before_reading(
        imported, run_main, capsys):
    """Through run.py's `cli` in this process (test_terminal_output runs
    a config check's refusal as a process). Fails if the channels of the
    folders are not checked against the model's before the images are
    read, or an unbound MODEL falls through to this run's (absent)
    checkpoint, or a MODEL that does not exist ends in a traceback (tried:
    `embedder_of` raising FileNotFoundError; and the existence check left
    out of `config_checks.existing_model`) or is reported as a model to
    export first."""
    code, output = _refused(run_main, capsys, imported,
                            imported / 'imported', 'CHANNELS = 1',
                            name='gray')
    assert code != 0
    assert (f'The model of {imported}/imported/export/embedder takes '
            '3-channel images, but CHANNELS = 1: bind CHANNELS = 3') in output
    assert 'Traceback' not in output
    code, output = _refused(run_main, capsys, imported,
                            imported / 'nothing', name='none')
    assert code == 78 and (f"MODEL = '{imported}/nothing' does not exist"
                           in output), output[-2000:]
    assert 'Traceback' not in output


@pytest.mark.slow
@pytest.mark.long
def test_paws_starts_from_an_import(imported):
    """`train.pretrained_model` on an import of a published model: the
    config's check passes, and a new run's compiled model gets the import's
    weights, backbone and heads, with its optimizer at step 0 (what
    `train` does before its first step; the run itself is
    test_pretrained_backbone's).

    Fails if only the backbone is read."""
    source = str(imported / 'imported')
    with _config(WRN_CONFIG, SYNTHETIC_BINDINGS + (
            f"train.pretrained_model = '{source}'",)):
        pretrained = start.check_pretrained(
            run_dir.RunDir(imported / 'new'),
            model=(source, 'train.pretrained_model'))
        model = building.build_compiled_model(
            tf.distribute.get_strategy(), input_channels=3,
            steps_per_epoch=1, num_epochs=600, optimizer_cls=lars.LARS,
            schedule_cls=schedules.WarmupCosineDecay, precision='float32',
            jit_compile=False, steps_per_execution=1)
        pretrained.check_channels(3)
        origin = pretrained.load_into(model)
    prefix = tf.train.latest_checkpoint(f'{source}/checkpoints')
    assert origin == f' from the model of {prefix}'
    assert checkpoints.global_step(model) == 0
    written = tf.train.Checkpoint(model=model).write(
        str(imported / 'new' / 'ckpt'))
    ours, theirs = (tf.train.load_checkpoint(p) for p in (written, prefix))
    keys = [key for key, _ in tf.train.list_variables(prefix)
            if key.startswith('model/') and '/optimizer/' not in key
            and '_CHECKPOINTABLE_OBJECT_GRAPH' not in key]
    assert any(key.startswith('model/projection_head') for key in keys)
    for key in keys:
        np.testing.assert_array_equal(ours.get_tensor(key),
                                      theirs.get_tensor(key), key)
