"""A start that fails leaves nothing that blocks the corrected command on
the same --model_dir, without --overwrite."""

import shutil

import pytest

from paws_tf.data import splits
from tests.helpers import image_folders
from tests.helpers import run_py

GIN_FILE = 'gin_configs/image_folders_small.gin'
# image_folders_small.gin shrunk to 2 steps (1 step per epoch on 30
# unlabeled images); no backup is due before the end.
SMALL = ['SUPPORT_CLASSES = 3',
         'make_pretrain_dataset_fn.global_batch_size = 16',
         'make_pretrain_dataset_fn.images_per_class = 2',
         'small_resnet.widths = (8, 8, 16)',
         'ProjectionHead.hidden_dim = 16', 'ProjectionHead.output_dim = 16']


def _folders(root):
    """The three folders, a labeled folder with an empty class folder and
    one with a corrupt image beside them; returns the bindings of each
    labeled folder."""
    image_folders.write_experiment(root, unlabeled=6, test=2)
    shutil.copytree(root / 'labeled', root / 'with_empty')
    (root / 'with_empty' / 'zebra').mkdir()
    shutil.copytree(root / 'labeled', root / 'with_corrupt')
    (root / 'with_corrupt' / 'up' / 'broken.jpg').write_bytes(b'\xff\xd8\x00')
    return {name: f"LABELED_DIR = '{root / name}'"
            for name in ('labeled', 'with_empty', 'with_corrupt')}


@pytest.mark.slow
@pytest.mark.long
def test_corrected_command_runs_after_a_failed_start(tmp_path, run_main,
                                                     capsys):
    """Each failed start is `cli.main` in this process (what run.py runs,
    its error printed as run.py prints it); the corrected commands are
    run.py, three processes side by side."""
    labeled = _folders(tmp_path)
    common = image_folders.path_bindings(tmp_path)[1:] + SMALL
    # (failed start, its message, the corrected command, what its config
    # holds and what it does not): each start fails once its data is read,
    # its records (config.gin, flags.txt, the split) not written. (A config
    # error such as train.num_epochs = 'ten' stops before:
    # tests/test_terminal_output.py.)
    starts = {
        'policy': (
            [labeled['with_corrupt'], "image_folder.on_bad_image = 'fail'",
             'train.num_epochs = 3'],
            'cannot be decoded as images: up/broken.jpg',
            [labeled['labeled']], 'train.num_epochs = 2', 'num_epochs = 3'),
        'empty': (
            [labeled['with_empty']], "hold no usable images: ['zebra']",
            [labeled['labeled']], f"{tmp_path / 'labeled'}'", 'with_empty'),
        'corrupt': (
            [labeled['with_corrupt'], "image_folder.on_bad_image = 'fail'"],
            'cannot be decoded as images: up/broken.jpg',
            [labeled['with_corrupt']], 'with_corrupt', 'on_bad_image'),
    }
    for name, start in starts.items():
        code, output = run_py.in_process(run_main, capsys, run_py.command(
            tmp_path / name, common + start[0], gin_file=GIN_FILE))
        assert code != 0 and start[1] in output, output[-3000:]
        for record in ('config.gin', 'flags.txt', 'labeled_split.txt',
                       'checkpoints'):
            assert not (tmp_path / name / record).exists(), (name, record)
    # The corrected commands, three at a time.
    corrected = {name: run_py.start(tmp_path / name, common + start[2],
                                    gin_file=GIN_FILE)
                 for name, start in starts.items()}
    for name, proc in corrected.items():
        code, output = run_py.finish(proc)
        assert code == 0, output[-3000:]
        assert 'different gin config' not in output
        config = (tmp_path / name / 'config.gin').read_text()
        assert starts[name][3] in config and starts[name][4] not in config
        assert (tmp_path / name / 'checkpoints').is_dir()
        # What docs/operations.md says a training run writes, for folders too.
        split = splits.read_split_file(tmp_path / name / 'labeled_split.txt')
        assert split == [f'{c}/{i}.png' for c in sorted(image_folders.CLASSES)
                         for i in range(4)]
        assert (tmp_path / name / 'normalization.json').exists()
