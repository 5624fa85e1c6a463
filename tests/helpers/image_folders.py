"""Image-folder experiments for tests: a folder tree of PNG/JPEG images
and the bindings that shrink `image_folders.gin` to seconds on a CPU."""

import numpy as np
from PIL import Image

# Shrink the template to seconds on a CPU; the data and code paths are the
# real ones.
SMALL = ['IMAGE_SIZE = 32', 'LOCAL_SIZE = 16', 'SUPPORT_CLASSES = 3',
         'make_pretrain_dataset_fn.global_batch_size = 16',
         'make_pretrain_dataset_fn.images_per_class = 2',
         "build_backbone.name = 'small_resnet'",
         'small_resnet.widths = (8, 16)',
         'small_resnet.blocks_per_stage = (1, 1)',
         'small_resnet.stage_strides = (2, 2)',
         'ProjectionHead.hidden_dim = 16', 'ProjectionHead.output_dim = 16',
         'PredictionHead.hidden_dim = 8', 'train.num_epochs = 2',
         'train_supervised.steps = 20',
         'train_supervised.batch_size = 8', 'train.verbose = 0',
         'fine_tune_suncet.images_per_class = 2',
         'fine_tune_suncet.num_epochs = 2']


def write_folder(root, classes, per_class, seed):
    rng = np.random.default_rng(seed)
    for c, name in enumerate(classes):
        for i in range(per_class):
            # A class is a brightness gradient direction, plus noise.
            grid = np.linspace(0, 1, 40)
            base = [np.add.outer(grid, 0 * grid), np.add.outer(0 * grid, grid),
                    np.add.outer(grid, grid) / 2][c]
            image = base[..., None] + 0.1 * rng.normal(size=(40, 40, 3))
            path = root / name / f'{i}.png' if name else root / f'{c}_{i}.jpg'
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray((np.clip(image, 0, 1) * 255).astype(np.uint8)
                            ).save(path)


# The classes `write_folder` can draw, as `write_experiment` names them.
CLASSES = ('up', 'left', 'diagonal')


def path_bindings(root):
    """The gin bindings of the three folders of `write_experiment(root)`."""
    return [f"LABELED_DIR = '{root / 'labeled'}'",
            f"UNLABELED_DIR = '{root / 'unlabeled'}'",
            f"TEST_DIR = '{root / 'test'}'"]


def write_experiment(root, *, unlabeled, test):
    """`root/labeled` (4 images of each of `CLASSES`), `root/unlabeled`
    (`unlabeled` of each, unnamed) and `root/test` (`test` of each).

    Returns:
        `path_bindings(root)`.
    """
    write_folder(root / 'labeled', CLASSES, 4, seed=0)
    write_folder(root / 'unlabeled', [''] * len(CLASSES), unlabeled, seed=1)
    write_folder(root / 'test', CLASSES, test, seed=2)
    return path_bindings(root)
