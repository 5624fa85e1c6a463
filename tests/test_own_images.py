"""The demo on a user's own image folders, through run.py."""

import json
import pathlib
import subprocess
import sys

import numpy as np
from PIL import Image
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
# Shrink the template to seconds on a CPU; the data and code paths are the
# real ones.
SMALL = ['IMAGE_SIZE = 32', 'LOCAL_SIZE = 16', 'SUPPORT_CLASSES = 3',
         'make_pretrain_dataset_fn.global_batch_size = 16',
         'make_pretrain_dataset_fn.images_per_class = 2',
         "build_backbone.name = 'small_resnet'",
         'build_backbone.widths = (8, 16)',
         'build_backbone.blocks_per_stage = (1, 1)',
         'build_backbone.stage_strides = (2, 2)',
         'ProjectionHead.hidden_dim = 16', 'ProjectionHead.output_dim = 16',
         'PredictionHead.hidden_dim = 8', 'train.num_epochs = 2',
         'WarmupCosineDecay.warmup_epochs = 1', 'train_supervised.steps = 20',
         'train_supervised.batch_size = 8', 'train.verbose = 0']


def write_folder(root, classes, per_class, seed):
    rng = np.random.default_rng(seed)
    for c, name in enumerate(classes):
        for i in range(per_class):
            # A class is a brightness gradient direction, plus noise.
            grid = np.linspace(0, 1, 40)
            base = [np.add.outer(grid, 0 * grid), np.add.outer(0 * grid, grid),
                    np.add.outer(grid, grid) / 2][c]
            image = base[..., None] + 0.1 * rng.normal(size=(40, 40, 3))
            path = root / name / f'{i}.png' if name else root / f'{c}_{i}.jpg'
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray((np.clip(image, 0, 1) * 255).astype(np.uint8)
                            ).save(path)


@pytest.mark.slow
def test_demo_on_image_folders(tmp_path):
    classes = ['up', 'left', 'diagonal']
    write_folder(tmp_path / 'labeled', classes, 4, seed=0)
    write_folder(tmp_path / 'unlabeled', [''] * 3, 20, seed=1)
    write_folder(tmp_path / 'test', classes, 5, seed=2)
    (tmp_path / 'unlabeled' / 'broken.jpg').write_bytes(b'')
    bindings = SMALL + [f"LABELED_DIR = '{tmp_path / 'labeled'}'",
                        f"UNLABELED_DIR = '{tmp_path / 'unlabeled'}'",
                        f"TEST_DIR = '{tmp_path / 'test'}'",
                        'SEED = 5', 'train.seed = %SEED']
    proc = subprocess.run(
        [sys.executable, str(REPO / 'run.py'),
         '--gin_file=gin_configs/image_folders.gin',
         f'--model_dir={tmp_path / "run"}', '--mode=demo'] +
        [f'--gin_bindings={b}' for b in bindings],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'Skipping 1 of 61 files' in proc.stderr  # 60 images + broken.
    results = json.loads((tmp_path / 'run' / 'results.json').read_text())
    assert results['num_labeled'] == 12 and results['num_test'] == 15
    assert results['num_unlabeled'] == 60 + 12  # Labeled ones included.
    assert results['seed'] == 5  # Through a macro.
    assert 0 <= results['paws_nn_top1'] <= 1
    assert (tmp_path / 'run' / 'results.png').stat().st_size > 10_000
    assert (tmp_path / 'run' / 'export' / 'classifier' / 'saved_model.pb'
            ).exists()
