"""A run that tests share, made once per pytest run, not once per test
process.

pytest-xdist's processes each build a module-scoped fixture again when they
run tests of its module, and work stealing splits modules between them: a
run that tests only read or copy is made here, in a directory every process
of the pytest run sees, by the first process that needs it; the others wait
for it (a lock file) and read what it made.
"""

import fcntl
import json
import os
import shutil


def made(tmp_path_factory, name, make):
    """`(directory, value)`: the directory `name` of this pytest run and the
    JSON value `make(directory)` returned when the first process that asked
    for `name` ran it. A `make` that raised is run again, on an emptied
    directory, by the next process that asks."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get('PYTEST_XDIST_WORKER'):
        base = base.parent  # The pytest run's, above each process's own.
    directory, record = base / name, base / f'{name}.json'
    with open(base / f'{name}.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # Released when the file closes.
        if not record.exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            record.write_text(json.dumps(make(directory)))
    return directory, json.loads(record.read_text())
