"""Files written whole or not at all."""

import json
import os

import pytest

from paws_tf import files


def test_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / 'record.json'
    files.write_json(str(path), {'b': 1, 'a': [2, 3]}, indent=1,
                     sort_keys=True)
    assert path.read_text() == '{\n "a": [\n  2,\n  3\n ],\n "b": 1\n}'
    files.write_text(str(path), 'second\n')
    assert path.read_text() == 'second\n'
    assert os.listdir(tmp_path) == ['record.json']


def test_a_failed_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / 'record.json'
    files.write_json(str(path), {'step': 1})
    # Fails in the middle of writing: after the temporary file is opened.
    with pytest.raises(TypeError):
        files.write_text(str(path), 2)
    assert json.loads(path.read_text()) == {'step': 1}
