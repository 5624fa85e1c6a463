"""A gin config (gin_configs/debug.gin by default) parsed in-process for
the duration of a test."""

import contextlib
import pathlib

import gin

from paws_tf import configurables  # noqa: F401  (registers the configurables)

REPO = pathlib.Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def parsed(bindings=(), gin_file='gin_configs/debug.gin'):
    """`gin_file` (default debug.gin) with `bindings`, from a clean gin
    state; cleared on exit."""
    gin.clear_config()
    gin.add_config_file_search_path(str(REPO))
    try:
        gin.parse_config_files_and_bindings(
            [str(REPO / gin_file)], list(bindings))
        yield
    finally:
        gin.clear_config()
