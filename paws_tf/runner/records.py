"""A trained run's data records, read and checked by the modes that do not
train: a labeled split or class set other than training's is refused."""

import re

import gin

from paws_tf.data import data_fingerprint
from paws_tf.data import splits

# The config lines that choose the labeled images and their classes: the
# data's configurables, their scopes and macros.
_DATA_LINES = re.compile(
    r'([A-Z][A-Z0-9_]* = |(load_data|select_labeled|image_folders?|'
    r'synthetic_source|class_subset|held_out|tfds_source)\.|'
    r'(train|test|unlabeled)/)')
# Of the changed config lines, how many a message names.
_LINES_SHOWN = 3


def config_changes(run, compared):
    """`(added, removed)`: the binding lines of this gin config that
    `compared` (a predicate) keeps and the run's training config
    (`RunDir.config`) lacks, and those it holds that this config lacks
    (gin's comments, such as a configurable's section header, are not
    compared); None when the run has no such record."""
    def kept(text):
        return [line for line in text.splitlines() if line.strip() and
                not line.startswith('#') and compared(line)]

    try:
        with open(run.config) as f:
            recorded = kept(f.read())
    except FileNotFoundError:
        return None
    current = kept(gin.config_str())
    return ([line for line in current if line not in recorded],
            [line for line in recorded if line not in current])


def _refuse(run, what, record, detail):
    """Raises `data_fingerprint.Changed`: `<the changed bindings> <what>
    than <record> (written by training): <detail>`, and the fix."""
    added, removed = config_changes(run, _DATA_LINES.match) or ([], [])
    if added:
        cause = '; '.join(added[:_LINES_SHOWN])
        fix = 'remove the binding' + ('s' if len(added) > 1 else '')
    elif removed:
        cause = f'This config, without {"; ".join(removed[:_LINES_SHOWN])},'
        fix = 'bind it back'
    else:
        cause, fix = 'This data', 'restore the data the run was trained on'
    raise data_fingerprint.Changed(
        f'{cause} {what} than {record} (written by training): {detail}. '
        f'{fix[0].upper()}{fix[1:]}, or train a new run in another '
        '--model_dir.')


def check(run, labeled):
    """Refuses `labeled` (the `ImageSource` this config selects) when its
    classes are not those the data fingerprint of the trained run `run`
    records, or its images not those its labeled split file lists (a
    record the run does not hold is not checked):
    `data_fingerprint.Changed`, naming the record, the config lines that
    differ from the run's training config (else the data) and the fix."""
    fingerprint = run.read_json(run.fingerprint)
    recorded = (fingerprint or {}).get('labeled') or {}
    classes = data_fingerprint.describe(labeled)['class_names']
    if recorded.get('class_names') not in (None, classes):
        _refuse(run, 'gives other classes', run.fingerprint,
                f'{len(labeled.class_names)} classes '
                f'{list(labeled.class_names)[:8]}')
    try:
        detail = splits.mismatch(run.split, labeled)
    except FileNotFoundError:
        return
    if detail is not None:
        _refuse(run, 'selects another labeled set', run.split, detail)
