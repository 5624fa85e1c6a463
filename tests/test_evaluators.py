"""Evaluators: PAWS-NN against NumPy, and a new evaluator added by one class
and one binding, run by training at its epoch ends."""

import gin
import numpy as np
import pytest
import tensorflow as tf

from paws_tf.data import pipeline
from paws_tf.data import sources
from paws_tf.demo import run_demo
from paws_tf.evaluation import evaluate
from paws_tf.runner import train
from tests.helpers import debug_gin
from tests.test_evaluate import numpy_top_ids

# The identity view: crop fraction 1 of an image of the output size, mean
# 0, std 1, so an image's view is its pixels in [0, 1].
IDENTITY = dict(image_size=4, crop_fraction=1.0, mean=(0.0, 0.0, 0.0),
                std=(1.0, 1.0, 1.0))


def _flatten(images):
    return tf.reshape(images, [tf.shape(images)[0], -1])


def test_paws_nn_of_the_first_queries_matches_numpy(tmp_path):
    """Fails if `max_queries` is ignored (all 30 queries), or if the
    TensorBoard points are not `{tag}/top1` at the step."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, [50, 4, 4, 3], np.uint8)
    classes = rng.integers(0, 3, 50)
    labeled = sources.from_arrays(images[:20], classes[:20])
    test = sources.from_arrays(images[20:], classes[20:])
    paws_nn = evaluate.PawsNN(
        labeled, test, preprocessing=IDENTITY, tau=0.5, max_queries=12,
        log_dir=str(tmp_path / 'tb'), tag='probe', batch_size=8)
    results = paws_nn(_flatten, step=7)
    pixels = images.reshape(50, -1).astype(np.float64) / 255
    top = numpy_top_ids(pixels[20:32], pixels[:20], classes[:20], 3, 0.5)
    assert results['num_queries'] == 12 and results['num_support'] == 20
    assert results['top1'] == pytest.approx(np.mean(top[:, 0] ==
                                                    classes[20:32]))
    steps, values = run_demo.read_scalars(str(tmp_path / 'tb'), 'probe/top1')
    assert list(steps) == [7] and values[0] == pytest.approx(results['top1'])


@gin.configurable
class FirstTestEmbeddings:
    """A new evaluator, all of it: it keeps the embeddings of the first
    test images at each call."""
    name, title = 'first', 'first test embeddings'
    calls = []

    def __init__(self, labeled, test, *, preprocessing, tau, log_dir,
                 max_queries):
        del labeled, tau, log_dir, max_queries  # Unused.
        self.images = next(iter(pipeline.make_eval_dataset(
            test, batch_size=4, **preprocessing)))[0]

    def __call__(self, embed_fn, step):
        self.calls.append((step, self.images, embed_fn(self.images).numpy()))
        return {}


@pytest.mark.slow
@pytest.mark.long
def test_a_new_evaluator_is_one_class_and_one_binding(tmp_path):
    """train.evaluators = [@PawsNN, @FirstTestEmbeddings]: training runs both
    at each epoch end, on the model of that epoch end.

    Fails if training runs only the first evaluator or none of the bound
    ones, or if the evaluated copy does not get the weights of the epoch end
    (`checkpoints.assign_weights` skipped: the embeddings are the
    untrained copy's)."""
    FirstTestEmbeddings.calls.clear()
    with debug_gin.parsed([
            'train.num_epochs = 2', 'train.verbose = 0',
            'train.eval_max_queries = 8', 'train.view_images = False',
            'train.evaluators = [@PawsNN, @FirstTestEmbeddings]']):
        model = train.train(str(tmp_path), tf.distribute.get_strategy())
    assert [call[0] for call in FirstTestEmbeddings.calls] == [16, 32]
    _, images, embeddings = FirstTestEmbeddings.calls[-1]
    np.testing.assert_allclose(
        embeddings, model(images, training=False)['embeddings'], rtol=1e-4,
        atol=1e-5)
    steps, _ = run_demo.read_scalars(str(tmp_path / 'tensorboard' / 'eval'),
                                   'paws_nn/top1')
    assert list(steps) == [16, 32]  # debug.gin: 16 steps per epoch.
