r"""Writes Fashion-MNIST as image folders, the layout of the folder recipes.

  python tools/fashion_mnist_folders.py --output_dir=/tmp/fmnist_folders

reads the IDX files of Debian's `dataset-fashion-mnist` package and writes
PNG files named by their index in the IDX file:

  OUTPUT_DIR/labeled/<class>/<index>.png     labels_per_class per class,
                                             drawn with --seed
  OUTPUT_DIR/unlabeled/<index>.png           the other training images
  OUTPUT_DIR/test/<class>/<index>.png        the 10,000 test images

Class folders are named '<class id>_<class name>' ('0_T-shirt_top', ...,
'9_Ankle boot'; '/' becomes '_'), so that sorted by name (how folder
classes are numbered) they keep the IDX class ids. Then:

  python run.py --gin_file=gin_configs/image_folders_small.gin \
      --gin_bindings="LABELED_DIR = '/tmp/fmnist_folders/labeled'" \
      --gin_bindings="UNLABELED_DIR = '/tmp/fmnist_folders/unlabeled'" \
      --gin_bindings="TEST_DIR = '/tmp/fmnist_folders/test'" \
      --gin_bindings='CHANNELS = 1' \
      --model_dir=runs/fmnist_folders --mode=train_and_evaluate
"""

import argparse
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import paws_tf  # noqa: E402,F401  (selects tf_keras before TF is used)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from paws_tf.data import sources  # noqa: E402
from paws_tf.demo import fashion_mnist  # noqa: E402


def class_folder_names():
    """Folder names of the ten classes, in class-id order when sorted."""
    return [f'{class_id}_{name.replace("/", "_")}' for class_id, name in
            enumerate(sources.FASHION_MNIST_CLASS_NAMES)]


def write_png(path, image):
    """Writes a uint8 [H, W] image as a grayscale PNG."""
    tf.io.write_file(path, tf.io.encode_png(image[..., None]))


def write_split(images, labels, positions, root, folders):
    """Writes `images[positions]` under `root` (class folders when given)."""
    for position in positions:
        directory = (root if folders is None else
                     os.path.join(root, folders[labels[position]]))
        write_png(os.path.join(directory, f'{position:05d}.png'),
                  images[position])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--output_dir', required=True)
    parser.add_argument('--idx_dir',
                        default=fashion_mnist.FASHION_MNIST_IDX_DIR)
    parser.add_argument('--labels_per_class', type=int, default=40)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    folders = class_folder_names()
    paths = {split: [os.path.join(args.idx_dir, f'{prefix}-{kind}-idx'
                                  f'{dims}-ubyte.gz')
                     for kind, dims in (('images', 3), ('labels', 1))]
             for split, prefix in (('train', 'train'), ('test', 't10k'))}
    for split_paths in paths.values():
        for path in split_paths:
            if not os.path.exists(path):
                sys.exit(f'{path} does not exist: install Debian\'s '
                         'dataset-fashion-mnist or pass --idx_dir.')
    if os.path.exists(args.output_dir) and os.listdir(args.output_dir):
        sys.exit(f'{args.output_dir} is not empty: choose a new folder.')
    images, labels = (sources.read_idx(p) for p in paths['train'])
    rng = np.random.default_rng(args.seed)
    labeled = np.sort(np.concatenate([
        rng.choice(np.flatnonzero(labels == c), args.labels_per_class,
                   replace=False) for c in range(len(folders))]))
    for folder in folders:
        os.makedirs(os.path.join(args.output_dir, 'labeled', folder))
        os.makedirs(os.path.join(args.output_dir, 'test', folder))
    os.makedirs(os.path.join(args.output_dir, 'unlabeled'))
    write_split(images, labels, labeled,
                os.path.join(args.output_dir, 'labeled'), folders)
    write_split(images, labels, np.setdiff1d(np.arange(len(images)), labeled),
                os.path.join(args.output_dir, 'unlabeled'), None)
    test_images, test_labels = (sources.read_idx(p) for p in paths['test'])
    write_split(test_images, test_labels, np.arange(len(test_images)),
                os.path.join(args.output_dir, 'test'), folders)
    print(f'{len(labeled)} labeled, {len(images) - len(labeled)} unlabeled '
          f'and {len(test_images)} test images written under '
          f'{args.output_dir}.')


if __name__ == '__main__':
    main()
