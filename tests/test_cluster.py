"""Strategy construction by name, and the cluster a process belongs to."""

import json

import numpy as np
import pytest
import tensorflow as tf

from paws_tf import checks
from paws_tf import cluster
from paws_tf import dist


def test_auto_is_one_device_on_a_cpu_machine(monkeypatch):
    monkeypatch.delenv('TF_CONFIG', raising=False)
    monkeypatch.delenv('SLURM_NTASKS', raising=False)
    strategy = cluster.make_strategy('auto')
    assert strategy is tf.distribute.get_strategy()  # The default strategy.
    assert strategy.num_replicas_in_sync == 1


def test_mirrored_on_logical_cpus_reduces_on_one_device():
    """Logical CPUs share memory: sums and gathers are ops on one device,
    no collectives; GPUs keep TensorFlow's collectives."""
    strategy = cluster.make_strategy('mirrored', devices=['CPU:0', 'CPU:1'])
    assert strategy.num_replicas_in_sync == 2
    rows = np.array([[1.0, 2.0], [10.0, 20.0]], np.float32)

    @tf.function
    def step():
        def replica_step():
            ctx = tf.distribute.get_replica_context()
            x = tf.gather(tf.constant(rows), ctx.replica_id_in_sync_group)
            return (ctx.all_reduce(tf.distribute.ReduceOp.SUM, x),
                    dist.all_gather(x[None]))

        return strategy.run(replica_step)

    sums, gathered = step()
    for replica in range(2):
        np.testing.assert_allclose(sums.values[replica], rows.sum(axis=0))
        np.testing.assert_allclose(gathered.values[replica], rows)
    op_types = {op.type for op in step.get_concrete_function().graph
                .get_operations()}
    assert not {t for t in op_types if t.startswith('Collective')}
    assert cluster._cross_device_ops(['GPU:0', 'GPU:1']) is None


@pytest.mark.parametrize('kind', ['auto', 'one_device'])
def test_devices_for_another_strategy_than_mirrored_are_refused(
        monkeypatch, kind):
    """Fails if `make_strategy.devices` is let through where it is not
    read (tried: without the check, `auto` on this CPU machine trained on
    one replica whatever the two devices named)."""
    monkeypatch.delenv('TF_CONFIG', raising=False)
    monkeypatch.delenv('SLURM_NTASKS', raising=False)
    with pytest.raises(checks.ConfigError, match=(
            r"make_strategy.devices = \['CPU:0', 'CPU:1'\] is bound, but "
            r'the strategy is one_device, .* run with --strategy=mirrored')):
        cluster.make_strategy(kind, devices=['CPU:0', 'CPU:1'])


def test_unknown_kind_names_the_choices():
    with pytest.raises(ValueError, match="'one_device', 'mirrored'"):
        cluster.make_strategy('tpu')


def test_multi_worker_without_cluster_says_how_to_fix(monkeypatch):
    monkeypatch.delenv('TF_CONFIG', raising=False)
    monkeypatch.delenv('SLURM_JOB_ID', raising=False)
    with pytest.raises(ValueError, match='TF_CONFIG'):
        cluster.make_strategy('multi_worker')


@pytest.mark.parametrize('kind', ['auto', 'multi_worker'])
@pytest.mark.parametrize('value', [
    json.dumps(cluster.loopback_tf_configs(2)[0]), '{"cluster": ', '[]'])
def test_a_tf_config_not_a_json_object_is_named(monkeypatch, kind, value):
    """A TF_CONFIG encoded twice (a JSON string), cut short, or a list.

    Fails if TF_CONFIG is used without checking that it is an object (a
    TypeError or JSONDecodeError traceback)."""
    monkeypatch.setenv('TF_CONFIG', value)
    with pytest.raises(checks.ConfigError,
                       match='TF_CONFIG is not a JSON object: .* Set it to'):
        cluster.make_strategy(kind)


@pytest.mark.parametrize('env,expected', [
    ({'TF_CONFIG': json.dumps({'cluster': {'worker': ['a:1', 'b:2']},
                               'task': {'type': 'worker', 'index': 0}})},
     True),
    ({'TF_CONFIG': json.dumps({'cluster': {'worker': ['a:1']},
                               'task': {'type': 'worker', 'index': 0}})},
     False),
    ({'SLURM_NTASKS': '4'}, True),
    ({}, False),
])
def test_cluster_detection(monkeypatch, env, expected):
    monkeypatch.delenv('TF_CONFIG', raising=False)
    monkeypatch.delenv('SLURM_NTASKS', raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert cluster.cluster_in_environment() is expected


def test_loopback_tf_configs_describe_one_cluster(monkeypatch):
    configs = [json.loads(c) for c in cluster.loopback_tf_configs(3)]
    addresses = configs[0]['cluster']['worker']
    assert [c['task'] for c in configs] == [
        {'type': 'worker', 'index': i} for i in range(3)]
    assert all(c['cluster'] == {'worker': addresses} for c in configs)
    hosts, ports = zip(*(a.split(':') for a in addresses))
    assert set(hosts) == {'127.0.0.1'} and len(set(ports)) == 3
    # What every worker's process then sees: a resolver of its own task.
    monkeypatch.setenv('TF_CONFIG', json.dumps(configs[2]))
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    assert resolver.task_id == 2
    assert resolver.cluster_spec().as_dict() == {'worker': addresses}
    assert cluster.cluster_in_environment()
    with pytest.raises(ValueError, match='at least 1 worker'):
        cluster.loopback_tf_configs(0)
