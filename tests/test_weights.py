"""Pretrained weights into a backbone (`pretrained.load_backbone_weights`)."""

import numpy as np
import pytest
import tensorflow as tf

from paws_tf.nets import backbones
from paws_tf.runner import pretrained
from tests.helpers import tiny_model


def _trained_tiny_backbone(**kwargs):
    model = backbones.build_backbone('small_resnet', input_channels=1,
                                     **dict(tiny_model.TINY, **kwargs))
    model(tf.random.normal([4, 8, 8, 1]), training=True)  # moving stats != 0
    return model


def _save(model, tmp_path, fmt):
    if fmt in ('h5', 'weights.h5'):
        path = str(tmp_path / f'backbone.{fmt}')
        model.save_weights(path)
        return path
    checkpoint = tf.train.Checkpoint(backbone=model)
    if fmt == 'ckpt_prefix':
        return checkpoint.write(str(tmp_path / 'ckpt'))
    checkpoint.save(str(tmp_path / 'ckpt'))  # also writes the state file
    return str(tmp_path)


@pytest.mark.parametrize(
    'fmt', ['h5', 'weights.h5', 'ckpt_prefix', 'ckpt_dir'])
def test_load_weights_round_trip(tmp_path, fmt):
    source = _trained_tiny_backbone()
    target = _trained_tiny_backbone()
    path = _save(source, tmp_path, fmt)
    pretrained.load_backbone_weights(target, path)
    for want, got in zip(source.variables, target.variables):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    images = tf.random.normal([2, 8, 8, 1])
    np.testing.assert_array_equal(target(images), source(images))


@pytest.mark.parametrize(
    'fmt', ['h5', 'weights.h5', 'ckpt_prefix', 'ckpt_dir'])
@pytest.mark.parametrize('other', [
    {'widths': (8, 12)},              # shape mismatch
    {'blocks_per_stage': (1, 2)},     # variables missing from the file
])
def test_load_weights_mismatch_leaves_backbone_unchanged(tmp_path, fmt,
                                                         other):
    path = _save(_trained_tiny_backbone(), tmp_path, fmt)
    target = _trained_tiny_backbone(**other)
    before = [v.numpy() for v in target.variables]
    with pytest.raises(ValueError, match='backbone is unchanged'):
        pretrained.load_backbone_weights(target, path)
    for variable, value in zip(target.variables, before):
        np.testing.assert_array_equal(variable.numpy(), value)


def test_load_checkpoint_names_unrestored_variables(tmp_path):
    source = _trained_tiny_backbone()
    prefix = tf.train.Checkpoint(model=source).write(str(tmp_path / 'ckpt'))
    with pytest.raises(ValueError, match=r'35 of 35 variables.*stem_conv/'
                                         r'kernel:0.*and 15 more'):
        pretrained.load_backbone_weights(_trained_tiny_backbone(), prefix)
    prefix = tf.train.Checkpoint(backbone=source).write(
        str(tmp_path / 'other'))
    target = _trained_tiny_backbone(blocks_per_stage=(1, 2))
    with pytest.raises(ValueError, match=r'10 of 45 variables.*'
                                         r'stage2_block2_conv1/kernel:0'):
        pretrained.load_backbone_weights(target, prefix)


@pytest.mark.parametrize('name', ['missing.h5', 'missing.weights.h5',
                                  'missing_prefix', '.'])
def test_load_weights_missing_path(tmp_path, name):
    with pytest.raises(FileNotFoundError, match='missing|no TF checkpoint'):
        pretrained.load_backbone_weights(_trained_tiny_backbone(),
                                      tmp_path / name)
