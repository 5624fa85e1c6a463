"""The start of a cluster: each task greets every other on their cluster
ports, for a bounded time, as TensorFlow 2.21's cluster registration
waits for ever for a task that never starts, holding the interpreter's lock
and ignoring SIGTERM."""

import hashlib
import json
import socket
import threading
import time

from absl import logging

# The jobs whose tasks run MultiWorkerMirroredStrategy's collectives.
_JOBS = ('chief', 'worker')
_RETRY_SECONDS = 0.5
_IO_SECONDS = 5
_MAX_LINE = 256
_OK = 'ok'


class NotStarted(RuntimeError):
    """A task of the cluster did not start within the timeout."""


def cluster_tasks(resolver):
    """{'chief 0': 'host:port', 'worker 0': ...} of the cluster's chief and
    workers (MultiWorkerMirroredStrategy's replicas' order)."""
    spec = resolver.cluster_spec()
    return {f'{job} {index}': spec.task_address(job, index)
            for job in _JOBS if job in spec.jobs
            for index in spec.task_indices(job)}


def _split(address):
    host, port = address.rsplit(':', 1)
    return host.strip('[]'), int(port)


def _read_line(connection):
    with connection.makefile('rb') as stream:
        return stream.readline(_MAX_LINE).decode(errors='replace').strip()


class _Listener:
    """Answers the other tasks' greetings on this task's cluster port and
    records who greeted (`heard`), in a thread, until `close`."""

    def __init__(self, me, port, token):
        self.heard = set()
        self._token = token
        dual = socket.has_dualstack_ipv6()
        try:
            self._server = socket.create_server(
                ('', port), family=socket.AF_INET6 if dual else
                socket.AF_INET, dualstack_ipv6=dual)
        except OSError as error:
            raise NotStarted(
                f'{me} cannot listen on port {port}, its address in the '
                f'cluster description ({error}): another process uses it, '
                'perhaps a task of an earlier launch that still runs. Stop '
                'it, or describe the cluster with a free port.') from None
        self._server.settimeout(_RETRY_SECONDS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name='cluster_rendezvous')
        self._thread.start()

    def _serve(self):
        while not self._stop.is_set():
            try:  # An OSError: a timeout, or a greeting cut short.
                connection, _ = self._server.accept()
                with connection:
                    connection.settimeout(_IO_SECONDS)
                    token, _, task = _read_line(connection).partition(' ')
                    if token != self._token:  # Not a task of this job.
                        continue
                    connection.sendall(f'{_OK}\n'.encode())
                    # The greeting task closes first, so that the closed
                    # connection lingers (TIME_WAIT) on its side, not on
                    # the port TensorFlow binds next.
                    connection.recv(1)
                    self.heard.add(task)
            except OSError:
                continue

    def close(self):
        self._stop.set()
        self._thread.join()
        self._server.close()


def _greet(address, greeting):
    """How the task at `address` answers `greeting`: `_OK`, another
    answer (a process of another job), or None (nothing listens)."""
    try:
        with socket.create_connection(_split(address),
                                      timeout=_IO_SECONDS) as connection:
            connection.sendall(greeting)
            return _read_line(connection)
    except OSError:
        return None


def wait_for_tasks(resolver, timeout):
    """Returns once this task and every other chief or worker task of the
    cluster (from `resolver`) have greeted each other on their cluster
    addresses, each listening on its own port (TensorFlow binds it next).

    Raises:
        NotStarted: within `timeout` seconds (0: for ever), naming the tasks
            not met and what to do.
    """
    tasks = cluster_tasks(resolver)
    me = f'{resolver.task_type} {resolver.task_id}'
    if me not in tasks or len(tasks) < 2:
        return
    token = hashlib.sha256(json.dumps(tasks, sort_keys=True).encode())
    token = token.hexdigest()[:16]
    peers = {task: address for task, address in tasks.items() if task != me}
    greeting = f'{token} {me}\n'.encode()
    listener = _Listener(me, _split(tasks[me])[1], token)
    logging.info('%s waits up to %s s (make_strategy.start_timeout) for the '
                 'other tasks of the cluster: %s.', me, timeout or 'infinite',
                 ', '.join(peers))
    deadline = time.monotonic() + timeout if timeout else None
    answers = dict.fromkeys(peers)
    try:
        while True:
            for task, address in peers.items():
                if answers[task] != _OK:
                    # A stranger that answered once is remembered as one.
                    answers[task] = _greet(address, greeting) or answers[task]
            if set(answers.values()) == {_OK} and set(peers) <= listener.heard:
                logging.info('All %d tasks of the cluster started.',
                             len(tasks))
                return
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(_RETRY_SECONDS)
    finally:
        listener.close()
    raise _not_started(me, tasks, answers, listener.heard, timeout)


def _not_started(me, tasks, answers, heard, timeout):
    """The `NotStarted` of task `me`, from the other tasks' `answers` and
    the tasks it `heard`."""

    def named(names):
        return ', '.join(f'{task} ({tasks[task]})' for task in names)

    silent = [task for task in answers if answers[task] is None]
    other = [task for task in answers if answers[task] not in (None, _OK)]
    deaf = [task for task in answers
            if answers[task] == _OK and task not in heard]
    causes = [cause for found, cause in (
        (silent, f'nothing answers at {named(silent)}: never started, or '
                 'stopped while starting'),
        (other, 'a process that is no task of this cluster listens at '
                f'{named(other)}: another program, or a task given another '
                'cluster description'),
        (deaf, f'{named(deaf)} answers but did not reach {me} at '
               f'{tasks[me]}: a wrong address in its cluster description, '
               'or a firewall between them')) if found]
    return NotStarted(
        f'{me}: the cluster did not form within {timeout:g} s '
        f'(make_strategy.start_timeout): {"; ".join(causes)}. Start the '
        'missing worker with the same command, or stop the job and start the '
        'same command on every worker again; a relaunch resumes from the '
        "run's backup or newest checkpoint.")
