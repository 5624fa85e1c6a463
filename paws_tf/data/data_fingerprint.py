"""The data a run trains on (sizes, digests), checked when it resumes."""

import hashlib

from absl import logging

from paws_tf import checks

ON_CHANGE = ('stop', 'continue')
_ROLES = ('labeled', 'unlabeled', 'test')


class Changed(checks.DataError):
    """The data differs from what the run started on."""


def _digest(items):
    digest = hashlib.sha256()
    for item in items:
        digest.update(str(item).encode())
        digest.update(b'\n')
    return digest.hexdigest()


def describe(source):
    """The fingerprint of one `sources.ImageSource` or `StreamSource`."""
    if source is None:
        return None
    described = dict(kind=type(source).__name__,
                     num_examples=int(source.num_examples),
                     channels=int(source.channels),
                     class_names=_digest(source.class_names))
    for key in ('names', 'labels'):  # Streams have neither.
        if getattr(source, key, None) is not None:
            described[key] = _digest(getattr(source, key))
    return described


def fingerprint(bundle):
    """The fingerprint of an `experiment.DataBundle`, a JSON-able dict."""
    return {role: describe(getattr(bundle, role)) for role in _ROLES}


_WHAT = dict(kind='source kind', num_examples='images', channels='channels',
             class_names='class names',
             names='image names (the folder listing, or the labeled split)',
             labels='labels')


def differences(recorded, current):
    """What differs between two fingerprints, one line each."""
    lines = []
    for role in _ROLES:
        old, new = recorded.get(role), current.get(role)
        if old == new:
            continue
        if old is None or new is None:
            lines.append(f'{role}: {"none" if new is None else "a source"}, '
                         f'recorded {"none" if old is None else "a source"}')
            continue
        lines += [f'{role}: {new[key]} {what}, recorded {old[key]}'
                  if key in ('num_examples', 'channels', 'kind') else
                  f'{role}: the {what} differ'
                  for key, what in _WHAT.items()
                  if old.get(key) != new.get(key)]
    return lines


def check(recorded, current, *, model_dir, path, resuming,
          on_change='stop', overwrite=False):
    """Compares the `fingerprint` `current` of the data a run loaded
    with its `recorded` one (or None) when it is `resuming` from a backup
    or checkpoint (else a record is just replaced); `model_dir` and `path`
    (the record) are for messages. A change raises `Changed`, naming it,
    unless `on_change` is 'continue' or `overwrite` (run.py's
    --overwrite); returns whether the run must start again on this data.
    """
    changed = differences(recorded, current) if recorded and resuming else []
    if changed and not overwrite and on_change == 'stop':
        raise Changed(
            f'The data differs from what the run in {model_dir} started on '
            f'(recorded in {path}):\n  ' + '\n  '.join(changed) + '\nResuming '
            'on other data would mix two experiments in one run. Restore the '
            'data, pass --overwrite to delete the run and start again on '
            "this data, or bind train.on_data_change = 'continue' to resume "
            'on it.')
    if changed:
        logging.warning('The data differs from what the run in %s started '
                        'on:\n  %s\n%s', model_dir, '\n  '.join(changed),
                        '--overwrite: starting the run again.' if overwrite
                        else "train.on_data_change = 'continue': resuming "
                        'on it and recording it.')
    return bool(changed) and overwrite
