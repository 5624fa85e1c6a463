"""The package selects the Keras 2 API for the whole process and does not
load the demo."""

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest
import tensorflow as tf
import tf_keras

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_tf_keras_is_tf_keras():
    assert tf.keras.Model is tf_keras.Model


def _python(code):
    """Runs `code` in a fresh Python that imports this checkout."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=300, env=env)


def test_import_after_keras3_resolved_fails_clearly():
    code = ('import os; os.environ["TF_USE_LEGACY_KERAS"] = "0"\n'
            'import tensorflow as tf; tf.keras.Model\n'
            'import paws_tf\n')
    proc = _python(code)
    assert proc.returncode != 0
    assert 'TF_USE_LEGACY_KERAS=1' in proc.stderr



@pytest.mark.slow
def test_the_library_does_not_load_the_demo():
    # Every name of the package's face and the modules that train,
    # evaluate, fine-tune, export and run the modes; then the program,
    # which registers the demo's gin configurables (configs bind them) but
    # loads its mode, report and plotting only when --mode=demo runs.
    code = (
        'import sys\n'
        'def loaded():\n'
        '    print(" ".join(m for m in sys.modules if "paws_tf" in m))\n'
        'import paws_tf\n'
        'for name in paws_tf.__all__: getattr(paws_tf, name)\n'
        'from paws_tf.evaluation import fine_tune\n'
        'from paws_tf.runner import modes, official_import, train\n'
        'loaded()\n'
        'from paws_tf import cli\n'
        'loaded()\n')
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    library, program = (set(line.split())
                        for line in proc.stdout.splitlines()[-2:])
    assert {'paws_tf.model', 'paws_tf.runner.modes',
            'paws_tf.evaluation.fine_tune'} <= library
    assert not {name for name in library if name.startswith('paws_tf.demo')}
    assert 'paws_tf.demo.supervised' in program
    assert 'paws_tf.demo.run_demo' not in program


def _layout_rows():
    """README's "Code layout": each row's modules of paws_tf, in order."""
    readme = (ROOT / 'README.md').read_text()
    table = readme.split('## Code layout', 1)[1].split('\n## ', 1)[0]
    rows = []
    for line in table.splitlines():
        cells = line.split('|')
        if len(cells) < 3 or 'paws_tf/' not in cells[1]:
            continue
        names = re.findall(r'`([^`]+)`', cells[1])
        # `paws_tf/checks.py`, `dist.py`: the first names the folder.
        folder = names[0].rsplit('/', 1)[0] if '/' in names[0] else ''
        rows.append([os.path.join(folder, name.split('/')[-1])
                     if '/' not in name else name.rstrip('/')
                     for name in names])
    return rows


def test_modules_import_only_from_their_row_and_the_rows_above():
    """README's code layout is the import graph: every module of paws_tf
    has a row, and imports from its own row and those above only. Fails
    if checkpoints.py and run_dir.py are put back in the rows they held
    (checkpoints.py above run_dir.py, which it imports), or if a module is
    added without a row."""
    rows = _layout_rows()

    def row_of(path):
        for i, names in enumerate(rows):
            for name in names:
                if path == name or path.startswith(name + '/'):
                    return i
        return None

    package = ROOT / 'paws_tf'
    unplaced, upward = [], []
    for path in sorted(package.rglob('*.py')):
        relative = 'paws_tf/' + path.relative_to(package).as_posix()
        if relative == 'paws_tf/__init__.py':
            continue  # The package's face re-exports every row.
        row = row_of(relative)
        if row is None:
            unplaced.append(relative)
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and
                    node.module.startswith('paws_tf')):
                continue
            for alias in node.names:
                target = f'{node.module}.{alias.name}'.replace('.', '/')
                found = [row_of(target + suffix) for suffix in
                         ('.py', '/__init__.py')] + [
                             row_of(node.module.replace('.', '/') + '.py')]
                imported = next((r for r in found if r is not None), None)
                if imported is not None and imported > row:
                    upward.append(f'{relative} imports {target}')
    assert not unplaced, f'modules without a row in README: {unplaced}'
    assert not upward, upward
