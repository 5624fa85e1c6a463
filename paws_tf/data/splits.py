"""The labeled split of a source: drawn with a seed or read from a file."""

import collections
import numbers

import gin
import numpy as np

from paws_tf import checks


class Split(collections.namedtuple('Split', ['labeled', 'unlabeled'])):
    """`(labeled, unlabeled)` `ImageSource`s; `header` says how many
    labeled images were chosen, of how many, and how (`RunDir.write_split`
    records it)."""

    def __new__(cls, labeled, unlabeled, header=None):
        split = super().__new__(cls, labeled, unlabeled)
        split.header = header
        return split


def read_split_file(path):
    """Reads item names, one per line; blank and `#` lines are skipped."""
    with open(path) as f:
        lines = (line.strip() for line in f)
        return [line for line in lines if line and not line.startswith('#')]


def mismatch(split_file, labeled):
    """How the labeled `ImageSource` `labeled` differs from the images the
    split file `split_file` lists (a message's detail), or None when it
    holds exactly them; FileNotFoundError when there is no such file."""
    names = read_split_file(split_file)
    if sorted(names) == sorted(labeled.names):
        return None
    missing = len(set(names) - set(labeled.names))
    return (f'it lists {len(names)} images, {missing} of them not among '
            f'the {labeled.num_examples} selected')


def _positions_of(source, names, split_file):
    position = {name: i for i, name in enumerate(source.names)}
    unknown = [name for name in names if name not in position]
    if unknown:
        raise checks.DataError(
            f'{split_file}: {len(unknown)} names are not in the source, e.g. '
            f'{unknown[:3]} (source names look like '
            f'{list(source.names[:3])}).')
    if len(set(names)) != len(names):
        raise checks.DataError(
            f'{split_file} lists some images more than once.')
    return np.array([position[name] for name in names], np.int64)


def _sample_per_class(source, labels_per_class, fraction, seed):
    rng = np.random.default_rng(seed)
    chosen = []
    for class_id, class_name in enumerate(source.class_names):
        members = np.flatnonzero(source.labels == class_id)
        count = (labels_per_class if labels_per_class is not None
                 else int(round(fraction * len(members))))
        if count > len(members):
            raise checks.DataError(
                f'Class {class_name!r} (id {class_id}) has {len(members)} '
                f'images, fewer than labels_per_class={count}: lower it.')
        chosen.append(rng.choice(members, size=count, replace=False))
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros([0], int)


@gin.configurable(denylist=['source'])
def select_labeled(source, *, labels_per_class=None, fraction=None, seed=0,
                   split_file=None, include_labeled_in_unlabeled=True):
    """Splits a labeled `ImageSource` into the labeled subset and the
    unlabeled set, a `Split(labeled, unlabeled)` both in source order.

    Give exactly one of `labels_per_class`, `fraction` or `split_file`.

    Args:
        labels_per_class: images drawn per class without replacement
            (CIFAR-10 with 4000 labels: 400).
        fraction: share of each class drawn (rounded per class).
        seed: seed of the draw.
        split_file: text file of item names, one per line (paths relative
            to the folder root, or indices for array and TFDS sources:
            suncet's `cifar10_subsets/*.txt` work as they are).
        include_labeled_in_unlabeled: keep the labeled images in the
            unlabeled set (paper footnote 1: they may overlap).

    Raises:
        ValueError: conflicting arguments, a class too small, or a split
            file naming unknown or repeated images.
    """
    if [labels_per_class, fraction, split_file].count(None) != 2:
        raise ValueError('Give exactly one of labels_per_class, fraction and '
                         'split_file.')
    if source.labels is None:
        raise ValueError('select_labeled needs a source with labels.')
    if labels_per_class is not None:
        checks.integer('select_labeled.labels_per_class', labels_per_class)
    if fraction is not None and not (
            isinstance(fraction, numbers.Real) and 0 < fraction <= 1):
        raise checks.ConfigError(
            f'select_labeled.fraction = {fraction!r}: give the share of each '
            'class in (0, 1], e.g. 0.1 for 10%.')
    if split_file is not None:
        positions = np.sort(_positions_of(
            source, read_split_file(split_file), split_file))
        how = f'from {split_file}'
    else:
        positions = _sample_per_class(source, labels_per_class, fraction, seed)
        how = (f'{labels_per_class} per class' if fraction is None
               else f'fraction {fraction} per class') + f', seed {seed}'
    header = f'{len(positions)} labeled of {source.num_examples} ({how})'
    unlabeled = source
    if not include_labeled_in_unlabeled:
        unlabeled = source.subset(
            np.setdiff1d(np.arange(source.num_examples), positions))
    return Split(source.subset(positions), unlabeled, header)
