"""`--mode=demo`: PAWS against a supervised-only baseline on the same
labels, and its report (a table, results.json and a figure with PAWS-NN's
pictures)."""

import glob
import os
import time

import matplotlib.image
from matplotlib import figure as mpl_figure
from matplotlib import ticker
import numpy as np
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

from paws_tf import bindings
from paws_tf import cluster
from paws_tf.data import pipeline
from paws_tf.demo import supervised
from paws_tf.evaluation import evaluate
from paws_tf.evaluation import fine_tune
from paws_tf.runner import experiment
from paws_tf.runner import modes
from paws_tf.runner import train


def demo(run, strategy, options):
    """PAWS pre-training (`modes.Options` `options`), export and
    PAWS-NN, the configured fine-tuning (the demo configs bind the
    CIFAR-10 protocol), then the baseline, in the `RunDir` `run`; returns
    the results dict, also in `RunDir.results`."""
    start = time.perf_counter()
    trained = modes.trained_model(run, strategy, options)
    paws_seconds = time.perf_counter() - start
    # Read once, for PAWS-NN, the export, fine-tuning and the baseline.
    bundle = modes.load_labeled_data(
        run, "the demo's PAWS-NN, fine-tuning and baseline use them")
    paws = modes.export_and_evaluate(run, strategy, trained, bundle=bundle)
    # Fine-tuning's float32 copy in the strategy's scope.
    model, _ = modes.load_trained_model(run, strategy)
    preprocessing = experiment.eval_preprocessing(bundle)
    tune_start = time.perf_counter()
    tuned = fine_tune.fine_tune(run, model, labeled=bundle.labeled,
                                test=bundle.test, strategy=strategy,
                                **preprocessing)
    tune_seconds = time.perf_counter() - tune_start
    if not cluster.is_chief(strategy):
        cluster.barrier(strategy)  # The chief's baseline and report.
        return None
    baseline = supervised.train_supervised(
        run, labeled=bundle.labeled, test=bundle.test,
        preprocessing=preprocessing)
    results = _results(run, bundle, paws, tuned, baseline,
                       paws_train_seconds=paws_seconds,
                       finetune_seconds=tune_seconds, start=start)
    _report(run, results, bundle=bundle, tuned=tuned, baseline=baseline,
            preprocessing=preprocessing, nn_figure=paws['figure_file'])
    cluster.barrier(strategy)
    return results


def _results(run, bundle, paws, tuned, baseline, *, paws_train_seconds,
             finetune_seconds, start):
    """The demo's top-1s, the data's sizes and the timings since `start`."""
    per_class = np.bincount(bundle.labeled.labels)
    return dict(
        paws_nn_top1=paws['top1'], paws_nn_top5=paws.get('top5'),
        paws_finetune_top1=tuned['top1'], finetune_protocol=tuned['protocol'],
        supervised_top1=baseline['top1'],
        labels_per_class=(int(per_class[0]) if len(set(per_class)) == 1
                          else per_class.tolist()),
        num_labeled=bundle.labeled.num_examples,
        num_unlabeled=bundle.unlabeled.num_examples,
        num_test=paws['num_queries'],
        seed=bindings.arguments(train.train)['seed'][0],
        paws_train_seconds=paws_train_seconds,
        finetune_seconds=finetune_seconds,
        supervised_seconds=baseline['wall_seconds'],
        images_per_second=training_views_per_second(run.train_logs),
        wall_seconds=time.perf_counter() - start)


def _report(run, results, *, bundle, tuned, baseline, preprocessing,
            nn_figure):
    """Writes `results.json` and the figure (with PAWS-NN's pictures,
    `nn_figure`, unless None), and prints the comparison."""
    run.write_json(run.results, results)
    # The test images embedded as PAWS-NN embeds them, by the export.
    embeddings, labels = evaluate.embed_dataset(
        evaluate.embedder_from_saved_model(run.embedder),
        pipeline.make_eval_dataset(bundle.test, batch_size=256,
                                   **preprocessing))
    _write_figure(run, results, embeddings.numpy(), labels,
                  bundle.labeled.class_names, tuned.get('paws_nn_by_epoch'),
                  nn_figure)
    views = results['images_per_second']
    rows = [('PAWS-NN', 'paws_nn', 'paws_train', ' (pre-training)',
             'not logged' if views is None else f'{views:.0f} views/s'),
            ('PAWS-NN, fine-tuned', 'paws_finetune', 'finetune',
             ' (fine-tuning)', ''),
            ('supervised only', 'supervised', 'supervised', '',
             f'{baseline["images_per_second"]:.0f} images/s')]
    print(table([
        {'method': method, 'top-1': f'{100 * results[top1 + "_top1"]:.2f}%',
         'wall time': f'{results[seconds + "_seconds"]:.0f} s{what}',
         'images/s': rate} for method, top1, seconds, what, rate in rows]))
    print(f'total wall time {results["wall_seconds"]:.0f} s; results in '
          f'{run.results}, figure in {run.results_figure}')


def read_scalars(log_dir, tag):
    """(steps, values) of a TensorBoard scalar under `log_dir`, by step."""
    points = {}
    for path in glob.glob(os.path.join(log_dir, 'events.out.tfevents.*')):
        events = event_accumulator.EventAccumulator(
            path, size_guidance={event_accumulator.TENSORS: 0})
        events.Reload()
        if tag in events.Tags()['tensors']:
            for event in events.Tensors(tag):
                points[event.step] = float(tf.make_ndarray(event.tensor_proto))
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


def _write_figure(run, results, embeddings, labels, class_names,
                  fine_tune_by_epoch, nn_figure):
    """`run.results_figure`: `_plot_curves`, the PCA of the `[N, D]` test
    `embeddings`, above PAWS-NN's pictures (the PNG file `nn_figure`;
    None: `evaluate_nn.pictures = False`, none drawn)."""
    # No pyplot, no display.
    figure = mpl_figure.Figure(figsize=(18, 14 if nn_figure else 5.3),
                               layout='constrained')
    top, bottom = (figure.subfigures(2, 1, height_ratios=[5.3, 8.7])
                   if nn_figure else (figure, None))
    axes = top.subplots(1, 4, width_ratios=[1.2, 1, 1, 1.1])
    _plot_curves(axes[:3], run, 100 * results['supervised_top1'],
                 fine_tune_by_epoch)
    points = project_2d(embeddings)
    for class_id, name in enumerate(class_names):
        mask = labels == class_id
        axes[3].scatter(points[mask, 0], points[mask, 1], s=2, label=name)
    axes[3].set(title='test embeddings (PCA)',
                xlabel='1st principal component',
                ylabel='2nd principal component')
    axes[3].legend(markerscale=5, fontsize=7, loc='best')
    top.suptitle(
        f'PAWS-NN {100 * results["paws_nn_top1"]:.1f}%, fine-tuned '
        f'{100 * results["paws_finetune_top1"]:.1f}% vs supervised '
        f'{100 * results["supervised_top1"]:.1f}% top-1 '
        f'({results["num_labeled"]} labels)')
    if nn_figure:
        pictures = bottom.subplots()
        pictures.imshow(matplotlib.image.imread(nn_figure))
        pictures.set_axis_off()
    figure.savefig(run.results_figure, dpi=110)


def _plot_curves(axes, run, baseline, fine_tune_by_epoch):
    """The figure's three panels of curves: the pre-training loss terms,
    PAWS-NN by pre-training epoch and by fine-tuning epoch, against the
    `baseline` top-1 (%)."""
    for tag, label in (('epoch/loss', 'loss = cross-entropy + me-max'),
                       ('epoch/cross_entropy', 'cross-entropy'),
                       ('epoch/me_max', 'me-max = -entropy of the mean '
                                        'prediction')):
        epoch_ends, values = read_scalars(run.train_logs, tag)
        axes[0].plot(np.arange(1, len(values) + 1), values, marker='o',
                     label=label)
    axes[0].axhline(0, color='grey', linewidth=0.5)
    axes[0].set(xlabel='pre-training epoch', ylabel='epoch mean',
                title='PAWS pre-training loss\n(me-max <= 0, so the loss '
                      'can be negative)')
    axes[0].legend(fontsize=8)
    # At the epochs that evaluated (every `train.eval_every_epochs`).
    steps, top1 = read_scalars(run.eval_logs, 'paws_nn/top1')
    axes[1].plot(1 + np.searchsorted(epoch_ends, steps), 100 * top1,
                 marker='o', label='PAWS-NN')
    axes[1].set(xlabel='pre-training epoch',
                title='PAWS-NN during pre-training')
    if fine_tune_by_epoch:
        axes[2].plot([e['epoch'] for e in fine_tune_by_epoch],
                     [100 * e['top1'] for e in fine_tune_by_epoch],
                     marker='.', color='C2', label='PAWS-NN, fine-tuned')
    axes[2].set(xlabel='fine-tuning epoch (0: before)',
                title='PAWS-NN during fine-tuning')
    for panel in axes[1:]:
        panel.axhline(baseline, color='grey', linestyle='--',
                      label='supervised only')
        panel.set(ylabel='test top-1 (%)')
        panel.legend(fontsize=8)
    # Both accuracy panels on one scale, to compare their heights.
    low, high = zip(*(panel.get_ylim() for panel in axes[1:]))
    for panel in axes[1:]:
        panel.set_ylim(min(low), max(high))
    for panel in axes:  # Whole epochs, half an epoch beyond the ends.
        first, last = panel.dataLim.intervalx
        if np.isfinite([first, last]).all():  # Else no curve, a line only.
            panel.set_xlim(first - 0.5, last + 0.5)
        panel.xaxis.set_major_locator(
            ticker.MaxNLocator(integer=True, min_n_ticks=1))


def table(rows):
    """A plain-text table of `rows` (dicts with the same keys)."""
    keys = list(rows[0])
    widths = [max(len(k), *(len(str(r[k])) for r in rows)) for k in keys]
    line = lambda cells: '  '.join(  # noqa: E731
        str(c).ljust(w) for c, w in zip(cells, widths))
    return '\n'.join([line(keys), line('-' * w for w in widths)] +
                     [line(r[k] for k in keys) for r in rows])
