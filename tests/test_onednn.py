"""Tests for paws_tf.nets.onednn."""

import os
import pathlib
import subprocess
import sys

import pytest

from paws_tf.nets import backbones
from paws_tf.nets import onednn


@pytest.mark.skipif(not onednn.onednn_enabled(),
                    reason='the guard only applies when oneDNN is on')
def test_strided_1x1_convolutions_on_few_channels_are_refused_under_onednn():
    """oneDNN #6035: wrong weight gradients for these; see BUILD.md."""
    with pytest.raises(ValueError, match=r'stage2_block1_proj_conv: a strided '
                       r'1x1 convolution on 4 input channels.*'
                       r'TF_ENABLE_ONEDNN_OPTS=0'):
        backbones.build_backbone('small_resnet', widths=(4, 8),
                                 blocks_per_stage=(1, 1),
                                 stage_strides=(1, 2))
    # 8 input channels are computed correctly, so they are allowed.
    backbones.build_backbone('small_resnet', widths=(8, 8),
                             blocks_per_stage=(1, 1), stage_strides=(1, 2))


@pytest.mark.slow
def test_importing_paws_tf_turns_onednn_on_unless_told_not_to():
    code = ('import paws_tf; from paws_tf.nets import onednn; '
            'print(onednn.onednn_enabled())')
    for setting, expected in ((None, 'True'), ('0', 'False')):
        env = {k: v for k, v in os.environ.items()
               if k != 'TF_ENABLE_ONEDNN_OPTS'}
        if setting is not None:
            env['TF_ENABLE_ONEDNN_OPTS'] = setting
        env['PYTHONPATH'] = str(pathlib.Path(__file__).resolve().parents[1])
        out = subprocess.run([sys.executable, '-c', code], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.stdout.strip().splitlines()[-1] == expected, out.stderr
