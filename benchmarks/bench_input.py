"""Throughput of the PAWS pre-training input pipeline (not a test).

Prints one JSON object per setting: multi-crop views per second (every view
produced counts: the support views plus 2 + m views per unlabeled image) and
unlabeled images per second, measured for `--seconds` after a warm-up, with
the paper's augmentations (`augment.CIFAR10_MULTICROP`,
`augment.IMAGENET_MULTICROP`), on the cores this process may run on (`taskset
-c 0` for one). The ImageNet setting reads JPEG photographs (cut from
scikit-image's sample photographs: decoding and blur costs depend on image
content) with the official per-GPU sizes: 64 unlabeled images and a support
of 15 classes x 7 images per step.

With `--against_official` the ImageNet setting also runs the official input
path (benchmarks/official_input.py: suncet's torchvision transforms in
DataLoaders of one worker per core; in-process on one core) on the same
files, in alternation with paws_tf's for `--rounds` rounds, and prints both
medians and their ratio. It and the photographs need the `torch` extra.

With `--against_step CONFIG` it then runs `bench_step.py --config CONFIG`
and prints the ratio of views produced to views the train step consumes per
second (each measured alone on the whole machine; in training both share the
cores).

It runs the input as a job training on GPUs runs it, with that job's
intra-op threads (`cluster.set_intra_op_threads`: one, unless
TF_NUM_INTRAOP_THREADS is set); `--cpu_job` keeps TensorFlow's default of a
thread per core, as a job training on the CPU does.

With `--digest STEPS` it prints, instead of a rate, the SHA-256 of every
array of the first STEPS elements (deterministic mode): two runs print the
same digest when a setting such as `--cpu_job` changes no element.

    python benchmarks/bench_input.py --settings imagenet --against_official
    python benchmarks/bench_input.py --seconds 30 --against_step cifar_small
    python benchmarks/bench_input.py --settings imagenet --digest 2 --cpu_job
"""

import argparse
import hashlib
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
import tensorflow as tf  # noqa: E402

from benchmarks import bench_step  # noqa: E402
from paws_tf import cluster  # noqa: E402
from paws_tf.data import augment  # noqa: E402
from paws_tf.data import folders
from paws_tf.data import pipeline  # noqa: E402
from paws_tf.data import sources  # noqa: E402
from paws_tf.data import splits


def cifar10_setting():
    """32x32 RGB in memory, 2x32^2 + 6x18^2, support 10 x 64 x 2 views."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, [50000, 32, 32, 3], np.uint8)
    source = sources.from_arrays(images, np.arange(50000) % 10)
    labeled, unlabeled = splits.select_labeled(source, labels_per_class=400)
    return unlabeled, labeled, augment.CIFAR10_MULTICROP, {
        'global_batch_size': 256, 'classes_per_step': 10,
        'images_per_class': 64, 'support_views': 2,
        'normalization': (augment.CIFAR10_MEAN, augment.CIFAR10_STD)}


def _write_photographs(root, num_classes, per_class):
    """JPEGs of ImageNet's typical size (500 x 375 or 375 x 500, quality 90),
    each a random crop of one of scikit-image's sample photographs."""
    try:
        from skimage import data
    except ImportError:
        raise SystemExit('The ImageNet setting cuts its JPEGs from '
                         "scikit-image's photographs: pip install .[torch]")
    photos = [data.astronaut(), data.chelsea(), data.coffee(), data.rocket(),
              data.hubble_deep_field(), data.immunohistochemistry(),
              data.retina(), data.stereo_motorcycle()[0]]
    rng = np.random.default_rng(0)
    for c in range(num_classes):
        folder = root / f'class_{c:03d}'
        folder.mkdir(parents=True)
        for i in range(per_class):
            photo = photos[rng.integers(len(photos))]
            h, w = photo.shape[:2]
            ch, cw = int(h * rng.uniform(0.4, 1)), int(w * rng.uniform(0.4, 1))
            y, x = rng.integers(h - ch + 1), rng.integers(w - cw + 1)
            size = (500, 375) if rng.random() < 0.75 else (375, 500)
            image = PIL.Image.fromarray(photo[y:y + ch, x:x + cw]).resize(
                size, PIL.Image.BICUBIC)
            image.save(folder / f'{i:04d}.jpg', quality=90)


def imagenet_setting(root):
    """JPEG photographs, 2x224^2 + 6x96^2 with blur, support 15 x 7,
    batch 64 (suncet configs/paws/imgnt_train.yaml, per GPU)."""
    _write_photographs(root, num_classes=16, per_class=24)
    labeled = folders.image_folder(root)
    return labeled, labeled, augment.IMAGENET_MULTICROP, {
        'global_batch_size': 64, 'classes_per_step': 15,
        'images_per_class': 7, 'support_views': 1,
        'normalization': (augment.IMAGENET_MEAN, augment.IMAGENET_STD)}


def _views_per_step(multicrop, sizes):
    support = (sizes['support_views'] * sizes['classes_per_step']
               * sizes['images_per_class'])
    return sizes['global_batch_size'] * (2 + multicrop.num_local) + support


def _run(iterator, args):
    """(steps, seconds) of `next(iterator)` for `args.seconds`."""
    for _ in range(args.warmup_steps):
        next(iterator)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        next(iterator)
        steps += 1
    return steps, time.perf_counter() - start


def _cores():
    return len(os.sched_getaffinity(0))


def measure(name, unlabeled, labeled, multicrop, sizes, args):
    pretrain = pipeline.make_pretrain_dataset_fn(
        unlabeled, labeled, num_replicas=1, multicrop=multicrop,
        deterministic=not args.nondeterministic, **sizes)
    steps, elapsed = _run(iter(pretrain.dataset_fn(None)), args)
    batch = sizes['global_batch_size']
    views = _views_per_step(multicrop, sizes)
    return {
        'setting': name, 'pipeline': 'paws_tf', 'steps': steps,
        'seconds': round(elapsed, 1), 'views_per_step': views,
        'views_per_s': round(steps * views / elapsed, 1),
        'unlabeled_images_per_s': round(steps * batch / elapsed, 1),
        'steps_per_s': round(steps / elapsed, 3),
        'deterministic': not args.nondeterministic,
        'cores': _cores(), 'intra_op_threads': _intra_op_threads(),
        'load_avg_1min': os.getloadavg()[0]}


def _intra_op_threads():
    """TensorFlow's intra-op threads here (0: its default)."""
    return (tf.config.threading.get_intra_op_parallelism_threads() or
            os.environ.get('TF_NUM_INTRAOP_THREADS', 0))


def digest(name, unlabeled, labeled, multicrop, sizes, args):
    """The SHA-256 of every array of the first `args.digest` elements."""
    pretrain = pipeline.make_pretrain_dataset_fn(
        unlabeled, labeled, num_replicas=1, multicrop=multicrop,
        deterministic=True, **sizes)
    sha = hashlib.sha256()
    iterator = iter(pretrain.dataset_fn(None))
    for _ in range(args.digest):
        for array in tf.nest.flatten(next(iterator)):
            sha.update(array.numpy().tobytes())
    return {'setting': name, 'steps': args.digest,
            'sha256': sha.hexdigest(),
            'intra_op_threads': _intra_op_threads()}


def measure_official(root, multicrop, sizes, args):
    """The official input path on the files under `root`."""
    from benchmarks import official_input
    cores = _cores()
    loaders = official_input.make_loaders(
        root, batch_size=sizes['global_batch_size'],
        classes_per_batch=sizes['classes_per_step'],
        images_per_class=sizes['images_per_class'],
        num_local=multicrop.num_local, num_workers=cores if cores > 1 else 0,
        global_scale=multicrop.global_scale,
        local_scale=multicrop.local_scale,
        color_strength=multicrop.color_strength)
    steps, elapsed = _run(loaders, args)
    views = _views_per_step(multicrop, sizes)
    return {'setting': 'imagenet', 'pipeline': 'official', 'steps': steps,
            'seconds': round(elapsed, 1), 'views_per_step': views,
            'views_per_s': round(steps * views / elapsed, 1),
            'cores': cores, 'load_avg_1min': os.getloadavg()[0]}


def race_official(root, setting, args):
    """paws_tf's ImageNet pipeline and the official one, in alternation."""
    rates = {'paws_tf': [], 'official': []}
    for _ in range(args.rounds):
        for result in (measure('imagenet', *setting, args),
                       measure_official(root, *setting[2:], args)):
            print(json.dumps(result), flush=True)
            rates[result['pipeline']].append(result['views_per_s'])
    medians = {k: round(float(np.median(v)), 1) for k, v in rates.items()}
    print(json.dumps({
        'benchmark': 'against_official', 'rounds': args.rounds,
        'cores': _cores(), 'intra_op_threads': _intra_op_threads(),
        'paws_tf_views_per_s': medians['paws_tf'],
        'official_views_per_s': medians['official'],
        'ratio': round(medians['paws_tf'] / medians['official'], 2)}),
        flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--seconds', type=float, default=30.0)
    parser.add_argument('--warmup_steps', type=int, default=3)
    parser.add_argument('--settings', default='cifar10,imagenet')
    parser.add_argument('--nondeterministic', action='store_true')
    parser.add_argument('--against_official', action='store_true',
                        help='race the ImageNet setting against the '
                             'official input path')
    parser.add_argument('--rounds', type=int, default=3,
                        help='alternations of --against_official')
    parser.add_argument('--digest', type=int, default=0,
                        help='print the SHA-256 of the first DIGEST steps\' '
                             'arrays instead of a rate')
    parser.add_argument('--against_step', default='',
                        help='bench_step.py config to compare with, e.g. '
                             'cifar_small (empty: no comparison)')
    parser.add_argument('--cpu_job', action='store_true',
                        help="TensorFlow's default intra-op threads (a CPU "
                             "training job's), not a GPU job's")
    args = parser.parse_args()
    if not args.cpu_job:
        cluster.set_intra_op_threads(['GPU:0'], [])
    results = {}
    for name in args.settings.split(','):
        with tempfile.TemporaryDirectory() as tmp:
            if name == 'cifar10':
                setting = cifar10_setting()
            elif name == 'imagenet':
                setting = imagenet_setting(pathlib.Path(tmp))
            else:
                raise SystemExit(f'unknown setting {name!r}')
            if args.digest:
                print(json.dumps(digest(name, *setting, args)), flush=True)
                continue
            if name == 'imagenet' and args.against_official:
                race_official(tmp, setting, args)
                continue
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
