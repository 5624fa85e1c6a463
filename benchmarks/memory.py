"""Process memory figures of the benchmarks (Linux /proc)."""


def status_kib(field):
    """A memory field of /proc/self/status (e.g. VmRSS, VmHWM), in KiB."""
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak_rss():
    """Restarts the peak resident memory (VmHWM) from the current RSS
    (Linux >= 4.0)."""
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')
