"""Evaluators: what measures a model on the labeled and test images, at
the training's epoch ends (`train.evaluators`), in `--mode=evaluate_nn`,
during fine-tuning and in the demo.

An evaluator is a class built as `Evaluator(labeled, test, *,
preprocessing, tau, log_dir, max_queries)`, with a `name` (its top-1's key
in `fit`'s logs) and a `title` (in log lines); called with `embed_fn`
(`evaluate.embed_dataset`'s) and the global step, it returns its results
dict and writes its TensorBoard points. Another than `PawsNN` (a linear
probe) is a new class and a binding, `train.evaluators = [@PawsNN, @Mine]`.
"""

import os

from absl import logging
import gin
import numpy as np
import tensorflow as tf
import tf_keras

from paws_tf.data import pipeline
from paws_tf.evaluation import evaluate
from paws_tf import files


@gin.configurable(allowlist=['batch_size', 'query_chunk'])
class PawsNN:
    """PAWS-NN (PAWS App. A): every test image classified by soft nearest
    neighbours among the embeddings of every labeled image.

    Both sets are embedded once, in order, with the evaluation
    preprocessing of `pipeline.make_eval_dataset`; the embedded counts are
    checked against the sources' sizes (the official code once reported 1%
    figures computed with the 10% support).

    Args:
        labeled: `sources.ImageSource`, the support.
        test: `sources.ImageSource` or `sources.StreamSource`, the queries.
        preprocessing: `pipeline.make_eval_dataset`'s `image_size`,
            `crop_fraction`, `mean` and `std`.
        tau: similarity temperature.
        log_dir, tag: TensorBoard directory (None: none) and group of the
            points `{tag}/top1`, `{tag}/top5`.
        max_queries: the first this many test images are the queries
            (None: all), so that a curve during training is cheap.
        results_file: JSON file of each call's results (None: none).
        record: entries added to the results: what was evaluated.
        batch_size, query_chunk: images per embedding batch, queries
            classified at once (`evaluate.classify`).
    """
    name, title = 'paws_nn', 'PAWS-NN'

    def __init__(self, labeled, test, *, preprocessing, tau, log_dir=None,
                 max_queries=None, tag=name, results_file=None, record=None,
                 batch_size=256, query_chunk=evaluate.DEFAULT_QUERY_CHUNK):
        if test.class_names and test.class_names != labeled.class_names:
            raise ValueError('The labeled and test sets name their classes '
                             'differently.')
        self._support = pipeline.make_eval_dataset(
            labeled, batch_size=batch_size, **preprocessing)
        self._queries = pipeline.make_eval_dataset(
            test, batch_size=batch_size, **preprocessing)
        num_queries = test.num_examples
        if max_queries is not None:
            self._queries = self._queries.unbatch().take(max_queries).batch(
                batch_size)
            num_queries = min(num_queries, max_queries)
        self._sizes = labeled.num_examples, num_queries
        self.num_classes = (len(labeled.class_names) or
                            int(np.max(labeled.labels)) + 1)
        self._tau, self._tag, self._query_chunk = tau, tag, query_chunk
        self._writer = log_dir and tf.summary.create_file_writer(log_dir)
        self._results_file, self._record = results_file, record or {}

    def __call__(self, embed_fn, step=0):
        """The `evaluate.paws_nn` results of `embed_fn`, plus `record` (and
        `results_file`, after writing it, when there is one).

        Raises:
            RuntimeError: embedded counts that differ from the sources'.
        """
        results = evaluate.paws_nn(
            embed_fn, self._support, self._queries,
            num_classes=self.num_classes, tau=self._tau,
            query_chunk=self._query_chunk)
        for what, embedded, expected in (
                ('support', results['num_support'], self._sizes[0]),
                ('query', results['num_queries'], self._sizes[1])):
            if embedded != expected:
                raise RuntimeError(f'Embedded {embedded} {what} images, but '
                                   f'the source holds {expected}.')
        if self._writer:
            with self._writer.as_default(step=step):
                for key in ('top1', 'top5'):
                    if key in results:
                        tf.summary.scalar(f'{self._tag}/{key}', results[key])
            self._writer.flush()
        results.update(self._record)
        if self._results_file:
            os.makedirs(os.path.dirname(self._results_file), exist_ok=True)
            files.write_json(self._results_file, results, indent=2)
            results['results_file'] = self._results_file
        return results


class EpochEndEvaluation(tf_keras.callbacks.Callback):
    """Runs evaluators every `every_epochs` epochs of `fit` and logs each
    one's top-1 (`{prefix}epoch {e}: {title} top-1 {x}%`).

    Args:
        evaluators: built evaluators, run in order.
        embedder: `embedder(model)`, called with `fit`'s model at each
            evaluation on every process: the `embed_fn` to evaluate, or
            None where this process only takes part in reading the weights
            (a cluster's workers but the chief).
        num_epochs: when given, the last epoch is evaluated too, and the
            log lines say `epoch {e}/{num_epochs}`.
        prefix: the start of the log lines.
        to_logs: put each evaluator's top-1 in `fit`'s logs as
            `{name}_top1`, for the progress bar and the epoch's log line.

    Attributes:
        history: `dict(epoch=..., **results)` of each evaluation, in order.
    """

    def __init__(self, evaluators, embedder, *, every_epochs=1,
                 num_epochs=None, prefix='', to_logs=True):
        super().__init__()
        self._evaluators, self._embedder = list(evaluators), embedder
        self._every, self._last = every_epochs, num_epochs
        self._prefix, self._to_logs = prefix, to_logs
        self.history = []

    def on_epoch_end(self, epoch, logs=None):
        done = epoch + 1
        if (done % self._every and done != self._last or
                self.model.stop_training):
            return  # Not due, or stopping (a preemption's grace period).
        embed_fn = self._embedder(self.model)
        if embed_fn is None:
            return
        step = int(self.model.optimizer.iterations.numpy())
        of = f'/{self._last}' if self._last else ''
        for evaluator in self._evaluators:
            results = evaluator(embed_fn, step)
            self.history.append(dict(epoch=done, **results))
            if 'top1' not in results:
                continue
            logging.info('%sepoch %d%s: %s top-1 %.2f%%', self._prefix, done,
                         of, evaluator.title, 100 * results['top1'])
            if self._to_logs and logs is not None:
                logs[f'{evaluator.name}_top1'] = results['top1']
