"""Cost of the PAWS objective against the support size (not a test).

The objective alone (`losses.paws_loss` forward and backward under a
`tf.function`) on random embeddings, against the support size M (640 ->
6720 gathered support embeddings of D = 2048, C classes), on one replica
and on 2 replicas (MirroredStrategy on 2 logical CPU devices: each replica
holds M / 2 supports and N / 2 anchors and all-gathers the supports). This
isolates the SNN matmuls and the all-gather from the encoder. Prints one
JSON object per measurement:

    python benchmarks/bench_support.py

With `--ropaws`, RoPAWS's objective against PAWS's instead, at the
ImageNet configs' support (6720 supports of D = 2048, 960 classes) for an
unlabeled batch M of 512 to 4096 images (the M x M label propagation of
each global view), the two timed in alternation in one process:

    python benchmarks/bench_support.py --ropaws
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import paws_tf  # noqa: E402,F401  (selects tf_keras before TF is used)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import bench_step  # noqa: E402
from paws_tf import cluster  # noqa: E402
from paws_tf import dist  # noqa: E402
from paws_tf import losses  # noqa: E402

# (support images M, classes C): CIFAR-10's 10 x 64, then ImageNet-like
# 7 images per class up to the paper's 960 x 7 = 6720.
SUPPORT_SIZES = ((640, 10), (1344, 192), (2688, 384), (4032, 576),
                 (6720, 960))
# Unlabeled images per step for `--ropaws`, up to the ImageNet configs' 4096.
UNLABELED_SIZES = (512, 1024, 2048, 4096)


def _context():
    return {'cpus': os.cpu_count(),
            'load_avg': [round(v, 2) for v in os.getloadavg()],
            'env': bench_step.env_knobs(),
            'tf': tf.__version__}


def _time(fn, steps, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def support_scaling(args, strategy):
    """Objective forward + backward against the support size."""
    rng = np.random.default_rng(0)
    anchors_per_replica = args.anchors // strategy.num_replicas_in_sync
    for support, classes in SUPPORT_SIZES:
        replicas = strategy.num_replicas_in_sync
        per_replica = support // replicas
        # Each replica samples C / R classes of n images (ImageNet's layout):
        # gathered, class c's n rows are the c-th block.
        labels = losses.label_matrix(np.repeat(
            np.arange(classes), support // classes), classes, 0.1)  # [M, C]

        def values(rows):
            return strategy.experimental_distribute_values_from_function(
                lambda _: tf.constant(rng.normal(
                    size=(rows, args.dim)).astype(np.float32)))

        anchors = values(anchors_per_replica)  # [(2 + m) B / R, D]
        supports = values(per_replica)  # [M / R, D]
        targets = values(2 * anchors_per_replica // (2 + args.multicrop))

        def replica_step(anchors, supports, targets):
            with tf.GradientTape() as tape:
                tape.watch([anchors, supports])
                gathered = dist.all_gather(supports)  # [M, D]
                terms = losses.paws_loss(
                    anchors, gathered, labels, targets,
                    tf.stop_gradient(gathered), labels,
                    multicrop=args.multicrop, tau=0.1,
                    sharpen_temperature=0.25)
                loss = (terms.cross_entropy + terms.me_max) / replicas
            return tape.gradient(loss, [anchors, supports])

        step = tf.function(lambda: strategy.run(
            replica_step, args=(anchors, supports, targets)))

        def run():
            grads = strategy.experimental_local_results(step()[0])
            grads[0].numpy()  # Waits for the step.

        times = _time(run, args.steps, args.warmup)
        median = statistics.median(times)
        print(json.dumps({
            'benchmark': 'support_scaling', 'replicas': replicas,
            'support_images': support, 'classes': classes, 'dim': args.dim,
            'anchors': args.anchors,
            'step_s': {'median': round(median, 4),
                       'min': round(min(times), 4),
                       'max': round(max(times), 4)},
            # FLOPs of the anchor SNN matmul (forward and its two backward
            # matmuls) and of the target one (forward only).
            'gflop_per_s': round(2 * args.dim * support * (
                3 * args.anchors + 2 * args.anchors // (2 + args.multicrop))
                / median / 1e9, 1),
            **_context()}), flush=True)


def ropaws_cost(args):
    """PAWS's and RoPAWS's objectives, forward and backward, alternating,
    and RoPAWS's targets alone.

    One replica holding the whole batch; the anchors are the two global
    views only (2M rows): the local views' cost is PAWS's in both. With R
    replicas, each one still computes RoPAWS's targets over all M gathered
    target rows (similarities to the supports and to each other, two M x M
    solves), where PAWS's targets cover its own M / R rows: the RoPAWS-only
    work of a replica is `step_s['ropaws_targets']` less PAWS's targets of
    M / R rows, so at most `step_s['ropaws_targets']`. `ropaws_extra_s`,
    the difference of the two objectives on one replica, leaves out the
    similarities of the other replicas' rows to the supports.
    """
    rng = np.random.default_rng(0)
    support, classes = SUPPORT_SIZES[-1]
    labels = losses.label_matrix(np.repeat(
        np.arange(classes), support // classes), classes, 0.1)  # [N, C]
    sizes = [m for m in UNLABELED_SIZES if m <= args.max_unlabeled]
    for batch in sizes:
        def normal(rows):
            return tf.constant(rng.normal(size=(rows, args.dim)), tf.float32)

        anchors, targets = normal(2 * batch), normal(2 * batch)
        supports, target_supports = normal(support), normal(support)
        settings = dict(multicrop=0, tau=0.1, sharpen_temperature=0.25)

        def step_fn(objective, extra):
            @tf.function
            def step():
                with tf.GradientTape() as tape:
                    tape.watch([anchors, supports])
                    terms = objective(anchors, supports, labels, targets,
                                      target_supports, labels, **settings,
                                      **extra)
                    loss = terms.cross_entropy + terms.me_max
                grads = tape.gradient(loss, [anchors, supports])
                return grads[0][0, 0] + grads[1][0, 0]
            return lambda: step().numpy()

        ropaws = dict(images_per_class=support // classes, prior_tau=3.0,
                      label_ratio=5.0)

        @tf.function
        def targets_only():
            return losses.ropaws_targets(targets, target_supports, labels,
                                         **settings, **ropaws)[0][0, 0]

        runs = {'paws': step_fn(losses.paws_loss, {}),
                'ropaws': step_fn(losses.ropaws_loss,
                                  dict(ropaws, prior_pow=1.0)),
                'ropaws_targets': lambda: targets_only().numpy()}
        times = {name: [] for name in runs}
        for _ in range(args.warmup):
            for run in runs.values():
                run()
        for _ in range(args.steps):  # Alternating: the load hits both.
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
        medians = {name: statistics.median(t) for name, t in times.items()}
        print(json.dumps({
            'benchmark': 'ropaws_cost', 'unlabeled': batch,
            'support_images': support, 'classes': classes, 'dim': args.dim,
            'anchors': 2 * batch,
            'step_s': {name: round(v, 3) for name, v in medians.items()},
            'ropaws_extra_s': round(medians['ropaws'] - medians['paws'], 3),
            'ratio': round(medians['ropaws'] / medians['paws'], 3),
            **_context()}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--anchors', type=int, default=512,
                        help='anchor views (2 + m) B over all replicas')
    parser.add_argument('--multicrop', type=int, default=6)
    parser.add_argument('--dim', type=int, default=2048)
    parser.add_argument('--steps', type=int, default=5,
                        help='timed steps per support size')
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--ropaws', action='store_true',
                        help='RoPAWS against PAWS instead (one replica)')
    parser.add_argument('--max_unlabeled', type=int, default=4096,
                        help='largest unlabeled batch M of --ropaws')
    args = parser.parse_args()
    if args.ropaws:
        ropaws_cost(args)
        return
    cpu = tf.config.list_physical_devices('CPU')[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    for strategy in (tf.distribute.get_strategy(),
                     cluster.make_strategy('mirrored', ['CPU:0', 'CPU:1'])):
        support_scaling(args, strategy)

if __name__ == '__main__':
    main()
