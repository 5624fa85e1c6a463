"""Files written whole or not at all."""

import json
import os
import socket


def write_text(path, text):
    """Writes `text` to `path` through a temporary file renamed over it (a
    reader finds the previous file or the new one, never part of one),
    named after this host and process (writers on a shared file system do
    not meet in it)."""
    tmp = f'{path}.tmp.{socket.gethostname()}.{os.getpid()}'
    with open(tmp, 'w') as f:
        f.write(text)
    os.replace(tmp, path)


def write_json(path, value, **dump_kwargs):
    """`write_text` of `json.dumps(value, **dump_kwargs)`."""
    write_text(path, json.dumps(value, **dump_kwargs))
