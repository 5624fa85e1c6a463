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
        'a model of other channels': (
            [f"train.pretrained_model = '{source}'",
             'train/synthetic_source.channels = 1',
             'test/synthetic_source.channels = 1',
             'load_data.normalization = ((0.5,), (0.25,))'], os.EX_CONFIG,
            f"train.pretrained_model = '{source}' fits 3-channel images, "
            'but the images have 1: start from a model of 1-channel '
            'images.'),
        'labels the data lacks': (
            ['select_labeled.labels_per_class = 100'], os.EX_DATAERR,
            'has 16 images, fewer than labels_per_class=100'),
        'a support the labels cannot fill': (
            ['make_pretrain_dataset_fn.images_per_class = 20'],
            os.EX_DATAERR, 'have fewer labeled images than a step draws'),
    }


# The start that runs as a process, run.py as the user starts it (its
# exit code and its last line); the others are `cli.main` in this process,
# on the same code path, while it runs.
IN_A_PROCESS = 'a model of another width'


@pytest.mark.slow
@pytest.mark.long
def test_a_refused_start_with_overwrite_deletes_nothing(tmp_path, trained,
                                                        run_main, capsys,
                                                        caplog):
    """Each start is refused with one line naming the binding, and the
    run's files are byte for byte what they were.

    Fails if --overwrite deletes the run before the pretrained model is
    checked (start.check_pretrained skipped a run with progress:
    the model of another width was found only after the deletion), before
    the data is loaded and the input built (the two data refusals), before
    the pretrained model's channels are compared with the data's (they
    were, once the run was deleted; the message then named the resolved
    checkpoint, not the binding), or if
    a pretrained model inside model_dir is not refused (the run deleted
    its own checkpoints, then failed to read them)."""
    source = tmp_path / 'source'
    shutil.copytree(trained, source)
    runs, before = {}, {}
    # Each start on a copy of the run under the same path as the message
    # names.
    for name in _refusals(tmp_path, source):
        runs[name] = tmp_path / name.replace(' ', '_')
        shutil.copytree(trained, runs[name])
        before[name] = run_py.files(runs[name])
    bindings, code, message = _refusals(runs[IN_A_PROCESS],
                                        source)[IN_A_PROCESS]
    proc = run_py.start(runs[IN_A_PROCESS], bindings, ['--overwrite'],
                        base_bindings=SHORT)
    for name, run in runs.items():
        if name == IN_A_PROCESS:
            continue
        bindings, expected_code, expected = _refusals(run, source)[name]
        caplog.clear()
        got, output = run_py.in_process(run_main, capsys, run_py.command(
            run, bindings, ['--overwrite'], base_bindings=SHORT))
        assert got == expected_code, name
        lines = output.strip().splitlines()
        assert expected in lines[-1], (name, lines[-5:])
        assert 'deleting' not in caplog.text, name
        assert run_py.files(run) == before[name], name
    got, output = run_py.finish(proc)
    lines = [line for line in output.splitlines() if line.strip()]
    assert got == code, output[-3000:]
    assert message in lines[-1], output[-3000:]
    assert 'Traceback' not in output and 'deleting' not in output
    assert run_py.files(runs[IN_A_PROCESS]) == before[IN_A_PROCESS]


@pytest.mark.slow
@pytest.mark.long
def test_a_run_whose_checkpoints_are_gone_is_still_a_run(tmp_path, trained,
                                                         run_main, capsys):
    """A finished run whose checkpoints and backup a user deleted after
    exporting it: another config is refused without --overwrite; with it,
    every output and record goes, the other modes' configs included, and
    the user's own files stay. Fails if the run counts as a failed start
    (its outputs were deleted without --overwrite, at INFO level) or if
    --overwrite leaves config_evaluate_nn.gin, which described the deleted
    run."""
    run = tmp_path / 'run'
    shutil.copytree(trained, run)
    for name in ('checkpoints', 'backup'):
        shutil.rmtree(run / name, ignore_errors=True)
    (run / 'eval').mkdir()
    (run / 'eval' / 'paws_nn.json').write_text('{}')
    (run / 'config_evaluate_nn.gin').write_text('# evaluate_nn\n')
    (run / 'notes.txt').write_text('mine')
    before = run_py.files(run)
    changed = run_py.command(run, ['train.seed = 1'], base_bindings=SHORT)
    code, output = run_py.in_process(run_main, capsys, changed)
    assert code == os.EX_CONFIG
    assert 'holds a run with a different gin config' in output
    assert run_py.files(run) == before
    code, output = run_py.in_process(run_main, capsys,
                                     changed + ['--overwrite'])
    assert code == 0, output[-3000:]
    assert not (run / 'eval').exists()
    assert not (run / 'config_evaluate_nn.gin').exists()
    assert (run / 'notes.txt').read_text() == 'mine'
