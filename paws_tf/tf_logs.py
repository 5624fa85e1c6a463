"""TensorFlow's start-up logs, kept off the program's terminal.

Loading TensorFlow writes its C++ start-up notes (oneDNN, the CUDA driver
stub, the CPU features) twice: `tf.profiler` loads
`_pywrap_profiler_plugin.so`, which carries its own copy of TensorFlow's
logging and runs the same start-up code as `libtensorflow_framework`. absl's
C++ logging writes them before it is initialised, which no log level filters
(abseil/abseil-cpp#1957), and the first look at the devices logs "failed
call to cuInit" on a machine without a GPU. So the program points file
descriptor 2 elsewhere while TensorFlow loads and lists its devices, and
sets TF_CPP_MIN_LOG_LEVEL=2 (C++ errors only) unless it is set already.
`--verbose` or PAWS_TF_VERBOSE=1 leaves all of it on the terminal.
"""

import contextlib
import os
import sys
import tempfile

# The environment variable that asks for TensorFlow's logs and tracebacks.
VERBOSE_ENV = 'PAWS_TF_VERBOSE'
_TRUE = ('1', 'true', 't', 'yes', 'y')


def verbose_from_env():
    """Whether PAWS_TF_VERBOSE asks for TensorFlow's logs and tracebacks."""
    return os.environ.get(VERBOSE_ENV, '').lower() in _TRUE


def verbose_requested(argv):
    """Whether `argv` (the program's, before absl parses it) or the
    environment asks for TensorFlow's start-up logs."""
    for arg in argv[1:]:
        name, _, value = arg.partition('=')
        if name == '--verbose':
            return not value or value.lower() in _TRUE
        if name == '--noverbose':
            return False
    return verbose_from_env()


@contextlib.contextmanager
def quiet_start(argv):
    """Loads TensorFlow and lists its devices with file descriptor 2 in a
    temporary file: what the block imports (TensorFlow) logs nothing.

    Nothing is hidden when `verbose_requested(argv)` or when TensorFlow is
    already loaded (its start-up logs are written). If the block raises,
    what was held back is written to stderr before the error travels on.
    """
    if verbose_requested(argv) or 'tensorflow' in sys.modules:
        yield
        return
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
            import tensorflow as tf  # pylint: disable=import-outside-toplevel
            tf.config.list_physical_devices()
        except BaseException:
            sys.stderr.flush()
            os.dup2(saved, 2)
            held.seek(0)
            os.write(2, held.read())
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
