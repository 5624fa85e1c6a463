"""The cluster's start: tasks meet on their loopback ports, or the one
waiting names those that did not come, within its timeout."""

import json
import socket
import threading
import time

import pytest
import tensorflow as tf

from paws_tf import cluster
from paws_tf import rendezvous


def resolvers(workers):
    """SimpleClusterResolvers of a loopback cluster, by task index."""
    configs = [json.loads(c) for c in cluster.loopback_tf_configs(workers)]
    spec = tf.train.ClusterSpec(configs[0]['cluster'])
    return [tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type='worker', task_id=index) for index in range(workers)]


def test_tasks_that_start_at_different_times_meet():
    tasks = resolvers(3)
    errors = []

    def start(resolver, delay):
        time.sleep(delay)
        try:
            rendezvous.wait_for_tasks(resolver, 30)
        except rendezvous.NotStarted as error:
            errors.append(error)

    threads = [threading.Thread(target=start, args=(resolver, delay))
               for resolver, delay in zip(tasks, (0, 1.0, 2.0))]
    started = time.time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert time.time() - started < 10
    # Every port is free again for TensorFlow's server.
    for resolver in tasks:
        address = resolver.cluster_spec().as_dict()['worker'][
            resolver.task_id]
        with socket.create_server(('127.0.0.1', int(address.split(':')[1]))):
            pass


def test_a_task_alone_names_the_one_that_never_started():
    worker_0, worker_1 = resolvers(2)
    address = worker_1.cluster_spec().as_dict()['worker'][1]
    started = time.time()
    with pytest.raises(rendezvous.NotStarted) as error:
        rendezvous.wait_for_tasks(worker_0, 1)
    assert 1 <= time.time() - started < 10
    assert str(error.value).startswith(
        'worker 0: the cluster did not form within 1 s '
        f'(make_strategy.start_timeout): nothing answers at worker 1 '
        f'({address}): never started')
    assert 'Start the missing worker with the same command' in str(
        error.value)


def test_a_stranger_on_a_task_port_is_named_as_such():
    worker_0, worker_1 = resolvers(2)
    port = int(worker_1.cluster_spec().as_dict()['worker'][1].split(':')[1])
    server = socket.create_server(('127.0.0.1', port))

    def answer_wrongly_once():
        with server:
            connection, _ = server.accept()
            with connection:
                connection.recv(256)
                connection.sendall(b'HTTP/1.1 400 Bad Request\n')

    threading.Thread(target=answer_wrongly_once, daemon=True).start()
    with pytest.raises(rendezvous.NotStarted,
                       match='a process that is no task of this cluster '
                       'listens at worker 1'):
        rendezvous.wait_for_tasks(worker_0, 1)


def test_a_port_in_use_is_named():
    worker_0, _ = resolvers(2)
    port = int(worker_0.cluster_spec().as_dict()['worker'][0].split(':')[1])
    with socket.create_server(('', port)):
        with pytest.raises(rendezvous.NotStarted,
                           match=f'worker 0 cannot listen on port {port}'):
            rendezvous.wait_for_tasks(worker_0, 1)
