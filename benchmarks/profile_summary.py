"""Top TensorFlow ops of a profiler trace (`bench_step.py --profile_dir`).

Reads the `*.xplane.pb` that `tf.profiler.experimental.stop()` writes and
sums the wall time of every executed op (events named `name:OpType` on the
executor threads) by op type and by the layer that issued it. Ops running at
the same time on different inter-op threads are both counted, so the shares
are of summed op time, not of the step.

    python benchmarks/profile_summary.py /tmp/prof [--top 25]

With `--memory` it replays the trace's allocator events instead (the BFC
allocators, `mklcpu` under oneDNN, record each allocation and free with its
op, shape and the bytes in use) and prints the tensors live at the peak of
bytes in use, by phase and by op. Tensors allocated before the trace started
(the weights, the optimizer's slots) count in the peak but are not listed.

    python benchmarks/profile_summary.py /tmp/prof --memory
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


def _read_space(trace):
    space = xplane_pb2.XSpace()
    with open(trace, 'rb') as f:
        space.ParseFromString(f.read())
    return space


def summarise(path, top):
    trace = _trace_file(path)
    space = _read_space(trace)
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

    return {'trace': trace, 'op_seconds_total': round(total, 3),
            'by_phase': rows(by_phase), 'top_op_types': rows(by_type, True),
            'top_layers': rows(by_layer)}


def _allocator_events(space):
    """(time ps, is_allocation, stats) of every allocator event, in order."""
    events = []
    for plane in space.planes:
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if name not in ('MemoryAllocation', 'MemoryDeallocation'):
                    continue
                stats = {}
                for stat in event.stats:
                    key = plane.stat_metadata[stat.metadata_id].name
                    stats[key] = (
                        plane.stat_metadata[stat.ref_value].name
                        if stat.ref_value else stat.str_value
                        or stat.int64_value or stat.uint64_value)
                events.append((line.timestamp_ns * 1000 + event.offset_ps,
                               name == 'MemoryAllocation', stats))
    return sorted(events, key=lambda e: e[0])


def memory_at_peak(path, top):
    """The tensors live when the allocator's bytes in use peaked."""
    trace = _trace_file(path)
    events = _allocator_events(_read_space(trace))
    if not events:
        raise SystemExit('no allocator events in the trace (is the tensor '
                         'allocator a BFC one? TF_ENABLE_ONEDNN_OPTS=1 or '
                         'TF_CPU_ALLOCATOR_USE_BFC=true)')
    in_use = [int(stats['bytes_allocated']) for _, _, stats in events]
    peak_index = max(range(len(events)), key=in_use.__getitem__)  # First.
    live = {}
    for _, is_allocation, stats in events[:peak_index + 1]:
        if is_allocation:
            live[stats['addr']] = stats
        else:
            live.pop(stats['addr'], None)
    peak = in_use[peak_index]
    by_phase, by_op, shapes = collections.Counter(), collections.Counter(), {}
    for stats in live.values():
        op = str(stats.get('tf_op') or '?')
        size = int(stats['allocation_bytes'])
        by_phase[_phase(op)] += size
        by_op[op] += size
        shapes[op] = stats.get('shape', '')
    mib = 2 ** 20
    return {
        'trace': trace,
        'allocators': sorted({str(e[2].get('allocator_name'))
                              for e in events}),
        'peak_in_use_mib': round(peak / mib, 1),
        'listed_at_peak_mib': round(sum(by_op.values()) / mib, 1),
        'by_phase_mib': {k: round(v / mib, 1)
                         for k, v in by_phase.most_common()},
        'top_ops': [dict(op=k, mib=round(v / mib, 1), shape=shapes[k])
                    for k, v in by_op.most_common(top)]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('path', help='profile dir or .xplane.pb file')
    parser.add_argument('--top', type=int, default=25)
    parser.add_argument('--memory', action='store_true',
                        help='tensors live at the peak instead of op time')
    args = parser.parse_args()
    report = memory_at_peak if args.memory else summarise
    print(json.dumps(report(args.path, args.top), indent=1))


if __name__ == '__main__':
    main()
