"""Time of the full PAWS train step on synthetic data (not a test).

Times `PAWSModel.train_step` as `fit` runs it: `model.make_train_function()`
(so `compile(jit_compile=...)` and the distribution strategy apply) fed from
an iterator over one constant synthetic batch, which tf.data repeats without
copying, so the figure is the step itself and not the input pipeline
(`bench_input.py` measures that). Every step is synchronised by fetching its
logs. Prints one JSON object:

    python benchmarks/bench_step.py --config cifar_small
    python benchmarks/bench_step.py --config rn50_tiny --xla
    python benchmarks/bench_step.py --config vit_small
    python benchmarks/bench_step.py --config cifar_small --replicas 2
    python benchmarks/bench_step.py --config cifar_small --deterministic_ops
    # RoPAWS's step against PAWS's, timed in alternation:
    python benchmarks/bench_step.py --config cifar_paper --objective both
    # Several workers: run it in every worker's process with TF_CONFIG set,
    # or under Slurm's srun (MultiWorkerMirroredStrategy over the workers'
    # GPUs, or their CPUs).
    # GPU: python benchmarks/bench_step.py --config rn50_tiny --xla \
    #          --precision bf16   (or fp16: loss scaling is added)

`images_per_s` counts every view forwarded: the support views plus 2 + m
views per unlabeled image, over all replicas.
"""

import argparse
import json
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import paws_tf  # noqa: E402,F401  (selects tf_keras before TF is used)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from benchmarks import memory  # noqa: E402
from paws_tf import adamw  # noqa: E402
from paws_tf import cluster  # noqa: E402
from paws_tf import determinism  # noqa: E402
from paws_tf import lars  # noqa: E402
from paws_tf import model as model_lib  # noqa: E402
from paws_tf.nets import backbones  # noqa: E402
from paws_tf.nets import heads  # noqa: E402

# Global sizes: B unlabeled images, m local views, K classes x n images x V
# support views (per replica; with R replicas every replica gets B / R
# images and the same K classes with n / R images each).
CONFIGS = {
    'cifar_small': dict(
        backbone=dict(name='wide_resnet', depth=28, width=2),
        projection=dict(hidden_dim=128, output_dim=128), prediction=None,
        batch=64, global_size=32, local_size=18, multicrop=6,
        classes=10, images_per_class=6, support_views=2),
    'cifar_paper': dict(
        backbone=dict(name='wide_resnet', depth=28, width=2),
        projection=dict(hidden_dim=128, output_dim=128), prediction=None,
        batch=256, global_size=32, local_size=18, multicrop=6,
        classes=10, images_per_class=64, support_views=2),
    'rn50_tiny': dict(
        backbone=dict(name='resnet50'),
        projection=dict(hidden_dim=2048, output_dim=2048),
        prediction=dict(hidden_dim=512, output_dim=2048),
        batch=8, global_size=96, local_size=48, multicrop=6,
        classes=16, images_per_class=2, support_views=1),
    # imagenet_vits16_10pct.gin's network, heads and optimizer (ViT-S/16
    # built for 224 px, GELU heads of 256, AdamW) at rn50_tiny's sizes: its
    # 96- and 48-px views get the position embeddings resampled.
    'vit_small': dict(
        backbone=dict(name='vit_small', patch_size=16, image_size=224),
        projection=dict(hidden_dim=256, output_dim=256, activation='gelu'),
        prediction=dict(hidden_dim=256, output_dim=256, activation='gelu'),
        optimizer='adamw',
        batch=8, global_size=96, local_size=48, multicrop=6,
        classes=16, images_per_class=2, support_views=1),
    # A slice of one GPU's step of the ImageNet configs (per GPU: 64 x (2 x
    # 224 + 6 x 96 px) and 15 x 7 supports of 224 px, 15.2M pixels): 4 x
    # (2 x 224 + 6 x 96) and 4 x 2 supports, 1.02M pixels, 1/14.9 of it.
    'rn50_imagenet_slice': dict(
        backbone=dict(name='resnet50'),
        projection=dict(hidden_dim=2048, output_dim=2048),
        prediction=dict(hidden_dim=512, output_dim=2048),
        batch=4, global_size=224, local_size=96, multicrop=6,
        classes=4, images_per_class=2, support_views=1),
}
# Environment variables that change CPU performance, echoed in the output.
ENV_KNOBS = ('TF_ENABLE_ONEDNN_OPTS', 'TF_CPU_ALLOCATOR_USE_BFC',
             'OMP_NUM_THREADS', 'MALLOC_ARENA_MAX', 'LD_PRELOAD',
             'TF_XLA_FLAGS')


def env_knobs():
    """The variables of `ENV_KNOBS` set in this process's environment."""
    return {k: os.environ[k] for k in ENV_KNOBS if k in os.environ}


POLICIES = {'fp32': 'float32', 'bf16': 'mixed_bfloat16',
            'fp16': 'mixed_float16'}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--config', required=True, choices=sorted(CONFIGS))
    parser.add_argument('--steps', type=int, default=5,
                        help='timed steps (the median is reported)')
    parser.add_argument('--warmup', type=int, default=2,
                        help='untimed steps first (tracing, XLA compile)')
    parser.add_argument('--xla', action='store_true',
                        help='model.compile(jit_compile=True)')
    parser.add_argument('--precision', default='fp32', choices=POLICIES)
    parser.add_argument('--replicas', type=int, default=1, choices=(1, 2),
                        help='replicas in this process, outside a cluster')
    parser.add_argument('--sync_bn', choices=('auto', 'on', 'off'),
                        default='auto',
                        help='synchronised (unfused) BN; auto: on iff '
                             'replicas > 1, as the trainer does')
    parser.add_argument('--recompute_bn_relu', choices=('on', 'off'),
                        default='on',
                        help='build_backbone.recompute_bn_relu (default '
                             'on, as the CPU configs: less memory, ~5%% more '
                             'CPU time; build_backbone defaults to off)')
    parser.add_argument('--sync_bn_impl', choices=('custom', 'keras'),
                        default='custom',
                        help="build_model.sync_bn_impl, for the backbone "
                             "and heads: paws_tf's GlobalBatchNormalization "
                             "(default, as the CPU configs) or tf_keras' "
                             "synchronized=True layer (build_model's "
                             "default)")
    parser.add_argument('--deterministic_ops', action='store_true',
                        help='determinism.enable(), as '
                             'train.deterministic_ops = True')
    parser.add_argument('--intra_op_threads', type=int, default=0,
                        help='0: TensorFlow default (all cores)')
    parser.add_argument('--inter_op_threads', type=int, default=0)
    parser.add_argument('--objective', default='paws',
                        choices=model_lib.OBJECTIVES + ('both',),
                        help="PAWSModel.objective; 'both' times PAWS and "
                             'RoPAWS steps in alternation (prints only '
                             'their times)')
    parser.add_argument('--profile_dir', default='',
                        help='write a TF profiler trace of 2 timed steps')
    args = parser.parse_args()
    # As the trainer's `--strategy=auto`: TF_CONFIG or Slurm.
    args.cluster = cluster.cluster_in_environment()
    if args.replicas > 1 and args.cluster:
        parser.error('in a cluster (TF_CONFIG or Slurm) the replicas are the '
                     'cluster\'s (every GPU of every worker, or one per CPU '
                     'worker): drop --replicas, or run outside the cluster '
                     'for one process')
    return args


def configure_devices(args):
    """Thread pools, logical CPUs and the strategy; runs before TF starts.

    One replica runs under TF's default strategy, as `cluster.make_strategy`
    gives the trainer; two run under MirroredStrategy on two GPUs, or on two
    logical devices that split the CPU. Where TF_CONFIG or Slurm describes
    a cluster, this process is one worker of its
    MultiWorkerMirroredStrategy, as in training.
    """
    if args.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(
            args.intra_op_threads)
    if args.inter_op_threads:
        tf.config.threading.set_inter_op_parallelism_threads(
            args.inter_op_threads)
    if args.cluster:
        return cluster.make_strategy('multi_worker')
    if args.replicas == 1:
        return tf.distribute.get_strategy()
    if tf.config.list_physical_devices('GPU'):
        return cluster.make_strategy(
            'mirrored', [f'GPU:{i}' for i in range(args.replicas)])
    cpu = tf.config.list_physical_devices('CPU')[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)
    return cluster.make_strategy(
        'mirrored', [f'CPU:{i}' for i in range(args.replicas)])


def build(config, sync_bn, switches, objective='paws'):
    """The PAWS model of a config; `switches`: `build_backbone`'s
    implementation arguments, whose `sync_bn_impl` the heads take too (as
    `model.build_model` passes it)."""
    backbone = backbones.build_backbone(sync_bn=sync_bn, **switches,
                                        **config['backbone'])
    norms = dict(sync_bn=sync_bn, sync_bn_impl=switches['sync_bn_impl'])
    projection = heads.ProjectionHead(**norms, **config['projection'])
    prediction = (heads.PredictionHead(**norms, **config['prediction'])
                  if config['prediction'] else None)
    return model_lib.PAWSModel(backbone, projection, prediction,
                               objective=objective)


def synthetic_batch(config, replicas, rng):
    """One replica's batch of normalised-looking random views; every
    replica samples the same classes, each its share of their images."""
    batch = config['batch'] // replicas
    classes, views_per_image = config['classes'], config['support_views']
    images = config['images_per_class'] // replicas
    rows = classes * images  # Per view.

    def views(count, size):
        return rng.normal(size=(count, size, size, 3)).astype(np.float32)

    data = {'global_views': views(2 * batch, config['global_size']),
            'local_views': views(config['multicrop'] * batch,
                                 config['local_size']),
            'support_views': views(views_per_image * rows,
                                   config['global_size']),
            'support_one_hot': np.eye(classes, dtype=np.float32)[np.tile(
                np.repeat(np.arange(classes), images), views_per_image)],
            'support_view_index': np.repeat(
                np.arange(views_per_image, dtype=np.int32), rows)}
    if not config['multicrop']:
        del data['local_views']  # As the pipeline: no local views.
    return data


def run_in_subprocess(arguments):
    """Runs this benchmark with command-line `arguments` in a fresh process
    (its own device and thread set-up); returns its JSON result."""
    proc = subprocess.run([sys.executable, __file__, *arguments],
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(
            f'bench_step.py {" ".join(arguments)} exited with '
            f'{proc.returncode}:\n{proc.stderr[-3000:]}')
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _status_mib(field):
    return round(memory.status_kib(field) / 1024)


def _tensor_peak_mib():
    """Peak bytes in use of TensorFlow's tensor allocator on the first device
    over the whole run, in MiB: the tensors alone, without the libraries,
    heap and free chunks that RSS also counts. On a CPU that allocator is
    oneDNN's BFC allocator; None when it keeps no statistics (oneDNN off)."""
    device = 'GPU:0' if tf.config.list_physical_devices('GPU') else 'CPU:0'
    try:
        info = tf.config.experimental.get_memory_info(device)
    except ValueError:
        return None
    return round(info['peak'] / 2**20)


def _median(usages, key, digits):
    return round(statistics.median(u[key] for u in usages), digits)


def views_per_step(config):
    return (config['batch'] * (2 + config['multicrop']) +
            config['support_views'] * config['classes'] *
            config['images_per_class'])


def make_step(config, strategy, sync_bn, switches, xla, objective='paws'):
    """The train step of `config` under `strategy`, as a function that runs
    one step and returns (seconds, {'cpu', 'sys', 'faults'} of the process
    in that time, loss)."""
    replicas = strategy.num_replicas_in_sync
    rng = np.random.default_rng(0)
    batches = [synthetic_batch(config, replicas, rng)
               for _ in range(replicas)]
    with strategy.scope():
        model = build(config, sync_bn, switches, objective)
        # The config's optimizer as in training (LARS unless told); the
        # learning rate only keeps the synthetic run finite.
        # mixed_float16 makes compile add loss scaling.
        optimizer = (adamw.AdamW(learning_rate=1e-3)
                     if config.get('optimizer') == 'adamw'
                     else lars.LARS(learning_rate=0.1))
        model.compile(optimizer=optimizer, jit_compile=xla)
    dataset = strategy.distribute_datasets_from_function(
        lambda ctx: tf.data.Dataset.from_tensors(
            batches[ctx.input_pipeline_id]).repeat())
    iterator = iter(dataset)
    train_function = model.make_train_function()

    def step():
        start, usage = time.perf_counter(), resource.getrusage(
            resource.RUSAGE_SELF)
        logs = train_function(iterator)
        loss = float(logs['loss'])  # Waits for the step to finish.
        seconds = time.perf_counter() - start
        end = resource.getrusage(resource.RUSAGE_SELF)
        return (seconds, {
            'cpu': end.ru_utime + end.ru_stime - usage.ru_utime -
            usage.ru_stime,
            'sys': end.ru_stime - usage.ru_stime,
            'faults': end.ru_minflt - usage.ru_minflt}, loss)

    return step


def alternate(args, config, strategy, sync_bn, switches):
    """PAWS's and RoPAWS's steps of one config, timed in alternation, so
    that the load of a shared machine weighs on both alike."""
    steps = {name: make_step(config, strategy, sync_bn, switches, args.xla,
                             name) for name in model_lib.OBJECTIVES}
    for _ in range(args.warmup):
        for step in steps.values():
            step()
    times = {name: [] for name in steps}
    cpu = {name: [] for name in steps}
    for _ in range(args.steps):
        for name, step in steps.items():
            seconds, usage, _ = step()
            times[name].append(seconds)
            cpu[name].append(usage['cpu'])
    medians = {name: statistics.median(t) for name, t in times.items()}
    cpu = {name: statistics.median(t) for name, t in cpu.items()}
    print(json.dumps({
        'benchmark': 'step_objectives', 'config': args.config,
        'step_s': {name: round(v, 3) for name, v in medians.items()},
        'ratio': round(medians['ropaws'] / medians['paws'], 3),
        # Process CPU time per step: less sensitive to other processes.
        'cpu_s_per_step': {name: round(v, 3) for name, v in cpu.items()},
        'cpu_ratio': round(cpu['ropaws'] / cpu['paws'], 3),
        'steps': args.steps, 'replicas': strategy.num_replicas_in_sync,
        'precision': args.precision, 'env': env_knobs(),
        'cpus': os.cpu_count(),
        'load_avg': [round(v, 2) for v in os.getloadavg()],
    }), flush=True)


def main():
    args = parse_args()
    strategy = configure_devices(args)
    replicas = strategy.num_replicas_in_sync
    config = CONFIGS[args.config]
    sync_bn = {'auto': replicas > 1, 'on': True, 'off': False}[args.sync_bn]
    switches = dict(recompute_bn_relu=args.recompute_bn_relu == 'on',
                    sync_bn_impl=args.sync_bn_impl)
    tf_keras.mixed_precision.set_global_policy(POLICIES[args.precision])
    if args.deterministic_ops:
        determinism.enable()
    if args.objective == 'both':
        alternate(args, config, strategy, sync_bn, switches)
        return
    step = make_step(config, strategy, sync_bn, switches, args.xla,
                     args.objective)
    rss_built_mib = _status_mib('VmRSS')

    first_step_s = [step()[0] for _ in range(args.warmup)]
    # Tracing and graph rewrites of the first step have their own peak.
    # Resetting the peak resets ru_maxrss too, so keep this one first.
    peak_warmup_mib = _status_mib('VmHWM')
    memory.reset_peak_rss()
    times, usages, losses = [], [], []
    for _ in range(args.steps):
        seconds, usage, loss = step()
        times.append(seconds)
        usages.append(usage)
        losses.append(loss)
    if args.profile_dir:
        tf.profiler.experimental.start(args.profile_dir)
        for _ in range(2):
            step()
        tf.profiler.experimental.stop()
    peak_timed_mib = _status_mib('VmHWM')
    median = statistics.median(times)
    views = views_per_step(config)
    print(json.dumps({
        'benchmark': 'step', 'config': args.config,
        'images_per_s': round(views / median, 1),
        'step_s': {'median': round(median, 3), 'min': round(min(times), 3),
                   'max': round(max(times), 3)},
        # Process CPU time (all threads) per step: less sensitive than wall
        # time to other processes on a shared machine. Of it, the kernel's
        # share, mostly the minor page faults (first touches of memory the
        # allocators took from the system since the last step).
        'cpu_s_per_step': _median(usages, 'cpu', 3),
        'sys_s_per_step': _median(usages, 'sys', 3),
        'page_faults_per_step': round(
            statistics.median(u['faults'] for u in usages)),
        'warmup_step_s': [round(t, 2) for t in first_step_s],
        'views_per_step': views, 'steps': args.steps,
        'loss_first_last': [round(losses[0], 4), round(losses[-1], 4)],
        'peak_rss_mib': max(peak_warmup_mib, peak_timed_mib),
        'peak_rss_timed_steps_mib': peak_timed_mib,
        'tensor_peak_mib': _tensor_peak_mib(),
        'rss_before_first_step_mib': rss_built_mib,
        'xla': args.xla, 'precision': args.precision,
        'objective': args.objective,
        'optimizer': config.get('optimizer', 'lars'),
        'deterministic_ops': args.deterministic_ops,
        'replicas': replicas, 'strategy': type(strategy).__name__,
        'sync_bn': sync_bn,
        **switches,
        'intra_op_threads': tf.config.threading
        .get_intra_op_parallelism_threads(),
        'inter_op_threads': tf.config.threading
        .get_inter_op_parallelism_threads(),
        'env': env_knobs(),
        'device': 'GPU' if tf.config.list_physical_devices('GPU') else 'CPU',
        'tf': tf.__version__, 'python': platform.python_version(),
        'cpus': os.cpu_count(),
        'load_avg': [round(v, 2) for v in os.getloadavg()],
        'config_sizes': {k: v for k, v in config.items()
                         if k in ('batch', 'classes', 'images_per_class',
                                  'support_views', 'multicrop')},
    }), flush=True)


if __name__ == '__main__':
    main()
