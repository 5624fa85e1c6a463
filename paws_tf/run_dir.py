"""A run directory (`--model_dir`): every file and folder a run writes is
named here, and only here.

The layout (docs/operations.md, "What a run directory holds", lists every
path, and tests/test_run_dir.py checks that the two agree):

    config.gin, config_<mode>.gin, flags.txt   what the run was started with
    operative_config.gin                        every value training called
    input.txt                                   the input's sizes per replica
    run_history.txt, run.lock                   starts, resumes and stops
    labeled_split.txt, normalization.json,      the run's data records
        data_fingerprint.json, .data_staging/
    imported.json                               an import of official weights
    checkpoints/, backup/chief/, damaged/       the model and optimizer
    export/embedder, export/classifier,         SavedModels
        export/fine_tuned
    eval/paws_nn.json                           PAWS-NN on the test split
    fine_tune/, supervised/                     their results and weights
        (results.json)
    results.json, results.png                   the demo's report
    tensorboard/{train,eval,fine_tune,supervised}

The data package and the runner compute the records; `RunDir` writes and
reads them.
"""

import datetime
import json
import os
import shutil
import socket

from paws_tf import files

# The records that wait in `RunDir.staging` until the data is accepted.
_STAGED = ('split', 'normalization')


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
        """The chief's backup, the one kept (`dist.write_dir`)."""
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
    def nn_results(self):
        """PAWS-NN's results (`evaluate_nn`)."""
        return self._join('eval', 'paws_nn.json')

    @property
    def fine_tune(self):
        return self._join('fine_tune')

    @property
    def fine_tune_results(self):
        return self._join('fine_tune', 'results.json')

    @property
    def supervised(self):
        return self._join('supervised')

    @property
    def supervised_results(self):
        """The demo's baseline's results."""
        return self._join('supervised', 'results.json')

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
    def train_logs(self):
        return self.tensorboard('train')

    @property
    def eval_logs(self):
        return self.tensorboard('eval')

    @property
    def fine_tune_logs(self):
        return self.tensorboard('fine_tune')

    @property
    def supervised_logs(self):
        return self.tensorboard('supervised')

    @property
    def training_outputs(self):
        """What a training run writes besides its config and data records:
        what `--overwrite` deletes."""
        return (self.checkpoints, self.backup, self.damaged,
                self.tensorboard(), self.export, self.eval, self.fine_tune,
                self.supervised, self.history, self.operative_config,
                self.input_summary, self.results, self.results_figure)

    def delete(self, paths):
        """Deletes the files and directories `paths` (of this run)."""
        for path in paths:
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)

    # The records.
    def write(self, path, text):
        """Writes `text` to `path`, one of this run's files, whole
        (`files.write_text`)."""
        os.makedirs(self.path, exist_ok=True)
        files.write_text(path, text)

    @staticmethod
    def _read_json(path):
        """The JSON record at `path`, or None if there is none."""
        try:
            with open(path) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def record_event(self, event):
        """Appends `<UTC time> <host> pid <pid>: <event>` to the history.

        A line is appended with one write, so a kill leaves the lines before
        it whole; a run that was killed shows as a start or resume line
        followed by the next resume line, with no end line between them.

        Returns:
            `event`.
        """
        now = datetime.datetime.now(datetime.timezone.utc).strftime(
            '%Y-%m-%dT%H:%M:%SZ')
        with open(self.history, 'a') as f:
            f.write(f'{now} {socket.gethostname()} pid {os.getpid()}: '
                    f'{event}\n')
        return event

    def write_split(self, names, header):
        """Records the labeled images' `names` under a `# header` line
        (`splits.read_split_file` reads it back)."""
        self.write(self.split, f'# {header}\n' +
                    ''.join(f'{name}\n' for name in names))

    def read_normalization(self):
        """The recorded normalisation (`normalization.record`), or None."""
        return self._read_json(self.normalization)

    def write_normalization(self, record):
        self.write(self.normalization, json.dumps(record, indent=2))

    def read_fingerprint(self):
        """The recorded `data_fingerprint.fingerprint`, or None."""
        return self._read_json(self.fingerprint)

    def write_fingerprint(self, fingerprint):
        self.write(self.fingerprint,
                    json.dumps(fingerprint, indent=1, sort_keys=True))

    def staged(self):
        """The `RunDir` of `staging`, where a start writes its data records
        until the data is accepted (`accept_staged`)."""
        return RunDir(self.staging)

    def accept_staged(self, accept=True):
        """Moves the staged data records in (`accept`), then deletes the
        staging directory: a refused start leaves the records as they
        were."""
        staged = self.staged()
        try:
            for name in _STAGED if accept else ():
                if os.path.exists(getattr(staged, name)):
                    os.replace(getattr(staged, name), getattr(self, name))
        finally:
            shutil.rmtree(staged.path, ignore_errors=True)
