"""Top TensorFlow ops of a profiler trace (`bench_step.py --profile_dir`).

Reads the `*.xplane.pb` that `tf.profiler.experimental.stop()` writes and
sums the wall time of every executed op (events named `name:OpType` on the
executor threads) by op type and by the layer that issued it. Ops running at
the same time on different inter-op threads are both counted, so the shares
are of summed op time, not of the step.

    python benchmarks/profile_summary.py /tmp/prof [--top 25]
"""

import argparse
import collections
import glob
import json
import os
import re

from tensorflow.tsl.profiler.protobuf import xplane_pb2

# Executor threads of the host plane; tf.data and Eigen worker threads hold
# no op events of their own.
_OP_THREADS = ('tf_Compute', 'tf_inter_op', 'tf_XLA')


def _trace_file(path):
    if os.path.isfile(path):
        return path
    found = sorted(glob.glob(os.path.join(path, '**', '*.xplane.pb'),
                             recursive=True))
    if not found:
        raise SystemExit(f'no *.xplane.pb under {path!r}')
    return found[-1]


def _phase(name):
    if name.startswith('gradient_tape/'):
        return 'backward'
    if re.match(r'(LARS|SGD|LossScale)', name) or '/LARS/' in name:
        return 'optimizer'
    return 'forward+loss'


def summarise(path, top):
    space = xplane_pb2.XSpace()
    with open(_trace_file(path), 'rb') as f:
        space.ParseFromString(f.read())
    by_type, by_layer, by_phase = (collections.Counter() for _ in range(3))
    count = collections.Counter()
    for plane in space.planes:
        for line in plane.lines:
            if not line.name.startswith(_OP_THREADS):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ':' not in name or '::' in name:
                    continue  # Executor bookkeeping, not an op.
                op_name, op_type = name.rsplit(':', 1)
                seconds = event.duration_ps / 1e12
                by_type[op_type] += seconds
                count[op_type] += 1
                layer = op_name.replace('gradient_tape/', '').split('/')
                by_layer['/'.join(layer[:2])] += seconds
                by_phase[_phase(op_name)] += seconds
    total = sum(by_type.values())

    def rows(counter, with_count=False):
        return [dict(name=k, seconds=round(v, 3),
                     share=round(v / total, 3),
                     **({'count': count[k]} if with_count else {}))
                for k, v in counter.most_common(top)]

    return {'trace': _trace_file(path), 'op_seconds_total': round(total, 3),
            'by_phase': rows(by_phase), 'top_op_types': rows(by_type, True),
            'top_layers': rows(by_layer)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('path', help='profile dir or .xplane.pb file')
    parser.add_argument('--top', type=int, default=25)
    args = parser.parse_args()
    print(json.dumps(summarise(args.path, args.top), indent=1))


if __name__ == '__main__':
    main()
