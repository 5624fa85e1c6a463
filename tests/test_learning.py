"""A short PAWS fit on clustered synthetic data learns the classes."""

import pytest
import tensorflow as tf

from paws_tf.demo import report
from paws_tf.runner import train
from tests.helpers import debug_gin


@pytest.mark.slow
def test_short_fit_lowers_the_loss_and_learns_the_classes(tmp_path):
    # debug.gin: 4 synthetic classes, 16 labels each; 16 epochs of 16 steps
    # (PAWS-NN is at 0.63-0.81 over epochs 1-8 with the heads initialised
    # as PyTorch's nn.Linear, and rises after). 16 steps per epoch: epoch
    # ends are not multiples of the TensorBoard update frequency, and
    # PAWS-NN must still be recorded at each.
    with debug_gin.parsed(['train.verbose = 0', 'train.view_images = False',
                           'train.log_every_steps = 5',
                           'train.num_epochs = 16']):
        train.train(str(tmp_path), tf.distribute.get_strategy())
    logs = tmp_path / train.TENSORBOARD_DIR
    _, loss = report.read_scalars(str(logs / 'train'), 'epoch/loss')
    _, top1 = report.read_scalars(str(logs / 'eval'), 'paws_nn/top1')
    _, views_per_second = report.read_scalars(
        str(logs / 'train'), 'throughput/views_per_second')
    print(f'PAWS-NN top-1 by epoch {[round(float(t), 3) for t in top1]}, loss '
          f'{[round(float(x), 3) for x in loss]}, '
          f'{views_per_second.mean():.0f} '
          f'views/s = {views_per_second.mean() / 160:.1f} steps/s')
    assert len(loss) == len(top1) == 16
    assert loss[-1] < loss[0] - 0.2
    # Chance is 0.25 with 4 classes; 128 test images.
    assert top1[-1] > 0.75
    assert top1[-1] > top1[0]
