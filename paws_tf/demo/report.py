"""The comparison report of `run.py --mode=demo`: a table, results.json and
a figure (training curves, 2-D projection of the test embeddings)."""

import glob
import os

import matplotlib
matplotlib.use('Agg')  # Files only; no display needed.
from matplotlib import pyplot  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorboard.backend.event_processing import event_accumulator  # noqa

from paws_tf import files


def read_scalars(log_dir, tag):
    """(steps, values) of a TensorBoard scalar under `log_dir`, by step."""
    points = {}
    for path in glob.glob(os.path.join(log_dir, 'events.out.tfevents.*')):
        events = event_accumulator.EventAccumulator(
            path, size_guidance={event_accumulator.TENSORS: 0})
        events.Reload()
        if tag in events.Tags()['tensors']:
            for event in events.Tensors(tag):
                points[event.step] = float(tf.make_ndarray(
                    event.tensor_proto))
    steps = sorted(points)
    return np.array(steps), np.array([points[s] for s in steps])


def training_views_per_second(log_dir):
    """The median training throughput (views/s) logged under `log_dir`:
    of the every-N-steps figures, else (runs shorter than N steps) of the
    per-epoch ones; None when neither was logged."""
    for tag in ('throughput/views_per_second',
                'throughput/epoch_views_per_second'):
        _, values = read_scalars(log_dir, tag)
        if len(values):
            return float(np.median(values))
    return None


def project_2d(embeddings):
    """Principal-component projection of `[N, D]` embeddings to `[N, 2]`."""
    centred = embeddings - embeddings.mean(axis=0)
    _, _, components = np.linalg.svd(centred, full_matrices=False)
    return centred @ components[:2].T


def write_figure(run, *, embeddings, labels, class_names, title,
                 fine_tune_by_epoch=None, supervised_top1=None):
    """Training curves, PAWS-NN by epoch and the embedding projection, as
    the `RunDir` `run`'s `results_figure` PNG.

    Args:
        run: the `RunDir` whose TensorBoard runs `train` and `eval` are read.
        embeddings, labels: `[N, D]` test embeddings, `[N]` their classes.
        class_names, title: names indexed by class id, the figure's title.
        fine_tune_by_epoch: the fine-tuning's `paws_nn_by_epoch` entries
            (`epoch`, `top1`), drawn after the pre-training epochs.
        supervised_top1: the baseline's top-1, drawn as a level.
    """
    figure, axes = pyplot.subplots(1, 3, figsize=(16, 4.8))
    for tag, label in (('epoch/loss', 'loss'),
                       ('epoch/cross_entropy', 'cross-entropy')):
        _, values = read_scalars(run.train_logs, tag)
        axes[0].plot(np.arange(1, len(values) + 1), values, marker='o',
                     label=label)
    axes[0].set(xlabel='epoch', title='PAWS training loss')
    axes[0].legend()
    _, top1 = read_scalars(run.eval_logs, 'paws_nn/top1')
    axes[1].plot(np.arange(1, len(top1) + 1), 100 * top1, marker='o',
                 label='PAWS pre-training')
    if fine_tune_by_epoch:
        # Fine-tuning epoch e is drawn at pre-training's last epoch + e.
        axes[1].plot([len(top1) + e['epoch'] for e in fine_tune_by_epoch],
                     [100 * e['top1'] for e in fine_tune_by_epoch],
                     marker='.', label='fine-tuning')
    if supervised_top1 is not None:
        axes[1].axhline(100 * supervised_top1, color='grey', linestyle='--',
                        label='supervised only')
    axes[1].set(xlabel='epoch', ylabel='top-1 (%)',
                title='PAWS-NN on the test split')
    axes[1].legend()
    points = project_2d(embeddings)
    for class_id, name in enumerate(class_names):
        mask = labels == class_id
        axes[2].scatter(points[mask, 0], points[mask, 1], s=2, label=name)
    axes[2].set(title='test embeddings (PCA)', xticks=[], yticks=[])
    axes[2].legend(markerscale=5, fontsize=7, loc='best')
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(run.results_figure, dpi=110)
    pyplot.close(figure)


def table(rows):
    """A plain-text table of `rows` (dicts with the same keys)."""
    keys = list(rows[0])
    widths = [max(len(k), *(len(str(r[k])) for r in rows)) for k in keys]
    line = lambda cells: '  '.join(  # noqa: E731
        str(c).ljust(w) for c, w in zip(cells, widths))
    return '\n'.join([line(keys), line('-' * w for w in widths)] +
                     [line(r[k] for k in keys) for r in rows])


def write_results(run, results):
    """Writes `results` to the `RunDir`'s `results`; returns the path."""
    files.write_json(run.results, results, indent=2)
    return run.results
