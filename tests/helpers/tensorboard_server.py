"""The real TensorBoard server on 127.0.0.1, for tests that read what it
serves."""

import contextlib
import json
import re
import subprocess
import sys
import time
import urllib.request

_START_SECONDS = 120


@contextlib.contextmanager
def serve(log_dir):
    """Yields `get(path)`, the bytes the server on `log_dir` returns for
    `path` (e.g. '/data/plugin/projector/runs'), and `url`."""
    process = subprocess.Popen(
        [sys.executable, '-m', 'tensorboard.main', '--logdir', str(log_dir),
         '--host', '127.0.0.1', '--port', '0', '--load_fast', 'false'],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url, seen, start = None, [], time.monotonic()
        while url is None:
            line = process.stderr.readline()
            seen.append(line)
            if not line and process.poll() is not None or (
                    time.monotonic() - start > _START_SECONDS):
                raise RuntimeError('TensorBoard did not start: ' +
                                   ''.join(seen[-20:]))
            match = re.search(r'at (http://127\.0\.0\.1:\d+/)', line)
            url = match and match.group(1).rstrip('/')

        def get(path):
            with urllib.request.urlopen(url + path, timeout=60) as response:
                return response.read()

        get.url = url
        get.json = lambda path: json.loads(get(path))
        yield get
    finally:
        process.terminate()
        process.wait(timeout=30)
