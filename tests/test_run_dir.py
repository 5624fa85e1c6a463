"""`RunDir` names every path of a run directory, the ones docs/operations.md
lists and no others, and writes the run's records."""

import os
import pathlib
import re
import socket

from paws_tf import run_dir

_DOC = pathlib.Path(__file__).parent.parent / 'docs' / 'operations.md'


def documented_paths():
    """The paths of the fenced block under "What a run directory holds"."""
    section = _DOC.read_text().split('## What a run directory holds')[1]
    block = section.split('```')[1]
    return {line.split()[0].rstrip('/') for line in block.splitlines()
            if line.strip()}


def run_dir_paths():
    """Every path a `RunDir` names, relative to its root."""
    run = run_dir.RunDir('/root')
    paths = {run.mode_config('<mode>'), run.tensorboard}
    for name, value in vars(run_dir.RunDir).items():
        if isinstance(value, property) and isinstance(
                getattr(run, name), (str, run_dir.RunDir)):
            paths.add(os.fspath(getattr(run, name)))
    return {os.path.relpath(path, '/root') for path in paths}


def test_the_documented_layout_is_the_run_dirs():
    """Fails if a `RunDir` path is renamed (e.g. `results.png` to
    `figure.png`), or one is added or dropped in either place."""
    documented = documented_paths()
    assert 'run.lock' in documented and 'export/embedder' in documented
    assert documented == run_dir_paths()


def test_data_records_wait_in_staging_until_accepted(tmp_path):
    """Fails if `accept_staged(False)` moves the staged records in, or if
    `accept_staged()` leaves them out or leaves the staging directory."""
    run = run_dir.RunDir(tmp_path)
    run.write_split(['a.png', 'b.png'], '2 labeled of 9 (seed 0)')
    assert pathlib.Path(run.split).read_text() == (
        '# 2 labeled of 9 (seed 0)\na.png\nb.png\n')
    staged = run.staging
    staged.write_split(['c.png'], '1 labeled of 9 (seed 1)')
    staged.write_json(staged.normalization,
                      {'mean': [0.5], 'std': [0.25]})
    run.accept_staged(False)  # A refused start.
    assert not os.path.exists(run.staging)
    assert pathlib.Path(run.split).read_text().endswith('a.png\nb.png\n')
    assert run.read_json(run.normalization) is None
    staged.write_split(['c.png'], '1 labeled of 9 (seed 1)')
    staged.write_json(staged.normalization,
                      {'mean': [0.5], 'std': [0.25]})
    run.accept_staged()
    assert not os.path.exists(run.staging)
    assert pathlib.Path(run.split).read_text() == (
        '# 1 labeled of 9 (seed 1)\nc.png\n')
    assert run.read_json(run.normalization) == {'mean': [0.5], 'std': [0.25]}


def test_history_lines_are_appended_with_time_host_and_pid(tmp_path):
    """Fails if `record_event` overwrites the history instead of appending,
    or drops the time, host or pid."""
    run = run_dir.RunDir(tmp_path)
    assert run.record_event('started') == 'started'
    run.record_event('finished')
    lines = pathlib.Path(run.history).read_text().splitlines()
    prefix = (r'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ' +
              re.escape(f'{socket.gethostname()} pid {os.getpid()}: '))
    assert len(lines) == 2
    assert re.fullmatch(prefix + 'started', lines[0])
    assert re.fullmatch(prefix + 'finished', lines[1])
