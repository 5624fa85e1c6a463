"""The official RoPAWS loss transcribed to float64 NumPy, line by line.

From facebookresearch/suncet `src/losses.py` (`init_paws_loss` with
`ropaws=True`: `snn`, `snn_semi`, `_snn_semi_each`, `loss`), with
`AllGather` and `AllReduce` written out over the replicas' inputs: rank
`rank` of `world_size` sees its own anchors and target views, and the
target views of every rank through the gather.
"""

import math

import numpy as np


def normalize(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def sharpen(p, t):
    sharp_p = p ** (1.0 / t)
    return sharp_p / np.sum(sharp_p, axis=1, keepdims=True)


def snn(query, supports, labels, tau):
    return softmax(normalize(query) @ normalize(supports).T / tau) @ labels


def _snn_semi_each(query, supports, labels, *, rank, world_size, tau,
                   prior_tau, label_ratio, s_batch_size, u_batch_size):
    """`query` is already gathered: [M, D], rank-major."""
    m = query.shape[0]
    n = labels.shape[0]
    s_sims = query @ supports.T
    u_sims = query @ query.T
    u_sims[np.arange(m), np.arange(m)] = -np.inf
    max_sim = s_sims.max(axis=1)
    prior = np.exp((max_sim - 1) / prior_tau).reshape(m, 1)
    r = label_ratio * u_batch_size / s_batch_size
    s_sims = s_sims + math.log(r) * tau
    c = softmax(np.concatenate([s_sims, u_sims], axis=1) / tau) * prior
    c_l, c_u = c[:, :n], c[:, n:]
    probs = np.linalg.inv(np.eye(m) - c_u) @ c_l @ labels
    return probs[m // world_size * rank:m // world_size * (rank + 1)]


def snn_semi(all_queries, supports, labels, rank, n_views=2, **kwargs):
    """`all_queries`: every rank's target views, a list of [2B, D]."""
    world_size = len(all_queries)
    queries = [normalize(q) for q in all_queries]
    supports = normalize(supports)
    probs = []
    for v in range(n_views):
        gathered = np.concatenate([np.split(q, n_views)[v] for q in queries])
        probs.append(_snn_semi_each(gathered, supports, labels, rank=rank,
                                    world_size=world_size, **kwargs))
    probs = np.concatenate(probs)
    m, c = probs.shape
    p_in = probs.sum(axis=1)
    probs = probs + (1 - p_in.reshape(m, 1)) * np.ones((m, c)) / c
    p_in = sum(np.split(p_in, n_views)) / n_views
    return probs, p_in


def rank_terms(anchors, anchor_supports, labels, all_targets, target_supports,
               *, rank, multicrop, tau, t, prior_tau, prior_pow, label_ratio,
               s_batch_size):
    """One rank's `(loss, mean of sharpen(probs))` before the all-reduce."""
    batch = len(anchors) // (2 + multicrop)
    probs = snn(anchors, anchor_supports, labels, tau)
    targets, p_in = snn_semi(
        all_targets, target_supports, labels, rank, tau=tau,
        prior_tau=prior_tau, label_ratio=label_ratio,
        s_batch_size=s_batch_size, u_batch_size=batch)
    targets = sharpen(targets, t)
    if multicrop > 0:
        mc_target = 0.5 * (targets[:batch] + targets[batch:])
        targets = np.concatenate([targets] + [mc_target] * multicrop)
    targets[targets < 1e-4] *= 0
    weight = np.tile(p_in, 2 + multicrop) ** prior_pow
    loss = np.mean(weight * np.sum(-targets * np.log(probs), axis=1))
    return loss, np.mean(sharpen(probs, t), axis=0)


def ropaws(ranks, labels, anchor_supports, target_supports, *, me_max=True,
           **kwargs):
    """The global objective of `world_size = len(ranks)` ranks.

    Args:
        ranks: one dict per rank: `a` its anchors `[(2 + m) B, D]`, `t` its
            swapped target views `[2B, D]`.
        labels: `[N, C]` label matrix of the gathered supports.
        anchor_supports: `[N, D]` gathered anchor supports.
        target_supports: `[N, D]` gathered target supports.
        me_max: with the me-max term.
        **kwargs: `rank_terms`' keyword arguments.

    Returns:
        `(cross_entropy, me_max)`: the mean over ranks of the rank losses
        (what the summed, 1 / world_size scaled gradients descend), and
        `-H(avg_probs)`.
    """
    all_targets = [r['t'] for r in ranks]
    results = [rank_terms(r['a'], anchor_supports, labels, all_targets,
                          target_supports, rank=i, **kwargs)
               for i, r in enumerate(ranks)]
    loss = np.mean([loss for loss, _ in results])
    reg = 0.0
    if me_max:
        avg_probs = np.mean([p for _, p in results], axis=0)
        reg = np.sum(avg_probs * np.log(avg_probs))
    return loss, reg
