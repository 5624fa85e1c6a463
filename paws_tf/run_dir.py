"""A run directory (`--model_dir`): every file and folder a run writes is
named here, and only here.

The layout (docs/operations.md, "What a run directory holds"):

    config.gin, config_<mode>.gin, flags.txt   what the run was started with
    operative_config.gin                        every value training called
    input.txt                                   the input's sizes per replica
    run_history.txt, run.lock                   starts, resumes and stops
    labeled_split.txt, normalization.json,      the run's data records
        data_fingerprint.json
    imported.json                               an import of official weights
    checkpoints/, backup/chief/, damaged/       the model and optimizer
    export/embedder, export/classifier,         SavedModels
        export/fine_tuned
    eval/paws_nn.json                           PAWS-NN on the test split
    fine_tune/, supervised/                     their results and weights
    results.json, results.png                   the demo's report
    tensorboard/{train,eval,fine_tune,supervised}
"""

import os


class RunDir:
    """The paths of one run directory.

    Args:
        path: the run directory; it need not exist yet.
    """

    def __init__(self, path):
        self.path = os.fspath(path)

    def __repr__(self):
        return f'RunDir({self.path!r})'

    def __str__(self):
        return self.path

    def __fspath__(self):
        return self.path

    def _join(self, *names):
        return os.path.join(self.path, *names)

    # What the run was started with.
    @property
    def config(self):
        """The gin config of a training run."""
        return self._join('config.gin')

    def mode_config(self, mode):
        """The gin config of a run of `mode` that does not train."""
        return self._join(f'config_{mode}.gin')

    @property
    def flags(self):
        return self._join('flags.txt')

    @property
    def operative_config(self):
        return self._join('operative_config.gin')

    @property
    def input_summary(self):
        return self._join('input.txt')

    @property
    def history(self):
        return self._join('run_history.txt')

    @property
    def lock(self):
        return self._join('run.lock')

    # The run's data records.
    @property
    def split(self):
        return self._join('labeled_split.txt')

    @property
    def normalization(self):
        return self._join('normalization.json')

    @property
    def fingerprint(self):
        return self._join('data_fingerprint.json')

    @property
    def staging(self):
        """Where the data records wait until the data is accepted."""
        return self._join('.data_staging')

    @property
    def imported(self):
        return self._join('imported.json')

    # The model and optimizer.
    @property
    def checkpoints(self):
        return self._join('checkpoints')

    @property
    def backup(self):
        return self._join('backup')

    @property
    def chief_backup(self):
        """The chief's backup, the one kept (`cluster.write_dir`)."""
        return self._join('backup', 'chief')

    @property
    def damaged(self):
        return self._join('damaged')

    # What is derived from the model.
    @property
    def export(self):
        return self._join('export')

    @property
    def embedder(self):
        return self._join('export', 'embedder')

    @property
    def classifier(self):
        return self._join('export', 'classifier')

    @property
    def fine_tuned(self):
        """The SavedModel of an imported fine-tuned classifier."""
        return self._join('export', 'fine_tuned')

    @property
    def eval(self):
        return self._join('eval')

    @property
    def fine_tune(self):
        return self._join('fine_tune')

    @property
    def supervised(self):
        return self._join('supervised')

    @property
    def results(self):
        """The demo's results."""
        return self._join('results.json')

    @property
    def results_figure(self):
        return self._join('results.png')

    def tensorboard(self, run=None):
        """TensorBoard's log directory, or that of one of its runs
        (`'train'`, `'eval'`, `'fine_tune'`, `'supervised'`)."""
        return self._join('tensorboard', *([run] if run else []))

    @property
    def training_outputs(self):
        """What a training run writes besides its config and data records:
        what `--overwrite` deletes."""
        return (self.checkpoints, self.backup, self.damaged,
                self.tensorboard(), self.export, self.eval, self.fine_tune,
                self.supervised, self.history, self.operative_config,
                self.input_summary, self.results, self.results_figure)
