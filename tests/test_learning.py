"""A short PAWS fit on clustered synthetic data learns the classes."""

import pytest
import tensorflow as tf
import tf_keras

from paws_tf.data import pipeline
from paws_tf.demo import run_demo
from paws_tf.evaluation import evaluate
from paws_tf import run_dir
from paws_tf.runner import building
from paws_tf.runner import experiment
from paws_tf.runner import train
from tests.helpers import debug_gin


def untrained_top1(record_dir):
    """PAWS-NN top-1 of the network `train` starts from (seed 0), before
    any step, on the run's labeled and test images."""
    tf_keras.utils.set_random_seed(0)
    bundle = experiment.load_data(run_dir.RunDir(record_dir))
    model = building.build_local_model(
        input_channels=bundle.labeled.channels)
    preprocessing = experiment.eval_preprocessing(bundle)
    support, queries = (
        pipeline.make_eval_dataset(source, batch_size=64, **preprocessing)
        for source in (bundle.labeled, bundle.test))
    return evaluate.paws_nn(evaluate.embedder_from_model(model), support,
                            queries, num_classes=4)['top1']


@pytest.mark.slow
def test_short_fit_lowers_the_loss_and_learns_the_classes(tmp_path):
    """Fails if training leaves the encoder as it started (the final
    PAWS-NN is then the untrained network's, 0.44-0.61 for seeds 0-2)."""
    # debug.gin: 4 synthetic classes, 16 labels each; 16 epochs of 16 steps
    # (PAWS-NN is at 0.63-0.81 over epochs 1-8 with the heads initialised
    # as PyTorch's nn.Linear, and rises after). 16 steps per epoch: epoch
    # ends are not multiples of the TensorBoard update frequency, and
    # PAWS-NN must still be recorded at each. One backup, at the end:
    # debug.gin's 32 took a quarter of the test's time.
    with debug_gin.parsed(['train.verbose = 0', 'train.view_images = False',
                           'train.log_every_steps = 5',
                           'train.num_epochs = 16',
                           'train.backup_every_steps = 256']):
        before = untrained_top1(tmp_path / 'untrained')
        train.train(str(tmp_path / 'run'), tf.distribute.get_strategy())
    run = run_dir.RunDir(tmp_path / 'run')
    _, loss = run_demo.read_scalars(run.train_logs, 'epoch/loss')
    _, top1 = run_demo.read_scalars(run.eval_logs, 'paws_nn/top1')
    _, views_per_second = run_demo.read_scalars(
        run.train_logs, 'throughput/views_per_second')
    print(f'PAWS-NN top-1 untrained {before:.3f}, by epoch '
          f'{[round(float(t), 3) for t in top1]}, loss '
          f'{[round(float(x), 3) for x in loss]}, '
          f'{views_per_second.mean():.0f} '
          f'views/s = {views_per_second.mean() / 160:.1f} steps/s')
    assert len(loss) == len(top1) == 16
    assert loss[-1] < loss[0] - 0.2
    # Chance is 0.25 with 4 classes; 128 test images.
    assert top1[-1] > 0.75
    # The epoch-1 figure is already far above the untrained network's, so
    # the start of training is the baseline to beat, not epoch 1.
    assert top1[-1] > before + 0.1
