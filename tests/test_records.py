"""Training writes a run's records (flags.txt: run.py's flags alone);
evaluation and export read them: they write none, and refuse a changed
labeled split, class set or normalisation in one line naming the record
and the binding, before writing anything."""

import os
import re
import shutil

import pytest

from paws_tf.data import splits
from paws_tf.runner import experiment
from tests.helpers import run_py

# debug.gin at 2 steps per epoch (64 unlabeled images), one epoch, 4 of
# the 16 images of each class labeled.
SHORT = ('train.num_epochs = 1', 'train/synthetic_source.num_images = 64',
         'select_labeled.labels_per_class = 4',
         'train.eval_every_epochs = 0', 'train.view_images = False',
         'train.verbose = 0')
# The records training writes, which no other mode may write.
RECORDS = ('config.gin', 'flags.txt', 'labeled_split.txt',
           'normalization.json', 'data_fingerprint.json', 'input.txt',
           'run_history.txt', 'operative_config.gin')


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """A finished run of `SHORT`."""
    return run_py.trained(tmp_path_factory, SHORT)


def _copy(trained, tmp_path):
    run = tmp_path / 'run'
    shutil.copytree(trained, run)
    return run


def test_flags_txt_records_run_py_flags_alone(trained):
    """flags.txt holds run.py's flags, as given or defaulted. Fails if it
    holds absl's and TensorFlow's own flags too (`flags_into_string`: about
    40 lines such as --logtostderr and --xla_gpu_...)."""
    assert (trained / 'flags.txt').read_text().splitlines() == [
        '--gin_file=gin_configs/debug.gin',
        *[f'--gin_bindings={binding}' for binding in SHORT],
        f'--model_dir={trained}', '--mode=train', '--strategy=auto',
        '--nooverwrite', '--noverbose', '--nolist_configs']


@pytest.mark.slow
@pytest.mark.parametrize('mode', ['evaluate_nn', 'export'])
def test_evaluation_and_export_write_no_record(trained, tmp_path, mode,
                                               run_main):
    """The mode runs (run.py's `cli.main`, in this process) and every
    record is byte for byte what training wrote; the mode's own config is
    kept as config_<mode>.gin. Fails if the mode rewrites flags.txt or
    labeled_split.txt (it did: flags.txt with --mode=<mode>)."""
    run = _copy(trained, tmp_path)
    before = run_py.files(run)
    run_main(*run_py.command(run, mode=mode, gin_file='debug.gin',
                             base_bindings=SHORT))
    after = run_py.files(run)
    for record in RECORDS:
        assert after[record] == before[record], record
    assert f'config_{mode}.gin' in after
    assert set(after) - set(before) - {f'config_{mode}.gin'} <= {
        name for name in after
        if name.startswith(('eval', 'export', 'tensorboard'))}


# A binding that changes a record, and run.py's last line refusing it.
REFUSALS = {
    'split': (
        'select_labeled.seed = 5',
        'Error: select_labeled.seed = 5 selects another labeled set than '
        '{run}/labeled_split.txt (written by training): it lists 16 images, '
        '{differ} of them not among the 16 selected. Remove the binding, or '
        'train a new run in another --model_dir.'),
    'classes': (
        'synthetic_source.num_classes = 2',
        "Error: synthetic_source.num_classes = 2 gives other classes than "
        "{run}/data_fingerprint.json (written by training): 2 classes "
        "['class_0', 'class_1']. Remove the binding, or train a new run in "
        'another --model_dir.'),
    'normalisation': (
        'load_data.normalization = ((0.4, 0.4, 0.4), (0.25, 0.25, 0.25))',
        'Error: {run}/normalization.json (written by training) records the '
        'normalisation this run was trained with, NORMALIZATION = [[0.5, '
        '0.5, 0.5], [0.25, 0.25, 0.25]] (mean (0.5, 0.5, 0.5), std (0.25, '
        '0.25, 0.25)), not ((0.4, 0.4, 0.4), (0.25, 0.25, 0.25)) '
        '(load_data.normalization): bind it back, or train a new run in '
        'another --model_dir.'),
}


def _refusal(trained, tmp_path, kind):
    """A copy of the trained run, its files, and the binding of `kind`
    with the line refusing it in that copy."""
    run = _copy(trained, tmp_path)
    listed = [line for line in (run / 'labeled_split.txt').read_text()
              .splitlines() if not line.startswith('#')]
    # The images training drew that seed 5 does not draw.
    drawn = splits.select_labeled(
        experiment.synthetic_source(num_images=64), labels_per_class=4,
        seed=5).labeled.names
    differ = len(set(listed) - set(drawn))
    assert len(listed) == 16 and differ > 0
    binding, message = REFUSALS[kind]
    return run, run_py.files(run), binding, message.format(run=run,
                                                           differ=differ)


@pytest.mark.parametrize('mode', ['evaluate_nn', 'export'])
@pytest.mark.parametrize('kind', REFUSALS)
def test_a_changed_record_is_refused_before_anything_is_written(
        trained, tmp_path, mode, kind, run_main, capsys):
    """Refused in one line naming the binding and the record, exit code
    65, the run's files unchanged (run.py's `cli.main`, in this process).
    Fails if the mode writes the new split and evaluates or exports on it
    (it did, logging that the labeled set matched the split file it had
    just written), or if a changed normalisation is a traceback."""
    run, before, binding, message = _refusal(trained, tmp_path, kind)
    with pytest.raises(SystemExit) as stopped:
        run_main(*run_py.command(run, [binding], mode=mode,
                                 gin_file='debug.gin', base_bindings=SHORT),
                 printed=True)
    assert stopped.value.code == os.EX_DATAERR
    assert capsys.readouterr().err.strip().splitlines()[-1] == message
    assert run_py.files(run) == before


@pytest.mark.slow
def test_run_py_ends_a_refusal_with_its_line_and_exit_code(trained,
                                                            tmp_path):
    """The refusal as run.py's process ends: exit code 65, the line last
    in its output, the run's files unchanged. Fails if run.py exits 0 or
    with a traceback after the line."""
    run, before, binding, message = _refusal(trained, tmp_path, 'split')
    code, output = run_py.finish(run_py.start(
        run, [binding], mode='evaluate_nn', base_bindings=SHORT))
    assert code == os.EX_DATAERR, output[-3000:]
    assert output.strip().splitlines()[-1] == message
    assert run_py.files(run) == before


@pytest.mark.parametrize('binding', ['ProgressBar.log_every_seconds = 5',
                                     'make_strategy.start_timeout = 60'])
def test_a_resume_only_binding_new_to_the_config_is_not_a_change(
        trained, tmp_path, run_main, capsys, binding):
    """A binding that may change on resume, of a configurable the run's
    config did not bind, resumes the finished run (nothing to train).
    Fails if gin's section header of that configurable ('# Parameters for
    ProgressBar:') counts as a changed line (it did: the start was refused
    as another config)."""
    run = _copy(trained, tmp_path)
    code, output = run_py.in_process(run_main, capsys, run_py.command(
        run, [binding], base_bindings=SHORT))
    assert code == 0, output[-2000:]


@pytest.mark.parametrize('mode', ['evaluate_nn', 'export', 'fine_tune'])
def test_a_model_dir_without_a_trained_run_is_named_in_one_line(
        tmp_path, run_main, capsys, mode):
    """A typo in --model_dir. Fails if the mode ends in a traceback of
    FileNotFoundError ('No TF checkpoint at ...'), or creates the
    directory."""
    run = tmp_path / 'typo'
    code, output = run_py.in_process(run_main, capsys, run_py.command(
        run, base_bindings=SHORT, mode=mode))
    assert code == os.EX_CONFIG, output[-2000:]
    assert output.strip().splitlines()[-1] == (
        f'Error: --model_dir={run} holds no checkpoint: give the model_dir '
        'of a trained run, or train this one first (--mode=train resumes a '
        'run stopped before its first checkpoint).')
    assert not run.exists()


def test_a_run_of_another_architecture_is_named_in_one_line(
        trained, tmp_path, run_main, capsys):
    """Fails if evaluating a run with other architecture bindings than it
    was trained with ends in a traceback of `checkpoints.Mismatch`."""
    run = _copy(trained, tmp_path)
    code, output = run_py.in_process(run_main, capsys, run_py.command(
        run, ['small_resnet.widths = (8, 32)'], base_bindings=SHORT,
        mode='export'))
    assert code == os.EX_CONFIG, output[-2000:]
    assert re.search(
        f'^Error: {re.escape(str(run))} holds a model of another '
        r'architecture than this config builds \(\d+ variables missing or '
        r'of other shapes: .*\): bind the architecture its '
        f'{re.escape(str(run / "config.gin"))} binds.$',
        output.strip().splitlines()[-1])


def test_an_existing_model_is_not_evaluated_into_a_training_run(
        trained, tmp_path, run_main, capsys):
    """evaluate_nn.from_model writes eval/ and export/classifier into
    --model_dir. Fails if a training run there lets them replace its own
    (it did: exit 0, its paws_nn.json then another model's), or if
    anything of the run changes."""
    source = _copy(trained, tmp_path / 'source')
    code, output = run_py.in_process(run_main, capsys, run_py.command(
        source, base_bindings=SHORT, mode='export'))
    assert code == 0, output[-2000:]
    run = _copy(trained, tmp_path)
    before = run_py.files(run)
    code, output = run_py.in_process(run_main, capsys, run_py.command(
        run, [f"evaluate_nn.from_model = '{source}'"], base_bindings=SHORT,
        mode='evaluate_nn'))
    assert code == os.EX_CONFIG, output[-2000:]
    assert output.strip().splitlines()[-1] == (
        f'Error: --model_dir={run} holds a training run, whose eval/ and '
        'export/classifier the evaluation of evaluate_nn.from_model would '
        'replace: give another --model_dir (the same config draws the same '
        'labeled images there).')
    assert run_py.files(run) == before
