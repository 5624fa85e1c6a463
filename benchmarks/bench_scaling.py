"""Scaling of the PAWS step with support size and replica count (not a test).

Three parts, each printing one JSON object per measurement:

1. `support`: the objective alone (`losses.paws_terms` forward and backward
   under a `tf.function`) on random embeddings, against the support size M
   (640 -> 6720 gathered support embeddings of D = 2048, C classes), on one
   replica and on 2 replicas (MirroredStrategy on 2 logical CPU devices:
   each replica holds M / 2 supports and N / 2 anchors and all-gathers the
   supports). This isolates the SNN matmuls and the all-gather from the
   encoder.
2. `replicas`: the full train step (`bench_step.py` in a subprocess, so
   that each run configures its own devices) on 1 and 2 replicas with the
   same global batch, with several intra/inter-op thread settings and
   glibc malloc arenas (`REPLICA_RUNS`); then two references with one
   thread per process: two independent processes, each one replica on half
   the batch at the same time (what the machine does for 2 replicas without
   their communication), and two workers of MultiWorkerMirroredStrategy on
   127.0.0.1 (gRPC collectives). The summary gives the 2-replica/1-replica
   ratio of the best settings (per core: all use all cores) and of the two
   references.
3. `interleaved`: 1 and 2 replicas (with and without synchronised BN, two
   thread settings), each in a `bench_step.py` process of its own, one step
   of each in turn (`interleaved_replicas`): the 2-replica/1-replica ratio
   of every round, under the same load.

    python benchmarks/bench_scaling.py --part support
    python benchmarks/bench_scaling.py --part replicas --config cifar_small
    python benchmarks/bench_scaling.py --part interleaved --config rn50_tiny
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
from paws_tf import dist  # noqa: E402
from paws_tf import losses  # noqa: E402

# (support images M, classes C): CIFAR-10's 10 x 64, then ImageNet-like
# 7 images per class up to the paper's 960 x 7 = 6720.
SUPPORT_SIZES = ((640, 10), (1344, 192), (2688, 384), (4032, 576),
                 (6720, 960))
# (replicas, sync_bn, intra_op, inter_op, environment) runs of the replica
# part; 0 is TensorFlow's default thread count (the number of cores). One
# replica with fused BN is what the trainer runs; with sync BN it separates
# the cost of synchronised batch norm from that of replication. With
# MALLOC_ARENA_MAX=1 every thread allocates from glibc's main heap, which
# keeps freed memory, instead of per-thread heaps, which return it: oneDNN's
# reorder buffers (malloc'd, not from TensorFlow's allocator) then stop
# faulting their pages in again at every op when two replicas' ops run on
# two threads (BUILD.md, Scaling).
_ONE_ARENA = {'MALLOC_ARENA_MAX': '1'}
REPLICA_RUNS = ((1, 'off', 0, 0, {}), (1, 'off', 0, 0, _ONE_ARENA),
                (1, 'on', 0, 0, {}), (2, 'on', 0, 0, {}),
                (2, 'on', 0, 1, {}), (2, 'on', 1, 2, {}),
                (2, 'on', 0, 0, _ONE_ARENA))
# (name, bench_step.py arguments) of the interleaved part, each run in its
# own process, the first the baseline: one replica as the trainer runs it
# (fused BN, TensorFlow's default threads); two as the trainer runs them
# (synchronised BN), with the default threads and with each replica's ops on
# one thread of their own (one intra-op thread, two inter-op threads); and
# two without synchronised BN (its cost).
_THREAD_PER_REPLICA = ['--intra_op_threads', '1', '--inter_op_threads', '2']
INTERLEAVED_RUNS = (
    ('1_replica', ['--replicas', '1']),
    ('2_replicas', ['--replicas', '2']),
    ('2_replicas_thread_each', ['--replicas', '2', *_THREAD_PER_REPLICA]),
    ('2_replicas_thread_each_no_sync_bn',
     ['--replicas', '2', '--sync_bn', 'off', *_THREAD_PER_REPLICA]))


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
        # Each replica samples C / R classes of n images (ImageNet's layout).
        labels = losses.support_labels(
            classes // replicas, support // classes, num_replicas=replicas,
            unique_classes_per_replica=True, smoothing=0.1)  # [M, C]

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
                terms = losses.paws_terms(
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


def replica_scaling(args):
    """Full train step on 1 and 2 replicas, via bench_step.py."""
    steps = ['--config', args.config, '--steps', str(args.steps),
             '--warmup', str(args.warmup)]
    results = []
    for replicas, sync_bn, intra, inter, env in REPLICA_RUNS:
        [result] = bench_step.run_in_subprocesses([(steps + [
            '--replicas', str(replicas), '--sync_bn', sync_bn,
            '--intra_op_threads', str(intra),
            '--inter_op_threads', str(inter)], env)])
        result['benchmark'] = 'replica_scaling'
        result['images_per_s_per_core'] = round(
            result['images_per_s'] / os.cpu_count(), 1)
        print(json.dumps(result), flush=True)
        results.append(result)
    baseline = max((r for r in results if r['replicas'] == 1
                    and not r['sync_bn']), key=lambda r: r['images_per_s'])
    best = max((r for r in results if r['replicas'] == 2),
               key=lambda r: r['images_per_s'])
    one_thread = steps + ['--intra_op_threads', '1', '--inter_op_threads', '1']
    halves = bench_step.run_in_subprocesses(
        [(one_thread + ['--per_replica_of', '2'], {})] * 2)
    workers = bench_step.run_in_subprocesses(
        [(one_thread, {'TF_CONFIG': tf_config})
         for tf_config in dist.loopback_tf_configs(2)])
    references = {'independent_halves': {
        'images_per_s': round(sum(r['images_per_s'] for r in halves), 1),
        'processes_images_per_s': [r['images_per_s'] for r in halves]},
        'two_workers': {  # Every worker reports the same global step.
            'images_per_s': workers[0]['images_per_s'],
            'step_s': workers[0]['step_s'],
            'sync_bn': workers[0]['sync_bn']}}
    print(json.dumps({'benchmark': 'replica_scaling_references',
                      'config': args.config, **references, **_context()}),
          flush=True)
    print(json.dumps({
        'benchmark': 'replica_scaling_summary', 'config': args.config,
        'best_1_replica_images_per_s': baseline['images_per_s'],
        'best_1_replica_threads': [baseline['intra_op_threads'],
                                   baseline['inter_op_threads']],
        'best_1_replica_env': baseline['env'],
        'best_2_replicas_images_per_s': best['images_per_s'],
        'best_2_replicas_threads': [best['intra_op_threads'],
                                    best['inter_op_threads']],
        'best_2_replicas_env': best['env'],
        'ratio_2_over_1': round(best['images_per_s'] /
                                baseline['images_per_s'], 3),
        **{f'ratio_{name}_over_1': round(
            reference['images_per_s'] / baseline['images_per_s'], 3)
           for name, reference in references.items()},
        **_context()}), flush=True)


def interleaved_replicas(args):
    """1 and 2 replicas stepped in turn, each in a process of its own.

    On a shared machine the speed of separate runs drifts by more than the
    difference between them; steps taken in turn see the same load. Every
    run of `INTERLEAVED_RUNS` is a `bench_step.py` process with its own
    devices and threads, warmed up at once; then each round runs one step of
    every run (the order rotating from round to round), the others waiting
    without taking CPU time, and gives a 2-replica/1-replica ratio of its
    own; the summary is their median. The malloc environment is this
    process's, the same for all.
    """
    common = ['--config', args.config, '--warmup', str(args.warmup)]
    servers = {name: bench_step.StepServer(common + arguments)
               for name, arguments in INTERLEAVED_RUNS}
    try:
        warmup = {name: server.ready() for name, server in servers.items()}
        names = list(servers)
        steps = {name: [] for name in names}
        for round_ in range(args.steps):
            for name in names[round_ % len(names):] + names[:round_ % len(
                    names)]:
                steps[name].append(servers[name].step())
    finally:
        for server in servers.values():
            server.close()
    views = bench_step.views_per_step(bench_step.CONFIGS[args.config])
    runs = {}
    for name, arguments in INTERLEAVED_RUNS:
        seconds = [s['seconds'] for s in steps[name]]
        runs[name] = {
            'arguments': arguments,
            'images_per_s': round(views / statistics.median(seconds), 1),
            'step_s': [round(t, 3) for t in seconds],
            'cpu_s_per_step': round(statistics.median(
                s['cpu'] for s in steps[name]), 3),
            'page_faults_per_step': round(statistics.median(
                s['faults'] for s in steps[name])),
            'warmup_step_s': warmup[name]}
    base = runs[names[0]]['step_s']
    ratios = {f'ratio_{name}_over_1': [
        round(b / t, 3) for b, t in zip(base, runs[name]['step_s'])]
        for name in names[1:]}
    print(json.dumps({
        'benchmark': 'replica_scaling_interleaved', 'config': args.config,
        'rounds': args.steps, 'runs': runs, 'ratios_per_round': ratios,
        **{f'{key}_median': round(statistics.median(values), 3)
           for key, values in ratios.items()},
        **_context()}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--part', choices=('support', 'replicas',
                                           'interleaved', 'all'),
                        default='all')
    parser.add_argument('--config', default='cifar_small',
                        help='bench_step.py config of the replica parts')
    parser.add_argument('--anchors', type=int, default=512,
                        help='anchor views (2 + m) B over all replicas')
    parser.add_argument('--multicrop', type=int, default=6)
    parser.add_argument('--dim', type=int, default=2048)
    parser.add_argument('--steps', type=int, default=5,
                        help='timed steps per run (interleaved: rounds)')
    parser.add_argument('--warmup', type=int, default=2)
    args = parser.parse_args()
    parts = (('support', 'replicas', 'interleaved') if args.part == 'all'
             else (args.part,))
    if 'support' in parts:
        cpu = tf.config.list_physical_devices('CPU')[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        for strategy in (tf.distribute.get_strategy(),
                         dist.make_strategy('mirrored', ['CPU:0', 'CPU:1'])):
            support_scaling(args, strategy)
    if 'replicas' in parts:
        replica_scaling(args)
    if 'interleaved' in parts:
        interleaved_replicas(args)


if __name__ == '__main__':
    main()
