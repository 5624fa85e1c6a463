"""--overwrite deletes a run only once the new run has passed every check:
a refused start with --overwrite leaves every file of the run as it was."""

import os
import shutil

import pytest

from tests.helpers import run_py

# debug.gin at 2 steps per epoch (64 unlabeled images), one epoch.
SHORT = ('train.num_epochs = 1', 'train/synthetic_source.num_images = 64',
         'train.eval_every_epochs = 0', 'train.view_images = False',
         'train.verbose = 0')


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """A finished run of `SHORT`."""
    return run_py.trained(tmp_path_factory, SHORT)


def _refusals(run, source):
    """(bindings, exit code, message) of starts that are refused with
    --overwrite on the run `run`; `source` is a copy of it elsewhere."""
    checkpoint = run / 'checkpoints' / 'ckpt-2'
    return {
        'the run itself': (
            [f"train.pretrained_model = '{run}'"], os.EX_CONFIG,
            f"train.pretrained_model = '{run}' is --model_dir={run}, the run "
            'it would start: start from a model in another directory, or '
            'train in another --model_dir.'),
        'a checkpoint inside it': (
            [f"train.pretrained_backbone = '{checkpoint}'"], os.EX_CONFIG,
            f"train.pretrained_backbone = '{checkpoint}' lies inside "
            f'--model_dir={run}, the run it would start'),
        'a model of another width': (
            [f"train.pretrained_model = '{source}'",
             'small_resnet.widths = (8, 8)'], os.EX_CONFIG,
            f"train.pretrained_model = '{source}' does not fit the "
            f'configured model: {source} was built with '
            'small_resnet.widths = (8, 16); this config builds '
            'small_resnet.widths = (8, 8).'),
        'labels the data lacks': (
            ['select_labeled.labels_per_class = 100'], os.EX_DATAERR,
            'has 16 images, fewer than labels_per_class=100'),
        'a support the labels cannot fill': (
            ['make_pretrain_dataset_fn.images_per_class = 20'],
            os.EX_DATAERR, 'have fewer labeled images than a step draws'),
    }


@pytest.mark.slow
@pytest.mark.long
def test_a_refused_start_with_overwrite_deletes_nothing(tmp_path, trained):
    """Each start is refused with one line naming the binding, and the
    run's files are byte for byte what they were.

    Fails if --overwrite deletes the run before the pretrained model is
    checked (start.check_pretrained skipped a run with progress:
    the model of another width was found only after the deletion), before
    the data is loaded and the input built (the two data refusals), or if
    a pretrained model inside model_dir is not refused (the run deleted
    its own checkpoints, then failed to read them)."""
    source = tmp_path / 'source'
    shutil.copytree(trained, source)
    names = list(_refusals(tmp_path, source))
    for batch in (names[i:i + 4] for i in range(0, len(names), 4)):
        # Each start on a copy of the run under the same path as the
        # message names: one at a time there, the others beside it.
        procs, before = {}, {}
        for name in batch:
            run = tmp_path / name.replace(' ', '_')
            shutil.copytree(trained, run)
            before[name] = run_py.files(run)
            bindings, _, _ = _refusals(run, source)[name]
            procs[name] = run_py.start(run, bindings, ['--overwrite'],
                                       base_bindings=SHORT)
        for name, proc in procs.items():
            run = tmp_path / name.replace(' ', '_')
            _, code, message = _refusals(run, source)[name]
            got, output = run_py.finish(proc)
            lines = [line for line in output.splitlines() if line.strip()]
            assert got == code, (name, output[-3000:])
            assert message in lines[-1], (name, output[-3000:])
            assert 'Traceback' not in output and 'deleting' not in output
            assert run_py.files(run) == before[name], name
