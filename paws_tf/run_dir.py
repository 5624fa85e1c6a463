"""A run directory (`--model_dir`): every file and folder a run writes is
named here, and only here (docs/operations.md lists them)."""

import json
import os
import shutil
import socket
import time

from paws_tf import files

# The records that wait in `RunDir.staging` until a training run's start is
# accepted: its data records, and run.py's config and flags.
_STAGED = ('split', 'normalization', 'config', 'flags')
# The results of the demo, of fine-tuning and of the baseline, each in its
# directory (a fine-tuning's output directory outside a run too).
RESULTS_FILE = 'results.json'


def _path(*names, doc=None):
    """A `RunDir` property: the path `names` joined under the run's."""
    return property(lambda run: os.path.join(run.path, *names), doc=doc)


class RunDir:
    """The paths of the run directory `path` (it need not exist yet)."""

    def __init__(self, path):
        self.path = os.fspath(path)

    def __str__(self):
        return self.path

    def __fspath__(self):
        return self.path

    # What the run was started with.
    config = _path('config.gin', doc='The gin config of a training run.')
    flags = _path('flags.txt')
    operative_config = _path('operative_config.gin')
    input_summary = _path('input.txt')
    history = _path('run_history.txt')
    lock = _path('run.lock')

    # The run.py modes that read a run and record only their config.
    READING_MODES = ('evaluate_nn', 'export', 'fine_tune')

    def mode_config(self, mode):
        """The gin config of a run of `mode` (of `READING_MODES`)."""
        return os.path.join(self.path, f'config_{mode}.gin')

    # The run's data records.
    split = _path('labeled_split.txt')
    normalization = _path('normalization.json')
    fingerprint = _path('data_fingerprint.json')
    staging = property(
        lambda run: RunDir(os.path.join(run.path, '.data_staging')),
        doc='The `RunDir` where a training run writes its records until '
        'its start is accepted (`accept_staged`).')
    imported = _path('imported.json')
    # What an import holds (the `kind` of its record): a pre-trained PAWS
    # model, a fine-tuned classifier (`fine_tuned`), a backbone alone.
    IMPORT_KINDS = ('pretrained', 'fine_tuned', 'backbone')

    # The model and optimizer.
    checkpoints = _path('checkpoints')
    backup = _path('backup')
    # The chief's backup, the one kept (`cluster.write_dir`).
    CHIEF = 'chief'
    chief_backup = _path('backup', CHIEF)
    damaged = _path('damaged')

    # What is derived from the model.
    export = _path('export')
    embedder = _path('export', 'embedder')
    classifier = _path('export', 'classifier')
    fine_tuned = _path('export', 'fine_tuned', doc='The SavedModel of an '
                       'imported fine-tuned classifier.')
    eval = _path('eval')
    nn_results = _path('eval', 'paws_nn.json', doc="PAWS-NN's results.")
    nn_figure = _path('eval', 'paws_nn.png', doc="PAWS-NN's confusion "
                      'matrix and neighbours.')
    fine_tune = _path('fine_tune')
    fine_tune_results = _path('fine_tune', RESULTS_FILE)
    supervised = _path('supervised')
    supervised_results = _path('supervised', RESULTS_FILE,
                               doc="The demo's baseline's results.")
    results = _path(RESULTS_FILE, doc="The demo's results.")
    results_figure = _path('results.png')

    tensorboard = _path('tensorboard', doc="TensorBoard's log directory, "
                        "the parent of its runs' below.")

    train_logs = _path('tensorboard', 'train')
    eval_logs = _path('tensorboard', 'eval')
    fine_tune_logs = _path('tensorboard', 'fine_tune')
    supervised_logs = _path('tensorboard', 'supervised')

    @property
    def overwritten(self):
        """What `--overwrite` deletes, for a training run and an import
        alike: every output and record of the run in this directory."""
        return (self.checkpoints, self.backup, self.damaged,
                self.tensorboard, self.export, self.eval, self.fine_tune,
                self.supervised, self.history, self.operative_config,
                self.input_summary, self.results, self.results_figure,
                self.config, self.flags, self.split, self.normalization,
                self.fingerprint, self.imported,
                *map(self.mode_config, self.READING_MODES))

    def holds_results(self):
        """Whether the run holds what is derived from its model: exports,
        evaluations, fine-tuning or the demo's results."""
        return any(os.path.exists(path) for path in (
            self.export, self.eval, self.fine_tune, self.supervised,
            self.results))

    def delete(self, paths):
        """Deletes the files and directories `paths` (of this run)."""
        for path in paths:
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)

    # The records.
    def write(self, path, text):
        """Writes `text` to `path`, one of this run's files, whole."""
        os.makedirs(self.path, exist_ok=True)
        files.write_text(path, text)

    def record_event(self, event):
        """Appends `<UTC time> <host> pid <pid>: <event>` to the history, in
        one write (a kill leaves the lines before it whole), and returns
        `event`."""
        now = time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())
        with open(self.history, 'a') as f:
            f.write(f'{now} {socket.gethostname()} pid {os.getpid()}: '
                    f'{event}\n')
        return event

    def write_split(self, names, header):
        """Records the labeled images' `names` under a `# header` line."""
        self.write(self.split, f'# {header}\n' +
                    ''.join(f'{name}\n' for name in names))

    def write_json(self, path, value, **dump_kwargs):
        """Writes `value` as indented JSON (`json.dumps`'s `dump_kwargs`)
        to `path`, one of this run's records, whole."""
        self.write(path, json.dumps(value, indent=2, **dump_kwargs))

    @staticmethod
    def read_json(path):
        """The JSON record at `path`, or None if there is none."""
        try:
            with open(path) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def accept_staged(self, accept=True):
        """Moves the staged records in (`accept`), then deletes the
        staging directory: a refused start leaves the records unchanged."""
        staged = self.staging
        try:
            for name in _STAGED if accept else ():
                if os.path.exists(getattr(staged, name)):
                    os.replace(getattr(staged, name), getattr(self, name))
        finally:
            shutil.rmtree(staged.path, ignore_errors=True)
