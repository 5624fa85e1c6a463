"""The PAWS and RoPAWS objectives, the support label matrix and logging
diagnostics: tensor functions of already-gathered supports, whose only
cross-replica operations are the me-max average (`dist`) and RoPAWS's
gather of the unlabeled targets."""

import collections

import numpy as np
import tensorflow as tf

from paws_tf import checks
from paws_tf import dist

# Target entries below this are zeroed, as the official PAWS code does.
TARGET_FLOOR = 1e-4
# Floor of probabilities inside logarithms: float32's smallest normal number.
_TINY = float(np.finfo(np.float32).tiny)

PawsTerms = collections.namedtuple('PawsTerms', [
    'cross_entropy', 'me_max', 'targets', 'log_probs', 'in_domain'])


def _normalize(x):
    return tf.math.l2_normalize(tf.cast(x, tf.float32), axis=-1)


def _log_snn_from_logits(logits, labels):
    """Log of `softmax(logits) @ labels` as `log(e @ Y) - log(sum(e))`, `e =
    exp(logits - max)` (largest weight exactly 1), with `log(tiny)` for a
    class whose probability underflows float32 instead of `-inf`."""
    logits = logits - tf.stop_gradient(
        tf.reduce_max(logits, axis=1, keepdims=True))
    weights = tf.exp(logits)  # [N, M], max 1 per row
    numerator = tf.matmul(weights, tf.cast(labels, tf.float32))  # [N, C]
    denominator = tf.reduce_sum(weights, axis=1, keepdims=True)  # >= 1
    return (tf.math.log(tf.maximum(numerator, _TINY)) -
            tf.math.log(denominator))


def _log_snn(query, supports, support_labels, tau):
    """Log of the soft nearest-neighbour prediction `snn(...)`."""
    logits = tf.matmul(_normalize(query), _normalize(supports),
                       transpose_b=True) / tau  # [N, M]
    return _log_snn_from_logits(logits, support_labels)


def snn(query, supports, support_labels, tau):
    """Soft nearest-neighbour class probabilities.

    PAWS (arXiv 2104.13963) Sec. 3.2: `p = softmax(q̂ Ŝᵀ / tau) Y` with
    L2-normalised rows of the query and support embeddings.

    Args:
        query: `[N, D]` query embeddings (any float dtype).
        supports: `[M, D]` support embeddings.
        support_labels: `[M, C]` label matrix (rows sum to 1).
        tau: similarity temperature.

    Returns:
        `[N, C]` float32 class probabilities.
    """
    return tf.exp(_log_snn(query, supports, support_labels, tau))


def _sharpen_log(log_p, sharpen_temperature):
    return tf.nn.softmax(log_p / sharpen_temperature, axis=-1)


def sharpen(p, sharpen_temperature):
    """Sharpens distributions: `p^(1/T) / sum(p^(1/T))` (PAWS Sec. 3.2, rho).

    Computed as `softmax(log(p) / T)`, which stays finite for small `T`.

    Args:
        p: `[N, C]` probabilities.
        sharpen_temperature: T > 0.

    Returns:
        `[N, C]` float32 sharpened probabilities.
    """
    log_p = tf.math.log(tf.maximum(tf.cast(p, tf.float32), _TINY))
    return _sharpen_log(log_p, sharpen_temperature)


def paws_targets(target_views, target_supports, target_support_labels, *,
                 multicrop, tau, sharpen_temperature):
    """Sharpened targets of all anchor views, without gradient.

    PAWS Appendix A, Eq. (multicrop_objective): the target of global view 1
    is the sharpened prediction of view 2 and vice versa (the caller passes
    the target views already swapped); each local view's target is the mean
    of the two sharpened global targets. Entries below `TARGET_FLOOR` are
    zeroed (official implementation, for numerical stability).

    Args:
        target_views, target_supports, target_support_labels, multicrop,
            tau, sharpen_temperature: as `paws_loss`.

    Returns:
        `[(2 + m) B, C]` float32 targets, rows ordered like the anchors.
    """
    target_views = tf.stop_gradient(target_views)
    target_supports = tf.stop_gradient(target_supports)
    targets = _sharpen_log(
        _log_snn(target_views, target_supports, target_support_labels, tau),
        sharpen_temperature)  # [2B, C]
    return _multicrop_targets(targets, multicrop)


def _multicrop_targets(targets, multicrop):
    """Appends the local views' targets (the mean of the two global ones)
    and zeroes entries below `TARGET_FLOOR`."""
    global_1, global_2 = tf.split(targets, 2, axis=0)  # [B, C] each
    local_target = 0.5 * (global_1 + global_2)
    targets = tf.concat([targets, tf.tile(local_target, [multicrop, 1])],
                        axis=0)  # [(2 + m) B, C]
    targets = tf.where(targets < TARGET_FLOOR, tf.zeros_like(targets), targets)
    return tf.stop_gradient(targets)


def paws_loss(anchor_views, anchor_supports, anchor_support_labels,
              target_views, target_supports, target_support_labels, *,
              multicrop, tau, sharpen_temperature, me_max=True):
    """The multi-crop PAWS objective of Appendix A, Eq. (multicrop_objective).

    `loss = cross_entropy + me_max` is what training minimises (the trainer
    weights the me-max term).

    Args:
        anchor_views: `[(2 + m) B, D]` anchor embeddings z, ordered
            `[global_1; global_2; local_1; ...; local_m]` (B rows each).
        anchor_supports: `[M, D]` support embeddings z_S gathered over
            replicas.
        anchor_support_labels: `[M, C]` label matrix of those rows
            (`label_matrix`).
        target_views: `[2B, D]` target embeddings of the global views,
            already swapped: `[global_2; global_1]`. No gradient flows here.
        target_supports: `[M, D]` support target embeddings (no gradient).
        target_support_labels: `[M, C]` label matrix for the targets.
        multicrop: number m of local views per image (0 for two views); an
            int or an int scalar tensor.
        tau: similarity temperature (0.1 in the paper).
        sharpen_temperature: sharpening temperature T (0.25 in the paper).
        me_max: whether to compute the mean-entropy maximisation term.

    Returns:
        `PawsTerms(cross_entropy, me_max, targets, log_probs)`: the two float32
        scalar loss terms, with `me_max = -H(mean_p)` (0 when `me_max` is
        False) where `mean_p` averages the sharpened anchor predictions over
        all views and, under a distribution strategy, over all replicas; the
        `[(2 + m) B, C]` targets and the anchors' log-probabilities.
    """
    # 1. Anchor predictions p = snn(z, z_S), in log space.
    log_probs = _log_snn(anchor_views, anchor_supports, anchor_support_labels,
                         tau)  # [(2 + m) B, C]
    # 2. Targets: sharpened predictions of the positive views, no gradient.
    targets = paws_targets(
        target_views, target_supports, target_support_labels,
        multicrop=multicrop, tau=tau, sharpen_temperature=sharpen_temperature)
    # 3-4. Cross-entropy H(targets, p) and me-max.
    return _terms(log_probs, targets, sharpen_temperature, me_max)


def _terms(log_probs, targets, sharpen_temperature, me_max, in_domain=None,
           view_weights=None):
    """The `PawsTerms` of both objectives: the cross-entropy H(targets, p),
    each anchor view's times `view_weights` if given, averaged over all
    views; me-max, -H(mean over views and replicas of sharpen(p)), or 0."""
    cross_entropy = tf.reduce_sum(-targets * log_probs, axis=1)
    if view_weights is not None:
        cross_entropy = view_weights * cross_entropy
    me_max_term = tf.constant(0.0)
    if me_max:
        mean_prob = dist.all_reduce_mean(tf.reduce_mean(
            _sharpen_log(log_probs, sharpen_temperature), axis=0))  # [C]
        me_max_term = tf.reduce_sum(tf.math.xlogy(mean_prob, mean_prob))
    return PawsTerms(tf.reduce_mean(cross_entropy), me_max_term, targets,
                     log_probs, in_domain)


def ropaws_targets(target_views, target_supports, target_support_labels, *,
                   multicrop, tau, sharpen_temperature, images_per_class,
                   prior_tau, label_ratio):
    """RoPAWS targets: label propagation over supports and unlabeled views.

    RoPAWS (Mo et al., ICLR 2023, arXiv 2302.14483) Sec. 3, as the official
    code (facebookresearch/suncet, `src/losses.py` `snn_semi`) computes it.
    For each global view separately, over the target embeddings z of that
    view on all replicas (M rows) and the supports s (N rows, labels Y):
    logits `[z s^T / tau + log r | z z^T / tau]` with the self-similarity
    masked, `r = label_ratio * B / images_per_class` (B the unlabeled
    images per replica); in-domain prior `pi = exp((max_j z s_j - 1) /
    prior_tau)`; `[C_L | C_U] = pi * softmax(logits)`; `P = (I - C_U)^-1
    C_L Y`. This replica keeps its B rows; `p_in = sum_c P_c` and the
    target is `sharpen(P + (1 - p_in) / C)`, local views taking the mean of
    the two global targets as in PAWS.

    Args:
        target_views, target_supports, multicrop, tau, sharpen_temperature:
            as `paws_loss` (N support rows).
        target_support_labels: `[N, C]` label matrix (label smoothing kept,
            as the official code keeps it).
        images_per_class: n, support images per class per replica (a
            number or a float32 scalar).
        prior_tau: temperature of the in-domain prior.
        label_ratio: weight of the labeled supports against the unlabeled
            targets (r above).

    Returns:
        `(targets, in_domain)`: `[(2 + m) B, C]` float32 targets ordered like
        the anchors, and `[B]` float32 p_in averaged over the two views; no
        gradient.
    """
    views = tf.stack(tf.split(tf.stop_gradient(_normalize(target_views)), 2))
    labels = tf.cast(target_support_labels, tf.float32)  # [N, C]
    batch = tf.shape(views)[1]
    # 1. Every replica's rows of each view: the propagation runs over the
    #    global batch, replica-major.
    propagated = _propagate_labels(
        dist.all_gather(views, axis=1),  # [2, M, D]
        tf.stop_gradient(_normalize(target_supports)), labels, tau=tau,
        prior_tau=prior_tau,
        ratio=label_ratio * tf.cast(batch, tf.float32) / images_per_class)
    start = dist.replica_id() * batch
    own = propagated[:, start:start + batch]  # [2, B, C]
    # 5. The out-of-domain mass 1 - p_in is spread uniformly over classes.
    in_domain = tf.reduce_sum(own, axis=2, keepdims=True)  # [2, B, 1]
    probs = own + (1.0 - in_domain) / tf.cast(tf.shape(labels)[1], tf.float32)
    targets = sharpen(tf.reshape(probs, [2 * batch, -1]),  # [2B, C]
                      sharpen_temperature)
    return (_multicrop_targets(targets, multicrop),
            tf.stop_gradient(tf.reduce_mean(in_domain[..., 0], axis=0)))


def _propagate_labels(queries, supports, labels, *, tau, prior_tau, ratio):
    """Steps 2-4 of `ropaws_targets`: `P = (I - C_U)^-1 C_L Y` `[2, M, C]`
    of the `[2, M, D]` normalised `queries` of both views, the `[N, D]`
    normalised `supports` and their `[N, C]` `labels`."""
    rows = tf.shape(queries)[1]
    # 2. Similarities; the prior uses the raw cosine of the nearest support.
    support_sims = tf.einsum('vmd,nd->vmn', queries, supports)  # [2, M, N]
    prior = tf.exp((tf.reduce_max(support_sims, axis=2, keepdims=True) - 1.0)
                   / prior_tau)  # [2, M, 1]
    unlabeled_sims = tf.matmul(queries, queries, transpose_b=True)  # [2,M,M]
    unlabeled_logits = tf.where(tf.eye(rows, dtype=tf.bool), -np.inf,
                                unlabeled_sims / tau)
    # 3. Transition weights to supports and to unlabeled rows, scaled by the
    #    prior: each row sums to pi <= 1.
    weights = prior * tf.nn.softmax(tf.concat(
        [support_sims / tau + tf.math.log(ratio), unlabeled_logits], axis=2))
    to_labeled, to_unlabeled = weights[..., :-rows], weights[..., -rows:]
    # 4. Label propagation in closed form; I - C_U is strictly diagonally
    #    dominant (rows of C_U sum to less than 1), so the float32 solve is
    #    well conditioned.
    return tf.linalg.solve(
        tf.eye(rows) - to_unlabeled,
        tf.einsum('vmn,nc->vmc', to_labeled, labels))  # [2, M, C]


def ropaws_loss(anchor_views, anchor_supports, anchor_support_labels,
                target_views, target_supports, target_support_labels, *,
                multicrop, tau, sharpen_temperature, images_per_class,
                prior_tau, prior_pow, label_ratio, me_max=True):
    """The RoPAWS objective: PAWS with `ropaws_targets` and weighted views.

    Predictions, me-max and inference are PAWS's; the targets come from
    `ropaws_targets`, and each anchor view's cross-entropy is weighted by
    its image's `p_in ** prior_pow`.

    Args:
        anchor_views, anchor_supports, anchor_support_labels, target_views,
            target_supports, target_support_labels, multicrop, tau,
            sharpen_temperature, me_max: as `paws_loss`.
        images_per_class, prior_tau, label_ratio: as `ropaws_targets`.
        prior_pow: exponent of p_in weighting each view's cross-entropy.

    Returns:
        `PawsTerms(cross_entropy, me_max, targets, log_probs, in_domain)`,
        `in_domain` the `[B]` p_in of this replica's images.
    """
    # 1. Anchor predictions p = snn(z, z_S), in log space, as PAWS.
    log_probs = _log_snn(anchor_views, anchor_supports, anchor_support_labels,
                         tau)  # [(2 + m) B, C]
    # 2. Targets by label propagation, and each image's in-domain p_in.
    targets, in_domain = ropaws_targets(
        target_views, target_supports, target_support_labels,
        multicrop=multicrop, tau=tau, sharpen_temperature=sharpen_temperature,
        images_per_class=images_per_class, prior_tau=prior_tau,
        label_ratio=label_ratio)
    # 3-4. Cross-entropy weighted by p_in^prior_pow, and me-max, as PAWS.
    return _terms(log_probs, targets, sharpen_temperature, me_max, in_domain,
                  tf.tile(tf.pow(in_domain, prior_pow), [2 + multicrop]))


def label_matrix(columns, num_classes, smoothing=0.0):
    """Label matrix of support rows, with label smoothing.

    Row i is the one-hot of `columns[i]`, its class among the step's
    `num_classes` support classes, with `smoothing` spread uniformly over the
    columns: `on = 1 - smoothing + smoothing / C`, `off = smoothing / C`.

    Args:
        columns: int `[M]` column of each support row, in `[0, C)`.
        num_classes: C, a Python int.
        smoothing: label smoothing factor in [0, 1).

    Returns:
        `[M, C]` float32.

    Raises:
        ValueError: `num_classes` not a positive int, or `smoothing` outside
            [0, 1).
    """
    checks.integer('num_classes', num_classes)
    checks.number('smoothing', smoothing, low=0.0, high=1.0)
    off = smoothing / num_classes
    return tf.one_hot(columns, num_classes, on_value=1.0 - smoothing + off,
                      off_value=off)


def nt_xent_loss(view_1, view_2, tau):
    """SimCLR instance-discrimination loss between two views, for logging.

    PAWS Sec. 6 (Fig. 4b) reports it as a diagnostic; no gradient is used.

    Args:
        view_1, view_2: `[B, D]` embeddings of the two global views of the
            same images.
        tau: temperature.

    Returns:
        float32 scalar: mean over the 2B embeddings of the cross-entropy of
        picking the other view of the same image among the other 2B - 1.
    """
    z = tf.stop_gradient(_normalize(tf.concat([view_1, view_2], 0)))  # [2B, D]
    batch = tf.shape(view_1)[0]
    logits = tf.matmul(z, z, transpose_b=True) / tau  # [2B, 2B]
    logits = logits - 1e9 * tf.eye(2 * batch)  # Exclude self-similarity.
    positives = tf.concat([tf.range(batch, 2 * batch), tf.range(batch)], 0)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=positives, logits=logits))


def suncet_loss(supports, labels, tau):
    """Supervised contrastive (SuNCEt) classification loss of the supports.

    Each support is classified by the soft nearest-neighbour classifier over
    all *other* supports: `-sum_c y_c log p_c` with p from the leave-one-out
    similarity weights (Assran et al. 2020, the classification loss of PAWS
    Fig. 4b). Differentiable, so it also serves supervised-contrastive
    fine-tuning (Appendix C).

    Args:
        supports: `[M, D]` support embeddings.
        labels: `[M, C]` label matrix.
        tau: temperature.

    Returns:
        float32 scalar mean loss.
    """
    z = _normalize(supports)
    logits = tf.matmul(z, z, transpose_b=True) / tau  # [M, M]
    logits = logits - 1e9 * tf.eye(tf.shape(z)[0])  # Leave each support out.
    log_probs = _log_snn_from_logits(logits, labels)  # [M, C]
    return tf.reduce_mean(
        tf.reduce_sum(-tf.cast(labels, tf.float32) * log_probs, axis=1))


def target_confidence(targets):
    """Mean over rows of the largest target probability (PAWS Fig. 4c)."""
    return tf.reduce_mean(tf.reduce_max(targets, axis=1))
