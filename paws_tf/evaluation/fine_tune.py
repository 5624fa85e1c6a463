"""Fine-tuning after PAWS pre-training: the ImageNet and CIFAR-10 protocols."""

import gin

from paws_tf import checks
from paws_tf.data import augment
from paws_tf.evaluation import linear_fine_tune
from paws_tf.evaluation import suncet_fine_tune

_PROTOCOLS = {'imagenet': linear_fine_tune.fine_tune_linear,
              'cifar10': suncet_fine_tune.fine_tune_suncet}


# The preprocessing is the run's evaluation's (`experiment.eval_preprocessing`),
# which the mode passes.
@gin.configurable(denylist=['run', 'model', 'labeled', 'test', 'strategy',
                            'image_size', 'crop_fraction', 'mean', 'std'])
def fine_tune(run, model, *, labeled, test, protocol='imagenet',
              strategy=None, image_size=224, crop_fraction=0.875,
              mean=augment.IMAGENET_MEAN, std=augment.IMAGENET_STD, seed=0):
    """Fine-tunes a pre-trained PAWS model (not modified) into
    `run.fine_tune` by `protocol`, 'imagenet' (`fine_tune_linear`, App. A)
    or 'cifar10' (`fine_tune_suncet`, App. C), each configured by its own
    bindings; returns the results dict, also in `fine_tune/results.json`.

    Args:
        run: the run's `RunDir`; TensorBoard logs in `run.fine_tune_logs`.
        model: restored `model.PAWSModel`, or an imported backbone's
            `vit_import.BackboneEmbedder`.
        labeled, test: labeled `sources.ImageSource`, labeled test source.
        strategy: default the current one.
        image_size, crop_fraction, mean, std: `pipeline.make_eval_dataset`'s.
        seed: seed of every random choice.
    """
    checks.one_of('fine_tune.protocol', protocol, tuple(_PROTOCOLS))
    _, results = _PROTOCOLS[protocol](
        model, labeled, test, output_dir=run.fine_tune,
        log_dir=run.fine_tune_logs, strategy=strategy, image_size=image_size,
        crop_fraction=crop_fraction, mean=mean, std=std, seed=seed)
    return results
