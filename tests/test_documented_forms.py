"""Every `run.py` and `paws-tf` command of README.md, BUILD.md and docs/,
as the user types it: each code block runs in bash (its loops, variables
and exports expanded by bash itself) with `python` and `paws-tf` recording
their arguments instead of running, and every recorded command's flags and
gin files parse and pass the checks run.py makes before reading any data.
The commands run end to end, shrunk, in test_shipped_configs.py,
test_documented_commands.py and test_existing_model.py; this test holds
their every written form, those loops included.

Bugs tried, each caught here: docs/ropaws.md's seed loop naming
`mismatch_fashion_mnist_curated_ropaw` (a config that does not exist);
a binding of a parameter renamed in the code (`build_backbone.widths`,
now `small_resnet.widths`) in docs/own_images.md; `--mode=evaluate`
(no such mode) in README.md.
"""

import pathlib
import re
import subprocess

from absl import flags
import gin
import pytest

from paws_tf import cli
from paws_tf import configurables
from paws_tf.runner import config_checks

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / 'README.md', ROOT / 'BUILD.md',
             *sorted((ROOT / 'docs').glob('*.md'))]
BLOCK = re.compile(r'^```[\w-]*\n(.*?)^```', re.M | re.S)
# Shell functions in place of the programs: a run.py command (`python
# run.py ...` or `paws-tf ...`) appends its arguments to $RECORDED, each
# ended by NUL, the command by a newline; every other program is a no-op,
# but for a launcher's (srun's) python command.
SHIMS = r'''
record() { { printf '%s\0' "$@"; printf '\n'; } >> "$RECORDED"; }
python() { if [ "$1" = run.py ]; then shift; record "$@"; fi; }
python3() { python "$@"; }
paws-tf() { record "$@"; }
command_not_found_handle() {  # srun, mpirun, ... run what follows.
  while [ $# -gt 0 ] && [ "$1" != python ]; do shift; done
  if [ $# -gt 0 ]; then "$@"; fi
}
'''
# Configs whose documented paths are the user's data or model, and the
# binding of a model that an earlier command of the block makes: checked
# once they exist (test_documented_commands.py).
PLACEHOLDER_CONFIGS = ('image_folders', 'existing_model_folders')
MODEL_BINDING = re.compile(r'^(MODEL|evaluate_nn\.from_model) =')


def _blocks():
    """(document, block) for each code block that runs run.py."""
    for path in DOCUMENTS:
        for block in BLOCK.findall(path.read_text()):
            if re.search(r'(^|\s)(python3? run\.py|paws-tf) ', block, re.M):
                yield path.relative_to(ROOT), block


def _recorded(block, tmp_path):
    """The argument lists of the run.py commands `block` runs."""
    recorded = tmp_path / 'recorded'
    recorded.touch()
    subprocess.run(['/bin/bash', '-c', SHIMS + block], check=True,
                   cwd=tmp_path, timeout=60,
                   env={'PATH': str(tmp_path / 'no_programs'),
                        'RECORDED': str(recorded), 'HOME': str(tmp_path)})
    return [line.rstrip('\0').split('\0')
            for line in recorded.read_text().splitlines()]


BLOCKS = list(_blocks())


def test_the_documents_have_run_py_blocks():
    assert len(BLOCKS) >= 15


@pytest.fixture
def parsed_flags():
    """absl's flags parsed from a command's arguments, restored after."""
    def parse(arguments):
        flags.FLAGS.unparse_flags()
        flags.FLAGS(['run.py', *arguments])
    yield parse
    flags.FLAGS.unparse_flags()


@pytest.mark.parametrize('document,block', BLOCKS,
                         ids=[f'{d}:{i}' for i, (d, _) in enumerate(BLOCKS)])
def test_a_documented_command_passes_run_pys_first_checks(
        document, block, tmp_path, monkeypatch, clean_gin, parsed_flags):
    """Fails if a documented command names a config, mode, flag or binding
    that run.py refuses before reading any data."""
    commands = _recorded(block, tmp_path)
    assert commands, f'{document}: no run.py command ran in\n{block}'
    monkeypatch.chdir(ROOT)
    for arguments in commands:
        shown = f'{document}: run.py {" ".join(arguments)}'
        if '--list_configs' in arguments:
            assert configurables.shipped_configs(), shown
            continue
        if any(a.startswith('[') for a in arguments):
            continue  # README's synopsis of run.py's flags.
        # The placeholders of a cluster recipe's shell: a path of its own.
        arguments = [a.replace('/shared/runs', str(tmp_path / 'runs'))
                     for a in arguments]
        try:
            parsed_flags(arguments)
            mode = cli.MODES[flags.FLAGS.mode]
            cli._check_flags(mode)  # pylint: disable=protected-access
            gin.clear_config()
            configurables.parse(flags.FLAGS.gin_file,
                                flags.FLAGS.gin_bindings)
            if not (any(name in path for path in flags.FLAGS.gin_file
                        for name in PLACEHOLDER_CONFIGS) or
                    any(MODEL_BINDING.match(binding)
                        for binding in flags.FLAGS.gin_bindings)):
                config_checks.check_config(pretraining=mode.trains,
                                           mode=flags.FLAGS.mode)
        except (flags.Error, ValueError) as error:
            pytest.fail(f'{shown}\n{type(error).__name__}: {error}')
