"""One writer per run directory: a second training run stops before touching
the first one's directory; a lock whose holder is gone is taken over."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers import run_py
from paws_tf import cluster
from paws_tf import run_dir
from paws_tf.runner import run_lock

def write_lock(model_dir, **contents):
    os.makedirs(model_dir, exist_ok=True)
    pathlib.Path(run_dir.RunDir(model_dir).lock).write_text(
        json.dumps(contents))


def test_a_live_holder_is_named_and_a_gone_one_taken_over(tmp_path, caplog):
    now = time.time()
    # Another host, heartbeat fresh: held.
    write_lock(tmp_path, host='node7', pid=4242, started=now - 60,
               heartbeat=now - 5)
    with pytest.raises(run_lock.Held) as held:
        run_lock.RunLock(run_dir.RunDir(tmp_path)).acquire()
    message = str(held.value)
    assert 'host node7, pid 4242, started' in message
    assert 'another --model_dir' in message and 'kill 4242' in message
    # Another host, heartbeat older than the timeout: taken over.
    write_lock(tmp_path, host='node7', pid=4242, started=now - 3600,
               heartbeat=now - run_lock.STALE_AFTER_SECONDS - 1)
    with run_lock.RunLock(run_dir.RunDir(tmp_path)):
        holder = run_lock.read(run_dir.RunDir(tmp_path).lock)
        assert holder['pid'] == os.getpid()
        assert holder['host'] == socket.gethostname()
    assert 'heartbeat is' in caplog.text and 'node7' in caplog.text
    assert not os.path.exists(run_dir.RunDir(tmp_path).lock)  # Released.
    # This host, a process that has exited: taken over.
    gone = subprocess.Popen([sys.executable, '-c', 'pass'])
    gone.wait()
    write_lock(tmp_path, host=socket.gethostname(), pid=gone.pid,
               started=now, heartbeat=now)
    with run_lock.RunLock(run_dir.RunDir(tmp_path)):
        pass
    assert f'process {gone.pid} is not running' in caplog.text
    # This host, a live process (this one's parent): held.
    write_lock(tmp_path, host=socket.gethostname(), pid=os.getppid(),
               pid_start=run_lock._process_start(os.getppid()), started=now,
               heartbeat=now)
    with pytest.raises(run_lock.Held):
        run_lock.RunLock(run_dir.RunDir(tmp_path)).acquire()


@pytest.mark.parametrize('text', ['', 'null', '[]', '{}', '1', '{"ho'])
def test_an_empty_lock_goes_stale_by_its_age(tmp_path, text):
    """A holder killed between creating the lock and writing it, or a
    lock file damaged into JSON that is not a holder's.

    Fails if `read` returns such JSON as it is: `null` reads as no lock
    (acquire retries for ever), a list or number breaks `stale_reason`."""
    path = pathlib.Path(run_dir.RunDir(tmp_path).lock)
    path.write_text(text)
    with pytest.raises(run_lock.Held):
        run_lock.RunLock(run_dir.RunDir(tmp_path)).acquire()
    old = time.time() - run_lock.STALE_AFTER_SECONDS - 1
    os.utime(path, (old, old))
    with run_lock.RunLock(run_dir.RunDir(tmp_path)):
        assert run_lock.read(path)['pid'] == os.getpid()


def test_heartbeat_and_release_keep_to_their_own_lock(tmp_path,
                                                      monkeypatch):
    monkeypatch.setattr(run_lock, 'HEARTBEAT_SECONDS', 0.05)
    lock = run_lock.RunLock(run_dir.RunDir(tmp_path), job='job-a').acquire()
    first = run_lock.read(run_dir.RunDir(tmp_path).lock)['heartbeat']
    time.sleep(0.3)
    assert run_lock.read(run_dir.RunDir(tmp_path).lock)['heartbeat'] > first
    # The workers of the same job pass; another job's do not.
    run_lock.check_held_by_job(run_dir.RunDir(tmp_path), 'job-a')
    with pytest.raises(run_lock.Held):
        run_lock.check_held_by_job(run_dir.RunDir(tmp_path), 'job-b')
    # Taken over by another run meanwhile: release leaves that run's lock.
    now = time.time()
    write_lock(tmp_path, host='node7', pid=1, started=now, heartbeat=now,
               token='theirs')
    lock.release()
    assert run_lock.read(run_dir.RunDir(tmp_path).lock)['token'] == 'theirs'


def lock_holder(model_dir, proc, timeout=300):
    """The lock of `model_dir` once `proc` has taken it and trains."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        holder = run_lock.read(run_dir.RunDir(model_dir).lock)
        if holder and holder.get('pid') == proc.pid and os.path.isdir(
                model_dir / 'backup' / 'chief'):
            return holder
        time.sleep(0.2)
    raise TimeoutError('the first run never took the lock')


@pytest.mark.slow
@pytest.mark.long
def test_second_run_stops_before_touching_a_live_runs_directory(
        tmp_path, run_main, capsys, caplog):
    """The first run is run.py; the second start and the export are
    `cli.main` in this process (its refusal printed as run.py prints it;
    `test_cluster_workers_refuse_a_directory_another_run_holds` runs the
    refusal as processes)."""
    # Long enough to outlive the second run; stopped by SIGTERM.
    bindings = ['train.num_epochs = 50']
    first = run_py.start(tmp_path, bindings)
    try:
        holder = lock_holder(tmp_path, first)
        written = {name: (tmp_path / name).read_bytes()
                   for name in ('flags.txt', 'config.gin',
                                'data_fingerprint.json', 'labeled_split.txt')}
        # absl's INFO records, which run.py prints, kept for `caplog`.
        code, output = run_py.in_process(run_main, capsys, run_py.command(
            tmp_path, bindings, ['--overwrite', '--verbosity=0']))
        assert code == os.EX_TEMPFAIL, output[-3000:]
        assert (f'host {holder["host"]}, pid {first.pid}, started'
                in output), output[-3000:]
        assert 'Training steps' not in output + caplog.text
        for name, content in written.items():  # Not even rewritten.
            assert (tmp_path / name).read_bytes() == content, name
        assert first.poll() is None, 'the first run ended too early'
        # Past its first checkpoint (step 8), which the export reads.
        run_py.wait_for_backup(tmp_path, first, 12)
        first.send_signal(signal.SIGTERM)
        code, output = run_py.finish(first)
        assert code == 143, output[-3000:]  # Backed up and stopped...
    finally:
        first.kill()
    assert not os.path.exists(run_dir.RunDir(tmp_path).lock)  # ...released.
    # Reading modes do not take the lock: while a run (this process here)
    # holds it, they read the newest complete checkpoint and say so.
    caplog.clear()
    with run_lock.RunLock(run_dir.RunDir(tmp_path)):
        code, output = run_py.in_process(run_main, capsys, run_py.command(
            tmp_path, bindings, mode='export'))
    assert code == 0, output[-3000:]
    assert f'pid {os.getpid()}' in caplog.text, caplog.text[-3000:]
    assert 'newest complete' in caplog.text
    assert (tmp_path / 'export' / 'embedder' / 'saved_model.pb').exists()


@pytest.mark.slow
@pytest.mark.long
def test_cluster_workers_refuse_a_directory_another_run_holds(tmp_path):
    """Under MultiWorkerMirroredStrategy the chief takes the lock and the
    other worker checks it: both stop when a live run of another job holds
    it (this test process here)."""
    with run_lock.RunLock(run_dir.RunDir(tmp_path)):
        procs = []
        for tf_config in cluster.loopback_tf_configs(2):
            procs.append(run_py.start(tmp_path, ['train.num_epochs = 1'],
                                      ['--strategy=multi_worker'],
                                      env={'TF_CONFIG': tf_config}))
        for proc in procs:
            code, output = run_py.finish(proc, timeout=300)
            assert code == os.EX_TEMPFAIL, output[-3000:]
            assert f'pid {os.getpid()}' in output
    assert sorted(os.listdir(tmp_path)) == []


def test_check_fails_once_another_run_took_the_lock_over(tmp_path):
    lock = run_lock.RunLock(run_dir.RunDir(tmp_path)).acquire()
    try:
        lock.check()  # Still ours.
        # A run on another host found this one's heartbeat stale and took
        # the lock over (renamed it away and created its own).
        now = time.time()
        write_lock(tmp_path, host='node7', pid=4242, started=now,
                   heartbeat=now, token='theirs')
        with pytest.raises(run_lock.Lost) as lost:
            lock.check()
        message = str(lost.value)
        assert 'no longer this run' in message
        assert 'host node7, pid 4242' in message
        assert 'without saving' in message
        os.remove(run_dir.RunDir(tmp_path).lock)
        with pytest.raises(run_lock.Lost, match='deleted'):
            lock.check()
    finally:
        lock.release()


@pytest.mark.slow
@pytest.mark.long
def test_a_run_whose_lock_was_taken_over_stops_before_its_next_save(
        tmp_path):
    proc = run_py.start(tmp_path, ['train.num_epochs = 50'])
    try:
        lock_holder(tmp_path, proc)
        run_py.wait_for_backup(tmp_path, proc, 8)
        # What a run on another host does to a lock whose heartbeat it
        # found stale: renames it away and creates its own.
        now = time.time()
        intruder = dict(host='node7', pid=4242, started=now, heartbeat=now,
                        token='theirs')
        staged = tmp_path / 'run.lock.new'
        staged.write_text(json.dumps(intruder))
        os.replace(staged, run_dir.RunDir(tmp_path).lock)
        taken_at = run_py.backup_step(tmp_path)
        code, output = run_py.finish(proc, timeout=300)
    finally:
        proc.kill()
    assert code == os.EX_TEMPFAIL, output[-3000:]
    assert 'no longer this run' in output and 'host node7' in output
    # At most the save running when the lock was replaced completed; none
    # after it (backups every 4 steps).
    assert run_py.backup_step(tmp_path) <= taken_at + 4
    assert 'Final weights fingerprint' not in output
    # The other run's lock is left as it is.
    assert run_lock.read(run_dir.RunDir(tmp_path).lock) == intruder
    history = pathlib.Path(run_dir.RunDir(tmp_path).history).read_text()
    assert 'stopped at step' in history and 'Lost' in history
