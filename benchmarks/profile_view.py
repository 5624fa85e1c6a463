"""Where a view's CPU time goes in the ImageNet pre-training input (not a
test).

Runs one multi-crop image (`augment.IMAGENET_MULTICROP`: 2 x 224^2 and
6 x 96^2 views) through cumulative stages of the view in a one-thread
`tf.data` map, on bench_input.py's JPEG photographs, and prints the wall
and CPU milliseconds per view of each stage (the process's CPU time moves
less with other work on the core) and the CPU time each op adds: reading the
file, decoding it, the random resized crops (decode + crop is the lower
bound of any input path that decodes and crops), the flip, the colour
distortion, the blur, the normalisation (the whole view, as
`augment.make_view` makes it). With `--official` it times the official
input path's view (benchmarks/official_input.py: PIL and torchvision) the
same way, in this process. It also times the support sampling per support
row. Run it on one core for per-core figures:

    taskset -c 0 python benchmarks/profile_view.py --official

With `--resize` it times instead the antialiased resize of a 300 x 400
uint8 image to 224 x 224 with one intra-op thread, `tf.image.resize`
against `image_ops.resize` (the same values), in alternating rounds.
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
import tensorflow as tf  # noqa: E402

from benchmarks import bench_input  # noqa: E402
from paws_tf.data import augment  # noqa: E402
from paws_tf.data import image_ops  # noqa: E402
from paws_tf.data import sampling  # noqa: E402
from paws_tf.data import sources  # noqa: E402

STAGES = ('read', 'decode', 'crop', 'flip', 'colour', 'blur', 'normalise')


def _view(image, seed, size, scale, stage):
    """`augment.make_view` up to and including `stage`."""
    config = augment.IMAGENET_MULTICROP
    crop_seed, flip_seed, color_seed, blur_seed = image_ops.split_seed(seed, 4)
    view = image_ops.random_resized_crop(image, crop_seed, size, scale)
    if STAGES.index(stage) >= STAGES.index('flip'):
        view = image_ops.random_flip(view, flip_seed)
    if STAGES.index(stage) >= STAGES.index('colour'):
        view = augment.color_distortion(view, color_seed,
                                        config.color_strength)
    if STAGES.index(stage) >= STAGES.index('blur'):
        view = image_ops.gaussian_blur(view, blur_seed, config.blur_prob)
    if stage == 'normalise':
        view = image_ops.normalize(view, augment.IMAGENET_MEAN,
                                   augment.IMAGENET_STD)
    return view


def _stage_fn(stage):
    """The map function of one multi-crop image up to `stage`."""
    config = augment.IMAGENET_MULTICROP

    def views(path, seed):
        encoded = tf.io.read_file(path)
        if stage == 'read':
            return tf.strings.length(encoded)
        image = sources.decode_image(encoded, 3)
        if stage == 'decode':
            return tf.shape(image)
        seeds = image_ops.split_seed(seed, 2 + config.num_local)
        return tuple(
            _view(image, s, config.global_size, config.global_scale, stage)
            for s in seeds[:2]) + tuple(
            _view(image, s, config.local_size, config.local_scale, stage)
            for s in seeds[2:])
    return views


def _one_thread(dataset):
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    return dataset.with_options(options)


def _seconds_per_call(fn, seconds):
    """(wall, CPU) seconds per call of `fn(count)` for `seconds`. The
    process's CPU time counts the work of its threads only, so it moves
    less than wall time with other work on the core."""
    count, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        fn(count)
        count += 1
    return ((time.perf_counter() - start) / count,
            (time.process_time() - cpu) / count)


def _seconds_per_element(dataset, seconds):
    """(wall, CPU) seconds per element of `dataset` (endless), after a
    warm-up."""
    iterator = iter(dataset)
    for _ in range(5):
        next(iterator)
    return _seconds_per_call(lambda _: next(iterator), seconds)


def profile_paws_tf(paths, args):
    views = 2 + augment.IMAGENET_MULTICROP.num_local
    items = tf.data.Dataset.from_tensor_slices(paths).repeat().enumerate()
    result = {}
    for stage in STAGES:
        dataset = _one_thread(items.map(
            lambda i, path: _stage_fn(stage)(path, tf.stack([i, i]))))
        result[stage] = _ms(_seconds_per_element(dataset, args.seconds),
                            views)
    return result


def _ms(seconds, views):
    """(wall, CPU) milliseconds per view."""
    return tuple(round(1e3 * s / views, 3) for s in seconds)


def profile_support_sampling(labels, args):
    """(wall, CPU) milliseconds per support row of `SupportSampler`'s
    stream (15 classes x 7 images per step, as bench_input.py's ImageNet
    setting)."""
    sampler = sampling.SupportSampler(
        labels, classes_per_step=15, images_per_class=7, num_replicas=1,
        unique_classes_per_replica=False, seed=0)
    rows = tf.data.Dataset.counter().flat_map(
        lambda i: sampler.items(i, 0, 1))
    return _ms(_seconds_per_element(_one_thread(rows.batch(105)),
                                    args.seconds), 105)


def profile_official(paths, args):
    """Milliseconds per view of the official path's stages, in order."""
    import PIL.Image
    from benchmarks import official_input
    transforms = official_input.transforms
    config = augment.IMAGENET_MULTICROP
    sizes = [(config.global_size, config.global_scale)] * 2 + [
        (config.local_size, config.local_scale)] * config.num_local
    full = [official_input.view_transform(size, scale, 1.0).transforms
            for size, scale in sizes]
    # The ops of the Compose in order: crop, flip, colour, blur, ToTensor
    # and Normalize (one stage).
    cut = {'crop': 1, 'flip': 2, 'colour': 3, 'blur': 4, 'normalise': 6}
    torch_threads = official_input.torch.get_num_threads()
    official_input.torch.set_num_threads(1)
    result = {}
    for stage in STAGES:
        def one_image(index):
            path = paths[index % len(paths)]
            if stage == 'read':
                with open(path, 'rb') as f:
                    return f.read()
            image = PIL.Image.open(path).convert('RGB')
            if stage == 'decode':
                return image
            return [transforms.Compose(ops[:cut[stage]])(image)
                    for ops in full]
        result[stage] = _ms(_seconds_per_call(one_image, args.seconds),
                            len(sizes))
    official_input.torch.set_num_threads(torch_threads)
    return result


def profile_resize(args, rounds=3):
    """CPU milliseconds per call of each antialiased resize, a list of
    `rounds` rounds of `args.seconds` each, the two in alternation."""
    image = tf.constant(np.random.default_rng(0).integers(
        0, 256, (300, 400, 3), dtype=np.uint8))
    resizes = {
        'tf.image.resize': tf.function(
            lambda x: tf.image.resize(x, (224, 224), antialias=True)),
        'image_ops.resize': tf.function(
            lambda x: image_ops.resize(x, (224, 224), antialias=True))}
    result = {name: [] for name in resizes}
    for resize in resizes.values():
        resize(image)  # Traced before it is timed.
    for _ in range(rounds):
        for name, resize in resizes.items():
            cpu = _seconds_per_call(lambda _: resize(image), args.seconds)[1]
            result[name].append(round(1e3 * cpu, 3))
    return result


def _added(cumulative):
    """Per stage, the CPU time it adds to the one before."""
    stages = list(cumulative)
    return {stage: round(cumulative[stage][1] - (
        cumulative[stages[i - 1]][1] if i else 0), 3)
        for i, stage in enumerate(stages)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--seconds', type=float, default=10.0)
    parser.add_argument('--official', action='store_true',
                        help='also time the official input path')
    parser.add_argument('--resize', action='store_true',
                        help='time the antialiased resizes instead')
    args = parser.parse_args()
    if args.resize:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        print(json.dumps({'cpu_ms_per_resize': profile_resize(args),
                          'cores': len(os.sched_getaffinity(0)),
                          'load_avg_1min': os.getloadavg()[0]}), flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        labeled = bench_input.imagenet_setting(pathlib.Path(tmp))[0]
        paths = sorted(str(p) for p in pathlib.Path(tmp).glob('*/*.jpg'))
        runs = {'paws_tf': profile_paws_tf(paths, args)}
        if args.official:
            runs['official'] = profile_official(paths, args)
        support_ms = profile_support_sampling(labeled.labels, args)
    for name, cumulative in runs.items():
        print(json.dumps({
            'pipeline': name,
            'ms_per_view_cumulative': {k: v[0] for k, v in cumulative.items()},
            'cpu_ms_per_view_cumulative': {
                k: v[1] for k, v in cumulative.items()},
            'cpu_ms_per_view_added': _added(cumulative),
            'cores': len(os.sched_getaffinity(0)),
            'load_avg_1min': os.getloadavg()[0]}), flush=True)
    print(json.dumps({'support_sampling_ms_per_row': support_ms[0],
                      'support_sampling_cpu_ms_per_row': support_ms[1],
                      'load_avg_1min': os.getloadavg()[0]}), flush=True)


if __name__ == '__main__':
    main()
