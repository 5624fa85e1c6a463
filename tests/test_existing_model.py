"""An existing model on your images: PAWS-NN of an imported official model
on image folders with the model's own preprocessing, and the classifier of
the folders' classes, as `gin_configs/existing_model_folders.gin` runs it."""

import json

import numpy as np
from PIL import Image
import pytest
import tensorflow as tf

torch = pytest.importorskip('torch')

from paws_tf import checkpoints  # noqa: E402
from paws_tf import lars  # noqa: E402
from paws_tf import schedules  # noqa: E402
from paws_tf.runner import building  # noqa: E402
from paws_tf.runner import config_checks  # noqa: E402
from paws_tf.runner import train  # noqa: E402
from tests.helpers import image_folders  # noqa: E402
from tests.helpers import run_py  # noqa: E402
from tests.test_official_import import _config  # noqa: E402
from tests.test_official_import import _wrn_checkpoint  # noqa: E402
from tests.test_official_import import SYNTHETIC_BINDINGS  # noqa: E402
from tests.test_official_import import WRN_CONFIG  # noqa: E402

CONFIG = 'gin_configs/existing_model_folders.gin'


def _evaluate(tmp_path, model, *bindings, name='mine'):
    folders = tmp_path / 'images'
    return run_py.finish(run_py.start(
        tmp_path / name, (f"MODEL = '{model}'",
                          f"LABELED_DIR = '{folders / 'labeled'}'",
                          f"TEST_DIR = '{folders / 'test'}'") + bindings,
        gin_file=CONFIG, mode='evaluate_nn'))


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
    image_folders.write_folder(tmp_path / 'images/labeled',
                               image_folders.CLASSES, 4, seed=0)
    image_folders.write_folder(tmp_path / 'images/test',
                               image_folders.CLASSES, 5, seed=1)
    return tmp_path


@pytest.mark.slow
@pytest.mark.long
def test_paws_nn_of_an_import_on_folders_and_its_classifier(imported):
    """PAWS-NN and the exported classifier equal the soft nearest-neighbour
    rule computed here in NumPy on the embeddings of the import's own
    SavedModel (raw images in, its recorded preprocessing inside).

    Fails if the folders are preprocessed with other values than the
    export's (e.g. the config's normalisation), or the classifier's
    supports are not every labeled image."""
    code, output = _evaluate(imported, imported / 'imported')
    assert code == 0, output[-3000:]
    results = json.loads(
        (imported / 'mine/eval/paws_nn.json').read_text())
    embedder = tf.saved_model.load(str(imported / 'imported/export/embedder'))

    def embed(root):
        images, labels, classes = _folder_images(root)
        embeddings = np.concatenate([
            embedder(tf.constant(image[None]))['embeddings'].numpy()
            for image in images])
        return embeddings / np.linalg.norm(embeddings, axis=1,
                                           keepdims=True), labels, classes

    supports, support_labels, classes = embed(imported / 'images/labeled')
    queries, query_labels, _ = embed(imported / 'images/test')
    logits = queries @ supports.T / results['tau']
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities = (weights / weights.sum(axis=1, keepdims=True)
                     @ np.eye(len(classes))[support_labels])
    predicted = probabilities.argmax(axis=1)
    assert results['num_support'] == len(support_labels) == 12
    assert results['top1'] == pytest.approx(
        np.mean(predicted == query_labels))
    assert results['source_path'] == str(
        imported / 'imported/export/embedder')
    classifier = tf.saved_model.load(
        str(imported / 'mine/export/classifier'))
    images, _, _ = _folder_images(imported / 'images/test')
    out = classifier(tf.constant(np.stack(images)))
    np.testing.assert_allclose(out['probabilities'].numpy(), probabilities,
                               atol=1e-5)
    assert [name.decode() for name in out['class_names'].numpy()] == [
        classes[k] for k in predicted]


@pytest.mark.slow
@pytest.mark.long
def test_a_model_of_other_channels_or_none_is_refused_before_reading(
        imported):
    """Fails if the channels of the folders are not checked against the
    model's before the images are read, or an unbound MODEL falls through
    to this run's (absent) checkpoint, or a MODEL without an export ends in
    a traceback (tried: `embedder_of` raising FileNotFoundError)."""
    code, output = _evaluate(imported, imported / 'imported', 'CHANNELS = 1',
                             name='gray')
    assert code != 0
    assert (f'The model of {imported}/imported/export/embedder takes '
            '3-channel images, but CHANNELS = 1: bind CHANNELS = 3') in output
    assert 'Traceback' not in output
    code, output = _evaluate(imported, imported / 'nothing', name='none')
    assert code == 78 and 'export it first' in output, output[-2000:]
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
        config_checks.check_pretrained(imported / 'new')
        model = building.build_compiled_model(
            tf.distribute.get_strategy(), input_channels=3,
            steps_per_epoch=1, num_epochs=600, optimizer_cls=lars.LARS,
            schedule_cls=schedules.WarmupCosineDecay, precision='float32',
            jit_compile=False, steps_per_execution=1)
        origin = train._load_pretrained(model, None, source)
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
