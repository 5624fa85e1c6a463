"""RoPAWS against a float64 NumPy transcription of the official loss
(tests/helpers/ropaws_reference.py), alone and as `PAWSModel`'s step
trains it.

Bugs tried, beside those the tests' docstrings name: the step weighing
the views by 1 (`PAWSModel` passing prior_pow = 0), its label ratio given
the prior temperature, the step training PAWS's objective, and the mean
of p_in ** 2 logged as `in_domain`.
"""

import pathlib

import gin
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from paws_tf import configurables  # noqa: F401  (registers configurables)
from paws_tf import dist
from paws_tf import losses
from paws_tf.runner import config_checks
from tests.helpers import cluster
from tests.helpers import ropaws_reference as ref
from tests.helpers import tiny_model
from tests.test_losses import np_labels
from tests.test_losses import np_paws
from tests.test_losses import numeric_grad

REPO = pathlib.Path(__file__).resolve().parents[1]
TAU, T = 0.1, 0.25


def make_case(seed, *, replicas=1, batch=3, dim=5, k=3, n=2, views=2,
              multicrop=2, smoothing=0.1, unique=False):
    """Per-replica anchors `a`, swapped targets `t`, anchor supports `s`
    and target supports `h`, and the gathered supports' label matrix."""
    rng = np.random.default_rng(seed)
    ranks = [dict(a=rng.normal(size=((2 + multicrop) * batch, dim)),
                  t=rng.normal(size=(2 * batch, dim)),
                  s=rng.normal(size=(views * k * n, dim)),
                  h=rng.normal(size=(views * k * n, dim)))
             for _ in range(replicas)]
    return ranks, np_labels(k, n, views, replicas, unique, smoothing)


def reference(ranks, labels, settings, **changed):
    """The official objective; `changed` replaces one rank's input."""
    ranks = [dict(r) for r in ranks]
    anchor_supports = None
    for key, value in changed.items():
        if key == 'anchor_supports':
            anchor_supports = value
        else:
            rank, name = key.split('_')
            ranks[int(rank)][name] = value
    if anchor_supports is None:
        anchor_supports = np.concatenate([r['s'] for r in ranks])
    return sum(ref.ropaws(
        ranks, labels, anchor_supports, np.concatenate([r['h'] for r in ranks]),
        tau=TAU, t=T, s_batch_size=settings['images_per_class'],
        me_max=settings['me_max'], multicrop=settings['multicrop'],
        prior_tau=settings['prior_tau'], prior_pow=settings['prior_pow'],
        label_ratio=settings['label_ratio']))


def replica_objective(a, s, t, h, labels, settings):
    """`(loss, grads wrt a and s)` on one replica, supports gathered."""
    with tf.GradientTape() as tape:
        tape.watch([a, s])
        supports = dist.all_gather(s)
        targets = tf.stop_gradient(dist.all_gather(h))
        terms = losses.ropaws_loss(
            a, supports, labels, t, targets, labels, tau=TAU,
            sharpen_temperature=T, **settings)
        loss = terms.cross_entropy + terms.me_max
        scaled = loss / dist.num_replicas()
    return loss, tape.gradient(scaled, [a, s])


SETTINGS = [
    dict(multicrop=2, prior_tau=0.5, prior_pow=1.0, label_ratio=5.0,
         me_max=True),
    dict(multicrop=0, prior_tau=0.1, prior_pow=2.0, label_ratio=0.5,
         me_max=False),
    dict(multicrop=3, prior_tau=3.0, prior_pow=0.5, label_ratio=20.0,
         me_max=True),
]


def worker_case():
    """What each worker of tests/helpers/ropaws_worker.py computes its share
    of: `(ranks, labels, settings)`."""
    return (*make_case(5, replicas=2, unique=True),
            dict(SETTINGS[0], images_per_class=2))


@pytest.mark.parametrize('settings', SETTINGS)
@pytest.mark.parametrize('smoothing', [0.0, 0.1])
def test_one_replica_values_and_gradients(settings, smoothing):
    settings = dict(settings, images_per_class=2)
    ranks, labels = make_case(1, multicrop=settings['multicrop'],
                              smoothing=smoothing)
    r = ranks[0]
    f32 = lambda x: tf.constant(x, tf.float32)  # noqa: E731
    loss, (grad_a, grad_s) = replica_objective(
        f32(r['a']), f32(r['s']), f32(r['t']), f32(r['h']), labels, settings)
    np.testing.assert_allclose(loss, reference(ranks, labels, settings),
                               rtol=1e-5)
    np.testing.assert_allclose(grad_a, numeric_grad(
        lambda x: reference(ranks, labels, settings, **{'0_a': x}), r['a']),
        rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad_s, numeric_grad(
        lambda x: reference(ranks, labels, settings, anchor_supports=x),
        r['s']), rtol=1e-5, atol=1e-5)


def two_replica_step(ranks, labels, settings):
    """The replica function of a 2-replica run: each replica's inputs by its
    id."""
    def step():
        rid = tf.distribute.get_replica_context().replica_id_in_sync_group
        pick = lambda key: tf.gather(tf.constant(  # noqa: E731
            np.stack([r[key] for r in ranks]), tf.float32), rid)
        return replica_objective(pick('a'), pick('s'), pick('t'), pick('h'),
                                 labels, settings)
    return step


def check_two_replicas(ranks, labels, settings, replica_losses, grads_a,
                       grads_s):
    """Each replica's loss and gradients against the global objective."""
    np.testing.assert_allclose(np.mean(replica_losses),
                               reference(ranks, labels, settings), rtol=1e-5)
    supports = np.concatenate([r['s'] for r in ranks])
    rows = len(ranks[0]['s'])
    want_s = numeric_grad(
        lambda x: reference(ranks, labels, settings, anchor_supports=x),
        supports)
    for i, (got_a, got_s) in enumerate(zip(grads_a, grads_s)):
        want_a = numeric_grad(lambda x: reference(  # noqa: B023
            ranks, labels, settings, **{f'{i}_a': x}), ranks[i]['a'])
        np.testing.assert_allclose(got_a, want_a, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got_s, want_s[i * rows:(i + 1) * rows],
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('unique', [False, True])
@pytest.mark.parametrize('fixture', ['two_replicas', 'two_replicas_collective'])
def test_two_replicas_gather_the_targets_and_keep_their_rows(
        request, fixture, unique):
    strategy = request.getfixturevalue(fixture)
    settings = dict(SETTINGS[0], images_per_class=2)
    ranks, labels = make_case(2, replicas=2, unique=unique)
    loss, (grad_a, grad_s) = strategy.run(
        tf.function(two_replica_step(ranks, labels, settings)))
    local = strategy.experimental_local_results
    check_two_replicas(ranks, labels, settings, local(loss), local(grad_a),
                       local(grad_s))


@pytest.mark.slow
@pytest.mark.long
def test_two_workers_gather_the_targets_and_keep_their_rows(tmp_path):
    """A real MultiWorkerMirroredStrategy cluster of two processes, one
    replica each (tests/helpers/ropaws_worker.py)."""
    results = cluster.launch_cluster(
        [REPO / 'tests' / 'helpers' / 'ropaws_worker.py', tmp_path])
    for code, output in results:
        assert code == 0, output[-3000:]
    outputs = [np.load(tmp_path / f'{i}.npz') for i in range(2)]
    check_two_replicas(*worker_case(), [o['loss'] for o in outputs],
                       [o['grad_a'] for o in outputs],
                       [o['grad_s'] for o in outputs])


@pytest.mark.parametrize('multicrop,smoothing,n', [(0, 0.0, 1), (2, 0.1, 2),
                                                   (4, 0.1, 3)])
def test_without_unlabeled_term_unit_ratio_and_flat_prior_it_is_paws(
        multicrop, smoothing, n):
    """One unlabeled image (C_U = 0), r = label_ratio B / n = 1 and a prior
    of 1: P = C_L Y = snn, p_in = 1, so RoPAWS is PAWS (closed form)."""
    ranks, labels = make_case(3, batch=1, n=n, multicrop=multicrop,
                              smoothing=smoothing)
    r = {key: tf.constant(value, tf.float32) for key, value in ranks[0].items()}
    common = dict(multicrop=multicrop, tau=TAU, sharpen_temperature=T)

    def both(a, s):
        ropaws = losses.ropaws_loss(
            a, s, labels, r['t'], r['h'], labels, images_per_class=n,
            prior_tau=1e12, prior_pow=1.0, label_ratio=float(n), **common)
        paws = losses.paws_loss(a, s, labels, r['t'], r['h'], labels,
                                **common)
        return ropaws, paws

    with tf.GradientTape(persistent=True) as tape:
        tape.watch([r['a'], r['s']])
        ropaws, paws = both(r['a'], r['s'])
        ropaws_loss = ropaws.cross_entropy + ropaws.me_max
        paws_loss = paws.cross_entropy + paws.me_max
    np.testing.assert_allclose(ropaws.in_domain, [1.0], rtol=1e-6)
    np.testing.assert_allclose(ropaws.targets, paws.targets, rtol=1e-6,
                               atol=1e-7)
    np.testing.assert_allclose(ropaws_loss, paws_loss, rtol=1e-6)
    want = np_paws(ranks[0]['a'], ranks[0]['s'], labels, ranks[0]['t'],
                   ranks[0]['h'], multicrop)
    np.testing.assert_allclose(ropaws.cross_entropy, want[0], rtol=1e-5)
    for x in (r['a'], r['s']):
        np.testing.assert_allclose(tape.gradient(ropaws_loss, x),
                                   tape.gradient(paws_loss, x), rtol=1e-6,
                                   atol=1e-7)


def test_an_image_far_from_every_support_gets_a_small_weight():
    """p_in <= prior = exp((max cos - 1) / prior_tau): a target orthogonal
    to the supports weighs at most exp(-1 / prior_tau)."""
    supports = np.eye(4, 6)  # [4, 6], classes 0 0 1 1
    labels = np_labels(2, 2)
    near = supports[:2] + 0.05
    far = np.eye(6)[4:]  # Orthogonal to every support.
    targets = np.concatenate([near[:1], far[:1], near[1:], far[1:]])
    terms = losses.ropaws_loss(
        tf.constant(targets, tf.float32), supports, labels,
        tf.constant(targets, tf.float32), supports, labels, multicrop=0,
        tau=TAU, sharpen_temperature=T, images_per_class=2, prior_tau=0.5,
        prior_pow=1.0, label_ratio=5.0)
    near_weight, far_weight = terms.in_domain.numpy()
    assert far_weight <= np.exp(-1 / 0.5) + 1e-6
    assert near_weight > 0.9


@pytest.mark.parametrize('dtype', [tf.float16, tf.bfloat16])
def test_low_precision_embeddings_are_solved_in_float32(dtype):
    settings = dict(SETTINGS[0], images_per_class=2)
    ranks, labels = make_case(4)
    r = ranks[0]
    low = [tf.constant(r[key], dtype) for key in 'asth']
    got = losses.ropaws_loss(low[0], low[1], labels, low[2], low[3], labels,
                             tau=TAU, sharpen_temperature=T, **settings)
    want = losses.ropaws_loss(*(tf.cast(x, tf.float32) for x in low[:2]),
                              labels, *(tf.cast(x, tf.float32)
                                        for x in low[2:]), labels, tau=TAU,
                              sharpen_temperature=T, **settings)
    assert got.cross_entropy.dtype == tf.float32
    assert got.in_domain.dtype == tf.float32
    np.testing.assert_allclose(got.cross_entropy, want.cross_entropy,
                               rtol=1e-6)


def test_train_step_under_mixed_precision_logs_the_in_domain_share():
    """Under mixed_float16 the step logs the mean p_in of its batch: the
    official code's (float64 NumPy) on the float16 embeddings the model
    gives the batch in training mode.

    Fails if the logged share is not the batch's mean p_in (tried: the
    mean of p_in ** 2).

    The weights are seeded: float16's error against the tolerance depends
    on them, and unseeded they followed the tests the process ran before
    (one order of `make test` gave 1.0015e-3 relative)."""
    tf_keras.utils.set_random_seed(0)
    tf_keras.mixed_precision.set_global_policy('mixed_float16')
    try:
        model = tiny_model.make(objective='ropaws', ropaws_prior_tau=0.5,
                                prediction_head=False)
        tiny_model.compile_and_build(model, learning_rate=0.3)
        data = tiny_model.random_step(np.random.default_rng(5), 3, 2, 2, 1, 2)
        loss, terms, *_ = model._forward(data, training=False)
        h, _ = model._encode(np.concatenate([data['support_views'],
                                             data['global_views']]),
                             training=True)
        logs = tf.function(model.train_step)(data)
    finally:
        tf_keras.mixed_precision.set_global_policy('float32')
    assert terms.cross_entropy.dtype == tf.float32
    assert terms.in_domain.shape == (3,)
    assert np.isfinite(logs['loss'])
    h = h.numpy().astype(np.float64)
    targets = np.concatenate(np.split(h[4:], 2)[::-1])
    _, p_in = ref.snn_semi([targets], h[:4], np_labels(2, 2, smoothing=0.1),
                           rank=0, tau=TAU, prior_tau=0.5, label_ratio=5.0,
                           s_batch_size=2, u_batch_size=3)
    np.testing.assert_allclose(logs['in_domain'], p_in.mean(), rtol=1e-3)


def test_the_model_reads_images_per_class_from_the_support_rows():
    """3 images x 2 views per class: r = label_ratio B / 3, counted from
    the rows of view 0 (not / 6, every row). Seeded weights; a small prior
    temperature, so that p_in depends on r (by 8e-4 here)."""
    tf_keras.utils.set_random_seed(0)
    model = tiny_model.make(prediction_head=False, objective='ropaws',
                            ropaws_prior_tau=0.05, ropaws_label_ratio=2.0)
    tiny_model.compile_and_build(model)
    data = tiny_model.random_step(np.random.default_rng(8), 3, 2, 3, 2, 0)
    _, terms, z_global, z_support, _ = model._forward(data, training=False)
    labels = np_labels(2, 3, views=2, smoothing=0.1)
    swapped = tf.concat(tf.split(z_global, 2)[::-1], 0)

    def ropaws(images_per_class):
        return losses.ropaws_loss(
            z_global, z_support, labels, swapped, z_support, labels,
            multicrop=0, tau=TAU, sharpen_temperature=T,
            images_per_class=images_per_class, prior_tau=0.05,
            prior_pow=1.0, label_ratio=2.0)

    np.testing.assert_allclose(terms.targets, ropaws(3).targets, rtol=1e-6,
                               atol=1e-7)
    np.testing.assert_allclose(terms.in_domain, ropaws(3).in_domain,
                               rtol=1e-6)
    assert np.abs(terms.in_domain - ropaws(6).in_domain).max() > 1e-4
    assert np.abs(terms.targets - ropaws(6).targets).max() > 1e-4


def official_step_objective(model, data, *, classes, images, smoothing,
                            multicrop, **settings):
    """The official RoPAWS objective (float64 NumPy, `ropaws_reference`)
    of the embeddings `model` gives a step's `data` in training mode, its
    views encoded as the step encodes them (supports and global views in
    one batch, local views apart): `(objective, PAWS's objective)`.

    Args:
        model: a built `PAWSModel`.
        data: one replica's step (`tiny_model.random_step`'s layout: 2
            support views of `classes` x `images`).
        classes, images, smoothing, multicrop: the supports' layout, their
            label smoothing, the local views per image.
        **settings: `prior_tau`, `prior_pow`, `label_ratio`.
    """
    h, z = (x.numpy().astype(np.float64) for x in model._encode(
        np.concatenate([data['support_views'], data['global_views']]),
        training=True))
    anchors = [z[len(data['support_views']):]]
    if multicrop:
        anchors.append(model._encode(data['local_views'], training=True)[1]
                       .numpy())
    supports = len(data['support_views'])
    h_global = np.split(h[supports:], 2)
    rank = {'a': np.concatenate(anchors),
            't': np.concatenate(h_global[::-1])}
    labels = np_labels(classes, images, views=2, smoothing=smoothing)
    cross_entropy, me_max = ref.ropaws(
        [rank], labels, z[:supports], h[:supports], tau=TAU, t=T,
        s_batch_size=images, multicrop=multicrop, **settings)
    paws = np_paws(rank['a'], z[:supports], labels, rank['t'], h[:supports],
                   multicrop=multicrop)
    return cross_entropy + me_max, sum(paws)


def test_a_train_step_descends_the_official_objective_of_its_batch():
    """One `train_step` of a RoPAWS model (prediction head, 2 local views,
    prior_pow 2) reports, as the loss it descends, the official objective
    of the embeddings the model gives the same batch before the step
    (`official_step_objective`); PAWS's objective of those embeddings is
    0.05 away.

    Fails if the step weighs the views by anything but p_in ** prior_pow
    (tried: `PAWSModel` passing prior_pow = 0, every weight 1; passing
    its prior_tau as the label ratio) or trains PAWS's objective."""
    settings = dict(prior_tau=0.3, prior_pow=2.0, label_ratio=3.0)
    tf_keras.utils.set_random_seed(2)
    model = tiny_model.make(objective='ropaws', **{
        f'ropaws_{key}': value for key, value in settings.items()})
    tiny_model.compile_and_build(model)
    data = tiny_model.random_step(np.random.default_rng(3), 3, 2, 2, 2, 2)
    expected, paws = official_step_objective(
        model, data, classes=2, images=2, smoothing=0.1, multicrop=2,
        **settings)
    logs = model.train_step(data)
    np.testing.assert_allclose(logs['loss'], expected, rtol=1e-5)
    assert abs(paws - expected) > 0.05


@pytest.mark.parametrize('kwargs,message', [
    (dict(objective='fixmatch'), "PAWSModel.objective must be one of"),
    (dict(objective='ropaws', ropaws_prior_tau=0.0),
     'PAWSModel.ropaws_prior_tau must be positive'),
    (dict(objective='ropaws', ropaws_prior_pow=-1.0),
     r'PAWSModel.ropaws_prior_pow must be a number >= 0.0'),
    (dict(objective='ropaws', ropaws_label_ratio='5'),
     'PAWSModel.ropaws_label_ratio must be positive'),
])
def test_bad_settings_name_the_binding(clean_gin, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_model.make(**kwargs)
    gin.parse_config_files_and_bindings(
        [str(REPO / 'gin_configs' / 'debug.gin')],
        [f'PAWSModel.{key} = {value!r}' for key, value in kwargs.items()])
    with pytest.raises(ValueError, match=message):
        config_checks.check_config()


def test_paws_ignores_the_ropaws_settings():
    model = tiny_model.make(ropaws_prior_tau=-1.0)
    assert model.objective == 'paws'


def test_unlabeled_batches_of_no_fixed_size_cannot_be_gathered(two_replicas):
    with two_replicas.scope():
        model = tiny_model.make(objective='ropaws')
        tiny_model.compile_and_build(model)
    data = tiny_model.random_step(np.random.default_rng(7), 2, 2, 2, 1, 2)
    spec = {key: tf.TensorSpec([None, *value.shape[1:]], value.dtype)
            for key, value in data.items()}
    step = tf.function(lambda d: two_replicas.run(model.train_step,
                                                  args=(d,)),
                       input_signature=[spec])
    with pytest.raises(ValueError, match='needs a static unlabeled batch'):
        step(data)
