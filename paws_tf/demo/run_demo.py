"""`--mode=demo`: PAWS pre-training, PAWS-NN and fine-tuning against a
supervised-only baseline on the same labels, with a table and a figure."""

import time

import numpy as np

from paws_tf import bindings
from paws_tf import cluster
from paws_tf.data import pipeline
from paws_tf.demo import report
from paws_tf.demo import supervised
from paws_tf.evaluation import evaluate
from paws_tf.evaluation import fine_tune
from paws_tf import run_dir
from paws_tf.runner import experiment
from paws_tf.runner import modes
from paws_tf.runner import official_import
from paws_tf.runner import train


def demo(model_dir, strategy, options):
    """PAWS pre-training, export and PAWS-NN, the configured fine-tuning
    (`fine_tune.fine_tune`; the demo configs bind the CIFAR-10 protocol),
    then the baseline (`supervised.train_supervised`); writes
    `results.json`, `results.png` and prints a table.

    Args:
        model_dir: the run directory.
        strategy: the `tf.distribute.Strategy`.
        options: `modes.Options`: `overwrite` and `owner_check`, passed to
            `train.train`.

    Returns:
        The results dict (also in `model_dir/results.json`).
    """
    record = official_import.read_record(model_dir)
    if record is not None:
        official_import.refuse(record, 'demo', model_dir, trains=True)
    start = time.perf_counter()
    train.train(model_dir, strategy, overwrite=options.overwrite,
                owner_check=options.owner_check)
    paws_seconds = time.perf_counter() - start
    # Read once, for PAWS-NN, the export, fine-tuning and the baseline.
    bundle = modes.load_labeled_data(
        model_dir, "the demo's PAWS-NN, fine-tuning and baseline use them")
    paws = modes.export_and_evaluate(model_dir, strategy, bundle=bundle)
    model, _ = modes.load_trained_model(model_dir, strategy)
    preprocessing = experiment.eval_preprocessing(bundle)
    tune_start = time.perf_counter()
    tuned = fine_tune.fine_tune(model_dir, model, labeled=bundle.labeled,
                                test=bundle.test, strategy=strategy,
                                **preprocessing)
    tune_seconds = time.perf_counter() - tune_start
    if not cluster.is_chief(strategy):
        cluster.barrier(strategy)  # The chief's baseline and report.
        return None
    run = run_dir.RunDir(model_dir)
    baseline = supervised.train_supervised(
        run, labeled=bundle.labeled, test=bundle.test,
        preprocessing=preprocessing)
    results = _results(run, bundle, paws, tuned, baseline,
                       paws_train_seconds=paws_seconds,
                       finetune_seconds=tune_seconds, start=start)
    _report(run, results, bundle=bundle, tuned=tuned, baseline=baseline,
            preprocessing=preprocessing)
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
        labels_per_class=(int(per_class[0]) if np.all(per_class ==
                                                      per_class[0])
                          else per_class.tolist()),
        num_labeled=bundle.labeled.num_examples,
        num_unlabeled=bundle.unlabeled.num_examples,
        num_test=paws['num_queries'], seed=bindings.bound('train.seed', 0),
        paws_train_seconds=paws_train_seconds,
        finetune_seconds=finetune_seconds,
        supervised_seconds=baseline['wall_seconds'],
        images_per_second=report.training_views_per_second(run.train_logs),
        wall_seconds=time.perf_counter() - start)


def _report(run, results, *, bundle, tuned, baseline, preprocessing):
    """Writes `results.json` and the figure, and prints the table."""
    results_path = report.write_results(run, results)
    # The test images embedded as PAWS-NN embeds them, by the export.
    embeddings, labels = evaluate.embed_dataset(
        evaluate.embedder_from_saved_model(run.embedder),
        pipeline.make_eval_dataset(bundle.test, batch_size=256,
                                   **preprocessing))
    report.write_figure(
        run, embeddings=embeddings.numpy(), labels=labels,
        class_names=bundle.labeled.class_names,
        fine_tune_by_epoch=tuned.get('paws_nn_by_epoch'),
        supervised_top1=baseline['top1'],
        title=f'PAWS-NN {100 * results["paws_nn_top1"]:.1f}%, fine-tuned '
        f'{100 * results["paws_finetune_top1"]:.1f}% vs supervised '
        f'{100 * results["supervised_top1"]:.1f}% top-1 '
        f'({results["num_labeled"]} labels)')
    print(_table(results, baseline_images_per_second=baseline[
        'images_per_second']))
    print(f'total wall time {results["wall_seconds"]:.0f} s; results in '
          f'{results_path}, figure in {run.results_figure}')


def _table(results, *, baseline_images_per_second):
    """The printed comparison of the demo's `results`."""
    views = results['images_per_second']
    rows = [('PAWS-NN', 'paws_nn', 'paws_train', ' (pre-training)',
             'not logged' if views is None else f'{views:.0f} views/s'),
            ('PAWS-NN, fine-tuned', 'paws_finetune', 'finetune',
             ' (fine-tuning)', ''),
            ('supervised only', 'supervised', 'supervised', '',
             f'{baseline_images_per_second:.0f} images/s')]
    return report.table([
        {'method': method, 'top-1': f'{100 * results[top1 + "_top1"]:.2f}%',
         'wall time': f'{results[seconds + "_seconds"]:.0f} s{what}',
         'images/s': rate} for method, top1, seconds, what, rate in rows])
