"""A new user's usual slips: each gets one message naming it and the fix,
before any data is read or any run state is written."""

import inspect
import json
import re

import gin
import pytest

from paws_tf import checks
from paws_tf import cli
from paws_tf import configurables
from paws_tf.evaluation import export
from paws_tf.nets import backbones
from paws_tf.runner import config_checks
from paws_tf.runner import modes
from tests.helpers import image_folders


def test_no_gin_file(run_main, tmp_path):
    with pytest.raises(checks.ConfigError, match=r'^--gin_file is required: .*'
                       r'--gin_file=debug.gin .*--list_configs'):
        run_main(f'--model_dir={tmp_path / "run"}')
    assert not (tmp_path / 'run').exists()


@pytest.mark.parametrize('mode', ['train', 'evaluate_nn'])
def test_model_dir_that_is_a_file(run_main, tmp_path, mode):
    (tmp_path / 'run').write_text('a file')
    with pytest.raises(checks.ConfigError, match=(
            f'--model_dir={tmp_path / "run"} is a file: give a directory')):
        run_main('--gin_file=debug.gin', f'--model_dir={tmp_path / "run"}',
                 f'--mode={mode}')
    with pytest.raises(checks.ConfigError, match=(
            f'is inside {tmp_path / "run"}, which is a file: give a dir')):
        run_main('--gin_file=debug.gin',
                 f'--model_dir={tmp_path / "run" / "sub"}', f'--mode={mode}')
    assert (tmp_path / 'run').read_text() == 'a file'


def test_a_model_dir_that_cannot_be_written_is_named(run_main):
    """sysfs refuses new directories, even to root. Fails if the start
    ends in a traceback of PermissionError (it did, from the run lock)."""
    with pytest.raises(checks.ConfigError, match=re.escape(
            '--model_dir=/sys/paws_tf_run cannot be written (Operation not '
            'permitted: /sys/paws_tf_run): give a directory this user can '
            'write')):
        run_main('--gin_file=debug.gin', '--model_dir=/sys/paws_tf_run')


def test_an_unbound_macro_is_named(run_main, tmp_path):
    with pytest.raises(checks.ConfigError, match=(
            r'^EPOCHS is not bound: the config uses %EPOCHS\. Bind it, e\.g\. '
            r'--gin_bindings="EPOCHS = \.\.\."$')):
        run_main('--gin_file=debug.gin', f'--model_dir={tmp_path / "run"}',
                 '--gin_bindings=train.num_epochs = %EPOCHS')
    assert not (tmp_path / 'run').exists()


def test_another_backbone_is_one_binding(run_main, tmp_path):
    """The demo switched to a ViT by one binding: its small ResNet's
    bindings go unused, the ViT is built, and the image check is the
    ViT's (28 px in 16-px patches), before anything is written. Seen
    failing on the code that refused the demo's small_resnet arguments
    until each was unset."""
    with pytest.raises(checks.ConfigError, match=(
            r"^eval_preprocessing\.image_size = 28 is not a multiple of "
            r"vit\.patch_size = 16: build_backbone\.name = 'vit_tiny' cuts "
            r"images into patches of that side\.$")):
        run_main('--gin_file=demo_fashion_mnist.gin',
                 f'--model_dir={tmp_path / "run"}',
                 "--gin_bindings=build_backbone.name = 'vit_tiny'")
    assert not (tmp_path / 'run').exists()
    gin.clear_config()
    configurables.parse(['demo_fashion_mnist.gin'],
                        ["build_backbone.name = 'vit_tiny'"])
    model = backbones.build_backbone(input_channels=1)
    assert (model.name, model.output_dim) == ('vit_tiny', 192)


def test_a_backbone_argument_of_build_backbone_names_its_family(clean_gin):
    """A family's argument bound on build_backbone (gin takes any name
    there) is refused when the config is parsed, naming the family's
    binding. Seen failing on the code that took it as the argument."""
    del clean_gin
    with pytest.raises(checks.ConfigError, match=(
            r"^build_backbone\.widths is bound, but build_backbone has no "
            r"parameter 'widths': a backbone family takes it under its own "
            r"name: bind small_resnet\.widths\.$")):
        configurables.parse(['debug.gin'], ['build_backbone.widths = (8,)'])
    with pytest.raises(checks.ConfigError, match=(
            r"^build_backbone\.depth is bound, .* bind wide_resnet\.depth "
            r"or vit\.depth\.$")):
        configurables.parse(['debug.gin'], ['build_backbone.depth = 2'])


@pytest.mark.parametrize('bound,missing,what', [
    ((), 'LABELED_DIR', 'labeled class subfolders'),
    (('LABELED_DIR',), 'UNLABELED_DIR', 'unlabeled images'),
    (('LABELED_DIR', 'UNLABELED_DIR'), 'TEST_DIR', 'test class subfolders'),
])
def test_a_folder_left_out_is_named(run_main, tmp_path, bound, missing,
                                    what):
    bindings = [b for b in image_folders.path_bindings(tmp_path)
                if b.split(' =')[0] in bound]
    for name in ('labeled', 'unlabeled', 'test'):
        (tmp_path / name / 'a').mkdir(parents=True)
    with pytest.raises(checks.ConfigError, match=(
            f'^{missing} is not bound: bind it to your folder of {what}, '
            f'e.g. --gin_bindings="{missing} = ')):
        run_main('--gin_file=image_folders_small.gin',
                 f'--model_dir={tmp_path / "run"}',
                 *[f'--gin_bindings={b}' for b in bindings])
    assert not (tmp_path / 'run').exists()


def test_one_labeled_folder_needs_no_unlabeled_dir(run_main, tmp_path):
    """docs/own_images.md's binding for labeled images picked out of one folder: only
    LABELED_DIR and TEST_DIR; the config check reaches the support check
    (3 class folders), which proves the folders resolved."""
    for name in ('labeled', 'test'):
        for label in ('a', 'b', 'c'):
            (tmp_path / name / label).mkdir(parents=True)
    bindings = [f"LABELED_DIR = '{tmp_path / 'labeled'}'",
                f"TEST_DIR = '{tmp_path / 'test'}'",
                'load_data.train = @image_folder',
                'select_labeled.fraction = 0.1']
    with pytest.raises(checks.ConfigError, match=(
            "SUPPORT_CLASSES = 10 support classes per step, but LABELED_DIR "
            f"= '{tmp_path / 'labeled'}' holds 3 class folder")):
        run_main('--gin_file=image_folders_small.gin',
                 f'--model_dir={tmp_path / "run"}',
                 *[f'--gin_bindings={b}' for b in bindings])


@pytest.mark.parametrize('binding,message', [
    ('CHANNEL = 1', r'^CHANNEL is bound but nothing in the config reads '
     r'%CHANNEL: did you mean CHANNELS\? The config reads .*CHANNELS.*\. '
     r'Correct the name or remove the binding of CHANNEL\.$'),
    ('train.num_epoch = 3', r"doesn't have a parameter named 'num_epoch'\. "
     r'Did you mean train\.num_epochs\?$'),
    ('buid_backbone.widths = (8,)', r"No configurable matching "
     r"'buid_backbone'\. Did you mean build_backbone\?$"),
    # Classes with **kwargs (Keras' constructors): gin accepts any name.
    ('PAWSModel.sharpen_temprature = 0.3', r'^PAWSModel.sharpen_temprature '
     r"is bound, but PAWSModel has no parameter 'sharpen_temprature'\. Did "
     r'you mean PAWSModel\.sharpen_temperature\?$'),
    ('LARS.momentm = 0.9', r"^LARS.momentm is bound, but LARS has no "
     r"parameter 'momentm'\. Did you mean LARS\.momentum\?$"),
])
def test_a_name_nothing_reads_is_named_with_the_closest(run_main, tmp_path,
                                                         binding, message):
    """Fails if configurables' finalize hooks let a macro nothing reads
    pass, or a parameter that a configurable with `**kwargs` does not have
    (tried: no `_refuse_unknown_parameters`: the run read its data and
    ended in Keras' TypeError 'Keyword argument not understood'), or if
    _closest suggests no name."""
    with pytest.raises(checks.ConfigError, match=message):
        run_main('--gin_file=image_folders_small.gin',
                 f'--model_dir={tmp_path / "run"}',
                 f'--gin_bindings={binding}')
    assert not (tmp_path / 'run').exists()


@pytest.mark.parametrize('binding,source', [
    ('PredictionHead.output_dim = 8', 'ProjectionHead.output_dim'),
    ('fine_tune.image_size = 64', 'eval_preprocessing.image_size'),
    ('fine_tune.crop_fraction = 1.0', 'eval_preprocessing.crop_fraction'),
    ('fine_tune.mean = (0.5,)', 'load_data.normalization'),
    ('fine_tune.std = (0.5,)', 'load_data.normalization'),
    ('make_pretrain_dataset_fn.seed = 3', 'train.seed'),
    ('make_pretrain_dataset_fn.start_step = 3', None),
    ("make_strategy.kind = 'mirrored'", "run.py's --strategy flag"),
    ('ProjectionHead.sync_bn = True', 'build_model.sync_bn'),
    ('build_backbone.input_channels = 1', "the data's channels"),
    ('LARS.learning_rate = 0.1', 'WarmupCosineDecay.*'),
    ('AdamW.learning_rate = 0.1', 'WarmupCosineDecay.*'),
    ('make_eval_dataset.batch_size = 8', 'PawsNN.batch_size'),
    ('make_eval_dataset.image_size = 8', 'eval_preprocessing.image_size'),
    ('make_eval_dataset.std = (0.5,)', 'load_data.normalization'),
    ('evaluate_nn.crop_fraction = 1.0', 'eval_preprocessing.crop_fraction'),
    ('evaluate_nn.mean = (0.5,)', 'load_data.normalization'),
    ('evaluate_nn.step = 3', None),
])
def test_a_parameter_the_run_passes_itself_is_refused(clean_gin, binding,
                                                      source):
    """A binding of a parameter that the run passes itself, which would be
    overridden unseen, is refused naming what sets it. Fails if one is
    bindable (tried: `PredictionHead.output_dim = 8` without its denylist:
    the prediction stayed the projection's 32 wide; the same for the
    preprocessing of `--mode=fine_tune`, the input's seed, --strategy,
    the images' channels, the optimizers' rate (the schedule's), the
    evaluation's batch, preprocessing and step),
    or if what sets it is not a parameter of the configs (a renamed one)."""
    with pytest.raises(checks.ConfigError, match=re.escape(
            f'The run sets {binding.split(" = ")[0]} itself' +
            (f': set {source}' if source else '; remove the binding.'))):
        configurables.parse(['debug.gin'], [binding])
    configurable = re.fullmatch(r'(\w+)\.(\w+)', source or '')
    if configurable:
        name, parameter = configurable.groups()
        assert parameter in inspect.signature(
            gin.config.get_configurable(name)).parameters


@pytest.mark.parametrize('binding,own', [
    ('evaluate_nn.tau = 0.5', 'PAWSModel.tau'),
    ("evaluate_nn.embedding = 'prediction'", 'PAWSModel.nn_embedding')])
def test_an_existing_models_setting_bound_for_the_runs_own_is_refused(
        run_main, tmp_path, binding, own):
    """`evaluate_nn.tau` and `.embedding` apply to `evaluate_nn.from_model`;
    a run's own model is evaluated with its `PAWSModel` settings. Fails if
    the binding is let through (tried: no `_check_own_model_bindings`:
    the command went on to read the run, here none, and a trained run is
    evaluated at its own tau, the binding ignored)."""
    with pytest.raises(checks.ConfigError, match=re.escape(
            f'{binding} is bound, but it applies to an existing model '
            f"(evaluate_nn.from_model): the run's own model evaluates "
            f'PAWS-NN with {own}; bind that instead.')):
        run_main('--gin_file=debug.gin', f'--model_dir={tmp_path / "run"}',
                 '--mode=evaluate_nn', f'--gin_bindings={binding}')
    assert not (tmp_path / 'run').exists()


def test_a_split_bound_beside_a_labeled_folder_is_refused(run_main,
                                                          tmp_path):
    """`select_labeled` draws labeled images out of one labeled source;
    image_folders gives its labeled folder whole. Fails if the binding is
    let through (tried: no `_check_split_bindings`: the run trained on
    every labeled image, 4 a class, with `labels_per_class = 1` bound)."""
    paths = image_folders.write_experiment(tmp_path / 'data', unlabeled=2,
                                           test=1)
    with pytest.raises(checks.ConfigError, match=re.escape(
            'select_labeled.labels_per_class is bound, but load_data.train '
            '= @image_folders gives its labeled images itself')):
        run_main('--gin_file=image_folders_small.gin',
                 f'--model_dir={tmp_path / "run"}',
                 '--gin_bindings=select_labeled.labels_per_class = 1',
                 *[f'--gin_bindings={b}' for b in image_folders.SMALL + paths])
    assert not (tmp_path / 'run').exists()


def test_a_base_class_parameter_is_taken(clean_gin):
    """LARS passes **kwargs to Keras' optimizer, whose `clipnorm` a config
    may bind. Fails if the unknown-parameter check reads only the class's
    own constructor."""
    configurables.parse(['debug.gin'], ['LARS.clipnorm = 1.0'])
    assert gin.query_parameter('LARS.clipnorm') == 1.0


def test_a_field_of_a_multicrop_preset_bound_on_the_class_is_refused(
        clean_gin):
    """debug.gin's views are `@cifar10_multicrop()`'s, which passes every
    field to MultiCropConfig over its bindings. Fails if
    `MultiCropConfig.num_local = 3` is let through there (tried: without
    `_refuse_preset_overrides`, the run trained on 2 local views), or
    refused where the views are `@MultiCropConfig()`'s own."""
    configurables.parse(['debug.gin'], ['MultiCropConfig.num_local = 3'])
    with pytest.raises(checks.ConfigError, match=re.escape(
            "MultiCropConfig.num_local is bound, but the views are "
            "cifar10_multicrop()'s preset, which sets every field itself: "
            'bind cifar10_multicrop.num_local instead.')):
        config_checks.check_config(pretraining=False)
    gin.clear_config()
    configurables.parse(['demo_fashion_mnist.gin'],
                        ['MultiCropConfig.num_local = 3'])
    config_checks.check_config(pretraining=False)


def test_labeled_images_left_out_of_a_given_unlabeled_source_is_refused(
        clean_gin):
    """mismatch_fashion_mnist.gin's unlabeled images are
    `load_data.unlabeled`'s, used as they are. Fails if
    `select_labeled.include_labeled_in_unlabeled = False` is let through
    there (tried: without `_check_unlabeled_bindings`, the run trained on
    the same 60,000 images, the labeled ones among them), or refused where
    the unlabeled images are the labeled source's others (the curated
    config)."""
    binding = 'select_labeled.include_labeled_in_unlabeled = False'
    configurables.parse(['mismatch_fashion_mnist.gin'], [binding])
    with pytest.raises(checks.ConfigError, match=re.escape(
            f'{binding} is bound, but load_data.unlabeled gives the '
            'unlabeled images, which are used as they are')):
        config_checks.check_config(pretraining=False)
    gin.clear_config()
    configurables.parse(['mismatch_fashion_mnist_curated.gin'], [binding])
    config_checks.check_config(pretraining=False)


def test_a_labeled_folder_of_one_class_is_refused(run_main, tmp_path):
    """PAWS classifies each view among the support's classes: one class
    would train on a constant target. Fails if config_checks lets a
    labeled folder of one class through (or advises SUPPORT_CLASSES = 1)."""
    for name in ('labeled/cats', 'unlabeled', 'test/cats'):
        (tmp_path / name).mkdir(parents=True)
    with pytest.raises(checks.DataError, match=(
            f"^LABELED_DIR = '{tmp_path / 'labeled'}' holds one class "
            r"folder \('cats'\): PAWS needs labeled images of at least two "
            r'classes .* Add a folder of images for each other class\.$')):
        run_main('--gin_file=image_folders_small.gin',
                 f'--model_dir={tmp_path / "run"}',
                 *[f'--gin_bindings={b}'
                   for b in image_folders.path_bindings(tmp_path)])
    assert not (tmp_path / 'run').exists()


def test_ctrl_c_is_one_plain_line(run_main, tmp_path, capsys,
                                  monkeypatch):
    """Ctrl-C (KeyboardInterrupt) during a mode exits with 130 and one
    line saying how to resume. Fails if it ends in a traceback (it did,
    with nothing on how to go on)."""
    def interrupted(*_):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.MODES, 'export', modes.Mode(interrupted))
    with pytest.raises(SystemExit) as stopped:
        run_main('--gin_file=debug.gin', f'--model_dir={tmp_path / "run"}',
                 '--mode=export', printed=True)
    assert stopped.value.code == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        'Error: interrupted (Ctrl-C). The same command resumes a training '
        'run from its newest backup or checkpoint.')


def test_an_error_is_one_plain_line(run_main, tmp_path, capsys):
    """run.py prints a user's error as `Error: <message>` on stderr and
    exits with its code. Fails if it is logged as an absl record
    (`E1128 06:10:06.595101 140475126840192 cli.py:217] ...`)."""
    with pytest.raises(SystemExit) as stopped:
        run_main(f'--model_dir={tmp_path / "run"}', printed=True)
    assert stopped.value.code == checks.ConfigError.EXIT_CODE
    assert capsys.readouterr().err == (
        'Error: --gin_file is required: it names the experiment, e.g. '
        '--gin_file=debug.gin (an install check); --list_configs names the '
        'shipped configs.\n')


def _existing_model(root, channels):
    """A run directory whose embedder export takes `channels`, as far as
    the checks look (its preprocessing file), and a labeled and a test
    folder; returns the bindings of the folders."""
    embedder = root / 'model' / 'export' / 'embedder'
    embedder.mkdir(parents=True)
    (embedder / export.PREPROCESSING_FILENAME).write_text(
        json.dumps(dict(channels=channels)))
    for name in ('labeled/a', 'labeled/b', 'test/a', 'test/b'):
        (root / name).mkdir(parents=True)
    return [f"LABELED_DIR = '{root / 'labeled'}'",
            f"TEST_DIR = '{root / 'test'}'"]


@pytest.mark.parametrize('model,extra,message', [
    ('mnie', [], r"^MODEL = '{root}/mnie' does not exist: bind it to the "
     r'model to evaluate \(a run directory or its export/embedder\)\.$'),
    ('labeled', [], r"^MODEL = '{root}/labeled' is neither an embedder "
     r'export nor a run directory with one'),
    ('model', ['CHANNELS = 3'], r'^The model of {root}/model/export/embedder '
     r'takes 1-channel images, but CHANNELS = 3: bind CHANNELS = 1'),
], ids=['missing', 'no export', 'other channels'])
def test_an_existing_model_is_checked_before_anything_is_written(
        run_main, tmp_path, model, extra, message):
    """docs/own_images.md's evaluate_nn of an existing model: a typo in
    MODEL says the path does not exist, in the macro the user bound; a
    model of other channels is refused; nothing is written in model_dir.
    Fails if the message names evaluate_nn.from_model, or says 'export it
    first' for a path that does not exist, or if the channels are checked
    only once the mode runs (after config_evaluate_nn.gin and flags.txt
    are written)."""
    folders = _existing_model(tmp_path, channels=1)
    with pytest.raises(checks.ConfigError,
                       match=message.format(root=tmp_path)):
        run_main('--gin_file=existing_model_folders.gin',
                 f'--model_dir={tmp_path / "run"}', '--mode=evaluate_nn',
                 f"--gin_bindings=MODEL = '{tmp_path / model}'",
                 *[f'--gin_bindings={b}' for b in folders + extra])
    assert not (tmp_path / 'run').exists()


@pytest.mark.parametrize('mode', ['train_and_evaluate', 'export', 'demo'])
def test_an_existing_model_for_another_mode_than_evaluate_nn_is_refused(
        run_main, tmp_path, mode):
    """Only --mode=evaluate_nn evaluates `evaluate_nn.from_model`. Fails if
    another mode lets it through before anything is written (tried:
    without the check, each mode went on, to an error of its own for want
    of a training config here; with one, `modes._paws_nn` evaluates the
    run's own model, the existing one unread)."""
    folders = _existing_model(tmp_path, channels=1)
    with pytest.raises(checks.ConfigError, match=re.escape(
            f'evaluate_nn.from_model is bound, but --mode={mode} does not '
            'read it: only --mode=evaluate_nn evaluates an existing model')):
        run_main('--gin_file=existing_model_folders.gin',
                 f'--model_dir={tmp_path / "run"}', f'--mode={mode}',
                 f"--gin_bindings=MODEL = '{tmp_path / 'model'}'",
                 *[f'--gin_bindings={b}' for b in folders + ['CHANNELS = 1']])
    assert not (tmp_path / 'run').exists()


def test_an_existing_model_is_resolved_once(run_main, tmp_path,
                                            monkeypatch):
    """`MODEL = <a run directory>`: the config check finds its embedder
    export, and the mode evaluates that export, the binding read once.
    Fails if the mode resolves `evaluate_nn.from_model` again where it
    starts (it did: `config_checks.existing_model` ran in `check_config`
    and in `modes._export_or_evaluate`)."""
    folders = _existing_model(tmp_path, channels=1)
    resolved, evaluated = [], []
    existing_model = config_checks.existing_model

    def counted():
        resolved.append(existing_model())
        return resolved[-1]

    monkeypatch.setattr(config_checks, 'existing_model', counted)
    monkeypatch.setattr(modes, 'evaluate_existing',
                        lambda run, strategy, embedder: evaluated.append(
                            embedder))
    run_main('--gin_file=existing_model_folders.gin',
             f'--model_dir={tmp_path / "run"}', '--mode=evaluate_nn',
             f"--gin_bindings=MODEL = '{tmp_path / 'model'}'",
             *[f'--gin_bindings={b}' for b in folders + ['CHANNELS = 1']])
    export_dir = str(tmp_path / 'model' / 'export' / 'embedder')
    assert (resolved, evaluated) == ([export_dir], [export_dir])
