"""A gin config (gin_configs/debug.gin by default) parsed in-process for
the duration of a test."""

import contextlib
import pathlib

import gin

from paws_tf import configurables  # noqa: F401  (registers the configurables)

REPO = pathlib.Path(__file__).resolve().parents[2]
# debug.gin's run with the Vision Transformer recipe at its size: vit_tiny
# of one block cutting its 16-px global and 8-px local views into 4-px
# patches, GELU heads, AdamW with a cosine weight decay, learning rates
# for Adam.
VIT = ("build_backbone.name = 'vit_tiny'", 'vit.patch_size = 4',
       'vit.image_size = 16', 'vit.depth = 1',
       "ProjectionHead.activation = 'gelu'",
       'train.optimizer_cls = @AdamW', 'AdamW.weight_decay = 0.04',
       'AdamW.final_weight_decay = 0.4', 'WarmupCosineDecay.start_lr = 1e-4',
       'WarmupCosineDecay.ref_lr = 1e-3', 'WarmupCosineDecay.final_lr = 1e-5')


def write_vit_config(path):
    """debug.gin with `VIT` after it (its small_resnet.* bindings go
    unused), written to `path`; returns `path`."""
    lines = (REPO / 'gin_configs' / 'debug.gin').read_text().splitlines()
    pathlib.Path(path).write_text('\n'.join(lines + list(VIT)) + '\n')
    return path


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
