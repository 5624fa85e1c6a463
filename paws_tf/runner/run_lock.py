"""One writer per run directory: the training lock, `RunDir.lock`, taken
over when its holder is gone; a holder taken over while alive finds out
before its next save and stops."""

import contextlib
import json
import os
import socket
import threading
import time
import uuid

from absl import logging

from paws_tf import cluster
from paws_tf import files

# The holder rewrites its heartbeat this often...
HEARTBEAT_SECONDS = 30
# ...and a lock of another host is stale once its heartbeat is this old (ten
# missed heartbeats: a loaded shared filesystem can delay a few).
STALE_AFTER_SECONDS = 300


class Held(RuntimeError):
    """Another live run holds the lock of this run directory."""
    EXIT_CODE = os.EX_TEMPFAIL  # run.py's: the other run goes on.


class Lost(RuntimeError):
    """Another run took over the lock this run held; this run stopped
    before saving."""
    EXIT_CODE = os.EX_TEMPFAIL  # run.py's: the other run goes on.


def _process_start(pid):
    """The start time of process `pid` in clock ticks since boot (Linux
    /proc), or None where /proc does not say; tells a reused pid apart."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            # Field 22; the command name (field 2) may hold spaces, so count
            # from the closing parenthesis.
            return int(f.read().rsplit(')', 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid, pid_start):
    """Whether process `pid` on this host is the one that took the lock
    (a restarted container reuses its pids; their start times differ)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # Alive, another user's.
    current = _process_start(pid)
    return pid_start is None or current is None or current == pid_start


def _utc(seconds):
    return time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(seconds))


def describe(holder):
    """'host H, pid P, started T' of a lock's contents."""
    return (f'host {holder.get("host")}, pid {holder.get("pid")}, started '
            f'{_utc(holder.get("started", 0))}')


def read(path):
    """The contents of the lock file `path` (`RunDir.lock`), or None if
    there is none."""
    try:
        with open(path) as f:
            text = f.read()
        written = os.path.getmtime(path)
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(text)
    except ValueError:
        holder = None
    # A lock being written, or left empty (or damaged) by a holder killed
    # while writing it, is of unknown host: it goes stale by the file's age.
    if not holder or not isinstance(holder, dict):
        holder = {'host': '?', 'pid': '?', 'started': written,
                  'heartbeat': written}
    return holder


def stale_reason(holder):
    """Why the lock `holder` is stale, or None if its holder may be alive."""
    now = time.time()
    if holder.get('host') == socket.gethostname():
        pid = holder.get('pid')
        if isinstance(pid, int) and not _alive(pid, holder.get('pid_start')):
            return f'process {pid} is not running on this host'
        return None
    age = now - holder.get('heartbeat', now)
    if age > STALE_AFTER_SECONDS:
        return (f'its heartbeat is {age:.0f} s old (stale after '
                f'{STALE_AFTER_SECONDS} s)')
    return None


def _held_error(run, holder):
    return Held(
        f'{run} is being trained by another run ({describe(holder)}; last '
        f'heartbeat {_utc(holder.get("heartbeat", 0))}): two runs writing one '
        "directory corrupt each other's checkpoints. Wait for it to finish, "
        f'stop it (kill {holder.get("pid")} on {holder.get("host")}), or use '
        'another --model_dir. (The lock of a process that has gone is taken '
        'over without asking: on its host at once, from another host once its '
        f'heartbeat is {STALE_AFTER_SECONDS} s old.)')


class RunLock:
    """The training lock of the `RunDir` `run` (created if missing), held
    from `acquire` (before the run touches any state) to `release`; a
    context manager. `job`: what the processes of one job share (`_job`),
    so that the other workers recognise their chief's lock; None for one
    process."""

    def __init__(self, run, job=None):
        self._run = run
        self._path = run.lock
        self._job = job
        self._token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread = None
        self._contents = None

    def acquire(self):
        """Takes the lock, taking over a stale one; raises `Held` when a
        live run holds it."""
        os.makedirs(self._run.path, exist_ok=True)
        now = time.time()
        self._contents = dict(
            host=socket.gethostname(), pid=os.getpid(),
            pid_start=_process_start(os.getpid()), started=now,
            heartbeat=now, job=self._job, token=self._token)
        while True:
            try:
                fd = os.open(self._path, os.O_CREAT | os.O_EXCL | os.O_WRONLY,
                             0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            with os.fdopen(fd, 'w') as f:
                json.dump(self._contents, f)
            break
        self._thread = threading.Thread(target=self._beat, daemon=True,
                                        name='run_lock heartbeat')
        self._thread.start()
        return self

    def _take_over_if_stale(self):
        holder = read(self._path)
        if holder is None:
            return  # Released meanwhile: try again.
        reason = stale_reason(holder)
        if reason is None:
            raise _held_error(self._run, holder)
        # Renaming is atomic: of several runs taking over one stale lock,
        # one renames it; the others find it gone, or find the winner's.
        aside = f'{self._path}.stale.{self._token}'
        try:
            os.rename(self._path, aside)
        except FileNotFoundError:
            return
        if read(aside) != holder:
            # Another run replaced the stale lock between the read and the
            # rename: put its lock back, unless a third took the place.
            with contextlib.suppress(FileExistsError):
                os.link(aside, self._path)
            os.remove(aside)
            return
        os.remove(aside)
        logging.warning('Taking over the lock of %s left by a run that is '
                        'gone (%s): %s.', self._run, describe(holder),
                        reason)

    def _beat(self):
        while not self._stop.wait(HEARTBEAT_SECONDS):
            holder = read(self._path)
            if not self._ours(holder):
                logging.error('The lock of %s is no longer this run\'s '
                              '(now %s): another run took it over.',
                              self._run,
                              describe(holder) if holder else 'deleted')
                return
            self._contents['heartbeat'] = time.time()
            try:
                files.write_json(self._path, self._contents)
            except OSError as error:  # A full disk must not stop training.
                logging.warning('Could not refresh the heartbeat of %s: %s',
                                self._path, error)

    def check(self):
        """Raises `Lost` unless the lock file is still there with this
        run's token (called before every save)."""
        holder = read(self._path)
        if self._ours(holder):
            return
        now = (f'held by another run ({describe(holder)})' if holder
               else 'deleted')
        raise Lost(
            f'The lock of {self._run} is no longer this run\'s: it was '
            f'{now} while this run trained (this run\'s heartbeat was late, '
            f'more than {STALE_AFTER_SECONDS} s: a suspended process or a '
            'host cut off from the filesystem). Stopped without saving, so '
            'as not to write over the other run, which continues this one '
            'from its last backup or checkpoint.')

    def release(self):
        """Stops the heartbeat and deletes the lock if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._ours(read(self._path)):
            os.remove(self._path)

    def _ours(self, holder):
        return holder is not None and holder.get('token') == self._token

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc_info):
        self.release()


def check_held_by_job(run, job):
    """For the non-chief workers of a job, whose chief holds the lock:
    raises `Held` when another live run holds it."""
    holder = read(run.lock)
    if (holder is not None and holder.get('job') != job
            and stale_reason(holder) is None):
        raise _held_error(run, holder)


def _job(strategy):
    """What the processes of one job share and another job does not: the
    cluster spec under MultiWorkerMirroredStrategy, else None."""
    resolver = getattr(strategy, 'cluster_resolver', None)
    return None if resolver is None else json.dumps(
        resolver.cluster_spec().as_dict(), sort_keys=True)


def for_process(run, strategy, *, training):
    """The lock this process holds in `run` (a `RunDir`): a `RunLock` on a
    training chief, else a no-op context; raises `Held` when `training`
    and another live run holds the lock."""
    if training and cluster.is_chief(strategy):
        return RunLock(run, job=_job(strategy))
    if training:
        check_held_by_job(run, _job(strategy))
        return contextlib.nullcontext()
    holder = read(run.lock)
    if holder is not None and stale_reason(holder) is None:
        logging.warning(
            'A training run (%s) is writing %s: reading its newest complete '
            'checkpoint (the checkpoint state file names a checkpoint only '
            'once its files are written).', describe(holder), run)
    return contextlib.nullcontext()
