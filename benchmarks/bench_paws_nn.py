"""Throughput and memory of PAWS-NN classification (not a test).

Random float32 embeddings stand in for an embedded support set and queries
(ImageNet 10%: 128k supports of D = 2048, 1000 classes). Prints one JSON
object: queries per second and CPU seconds (all threads) of
`evaluate.classify`, the resident memory before classifying (embeddings and
labels in memory) and its peak while classifying (Linux only), the CPU count
and the load average. Run one setting per process, since the peak is per
process.

    python benchmarks/bench_paws_nn.py --supports 128000 --queries 10000
"""

import argparse
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import paws_tf  # noqa: E402,F401  (selects tf_keras before TF is used)
import tensorflow as tf  # noqa: E402

from benchmarks import memory  # noqa: E402
from paws_tf.evaluation import evaluate  # noqa: E402


def _status_gib(field):
    return memory.status_kib(field) / 2**20


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--supports', type=int, default=128_000)
    parser.add_argument('--queries', type=int, default=10_000)
    parser.add_argument('--dim', type=int, default=2048)
    parser.add_argument('--classes', type=int, default=1000)
    parser.add_argument('--query_chunk', type=int,
                        default=evaluate.DEFAULT_QUERY_CHUNK)
    parser.add_argument('--support_dtype', default='float32',
                        help='storage dtype of the supports (snn computes '
                             'in float32 whatever it is given)')
    args = parser.parse_args()
    supports = tf.cast(tf.random.stateless_normal(
        [args.supports, args.dim], seed=[0, 1]), args.support_dtype)
    labels = tf.random.stateless_uniform(
        [args.supports], seed=[0, 2], maxval=args.classes, dtype=tf.int32)
    queries = tf.random.stateless_normal([args.queries, args.dim],
                                         seed=[0, 3])
    # One query first: excludes one-off start-up from the timing.
    evaluate.classify(queries[:1], supports, labels,
                      num_classes=args.classes)
    before = _status_gib('VmRSS')
    memory.reset_peak_rss()
    start, cpu_start = time.perf_counter(), time.process_time()
    evaluate.classify(queries, supports, labels, num_classes=args.classes,
                      query_chunk=args.query_chunk)
    seconds = time.perf_counter() - start
    print(json.dumps(dict(
        vars(args), seconds=round(seconds, 2),
        cpu_seconds=round(time.process_time() - cpu_start, 2),
        queries_per_second=round(args.queries / seconds, 1),
        rss_gib_before=round(before, 2),
        peak_rss_gib=round(_status_gib('VmHWM'), 2),
        devices=[d.name for d in tf.config.list_logical_devices()],
        cpus=os.cpu_count(),
        load_avg=[round(v, 2) for v in os.getloadavg()])))


if __name__ == '__main__':
    main()
