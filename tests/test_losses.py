"""PAWS objective against an independent float64 NumPy implementation."""

import numpy as np
import pytest
import tensorflow as tf

from paws_tf import losses

TAU = 0.1
T = 0.25


# --- NumPy reference (PAWS Sec. 3.2 and Appendix A, written from the paper) --
def np_normalize(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def np_softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def np_snn(query, supports, labels, tau=TAU):
    sims = np_normalize(query) @ np_normalize(supports).T
    return np_softmax(sims / tau) @ labels


def np_sharpen(p, t=T):
    p = p ** (1.0 / t)
    return p / p.sum(axis=1, keepdims=True)


def np_labels(k, n, views=1, replicas=1, unique=False, smoothing=0.0):
    """Label matrix built row by row from the documented layout."""
    columns = replicas * k if unique else k
    rows = []
    for r in range(replicas):
        for _ in range(views):
            for slot in range(k):
                for _ in range(n):
                    row = np.full(columns, smoothing / columns)
                    row[r * k + slot if unique else slot] += 1.0 - smoothing
                    rows.append(row)
    return np.array(rows)


def np_paws(anchors, anchor_sup, labels, targets, target_sup, multicrop,
            me_max=True, tau=TAU, log_floor=0.0):
    """Eq. (multicrop_objective): returns (cross_entropy, -H(mean p)).

    `log_floor` > 0 floors the anchors' log-probabilities as the
    implementation documents for those that underflow float32:
    `log p = log(max(e @ Y, log_floor)) - log(sum(e))` with
    `e = exp(logits - max)`.
    """
    batch = targets.shape[0] // 2
    probs = np_snn(anchors, anchor_sup, labels, tau)
    logits = np_normalize(anchors) @ np_normalize(anchor_sup).T / tau
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    tgt = np_sharpen(np_snn(targets, target_sup, labels, tau))
    if multicrop:
        local = 0.5 * (tgt[:batch] + tgt[batch:])
        tgt = np.concatenate([tgt] + [local] * multicrop)
    tgt[tgt < 1e-4] = 0.0
    log_probs = (np.log(np.maximum(weights @ labels, log_floor)) -
                 np.log(weights.sum(axis=1, keepdims=True)))
    cross_entropy = np.mean(np.sum(-tgt * log_probs, axis=1))
    reg = 0.0
    if me_max:
        mean_p = np_sharpen(probs).mean(axis=0)
        reg = np.sum(mean_p * np.log(mean_p))
    return cross_entropy, reg


def numeric_grad(fn, x, h=1e-6):
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += h
        down[i] -= h
        grad[i] = (fn(up) - fn(down)) / (2 * h)
    return grad


def make_problem(seed, batch=2, dim=5, k=3, n=2, multicrop=0, smoothing=0.0):
    rng = np.random.default_rng(seed)
    anchors = rng.normal(size=((2 + multicrop) * batch, dim))
    anchor_sup = rng.normal(size=(k * n, dim))
    targets = rng.normal(size=(2 * batch, dim))
    target_sup = rng.normal(size=(k * n, dim))
    labels = np_labels(k, n, smoothing=smoothing)
    return anchors, anchor_sup, labels, targets, target_sup


# --- snn and sharpen ---------------------------------------------------------
def test_snn_matches_numpy():
    q, s, y, _, _ = make_problem(0, smoothing=0.1)
    np.testing.assert_allclose(losses.snn(q, s, y, TAU), np_snn(q, s, y),
                               rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize('t', [0.25, 0.5, 1.0])
def test_sharpen_matches_numpy(t):
    p = np_softmax(np.random.default_rng(1).normal(size=(6, 4)))
    np.testing.assert_allclose(losses.sharpen(p, t), np_sharpen(p, t),
                               rtol=1e-5, atol=1e-7)


def test_sharpen_small_temperature_is_finite_one_hot():
    p = np.array([[0.2, 0.3, 0.5]])
    out = losses.sharpen(p, 0.001).numpy()
    np.testing.assert_allclose(out, [[0.0, 0.0, 1.0]], atol=1e-6)


# --- values and gradients of the objective -----------------------------------
@pytest.mark.parametrize('multicrop', [0, 6])
@pytest.mark.parametrize('smoothing', [0.0, 0.1])
@pytest.mark.parametrize('me_max', [True, False])
def test_paws_loss_values_and_gradients(multicrop, smoothing, me_max):
    anchors, a_sup, labels, targets, t_sup = make_problem(
        7, multicrop=multicrop, smoothing=smoothing)
    want_ce, want_reg = np_paws(anchors, a_sup, labels, targets, t_sup,
                                multicrop, me_max)

    anchors_v = tf.Variable(anchors, dtype=tf.float32)
    a_sup_v = tf.Variable(a_sup, dtype=tf.float32)
    with tf.GradientTape() as tape:
        ce, reg = losses.paws_loss(
            anchors_v, a_sup_v, labels, targets, t_sup, labels,
            multicrop=multicrop, tau=TAU, sharpen_temperature=T,
            me_max=me_max)[:2]
        total = ce + reg
    grad_anchors, grad_sup = tape.gradient(total, [anchors_v, a_sup_v])

    np.testing.assert_allclose(ce, want_ce, rtol=1e-5)
    np.testing.assert_allclose(reg, want_reg, rtol=1e-5, atol=1e-7)
    if not me_max:
        assert float(reg) == 0.0

    def total_of(a=anchors, s=a_sup):
        return sum(np_paws(a, s, labels, targets, t_sup, multicrop, me_max))

    np.testing.assert_allclose(
        grad_anchors, numeric_grad(lambda a: total_of(a=a), anchors),
        rtol=2e-3, atol=2e-5)
    np.testing.assert_allclose(
        grad_sup, numeric_grad(lambda s: total_of(s=s), a_sup),
        rtol=2e-3, atol=2e-5)


def test_no_gradient_flows_into_targets():
    anchors, a_sup, labels, targets, t_sup = make_problem(3, multicrop=2)
    variables = [tf.Variable(x, dtype=tf.float32)
                 for x in (anchors, a_sup, targets, t_sup)]
    with tf.GradientTape() as tape:
        ce, reg = losses.paws_loss(
            variables[0], variables[1], labels, variables[2], variables[3],
            labels, multicrop=2, tau=TAU, sharpen_temperature=T)[:2]
        total = ce + reg
    grads = tape.gradient(total, variables)
    assert grads[0] is not None and grads[1] is not None
    assert grads[2] is None and grads[3] is None


def test_shared_embeddings_only_differentiate_the_anchor_path():
    """Without a prediction head the same h feeds anchors and targets."""
    batch, k, n = 2, 3, 2
    rng = np.random.default_rng(11)
    views = rng.normal(size=(2 * batch, 4))
    sup = rng.normal(size=(k * n, 4))
    labels = np_labels(k, n, smoothing=0.1)
    swapped = np.concatenate([views[batch:], views[:batch]])

    views_v = tf.Variable(views, dtype=tf.float32)
    sup_v = tf.Variable(sup, dtype=tf.float32)
    with tf.GradientTape() as tape:
        swapped_v = tf.concat([views_v[batch:], views_v[:batch]], 0)
        total = sum(losses.paws_loss(
            views_v, sup_v, labels, swapped_v, sup_v, labels, multicrop=0,
            tau=TAU, sharpen_temperature=T)[:2])
    got = tape.gradient(total, views_v)
    # Targets frozen at their current value: only the anchor path counts.
    want = numeric_grad(
        lambda a: sum(np_paws(a, sup, labels, swapped, sup, 0)), views)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-5)


def test_targets_swap_average_and_floor():
    _, _, labels, targets, t_sup = make_problem(5, batch=3)
    got = losses.paws_targets(targets, t_sup, labels, multicrop=2, tau=TAU,
                              sharpen_temperature=T).numpy()
    sharp = np_sharpen(np_snn(targets, t_sup, labels))
    local = 0.5 * (sharp[:3] + sharp[3:])
    want = np.concatenate([sharp, local, local])
    want[want < 1e-4] = 0.0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert got.shape == (12, 3)


# --- numerical safety and precision ------------------------------------------
def test_large_support_and_small_tau_match_float64():
    """6720 supports at tau 0.1 and 0.005 against the float64 reference.

    At tau 0.005 the logits span about 400, so most probabilities underflow
    float32 and take the documented floor; the reference applies the same
    floor in float64. Fails if the softmax is not shifted by its row
    maximum (exp overflows: NaN), or if the logits are computed in float16
    (the tau 0.1 slope is then 0.9% off).
    """
    rng = np.random.default_rng(2)
    k, n, batch, dim = 960, 7, 16, 64
    labels = losses.label_matrix(  # 6720 supports, no smoothing
        np.repeat(np.arange(k), n), k)
    anchors = rng.normal(size=(8 * batch, dim))
    sup = rng.normal(size=(k * n, dim))
    targets = rng.normal(size=(2 * batch, dim))
    anchors_v = tf.Variable(anchors, dtype=tf.float32)
    direction = rng.normal(size=anchors.shape)
    floor = np.finfo(np.float32).tiny
    for tau in (0.1, 0.005):
        with tf.GradientTape() as tape:
            terms = losses.paws_loss(
                anchors_v, sup, labels, targets, sup, labels, multicrop=6,
                tau=tau, sharpen_temperature=T)[:2]
            total = sum(terms)
        grad = tape.gradient(total, anchors_v).numpy()

        def reference(a, tau=tau):
            return np_paws(a, sup, labels.numpy(), targets, sup, 6,
                           tau=tau, log_floor=floor)

        np.testing.assert_allclose(terms, reference(anchors), rtol=1e-4)
        assert np.all(np.isfinite(grad))
        if tau == 0.1:  # No floored entry: the true directional derivative.
            h = 1e-6
            slope = (sum(reference(anchors + h * direction)) -
                     sum(reference(anchors - h * direction))) / (2 * h)
            np.testing.assert_allclose(np.sum(grad * direction), slope,
                                       rtol=1e-3)


@pytest.mark.parametrize('dtype', [tf.bfloat16, tf.float16])
def test_low_precision_inputs_are_computed_in_float32(dtype):
    anchors, a_sup, labels, targets, t_sup = make_problem(9, multicrop=2)
    low = [tf.cast(x, dtype) for x in (anchors, a_sup, targets, t_sup)]
    got = losses.paws_loss(low[0], low[1], labels, low[2], low[3], labels,
                           multicrop=2, tau=TAU, sharpen_temperature=T)[:2]
    # Reference: the same (rounded) inputs, in float64.
    rounded = [tf.cast(x, tf.float64).numpy() for x in low]
    want = np_paws(rounded[0], rounded[1], labels, rounded[2], rounded[3], 2)
    assert got[0].dtype == tf.float32 and got[1].dtype == tf.float32
    np.testing.assert_allclose(got, want, rtol=1e-4)


# --- Proposition 1 -----------------------------------------------------------
@pytest.mark.parametrize('smoothing', [0.0, 0.1])
def test_collapsed_representations_give_uniform_predictions(smoothing):
    """Prop. 1: class-balanced supports + collapse -> p = uniform over K."""
    k, n = 4, 3
    point = np.random.default_rng(0).normal(size=(1, 6))
    labels = np_labels(k, n, smoothing=smoothing)
    p = losses.snn(np.repeat(point, 5, 0), np.repeat(point, k * n, 0), labels,
                   TAU)
    np.testing.assert_allclose(p, np.full((5, k), 1.0 / k), rtol=1e-6)


def test_collapse_gradient_wrt_predictions_is_nonzero():
    """Prop. 1: p is uniform but the sharpened target is not, so H(p+, p)
    has a non-zero gradient. In the similarity logits l (all equal under
    collapse) it is, in closed form, dH/dl_j = -(K t_c(j) - 1) / M."""
    k, n = 3, 2
    labels = np_labels(k, n)
    raw_target = np.array([[0.5, 0.3, 0.2]])
    target = np_sharpen(raw_target)  # Not uniform (Assumption 2).
    logits = tf.Variable(tf.zeros([1, k * n]))
    with tf.GradientTape() as tape:
        log_p = losses._log_snn_from_logits(logits, labels)
        cross_entropy = -tf.reduce_sum(target * log_p)
    grad = tape.gradient(cross_entropy, logits).numpy()
    want = -(k * target[0][np.argmax(labels, axis=1)] - 1.0) / (k * n)
    np.testing.assert_allclose(grad[0], want, rtol=1e-5, atol=1e-7)
    assert np.abs(grad).max() > 0.1


def test_near_collapse_is_not_a_minimum():
    """From a nearly collapsed state (spread 1e-3) the gradient is non-zero
    and gradient descent lowers the loss: collapse does not attract.

    Exactly at collapse the gradient w.r.t. the representations themselves
    is zero: every cosine similarity sits at its maximum 1, where its
    derivative vanishes; Prop. 1 is a statement about the predictions
    (previous test)."""
    rng = np.random.default_rng(4)
    batch, k, n, dim = 4, 3, 2, 6
    labels = np_labels(k, n, smoothing=0.1)
    centre = rng.normal(size=(1, dim))
    anchors = tf.Variable(centre + 1e-3 * rng.normal(size=(2 * batch, dim)),
                          dtype=tf.float32)
    sup = tf.Variable(centre + 1e-3 * rng.normal(size=(k * n, dim)),
                      dtype=tf.float32)
    targets = rng.normal(size=(2 * batch, dim))  # Sharpened, not uniform.
    t_sup = rng.normal(size=(k * n, dim))

    def loss():
        return losses.paws_loss(anchors, sup, labels, targets, t_sup, labels,
                                multicrop=0, tau=TAU, sharpen_temperature=T,
                                me_max=False)[0]

    def min_cosine():
        z = tf.math.l2_normalize(tf.concat([anchors, sup], 0), axis=1)
        return float(tf.reduce_min(tf.matmul(z, z, transpose_b=True)))

    with tf.GradientTape() as tape:
        before = loss()
    grads = tape.gradient(before, [anchors, sup])
    assert min(float(tf.norm(g)) for g in grads) > 1e-5
    assert min_cosine() > 0.99999
    for _ in range(50):
        with tf.GradientTape() as tape:
            value = loss()
        for var, g in zip([anchors, sup], tape.gradient(value, [anchors, sup])):
            var.assign_sub(1e-2 * g / tf.norm(g))
    # The representations spread out and the loss falls: collapse repels.
    assert min_cosine() < 0.99
    assert float(loss()) < float(before) - 0.03


# --- support label matrix ----------------------------------------------------
@pytest.mark.parametrize('replicas,unique', [(1, False), (2, False),
                                             (2, True), (3, True)])
@pytest.mark.parametrize('views', [1, 2])
@pytest.mark.parametrize('smoothing', [0.0, 0.1])
def test_label_matrix_of_the_gathered_columns(replicas, unique, views,
                                              smoothing):
    # The columns of the gathered support rows, replica by replica as each
    # replica's sampler gives them (class-major blocks per view).
    columns = np.concatenate([
        np.tile(np.repeat(np.arange(4) + (4 * r if unique else 0), 3), views)
        for r in range(replicas)])
    got = losses.label_matrix(columns, 4 * replicas if unique else 4,
                              smoothing).numpy()
    want = np_labels(4, 3, views, replicas, unique, smoothing)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-6)
    # Class balance (Assumption 1): every column gets the same mass.
    np.testing.assert_allclose(got.sum(axis=0), got.sum(axis=0)[0], rtol=1e-5)


@pytest.mark.parametrize('kwargs,match', [
    (dict(num_classes=0), 'num_classes'),
    (dict(num_classes=2, smoothing=1.0), 'smoothing'),
    (dict(num_classes=1.5), 'num_classes'),
])
def test_label_matrix_rejects_bad_sizes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        losses.label_matrix([0, 1], **kwargs)


# --- me-max and gathering across replicas ------------------------------------
def test_loss_under_two_replicas_equals_global_batch(two_replicas):
    """Per-replica anchors, gathered supports, all-reduced me-max."""
    batch, k, n, dim, multicrop = 2, 3, 2, 5, 2
    rng = np.random.default_rng(21)
    # Per replica: its anchors [(2+m)B], targets [2B] and supports [K n].
    per_replica = [dict(a=rng.normal(size=((2 + multicrop) * batch, dim)),
                        t=rng.normal(size=(2 * batch, dim)),
                        s=rng.normal(size=(k * n, dim))) for _ in range(2)]
    labels = np_labels(k, n, replicas=2, unique=True, smoothing=0.1)

    def regroup(key, views):
        """Global batch in the single-device layout: view-major rows."""
        parts = [np.split(r[key], views) for r in per_replica]
        return np.concatenate([np.concatenate([p[v] for p in parts])
                               for v in range(views)])

    want = np_paws(regroup('a', 2 + multicrop),
                   np.concatenate([r['s'] for r in per_replica]),
                   labels, regroup('t', 2),
                   np.concatenate([r['s'] for r in per_replica]), multicrop)

    strategy = two_replicas

    def step():
        rid = tf.distribute.get_replica_context().replica_id_in_sync_group
        pick = lambda key: tf.gather(  # noqa: E731
            tf.constant(np.stack([r[key] for r in per_replica]), tf.float32),
            rid)
        sup = losses.dist.all_gather(pick('s'))
        # Each replica's columns (its own classes), gathered with the rows.
        columns = losses.dist.all_gather(tf.repeat(rid * k + tf.range(k), n))
        gathered = losses.label_matrix(columns, 2 * k, 0.1)
        return losses.paws_loss(pick('a'), sup, gathered, pick('t'), sup,
                                gathered, multicrop=multicrop, tau=TAU,
                                sharpen_temperature=T)[:2]

    ce, reg = strategy.run(tf.function(step))
    ce = strategy.reduce(tf.distribute.ReduceOp.MEAN, ce, axis=None)
    regs = strategy.experimental_local_results(reg)
    np.testing.assert_allclose(ce, want[0], rtol=1e-5)
    for value in regs:  # Identical on every replica.
        np.testing.assert_allclose(value, want[1], rtol=1e-5)


# --- diagnostics -------------------------------------------------------------
def test_nt_xent_matches_numpy():
    rng = np.random.default_rng(8)
    v1, v2 = rng.normal(size=(4, 6)), rng.normal(size=(4, 6))
    z = np_normalize(np.concatenate([v1, v2]))
    sims = z @ z.T / TAU
    want = []
    for i in range(8):
        others = [j for j in range(8) if j != i]
        pos = (i + 4) % 8
        want.append(-sims[i, pos] + np.log(np.sum(np.exp(sims[i, others]))))
    np.testing.assert_allclose(losses.nt_xent_loss(v1, v2, TAU),
                               np.mean(want), rtol=1e-5)


def test_suncet_matches_numpy():
    rng = np.random.default_rng(9)
    sup = rng.normal(size=(6, 4))
    labels = np_labels(3, 2, smoothing=0.1)
    z = np_normalize(sup)
    want = []
    for i in range(6):
        w = np.exp(z[i] @ z.T / TAU)
        w[i] = 0.0
        p = (w / w.sum()) @ labels
        want.append(-np.sum(labels[i] * np.log(p)))
    np.testing.assert_allclose(losses.suncet_loss(sup, labels, TAU),
                               np.mean(want), rtol=1e-5)


def test_target_confidence():
    targets = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    np.testing.assert_allclose(losses.target_confidence(targets), 0.75)
