"""Class-balanced support sampler and stateless permutations."""

import numpy as np
import pytest
import tensorflow as tf

from paws_tf.data import sampling


def _sampler(labels, num_replicas=2, **kwargs):
    kwargs = {'classes_per_step': 4, 'images_per_class': 3, 'seed': 0,
              'unique_classes_per_replica': False, **kwargs}
    return sampling.SupportSampler(labels, num_replicas=num_replicas, **kwargs)


def _support_draws(sampler, steps):
    """{(step, replica): (positions, class_ids, columns)} as NumPy."""
    call = tf.function(sampler)
    return {(s, r): tuple(t.numpy() for t in call(tf.constant(s),
                                                  tf.constant(r)))
            for s in range(steps) for r in range(sampler.num_replicas)}


# Labels with uneven class sizes: 10 classes of 6..15 images, shuffled.
_LABELS = np.random.default_rng(5).permutation(
    np.concatenate([[c] * (6 + c) for c in range(10)]))


@pytest.mark.parametrize('unique', [False, True])
def test_support_balanced_unique_and_matching_labels(unique):
    k, n = (2, 3) if unique else (4, 3)
    sampler = _sampler(_LABELS, classes_per_step=4,
                       unique_classes_per_replica=unique)
    assert sampler.classes_per_replica == k
    draws = _support_draws(sampler, 200)
    for step in range(200):
        (p0, c0, _), (p1, c1, _) = draws[step, 0], draws[step, 1]
        for positions, class_ids in ((p0, c0), (p1, c1)):
            assert positions.shape == class_ids.shape == (k * n,)
            np.testing.assert_array_equal(_LABELS[positions], class_ids)
            slots = class_ids.reshape(k, n)
            assert (slots == slots[:, :1]).all()  # n rows per slot
            assert len(set(slots[:, 0])) == k
        assert len(set(p0) | set(p1)) == 2 * k * n  # unique globally
        if unique:
            assert len(set(c0) | set(c1)) == 2 * k  # disjoint classes
        else:
            np.testing.assert_array_equal(c0, c1)  # same class per slot



def test_items_interleave_a_pipelines_replicas_step_by_step():
    # A pipeline serving global replicas 2 and 3 of 4: its elements are
    # (step 0, replica 2), (step 0, replica 3), (step 1, replica 2), ...
    sampler = _sampler(_LABELS, num_replicas=4, unique_classes_per_replica=True)
    draws = _support_draws(sampler, steps=3)
    rows = sampler.classes_per_replica * sampler.images_per_class  # 1 x 3
    batches = list(tf.data.Dataset.range(6).flat_map(
        lambda i: sampler.items(i, 2, 2)).batch(rows))
    assert len(batches) == 6
    for i, (steps, positions, class_ids, columns) in enumerate(batches):
        step, replica = i // 2, 2 + i % 2
        np.testing.assert_array_equal(steps.numpy(), [step] * rows)
        np.testing.assert_array_equal(positions.numpy(),
                                      draws[step, replica][0])
        np.testing.assert_array_equal(class_ids.numpy(),
                                      draws[step, replica][1])
        np.testing.assert_array_equal(_LABELS[positions.numpy()],
                                      class_ids.numpy())
        np.testing.assert_array_equal(columns.numpy(),
                                      draws[step, replica][2])


@pytest.mark.parametrize('unique', [False, True])
def test_columns_name_one_class_per_step_and_the_slots_by_replica(unique):
    # Columns index the step's classes_per_step support classes: replica r's
    # slot k is column r*K + k with disjoint classes, k with shared ones, and
    # one column is one class over all replicas.
    k, n = (2, 3) if unique else (4, 3)
    sampler = _sampler(_LABELS, classes_per_step=4,
                       unique_classes_per_replica=unique)
    draws = _support_draws(sampler, 20)
    for step in range(20):
        column_class = {}
        for replica in range(2):
            _, class_ids, columns = draws[step, replica]
            first = replica * k if unique else 0
            np.testing.assert_array_equal(
                columns, np.repeat(np.arange(first, first + k), n))
            for column, class_id in zip(columns, class_ids):
                assert column_class.setdefault(column, class_id) == class_id
        assert sorted(column_class) == list(range(4))

def test_support_draws_with_replacement_across_steps_and_covers_classes():
    draws = _support_draws(_sampler(_LABELS), 50)
    seen = [set(draws[s, 0][0]) for s in range(50)]
    assert any(seen[0] & later for later in seen[1:])
    classes = set(np.concatenate([draws[s, 0][1] for s in range(50)]))
    assert classes == set(range(10))


def test_support_seed():
    base = _support_draws(_sampler(_LABELS), 5)
    same = _support_draws(_sampler(_LABELS), 5)
    other = _support_draws(_sampler(_LABELS, seed=1), 5)
    assert all((base[key][0] == same[key][0]).all() for key in base)
    assert any((base[key][0] != other[key][0]).any() for key in base)


@pytest.mark.parametrize('kwargs,message', [
    ({'labels': []}, 'labeled set is empty'),
    ({'classes_per_step': 11},
     r'make_pretrain_dataset_fn.classes_per_step=11 \(global\) exceeds the '
     '10 classes of the labeled set: use '
     'make_pretrain_dataset_fn.classes_per_step <= 10'),
    ({'classes_per_step': 12, 'unique_classes_per_replica': True},
     r'global = 6 per replica x 2 replicas\) exceeds the 10 classes'),
    ({'classes_per_step': 5, 'unique_classes_per_replica': True},
     r'classes_per_step=5 \(global\) is not divisible by the 2 replicas'),
    ({'images_per_class': 4}, r"'c0' \(id 0\) has 6, 'c1' \(id 1\) has 7.*"
     'Lower make_pretrain_dataset_fn.images_per_class.*'
     'unique_classes_per_replica=True'),
    ({'images_per_class': 7, 'unique_classes_per_replica': True},
     r"1 class\(es\).*\(7 = images_per_class 7\): 'c0' \(id 0\) has 6"),
])
def test_support_errors_name_the_problem(kwargs, message):
    kwargs = {'labels': _LABELS, 'class_names': [f'c{c}' for c in range(10)],
              **kwargs}
    with pytest.raises(ValueError, match=message):
        _sampler(**kwargs)


def test_permutation_and_seeds():
    key = sampling.derive_seed(0, sampling.SUPPORT_CLASSES, 3)
    perm = sampling.permutation(1000, key).numpy()
    np.testing.assert_array_equal(np.sort(perm), np.arange(1000))
    np.testing.assert_array_equal(sampling.permutation(1000, key), perm)
    other_tag = sampling.derive_seed(0, sampling.SUPPORT_IMAGES, 3)
    other_step = sampling.derive_seed(0, sampling.SUPPORT_CLASSES, 4)
    for other in (other_tag, other_step):
        assert (sampling.permutation(1000, other).numpy() != perm).any()
    # Many keys give many distinct orders (index_shuffle gives 256).
    firsts = {tuple(sampling.permutation(
        64, sampling.derive_seed(0, 1, s)).numpy()[:3]) for s in range(300)}
    assert len(firsts) > 290


@pytest.mark.parametrize('sizes', [dict(classes_per_step=0),
                                   dict(images_per_class=0)])
def test_sizes_below_one_are_refused(sizes):
    """Fails if the sampler builds with no support class or no image per
    class (a support that classifies nothing)."""
    with pytest.raises(ValueError, match='must be >= 1'):
        _sampler(np.repeat(np.arange(4), 5), **sizes)
