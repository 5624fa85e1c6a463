"""A process that takes a few steps of the ImageNet multi-crop pre-training
input on a JPEG folder and exits: `python pipeline_exit.py FOLDER STEPS BATCH
CLASSES PER_CLASS NUM_LOCAL` (global batch size, support classes per step,
images per class and local views: `augment.IMAGENET_MULTICROP` with
NUM_LOCAL of its 6).

Its iterator lives until the interpreter exits, which destroys it while the
parallel map still has calls in flight; the process must exit all the same.
"""

import sys

import paws_tf  # noqa: F401  (selects tf_keras before TF is used)
from paws_tf.data import augment
from paws_tf.data import folders
from paws_tf.data import pipeline


def take_steps(folder, steps, batch, classes, per_class, num_local):
    """The iterator of the pre-training input after `steps` steps."""
    labeled = folders.image_folder(folder)
    pretrain = pipeline.make_pretrain_dataset_fn(
        labeled, labeled, num_replicas=1, global_batch_size=batch,
        classes_per_step=classes, images_per_class=per_class,
        multicrop=augment.imagenet_multicrop(num_local=num_local),
        normalization=(augment.IMAGENET_MEAN, augment.IMAGENET_STD))
    iterator = iter(pretrain.dataset_fn(None))
    for _ in range(steps):
        next(iterator)
    return iterator


if __name__ == '__main__':
    ITERATOR = take_steps(sys.argv[1], *map(int, sys.argv[2:]))
    print('took the steps', flush=True)
