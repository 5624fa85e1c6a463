"""Runs run.py with the checkpoint writes into one directory failing, as a
full disk, a lost permission or a read-only filesystem makes them fail.

    python failing_saves.py SUBDIR N ERRNO_NAME [run.py flags...]

The fault is injected where TensorFlow writes a checkpoint's tensors (the
SaveV2 op, which every checkpoint and backup save runs): the first N writes
under `--model_dir/SUBDIR` succeed; from then on each write leaves a
truncated data shard in the checkpoint's temporary directory, as a write
cut short does, and raises the error TensorFlow raises for ERRNO_NAME
(ENOSPC: ResourceExhaustedError; EACCES, EROFS: PermissionDeniedError).
"""

import contextlib
import errno
import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import tensorflow as tf  # noqa: E402
from tensorflow.python.ops import io_ops  # noqa: E402

from paws_tf import cli  # noqa: E402

_ERRORS = {errno.ENOSPC: tf.errors.ResourceExhaustedError,
           errno.EACCES: tf.errors.PermissionDeniedError,
           errno.EROFS: tf.errors.PermissionDeniedError}


@contextlib.contextmanager
def inject(directory, succeed, code):
    """Makes SaveV2 writes under `directory` fail after `succeed` of them,
    until the context exits."""
    save_v2 = io_ops.save_v2
    writes = [0]

    def failing_save_v2(prefix, *args, **kwargs):
        path = prefix.numpy().decode() if hasattr(prefix, 'numpy') else prefix
        if not path.startswith(directory + os.sep):
            return save_v2(prefix, *args, **kwargs)
        writes[0] += 1
        if writes[0] <= succeed:
            return save_v2(prefix, *args, **kwargs)
        result = save_v2(prefix, *args, **kwargs)
        del result  # Written, then cut short as the fault would.
        shard = f'{path}.data-00000-of-00001'
        os.truncate(shard, os.path.getsize(shard) // 2)
        print(f'failing_saves: write {writes[0]} into {directory} fails '
              f'({errno.errorcode[code]})', flush=True)
        raise _ERRORS[code](None, None, f'{shard}; {os.strerror(code)}')

    io_ops.save_v2 = failing_save_v2
    try:
        yield
    finally:
        io_ops.save_v2 = save_v2


def main():
    subdir, succeed, name = sys.argv[1:4]
    argv = [str(REPO / 'run.py')] + sys.argv[4:]
    model_dir = next(arg.split('=', 1)[1] for arg in argv
                     if arg.startswith('--model_dir='))
    with inject(os.path.join(os.path.abspath(model_dir), subdir),
                int(succeed), getattr(errno, name)):
        cli.run(argv)


if __name__ == '__main__':
    main()
