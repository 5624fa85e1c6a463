"""Commands of docs/ as written: docs/own_images.md's PAWS-NN of an existing
model (shrunk: a small grayscale run as the model, tiny folders),
docs/experiments.md's import of a published model and its PAWS-NN (a
ResNet-50 of random weights, a tiny ImageNet), and the bindings of
docs/demo.md that shrink the demo configs.

Bugs tried: the channels checked only once the mode runs; the ImageNet
validation split read from TFDS' default data_dir whatever the documented
data bindings name; a one-epoch demo that keeps its one-epoch warm-up."""

import json
import os
import re
import shlex
import subprocess
import sys

import gin
import pytest

from paws_tf import configurables
from paws_tf import schedules
from paws_tf.runner import config_checks
from tests.helpers import image_folders
from tests.helpers import official_torch
from tests.helpers import run_py
from tests.helpers import tfds_archives

DOCS = run_py.REPO / 'docs'
CONFIG = 'gin_configs/existing_model_folders.gin'


def _commands(path):
    """The `python run.py ...` commands of the code blocks of `path`, each
    as its argument list."""
    text = re.sub(r'\\\n\s*', ' ', path.read_text())
    return [shlex.split(line, comments=True)[2:]
            for line in text.splitlines()
            if line.startswith('python run.py ')]


def _documented():
    """The existing-model command of docs/own_images.md."""
    [command] = [c for c in _commands(DOCS / 'own_images.md')
                 if f'--gin_file={CONFIG}' in c]
    return command


def _as_run_here(command, values, extra=()):
    """`command` with the bound values of `values` (binding name: value)
    and --model_dir replaced, then the `extra` arguments."""
    replaced = []
    for argument in command:
        name = argument.partition('=')[2].split(' =')[0]
        if argument.startswith('--gin_bindings=') and name in values:
            argument = f"--gin_bindings={name} = '{values[name]}'"
        elif argument.startswith('--model_dir='):
            argument = f'--model_dir={values["--model_dir"]}'
        replaced.append(argument)
    return replaced + list(extra)


def _start(arguments, **environment):
    """run.py with `arguments`, as a user runs it from the checkout, with
    `environment` added to the environment."""
    return subprocess.Popen(
        [sys.executable, str(run_py.REPO / 'run.py')] + arguments,
        cwd=run_py.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env=dict(os.environ, PYTHONPATH=str(run_py.REPO),
                            **environment))


def test_the_documented_model_is_the_import_of_experiments_md():
    """The MODEL of the command is the run directory that
    docs/experiments.md imports the published model into, as the config's
    own header says. Fails on runs/imagenet_10pct_300ep beside
    runs/official_10pct_300ep."""
    [model] = [a.split(' = ')[1] for a in _documented()
               if a.startswith('--gin_bindings=MODEL = ')]
    [imported] = [a.partition('=')[2]
                  for c in _commands(DOCS / 'experiments.md')
                  if '--mode=import_official' in c
                  for a in c if a.startswith('--model_dir=')]
    assert model == f"'{imported}'"
    assert f'MODEL = {model}' in (run_py.REPO / CONFIG).read_text()


@pytest.fixture(scope='module')
def grayscale_run(tmp_path_factory):
    """A trained and exported run of image_folders_small.gin on grayscale
    images, and its folders."""
    root = tmp_path_factory.mktemp('grayscale')
    folders = image_folders.write_experiment(root, unlabeled=6, test=2)
    code, output = run_py.finish(run_py.start(
        root / 'model', folders + ['CHANNELS = 1'],
        gin_file='gin_configs/image_folders_small.gin',
        mode='train_and_evaluate', base_bindings=image_folders.SMALL + [
            'train.num_epochs = 1', 'train.eval_every_epochs = 0',
            'train.view_images = False', 'train.verbose = 0',
            'evaluate_nn.pictures = False']))
    assert code == 0, output[-3000:]
    return root


@pytest.mark.slow
@pytest.mark.long
def test_the_documented_command_on_a_grayscale_model(grayscale_run,
                                                    run_main, capsys):
    """The command as written, MODEL and the folders bound to the test's:
    without CHANNELS = 1 it is refused before anything is written (through
    run.py's `cli` in this process: test_terminal_output runs a config
    check's refusal as a process); with it, as the docs say to add, it
    writes PAWS-NN's results and the classifier. Fails if the channels are
    checked only once the mode runs (config_evaluate_nn.gin and flags.txt
    written first)."""
    root = grayscale_run
    values = {'MODEL': root / 'model', 'LABELED_DIR': root / 'labeled',
              'TEST_DIR': root / 'test', '--model_dir': root / 'refused'}
    command = _as_run_here(_documented(), values)
    code, output = run_py.in_process(run_main, capsys, command)
    assert code == os.EX_CONFIG, output[-3000:]
    assert output.strip().splitlines()[-1] == (
        f'Error: The model of {root}/model/export/embedder takes 1-channel '
        'images, but CHANNELS = 3: bind CHANNELS = 1 (the images are '
        'decoded to that).')
    assert not (root / 'refused').exists()

    values['--model_dir'] = root / 'nn'
    command = _as_run_here(_documented(), values,
                           ["--gin_bindings=CHANNELS = 1"])
    code, output = run_py.finish(_start(command))
    assert code == 0, output[-3000:]
    results = json.loads((root / 'nn' / 'eval' / 'paws_nn.json').read_text())
    assert results['num_queries'] == 2 * len(image_folders.CLASSES)
    assert (root / 'nn' / 'export' / 'classifier').is_dir()


@pytest.mark.slow
@pytest.mark.long
def test_the_published_model_imported_and_evaluated_as_documented(tmp_path):
    """docs/experiments.md's two commands of "The published models" as
    written (the checkpoint and model_dir replaced by the test's): the
    import of a published ResNet-50 (here of random weights), then its
    PAWS-NN with the data bindings of the training command above, pointed
    at a tiny ImageNet that TFDS' builders prepared outside TFDS' default
    directory (HOME is the test's own); without the data directory, one
    error line. Fails if the test split is read from TFDS' default
    data_dir whatever those bindings name (a traceback of TFDS' "could not
    find data"), or if a dataset that is not prepared gives a
    traceback."""
    torch = pytest.importorskip('torch')
    del torch  # official_torch builds the network in it.
    data_dir = tfds_archives.prepare_imagenet(
        tmp_path / 'imagenet', per_class=3, subsets={'10pct': (0, 1)})
    checkpoint = tmp_path / 'paws_imgnt_10percent_300ep.pth.tar'
    official_torch.save_official(official_torch.randomize(
        official_torch.add_pretraining_heads(
            official_torch.ResNet50(), 2048, use_pred=True), seed=1),
        checkpoint)
    commands = _commands(DOCS / 'experiments.md')
    [training] = [c for c in commands if '--mode=train_and_evaluate' in c
                  and '--gin_file=gin_configs/imagenet_rn50_10pct.gin' in c]
    [imported] = [c for c in commands if '--mode=import_official' in c]
    [evaluated] = [c for c in commands if '--mode=evaluate_nn' in c and
                   '--gin_file=gin_configs/imagenet_rn50_10pct.gin' in c]
    data = [a for a in training if a.startswith('--gin_bindings=')]
    assert len(data) == 2, training  # The cache and the data directory.
    run = tmp_path / 'runs' / 'official_10pct_300ep'
    values = {'--model_dir': run}
    code, output = run_py.finish(_start(
        [f'--official_checkpoint={checkpoint}' if a.startswith(
            '--official_checkpoint=') else a
         for a in _as_run_here(imported, values)], HOME=str(tmp_path)))
    assert code == 0, output[-3000:]
    directories = {'/data/paws_cache': str(tmp_path / 'cache'),
                   '/data/tensorflow_datasets': data_dir}
    for documented, here in directories.items():
        data = [a.replace(documented, here) for a in data]
    # Without the data directory: one error line naming where it looked.
    code, output = run_py.finish(_start(
        _as_run_here(evaluated, values) + [
            a for a in data if 'DATA_DIR' not in a], HOME=str(tmp_path)))
    assert code == os.EX_DATAERR, output[-3000:]
    assert output.strip().splitlines()[-1] == (
        "Error: TFDS imagenet2012_subset/10pct is not prepared in TFDS' "
        'default data_dir (~/tensorflow_datasets): prepare it '
        '(docs/experiments.md, "ImageNet"), or bind DATA_DIR, which the '
        'ImageNet configs pass to every TFDS source, to the data_dir it was '
        'prepared in.')
    code, output = run_py.finish(_start(
        _as_run_here(evaluated, values) + data, HOME=str(tmp_path)))
    assert code == 0, output[-3000:]
    results = json.loads((run / 'eval' / 'paws_nn.json').read_text())
    assert results['num_queries'] == 2  # The two validation images.


@pytest.mark.parametrize('config', ['demo_fashion_mnist.gin',
                                    'demo_fashion_mnist_vit.gin'])
def test_the_documented_shorter_demo_decays(clean_gin, config):
    """docs/demo.md's one-epoch demo: its bindings on each demo config
    pass the config checks and give a schedule that warms up for a
    quarter of the run, then decays to the final learning rate. Fails if
    the bindings leave the warm-up at one epoch (the learning rate ends
    at the peak)."""
    [command] = [c for c in _commands(DOCS / 'demo.md')
                 if "--gin_bindings=train.num_epochs = 1" in c]
    shrink = [a.partition('=')[2] for a in command
              if a.startswith('--gin_bindings=')]
    configurables.parse([f'gin_configs/{config}'], shrink)
    config_checks.check_config()
    steps_per_epoch = 468  # 59,600 unlabeled images in batches of 128.
    schedule = gin.get_configurable(schedules.WarmupCosineDecay)(
        steps_per_epoch=steps_per_epoch,
        num_epochs=gin.query_parameter('train.num_epochs'))
    assert (schedule.warmup_steps, schedule.total_steps) == (117, 468)
    assert float(schedule(schedule.total_steps)) == pytest.approx(
        schedule.final_lr)
    assert schedule.final_lr < schedule.ref_lr / 10
