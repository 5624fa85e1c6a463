"""Installed use: `pip install .` ships the gin configs as package data and
the `paws-tf` program, which runs from any directory."""

import os
import re
import pathlib
import shutil
import site
import subprocess
import sys
import sysconfig
import tomllib
import zipfile

import pytest

from paws_tf import configurables

REPO = pathlib.Path(__file__).resolve().parents[1]
# What a build reads from the checkout (pyproject.toml names README.md).
BUILD_INPUTS = ('pyproject.toml', 'README.md', 'paws_tf', 'gin_configs')
# debug.gin, one epoch of 16 steps without a warm-up: seconds on a CPU.
TINY = ('train.num_epochs = 1', 'WarmupCosineDecay.warmup_fraction = 0',
        'train.view_images = False', 'train.verbose = 0')


def copy_sources(dest):
    """Copies what a build reads into `dest`: setuptools writes build/ and
    *.egg-info into the tree it builds, and two test processes building in
    the checkout at once would overwrite each other's files.

    Returns:
        `dest`, a `pathlib.Path`.
    """
    dest = pathlib.Path(dest)
    dest.mkdir(parents=True)
    for name in BUILD_INPUTS:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns(
                '__pycache__', '*.pyc'))
        else:
            shutil.copy(source, dest / name)
    return dest


def clean_env():
    """The environment for installed programs: without PYTHONPATH, which
    would put the checkout on their path."""
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    return dict(env, TF_CPP_MIN_LOG_LEVEL='2',
                PIP_DISABLE_PIP_VERSION_CHECK='1')


def test_the_wheel_holds_every_module_config_and_the_program(tmp_path):
    sources = copy_sources(tmp_path / 'src')
    proc = subprocess.run(
        [sys.executable, '-c', 'import sys; from setuptools import '
         'build_meta; print(build_meta.build_wheel(sys.argv[1]))',
         str(tmp_path / 'dist')],
        cwd=sources, capture_output=True, text=True, timeout=300,
        env=clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheel = tmp_path / 'dist' / proc.stdout.split()[-1]
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(archive.read(name).decode() for name in names
                            if name.endswith('.dist-info/entry_points.txt'))
    configs = sorted(p.name for p in (REPO / 'gin_configs').glob('*.gin'))
    assert configs
    assert {f'paws_tf/gin_configs/{name}' for name in configs} <= names
    # pyproject.toml lists the packages by name: a new one must be added.
    modules = {p.relative_to(REPO).as_posix()
               for p in (REPO / 'paws_tf').rglob('*.py')}
    assert modules <= names, sorted(modules - names)
    assert 'paws-tf = paws_tf.cli:run' in entry_points


def test_a_config_name_resolves_to_the_shipped_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shipped = os.path.join(configurables.CONFIG_DIR, 'debug.gin')
    assert configurables.resolve_gin_file('debug.gin') == shipped
    assert configurables.resolve_gin_file(
        'gin_configs/debug.gin') == os.path.join(
            configurables.CONFIG_ROOT, 'gin_configs', 'debug.gin')
    assert configurables.shipped_configs() == sorted(
        p.name for p in (REPO / 'gin_configs').glob('*.gin'))


def test_a_path_that_exists_wins_over_a_shipped_config(tmp_path,
                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'debug.gin').write_text("include 'gin_configs/debug.gin'\n")
    assert configurables.resolve_gin_file('debug.gin') == 'debug.gin'
    path = str(tmp_path / 'debug.gin')
    assert configurables.resolve_gin_file(path) == path


def test_an_unknown_config_lists_the_shipped_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as error:
        configurables.resolve_gin_file('demo_fashion_mnist_typo.gin')
    message = str(error.value)
    assert '--gin_file=demo_fashion_mnist_typo.gin: no such file' in message
    for name in configurables.shipped_configs():
        assert name in message


def venv_with_this_environment(venv):
    """A fresh virtualenv at `venv` that imports what this interpreter's
    site-packages hold (TensorFlow and the other dependencies), through a
    .pth file, so that nothing is downloaded.

    Returns:
        (its python, its site-packages directory), `pathlib.Path`s.
    """
    subprocess.run([sys.executable, '-m', 'venv', str(venv)], check=True,
                   timeout=300, env=clean_env())
    python = venv / 'bin' / 'python'
    site_packages = pathlib.Path(subprocess.run(
        [str(python), '-c',
         'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
        check=True, capture_output=True, text=True, timeout=60,
        env=clean_env()).stdout.strip())
    ours = dict.fromkeys(
        site.getsitepackages() + [sysconfig.get_paths()['purelib'],
                                  sysconfig.get_paths()['platlib']])
    # A .pth file's lines are appended to sys.path after the venv's own
    # site-packages: the installed paws_tf comes first. The .pth files in
    # those directories (this environment's editable install of the
    # checkout among them) are not run.
    (site_packages / 'dependencies.pth').write_text(
        ''.join(f'{path}\n' for path in ours if os.path.isdir(path)))
    return python, site_packages


@pytest.mark.slow
@pytest.mark.long
def test_paws_tf_installed_runs_from_any_directory(tmp_path):
    python, site_packages = venv_with_this_environment(tmp_path / 'venv')
    sources = copy_sources(tmp_path / 'src')
    subprocess.run(
        [str(python), '-m', 'pip', 'install', '--quiet', '--no-deps',
         '--no-build-isolation', '--no-index', str(sources)],
        check=True, timeout=600, env=clean_env())
    shutil.rmtree(sources)
    work = tmp_path / 'work'
    work.mkdir()
    paws_tf_program = str(tmp_path / 'venv' / 'bin' / 'paws-tf')

    def run(*args, timeout=300, returncode=0):
        proc = subprocess.run(list(args), cwd=work, capture_output=True,
                              text=True, timeout=timeout, env=clean_env())
        assert proc.returncode == returncode, (
            proc.stdout + proc.stderr)[-3000:]
        return proc.stdout

    where = run(str(python), '-c', 'import paws_tf, paws_tf.configurables; '
                'print(paws_tf.__file__); '
                'print(paws_tf.configurables.CONFIG_DIR)')
    package = site_packages.resolve() / 'paws_tf'
    assert [pathlib.Path(p).resolve() for p in where.split()] == [
        package / '__init__.py', package / 'gin_configs']
    assert run(paws_tf_program, '--list_configs').split() == sorted(
        p.name for p in (REPO / 'gin_configs').glob('*.gin'))
    # absl's --help prints the usage and exits with 1.
    usage = run(paws_tf_program, '--help', returncode=1)
    assert 'paws-tf --gin_file=debug.gin' in usage
    assert '--gin_file' in usage and '--model_dir' in usage

    # debug.gin includes 'gin_configs/base.gin': found in the package.
    model_dir = tmp_path / 'run'
    output = run(paws_tf_program, '--gin_file=debug.gin',
                 f'--model_dir={model_dir}', '--mode=train_and_evaluate',
                 *[f'--gin_bindings={b}' for b in TINY], timeout=900)
    assert 'PAWS-NN' in output
    assert (model_dir / 'checkpoints' / 'checkpoint').exists()
    for name in ('embedder', 'classifier'):
        assert (model_dir / 'export' / name / 'saved_model.pb').exists()
    assert (model_dir / 'eval' / 'paws_nn.json').exists()
    assert (model_dir / 'operative_config.gin').exists()


def make_commands(target):
    """The commands `make -n TARGET` would run for a venv not yet built."""
    proc = subprocess.run(
        ['make', '-n', target, 'VENV=/nonexistent/venv'], cwd=REPO,
        capture_output=True, text=True, timeout=60, check=True)
    return proc.stdout


def requirement_names(path):
    return {re.split(r'[=<>\[ ;]', line.strip())[0].lower()
            for line in (REPO / path).read_text().splitlines()
            if line.strip() and not line.startswith('#')}


def test_the_runtime_install_holds_no_pytorch_and_the_tests_do(tmp_path):
    """`make`, `make demo`, `make check` and `pip install .` install the
    runtime alone; the test targets add PyTorch and pytest.

    Fails if torch (or pytest) moves into requirements.txt or pyproject's
    dependencies, or if `make test` stops installing
    requirements-test.txt."""
    runtime = requirement_names('requirements.txt')
    tests = requirement_names('requirements-test.txt')
    assert {'tensorflow', 'tf_keras', 'tensorboard'} <= runtime
    assert not {'torch', 'torchvision', 'pytest'} & runtime
    assert {'torch', 'pytest', 'pytest-xdist'} <= tests
    with open(REPO / 'pyproject.toml', 'rb') as f:
        project = tomllib.load(f)['project']
    depends = {re.split(r'[=<>\[ ;]', d)[0].lower()
               for d in project['dependencies']}
    assert not {'torch', 'torchvision', 'pytest'} & depends
    assert 'torch' in ' '.join(project['optional-dependencies']['torch'])
    for target in ('venv', 'demo', 'check'):
        commands = make_commands(target)
        assert 'pip install --quiet -r requirements.txt' in commands
        assert 'requirements-test.txt' not in commands, target
    for target in ('test', 'test-long', 'test-fast'):
        commands = make_commands(target)
        assert 'pip install --quiet -r requirements.txt' in commands
        assert 'pip install --quiet -r requirements-test.txt' in commands
        assert commands.index('requirements-test.txt') < commands.index(
            '-m pytest'), target
