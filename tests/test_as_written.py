"""AutoGraph leaves paws_tf's functions as written (paws_tf/as_written.py)
and still rewrites a user's own, a user's backbone also where PAWSModel
calls it.

What AutoGraph rewrites is read from its converter: every function whose
rewrite it builds (`api._convert_actual`) is recorded while a train step,
the pre-training and evaluation pipelines, an export and its embedder run.

Bugs tried: the rule left out of as_written.py (PAWSModel.call,
NormReLUThen.call, the heads' and LastValue's methods, the pipelines'
functions rewritten); `autograph=False` dropped from
`evaluate.embedder_from_model`'s tf.function (its `embed` rewritten);
PAWSModel.call marked `tf.autograph.experimental.do_not_convert`, which
turns AutoGraph off for everything it calls (the user's backbone below,
whose branch on a tensor needs AutoGraph, stops the step).
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from tensorflow.python.autograph.impl import api

from paws_tf import lars
from paws_tf import model as model_lib
from paws_tf.data import augment
from paws_tf.data import pipeline
from paws_tf.data import sources
from paws_tf.evaluation import evaluate
from paws_tf.evaluation import export
from paws_tf.nets import heads
from tests.helpers import tiny_model


@pytest.fixture
def rewritten(monkeypatch):
    """The qualified names of the functions AutoGraph rewrites while the
    test runs."""
    names = []
    convert = api._convert_actual

    def recording(entity, program_ctx):
        names.append(f'{entity.__module__}.{entity.__qualname__}')
        return convert(entity, program_ctx)

    monkeypatch.setattr(api, '_convert_actual', recording)
    return names


@pytest.mark.slow
def test_paws_tf_functions_are_traced_as_written(rewritten, tmp_path):
    """A train step, a pre-training and an evaluation pipeline, an export
    and both embedders: AutoGraph rewrites Keras' train function (the
    recording works) and no function of paws_tf."""
    model = tiny_model.make(sync_bn=True)
    tiny_model.compile_and_build(model)
    assert np.isfinite(tiny_model.run_steps(model, tiny_model.random_step(
        np.random.default_rng(0), 4, 3, 2, 1, 2))['loss'])
    rng = np.random.default_rng(1)
    source = sources.from_arrays(
        rng.integers(0, 256, [24, 12, 12, 3], np.uint8), np.arange(24) % 3)
    multicrop = augment.MultiCropConfig(
        global_size=8, global_scale=(0.5, 1.0), local_size=4,
        local_scale=(0.2, 0.5), num_local=2, color_strength=0.5,
        blur_prob=0.5, mean=(0.5,) * 3, std=(0.25,) * 3)
    pretrain = pipeline.make_pretrain_dataset_fn(
        source, source, num_replicas=1, global_batch_size=4,
        classes_per_step=3, images_per_class=2, multicrop=multicrop)
    next(iter(pretrain.dataset_fn(tf.distribute.InputContext())))
    images, _ = next(iter(pipeline.make_eval_dataset(
        source, batch_size=4, image_size=8, crop_fraction=1.0,
        mean=(0.5,) * 3, std=(0.25,) * 3)))
    in_hand = evaluate.embedder_from_model(model)(images)
    export.export_embedder(model, str(tmp_path / 'embedder'),
                           image_size=8, crop_fraction=1.0,
                           mean=(0.5,) * 3, std=(0.25,) * 3, channels=3)
    loaded = evaluate.embedder_from_saved_model(str(tmp_path / 'embedder'))
    np.testing.assert_allclose(loaded(images), in_hand, rtol=1e-4,
                               atol=1e-5)
    assert any(name.startswith('tf_keras.') for name in rewritten), rewritten
    assert [name for name in rewritten if name.startswith('paws_tf.')] == []


class _SignedBackbone(tf_keras.layers.Layer):
    """A user's backbone that branches on a tensor, as only AutoGraph
    lets a traced `call` do: its features, negated when they sum above
    0."""

    def __init__(self):
        super().__init__()
        self.dense = tf_keras.layers.Dense(8)

    def call(self, images):
        features = self.dense(tf.reduce_mean(images, axis=[1, 2]))
        if tf.reduce_sum(features) > 0:
            features = -features
        return features


def test_a_users_backbone_keeps_autograph_inside_paws_tf(rewritten):
    """PAWSModel.call, as written, calls the user's backbone, which
    AutoGraph rewrites: the step trains, and the traced model gives what
    the backbone gives eagerly (its branch taken both ways)."""
    model = model_lib.PAWSModel(
        _SignedBackbone(), heads.ProjectionHead(hidden_dim=8, output_dim=6),
        diagnostics_every=0)
    model.compile(optimizer=lars.LARS(learning_rate=0.1))
    assert np.isfinite(tiny_model.run_steps(model, tiny_model.random_step(
        np.random.default_rng(0), 4, 3, 2, 1, 2))['loss'])
    assert f'{__name__}._SignedBackbone.call' in rewritten
    traced = tf.function(lambda x: model(x)['features'])
    for sign in (1.0, -1.0):
        images = sign * np.ones([2, 8, 8, 3], np.float32)
        eager = model.backbone.dense(tf.reduce_mean(images, axis=[1, 2]))
        expected = -eager if np.sum(eager) > 0 else eager
        np.testing.assert_allclose(traced(images), expected, rtol=1e-6)
