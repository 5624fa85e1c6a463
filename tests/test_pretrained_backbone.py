"""`train.pretrained_backbone` and `train.pretrained_model` through run.py,
as docs/operations.md gives them: the run starts from the file's backbone
weights, or from an earlier run's whole model, and a file of another
architecture or channel count is refused before any image is read.

Bugs tried: the backbone file not loaded (`load_backbone_weights`
skipped); `start.start` checking the file after reading the data;
`check_pretrained` building the model for 3 channels whatever the
folders decode to (the grayscale run started from the RGB model's
checkpoint and stopped on its missing folder instead).
"""

import os
import re

import gin
import numpy as np
import pytest
import tensorflow as tf

from paws_tf import run_dir
from paws_tf.nets import backbones
from paws_tf.runner import architecture
from paws_tf.runner import building
from paws_tf.runner import official_import
from paws_tf.runner import start
from tests.helpers import debug_gin
from tests.helpers import image_folders
from tests.helpers import run_py

# image_folders.SMALL's backbone.
WIDTHS = (8, 16)
# One epoch at a learning rate of 0: LARS moves no weight, so the trained
# backbone's trainable variables are the ones the first step started from.
BINDINGS = image_folders.SMALL + [
    'train.num_epochs = 1', 'train.eval_every_epochs = 0',
    'train.view_images = False', 'WarmupCosineDecay.start_lr = 0.0',
    'WarmupCosineDecay.ref_lr = 0.0', 'WarmupCosineDecay.final_lr = 0.0']


def small_backbone(widths=WIDTHS):
    """The backbone run.py builds for `BINDINGS`, with weights drawn here
    (not its initialiser's)."""
    backbone = backbones.build_backbone(
        'small_resnet', input_channels=3, widths=widths,
        blocks_per_stage=(1,) * len(widths), stage_strides=(2,) * len(widths),
        recompute_bn_relu=True)
    backbone(tf.zeros([1, 32, 32, 3]))
    rng = np.random.default_rng(7)
    for variable in backbone.variables:
        variable.assign(rng.uniform(0.5, 1.5, variable.shape).astype(
            np.float32))
    return backbone


def write_weights(folder, kind, backbone):
    """The backbone's weights as a tf_keras weights file or a
    `tf.train.Checkpoint(backbone=...)` checkpoint; returns the path."""
    if kind == 'h5':
        path = str(folder / 'backbone.h5')
        backbone.save_weights(path)
        return path
    return tf.train.Checkpoint(backbone=backbone).write(
        str(folder / 'backbone_ckpt'))


def run(tmp_path, weights_path, data, *, part='backbone', name='run',
        bindings=(), in_process=None):
    """`(exit code, output)` of run.py from `weights_path`
    (`train.pretrained_{part}`) in `tmp_path / name`; run by `cli.main` in
    this process when `in_process` is `(run_main, capsys)` (the fixtures),
    by a process of its own otherwise."""
    model_dir = tmp_path / name
    bindings = data + [f"train.pretrained_{part} = '{weights_path}'",
                       *bindings]
    config = dict(gin_file='gin_configs/image_folders_small.gin',
                  base_bindings=BINDINGS)
    if in_process:
        return run_py.in_process(*in_process, run_py.command(
            model_dir, bindings, **config))
    return run_py.finish(run_py.start(model_dir, bindings, **config),
                         timeout=300)


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp('images')
    return image_folders.write_experiment(root, unlabeled=6, test=1)


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize('kind', ['h5', 'checkpoint'])
def test_run_starts_from_the_files_backbone(tmp_path, kind, data):
    """Fails if train.pretrained_backbone is not loaded into the trained
    model (building.py's load_backbone_weights call skipped)."""
    backbone = small_backbone()
    path = write_weights(tmp_path, kind, backbone)
    code, output = run(tmp_path, path, data)
    assert code == 0, output[-3000:]
    trained = tf.train.load_checkpoint(tf.train.latest_checkpoint(
        str(tmp_path / 'run' / 'checkpoints')))
    # The file's values under the run checkpoint's names: run.py saves the
    # backbone as `tf.train.Checkpoint(model=...)` does, under
    # model/backbone/.
    reference = write_weights(tmp_path / 'reference', 'checkpoint', backbone)
    compared = 0
    for name, _ in tf.train.list_variables(reference):
        if not name.startswith('backbone/') or 'moving_' in name:
            continue  # Batch norm's moving statistics moved in the step.
        np.testing.assert_array_equal(
            trained.get_tensor(f'model/{name}'),
            tf.train.load_checkpoint(reference).get_tensor(name), name)
        compared += 1
    # 7 convolutions, 7 batch norms' gamma and beta.
    assert compared == len(backbone.trainable_variables) == 21


@pytest.mark.slow
@pytest.mark.long
def test_a_file_of_another_architecture_is_refused_before_reading(
        tmp_path, data, run_main, capsys):
    """Fails if run.py reads the data before checking the file
    (`start.start` checking it after loading the data: the missing
    unlabeled folder is found first). The .h5 file refused by run.py, the
    checkpoint by `cli.main` in this process."""
    # Wider second stage; the unlabeled folder does not exist, so a run
    # that read its data first would stop on that instead.
    backbone = small_backbone(widths=(8, 32))
    data = data[:1] + [f"UNLABELED_DIR = '{tmp_path / 'missing'}'"] + data[2:]
    for kind, in_process in (('h5', None), ('checkpoint', (run_main, capsys))):
        path = write_weights(tmp_path, kind, backbone)
        code, output = run(tmp_path, path, data, in_process=in_process)
        assert code == os.EX_CONFIG, output[-3000:]
        assert 'Traceback' not in output
        line = output.strip().splitlines()[-1]
        assert (f"train.pretrained_backbone = '{path}' does not fit the "
                'configured backbone: ') in line, output
        # The first variable that does not fit, with both shapes.
        assert 'stage2_block1_' in line
        assert '16' in line and '32' in line
        assert 'Normalisation computed' not in output
        assert not (tmp_path / 'run').exists()


@pytest.mark.parametrize('channels', [1, 3])
def test_the_check_of_a_source_of_unknown_channels(tmp_path, channels):
    """debug.gin's synthetic source has its channels known only once read:
    a file of its backbone for 1 or 3 channels passes the check before
    reading, one of a wider backbone is refused naming the binding.
    Fails if check_pretrained tries only 3 channels there."""
    with debug_gin.parsed():
        fitting = building.build_local_model(
            input_channels=channels).backbone
    wider = small_backbone(widths=(8, 32))
    for backbone, fits in ((fitting, True), (wider, False)):
        path = write_weights(tmp_path, 'h5', backbone)
        bound = (str(path), 'train.pretrained_backbone')
        with debug_gin.parsed():
            if fits:
                start.check_pretrained(run_dir.RunDir(tmp_path / 'run'), bound)
            else:
                with pytest.raises(ValueError, match=(
                        "train.pretrained_backbone = '.*' does not fit the "
                        'configured backbone')):
                    start.check_pretrained(
                        run_dir.RunDir(tmp_path / 'run'), bound)


@pytest.fixture(scope='module')
def earlier(tmp_path_factory, data):
    """A run of `BINDINGS` with another seed than the runs that start from
    it, so that their own initial weights differ from its."""
    model_dir = tmp_path_factory.mktemp('earlier') / 'run'
    code, output = run_py.finish(run_py.start(
        model_dir, data + ['train.seed = 1'],
        gin_file='gin_configs/image_folders_small.gin',
        base_bindings=BINDINGS), timeout=300)
    assert code == 0, output[-3000:]
    return model_dir


@pytest.mark.slow
@pytest.mark.long
def test_a_run_starts_from_an_earlier_runs_whole_model(tmp_path, data,
                                                       earlier):
    """At a learning rate of 0 the new run's trainable weights stay the
    earlier run's, backbone and heads; its optimizer starts at step 0; the
    config and the run history name the model it started from.

    Fails if only the backbone is read (the heads keep their own
    initialisation), or the optimizer's state is read too (the new run's
    step counts on from the earlier run's)."""
    code, output = run(tmp_path, earlier, data, part='model')
    assert code == 0, output[-3000:]
    source = tf.train.latest_checkpoint(str(earlier / 'checkpoints'))
    theirs = tf.train.load_checkpoint(source)
    new = tf.train.latest_checkpoint(str(tmp_path / 'run' / 'checkpoints'))
    ours = tf.train.load_checkpoint(new)
    heads = compared = 0
    for key, _ in tf.train.list_variables(source):
        if (not key.startswith('model/') or 'moving_' in key
                or 'OPTIMIZER_SLOT' in key):
            continue
        np.testing.assert_array_equal(ours.get_tensor(key),
                                      theirs.get_tensor(key), key)
        compared += 1
        heads += 'backbone' not in key
    assert compared > 21 and heads > 0
    # One epoch each: the new run's own step count, not the sum.
    assert new.endswith(source.rsplit('-', 1)[1])
    history = (tmp_path / 'run' / 'run_history.txt').read_text()
    assert f'from the model of {source}' in history
    assert (f"train.pretrained_model = '{earlier}'" in
            (tmp_path / 'run' / 'config.gin').read_text())


def _refused_before_the_data(tmp_path, earlier, data, binding, in_process):
    """The output of a start from `train.pretrained_model = earlier` with
    `binding`, by `cli.main` in this process (`in_process`: `(run_main,
    capsys)`), which must be refused as a config error, in one line, before
    the run directory is made (the file test above runs this refusal as a
    process)."""
    code, output = run(tmp_path, earlier, data, part='model',
                       bindings=[binding], in_process=in_process)
    assert code == os.EX_CONFIG, output[-3000:]
    assert 'Traceback' not in output
    assert not (tmp_path / 'run').exists()
    return output


@pytest.mark.slow
@pytest.mark.long
def test_a_model_of_another_architecture_is_refused_naming_both(
        tmp_path, data, earlier, run_main, capsys):
    """Fails if the model is not checked before the data is read (the
    missing unlabeled folder would be found first), or the message does
    not name the differing bindings of both sides first, or lists the
    variables that do not fit."""
    data = data[:1] + [f"UNLABELED_DIR = '{tmp_path / 'missing'}'"] + data[2:]
    output = _refused_before_the_data(tmp_path, earlier, data,
                                      'small_resnet.widths = (8, 32)',
                                      (run_main, capsys))
    # The differing bindings first: no variable of the loader's, no
    # advice for the run's own checkpoints ("move it away").
    assert output.strip().splitlines()[-1].endswith(
        f"train.pretrained_model = '{earlier}' does not fit the configured "
        f'model: {earlier} was built with small_resnet.widths = (8, 16); '
        'this config builds small_resnet.widths = (8, 32). Start from a '
        'model of this architecture, or bind its architecture: replace '
        'small_resnet.widths = (8, 32) -> small_resnet.widths = (8, 16).')
    code, output = run(tmp_path, earlier, data, part='model', bindings=[
        f"train.pretrained_backbone = '{earlier}'"],
        in_process=(run_main, capsys))
    assert code == os.EX_CONFIG
    assert ('train.pretrained_backbone and train.pretrained_model are both '
            'bound: bind one') in output


@pytest.mark.slow
@pytest.mark.long
def test_a_model_of_other_channels_is_refused_naming_both(tmp_path, data,
                                                          earlier, run_main,
                                                          capsys):
    """docs/own_images.md: a `train.pretrained_model` of another channel
    count is refused before any image is read, naming both counts. The
    earlier run took RGB images; this config decodes them to grayscale
    (`CHANNELS = 1`, as the config's comment gives it).

    Fails if the check does not try the folders' channels (tried:
    `start.check_pretrained` building the model for 3 channels
    whatever the folders decode to: the run starts), or the message does
    not name the channel counts."""
    data = data[:1] + [f"UNLABELED_DIR = '{tmp_path / 'missing'}'"] + data[2:]
    output = _refused_before_the_data(tmp_path, earlier, data, 'CHANNELS = 1',
                                      (run_main, capsys))
    assert (f"train.pretrained_model = '{earlier}' does not fit the "
            'configured model') in output
    assert (f'{earlier} takes 3-channel images, this config 1.'
            in output), output[-3000:]


@pytest.mark.parametrize('part', ['backbone', 'model'])
def test_a_path_that_does_not_exist_says_so(tmp_path, part):
    """Fails if a typo in the path is reported as a checkpoint that is not
    there ('No TF checkpoint at ...: expected a checkpoint prefix') rather
    than as a path that does not exist."""
    typo = tmp_path / 'runs' / 'mnie'
    with debug_gin.parsed():
        with pytest.raises(ValueError, match=(
                f"^train.pretrained_{part} = '{typo}' does not exist: bind "
                'it to a run directory or a checkpoint')):
            start.check_pretrained(run_dir.RunDir(tmp_path / 'run'), **{
                part: (str(typo), f'train.pretrained_{part}')})


def test_a_run_of_other_batch_norm_settings_is_read(tmp_path):
    """A run whose config binds the same backbone with other batch-norm
    settings (`build_backbone.bn_momentum`, `sync_bn_impl`,
    `recompute_bn_relu`: how it trains and runs, not its architecture)
    gives its backbone and its model to a new run; one of another family
    argument (`small_resnet.stem_stride`, which changes no variable) is
    refused before it is read. Fails if every `build_backbone` line is
    compared (tried: the settings refused as another architecture), or
    the family's lines are left to the read."""
    source = tmp_path / 'earlier'
    (source / 'checkpoints').mkdir(parents=True)
    with debug_gin.parsed():
        model = building.build_local_model(input_channels=3)
        tf.train.CheckpointManager(tf.train.Checkpoint(model=model),
                                   str(source / 'checkpoints'), 1).save()
        config = [line for line in gin.config_str().splitlines()
                  if not line.startswith('build_backbone.recompute')]
    (source / 'config.gin').write_text('\n'.join(config + [
        'build_backbone.bn_momentum = 0.99',
        "build_backbone.sync_bn_impl = 'keras'"]) + '\n')
    for part in ('backbone', 'model'):
        with debug_gin.parsed():
            read = start.check_pretrained(run_dir.RunDir(tmp_path / 'run'), **{
                part: (str(source), f'train.pretrained_{part}')})
        assert read.part == part
    with debug_gin.parsed(['small_resnet.stem_stride = 2']):
        with pytest.raises(ValueError, match=(
                'does not fit the configured backbone: .* was built with '
                'small_resnet.stem_stride = 1; this config builds '
                r'small_resnet.stem_stride = 2. .*: replace '
                'small_resnet.stem_stride = 2 -> small_resnet.stem_stride = '
                '1.')):
            start.check_pretrained(run_dir.RunDir(tmp_path / 'run'), (
                str(source), 'train.pretrained_backbone'))


def _refusal(tmp_path, source_bindings, bindings):
    """What `architecture.refuse_another` says of a run of debug.gin with
    `source_bindings` (its config.gin alone) as the pretrained backbone of
    a config with `bindings`; None when it accepts it."""
    source = tmp_path / 'earlier'
    source.mkdir(exist_ok=True)
    with debug_gin.parsed(source_bindings):
        (source / 'config.gin').write_text(gin.config_str())
    with debug_gin.parsed(bindings):
        try:
            architecture.refuse_another(str(source / 'checkpoints'),
                                        'train.pretrained_backbone',
                                        'backbone')
        except ValueError as error:
            return str(error)
    return None


def test_the_source_runs_architecture_is_compared_by_value(tmp_path):
    """The run a backbone comes from and this config are compared on what
    the named family computes, by value: another family's unused lines, a
    default written out, a training setting (`wide_resnet.
    final_bn_momentum`), a macro of the same value and a list of the
    tuple's values are accepted; a macro of another
    `vit.position_interpolation` is refused. Fails if the config.gin lines
    are compared as text (tried: each accepted case was refused, the
    macro's other value accepted), or a list and a tuple are compared as
    they are (tried: `architecture._comparable` the identity, the list
    refused)."""
    vit = list(debug_gin.VIT)
    wide = ["build_backbone.name = 'wide_resnet'", 'wide_resnet.depth = 10',
            'wide_resnet.width = 1']
    dino = ["INTERPOLATION = 'dino'",
            'vit.position_interpolation = %INTERPOLATION']
    for source_bindings, bindings in (
            (vit, vit + ['small_resnet.widths = (8, 32)']),
            (vit + ['vit.layer_scale = False'], vit),
            (wide, wide + ['wide_resnet.final_bn_momentum = 0.5']),
            (vit + dino, vit + ["vit.position_interpolation = 'dino'"]),
            (['small_resnet.widths = [32, 64, 128]'],
             ['small_resnet.widths = (32, 64, 128)'])):
        assert _refusal(tmp_path, source_bindings, bindings) is None
    assert _refusal(tmp_path, vit + dino, vit + [
        "INTERPOLATION = 'timm'",
        'vit.position_interpolation = %INTERPOLATION']).endswith(
            "replace vit.position_interpolation = 'timm' -> "
            "vit.position_interpolation = 'dino'.")


def test_a_run_of_another_batch_norm_epsilon_is_refused(tmp_path):
    """`build_backbone.bn_epsilon` changes every batch norm's output and no
    variable: a source run of another epsilon is refused naming the edit,
    which once followed is accepted; a ViT, which has no batch norm, is
    accepted at another epsilon. Fails if only the family's arguments are
    compared (tried: `bn_epsilon` left out of `architecture._differences`,
    the run accepted), or if the epsilon is compared for every family
    (tried: the ViT refused with an edit that changes nothing)."""
    vit = list(debug_gin.VIT)
    assert _refusal(tmp_path, vit + ['build_backbone.bn_epsilon = 1e-3'],
                    vit) is None
    refusal = _refusal(tmp_path, ['build_backbone.bn_epsilon = 1e-3'], [])
    assert refusal is not None and refusal.endswith(
        'was built with build_backbone.bn_epsilon = 0.001; this config '
        'builds build_backbone.bn_epsilon = 1e-05. Start from a backbone of '
        'this architecture, or bind its architecture: add '
        'build_backbone.bn_epsilon = 0.001.'), refusal
    assert _refusal(tmp_path, ['build_backbone.bn_epsilon = 1e-3'],
                    ['build_backbone.bn_epsilon = 0.001']) is None


def test_a_run_of_another_family_is_refused_naming_every_edit(tmp_path):
    """A ViT config from a small_resnet run: one message names the
    backbone's name and the source family's arguments against this
    config's (unused) bindings of them, and the config with those edits
    is accepted. Fails if only the name is compared when the names
    differ (tried: the family's arguments compared only under the same
    name, the edited config refused again for `small_resnet.widths`)."""
    source = ['small_resnet.widths = (8, 32)']
    refusal = _refusal(tmp_path, source, debug_gin.VIT)
    edits = (
        "replace build_backbone.name = 'vit_tiny' -> build_backbone.name = "
        "'small_resnet'; replace small_resnet.widths = (8, 16) -> "
        'small_resnet.widths = (8, 32).')
    assert refusal is not None and refusal.endswith(edits), refusal
    assert _refusal(tmp_path, source, list(debug_gin.VIT) + [
        "build_backbone.name = 'small_resnet'",
        'small_resnet.widths = (8, 32)']) is None


def test_a_runs_operative_config_gives_the_defaults_it_used(tmp_path):
    """A run whose config.gin leaves `small_resnet.stem_stride` out was
    built at the default of its day, which its operative_config.gin
    writes (2 here): against a config at today's default (1) it is
    refused naming the operative value, and accepted by a config that
    binds it. Fails if config.gin alone is read (tried: the run judged
    at today's default, accepted)."""
    source = tmp_path / 'earlier'
    source.mkdir()
    with debug_gin.parsed(['small_resnet.stem_stride = 2']):
        building.build_local_model(input_channels=3)
        (source / 'operative_config.gin').write_text(
            gin.operative_config_str())
    refusal = _refusal(tmp_path, [], [])
    assert refusal is not None and refusal.endswith(
        'was built with small_resnet.stem_stride = 2; this config builds '
        'small_resnet.stem_stride = 1. Start from a backbone of this '
        'architecture, or bind its architecture: add '
        'small_resnet.stem_stride = 2.'), refusal
    assert _refusal(tmp_path, [], ['small_resnet.stem_stride = 2']) is None


def test_a_relative_path_is_judged_by_its_own_run(tmp_path, monkeypatch):
    """From a working directory that holds a ViT run's config.gin:
    '../backbone.h5', a file of debug.gin's backbone outside that run,
    is read; 'backbone.h5', a file in that run, is refused naming the run
    by its absolute path. Fails if `architecture.owner` walks the
    relative path's parents by `dirname` (tried: '..' followed by '', the
    working directory's run taken for the file's; the message naming an
    empty run)."""
    vit_run = tmp_path / 'vit_run'
    vit_run.mkdir()
    debug_gin.write_vit_config(vit_run / 'config.gin')
    with debug_gin.parsed():
        backbone = building.build_local_model(input_channels=3).backbone
        for folder in (tmp_path, vit_run):
            write_weights(folder, 'h5', backbone)
        monkeypatch.chdir(vit_run)
        read = start.check_pretrained(run_dir.RunDir(tmp_path / 'run'), (
            '../backbone.h5', 'train.pretrained_backbone'))
        assert read.part == 'backbone'
        with pytest.raises(ValueError, match=(
                "^train.pretrained_backbone = 'backbone.h5' does not fit the "
                f"configured backbone: {vit_run} was built with "
                "build_backbone.name = 'vit_tiny'")):
            start.check_pretrained(run_dir.RunDir(tmp_path / 'run'), (
                'backbone.h5', 'train.pretrained_backbone'))


@pytest.mark.parametrize('part, needs', [
    ('backbone', 'a backbone: a PAWS, DINO, MSN or DINOv2 checkpoint'),
    ('model', 'a pre-trained checkpoint (backbone, fc projection')])
def test_an_imported_fine_tuned_classifier_is_refused_saying_what_it_is(
        tmp_path, part, needs):
    """A fine-tuned import (imported.json of kind 'fine_tuned', its
    SavedModel under fine_tuned/) named by train.pretrained_model or
    train.pretrained_backbone, as its directory or its fine_tuned/ export,
    is refused before any read with what it is and what is needed: a
    pre-trained checkpoint's import for a model, a backbone for a
    backbone; so are evaluate_nn and fine_tune on it. Caught: without the
    refusal, the read of this one ended in 'No TF checkpoint at ...:
    expected a checkpoint prefix', which says nothing of the import; a
    backbone (the binding, and fine_tune: tried, `check_mode` not passing
    `backbone` on) was said to need the heads too."""
    imported = tmp_path / 'fine_tuned_import'
    (imported / 'export' / 'fine_tuned' / 'variables').mkdir(parents=True)
    (imported / 'imported.json').write_text(
        '{"kind": "fine_tuned", "source": "ft.pth.tar"}')
    for path in (imported, imported / 'export' / 'fine_tuned'):
        with debug_gin.parsed():
            with pytest.raises(ValueError, match=(
                    f"^{imported} holds the fine-tuned classifier imported "
                    r'from ft.pth.tar \(its SavedModel is .*\): '
                    f"train.pretrained_{part} = '{path}' needs "
                    + re.escape(needs))):
                start.check_pretrained(run_dir.RunDir(tmp_path / 'run'), **{
                    part: (str(path), f'train.pretrained_{part}')})
    # A mode on the import: fine_tune runs on a backbone, evaluate_nn not.
    mode = 'fine_tune' if part == 'backbone' else 'evaluate_nn'
    with pytest.raises(ValueError, match=f'--mode={mode} needs ' + re.escape(
            needs)):
        official_import.check_mode(run_dir.RunDir(str(imported)), mode,
                                   backbone=part == 'backbone')


@pytest.mark.parametrize('theirs, ours', [
    ("ProjectionHead.activation = 'gelu'",
     "ProjectionHead.activation = 'relu'"),
    ('ProjectionHead.bn_epsilon = 0.001',
     'ProjectionHead.bn_epsilon = 1e-05')])
def test_the_source_runs_heads_are_compared_for_a_model(tmp_path, theirs,
                                                        ours):
    """A run whose projection head used GELU or another batch-norm epsilon
    (`ProjectionHead.activation`, `.bn_epsilon`, which make no variable)
    given as train.pretrained_model to a config of ReLU heads at the
    default epsilon is refused before any read, naming both lines and the
    edit; as train.pretrained_backbone (fresh heads) it is accepted.
    Caught: the heads were not compared, and the model's weights were read
    into heads that compute another function; the heads' epsilon was not
    compared (tried: `bn_epsilon` left out of the heads' keys in
    `architecture._differences`, the model accepted)."""
    source = tmp_path / 'earlier'
    source.mkdir()
    with debug_gin.parsed([theirs]):
        (source / 'config.gin').write_text(gin.config_str())
    with debug_gin.parsed():
        with pytest.raises(ValueError, match=re.escape(
                f'was built with {theirs}; this config builds {ours}. Start '
                'from a model of this architecture, or bind its '
                f'architecture: add {theirs}.')):
            architecture.refuse_another(str(source), 'train.pretrained_model',
                                        architecture.MODEL)
        architecture.refuse_another(str(source), 'train.pretrained_backbone',
                                    architecture.BACKBONE)
