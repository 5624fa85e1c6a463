"""Throughput of the PAWS pre-training input pipeline (not a test).

Prints one JSON object per setting: multi-crop views per second (every view
produced counts: the support views plus 2 + m views per unlabeled image) and
unlabeled images per second, measured for `--seconds` after a warm-up, with
the paper's augmentations (`augment.CIFAR10_MULTICROP`,
`augment.IMAGENET_MULTICROP`). With `--against_step CONFIG` it then runs
`bench_step.py --config CONFIG` and prints the ratio of views produced to
views the train step consumes per second (each measured alone on the whole
machine; in training both share the cores).

    python benchmarks/bench_input.py --seconds 30 --against_step cifar_small
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import paws_tf  # noqa: E402,F401  (selects tf_keras before TF is used)
import numpy as np  # noqa: E402
import PIL.Image  # noqa: E402

from benchmarks import bench_step  # noqa: E402
from paws_tf.data import augment  # noqa: E402
from paws_tf.data import folders
from paws_tf.data import pipeline  # noqa: E402
from paws_tf.data import sources  # noqa: E402


def cifar10_setting():
    """32x32 RGB in memory, 2x32^2 + 6x18^2, support 10 x 64 x 2 views."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, [50000, 32, 32, 3], np.uint8)
    source = sources.from_arrays(images, np.arange(50000) % 10)
    labeled, unlabeled = sources.select_labeled(source, labels_per_class=400)
    return unlabeled, labeled, augment.CIFAR10_MULTICROP, {
        'global_batch_size': 256, 'classes_per_step': 10,
        'images_per_class': 64, 'support_views': 2}


def _write_jpegs(root, num_classes, per_class):
    """Smooth random ~400x350 JPEGs (noise would make decoding unrealistic)."""
    rng = np.random.default_rng(0)
    for c in range(num_classes):
        folder = root / f'class_{c:03d}'
        folder.mkdir(parents=True)
        for i in range(per_class):
            h, w = rng.integers(330, 420), rng.integers(330, 420)
            coarse = rng.integers(0, 256, [h // 16 + 1, w // 16 + 1, 3],
                                  np.uint8)
            image = PIL.Image.fromarray(coarse).resize((w, h),
                                                       PIL.Image.BILINEAR)
            image.save(folder / f'{i:04d}.jpg', quality=90)


def imagenet_setting(root):
    """JPEG files, 2x224^2 + 6x96^2 with blur, support 16 x 7, batch 64."""
    _write_jpegs(root, num_classes=16, per_class=24)
    labeled = folders.image_folder(root)
    return labeled, labeled, augment.IMAGENET_MULTICROP, {
        'global_batch_size': 64, 'classes_per_step': 16,
        'images_per_class': 7, 'support_views': 1}


def measure(name, unlabeled, labeled, multicrop, sizes, args):
    pretrain = pipeline.make_pretrain_dataset_fn(
        unlabeled, labeled, num_replicas=1, multicrop=multicrop,
        deterministic=not args.nondeterministic, **sizes)
    iterator = iter(pretrain.dataset_fn(None))
    for _ in range(args.warmup_steps):
        next(iterator)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        next(iterator)
        steps += 1
    elapsed = time.perf_counter() - start
    batch = sizes['global_batch_size']
    support = (sizes['support_views'] * sizes['classes_per_step']
               * sizes['images_per_class'])
    views = batch * (2 + multicrop.num_local) + support
    return {
        'setting': name, 'steps': steps, 'seconds': round(elapsed, 1),
        'views_per_step': views,
        'views_per_s': round(steps * views / elapsed, 1),
        'unlabeled_images_per_s': round(steps * batch / elapsed, 1),
        'steps_per_s': round(steps / elapsed, 3),
        'deterministic': not args.nondeterministic,
        'cpus': os.cpu_count(), 'load_avg_1min': os.getloadavg()[0]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--seconds', type=float, default=30.0)
    parser.add_argument('--warmup_steps', type=int, default=3)
    parser.add_argument('--settings', default='cifar10,imagenet')
    parser.add_argument('--nondeterministic', action='store_true')
    parser.add_argument('--against_step', default='',
                        help='bench_step.py config to compare with, e.g. '
                             'cifar_small (empty: no comparison)')
    args = parser.parse_args()
    results = {}
    for name in args.settings.split(','):
        with tempfile.TemporaryDirectory() as tmp:
            if name == 'cifar10':
                setting = cifar10_setting()
            elif name == 'imagenet':
                setting = imagenet_setting(pathlib.Path(tmp))
            else:
                raise SystemExit(f'unknown setting {name!r}')
            results[name] = measure(name, *setting, args)
            print(json.dumps(results[name]), flush=True)
    if args.against_step:
        compare_with_step(args.against_step, results)


def compare_with_step(config, results):
    """Runs the train-step benchmark and prints input/step throughput."""
    step = bench_step.run_in_subprocess(['--config', config])
    print(json.dumps(step), flush=True)
    print(json.dumps({
        'benchmark': 'input_over_step', 'step_config': config,
        'step_images_per_s': step['images_per_s'],
        **{f'{name}_views_per_s_over_step': round(
            result['views_per_s'] / step['images_per_s'], 2)
           for name, result in results.items()},
        'cpus': os.cpu_count(), 'load_avg_1min': os.getloadavg()[0]}),
        flush=True)


if __name__ == '__main__':
    main()
