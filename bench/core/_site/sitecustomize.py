"""Record which of FStream's modules this process imports (``fstream_bench.core.provenance``, issue 42).

A benchmark's provenance puts this directory first on ``PYTHONPATH`` and names a directory in
``FSTREAM_PROVENANCE_RECORD``; every Python process it starts then appends the name of each FStream
module it imports to ``<that dir>/<pid>.imports``, one line per module, as it is imported (a process
killed later has still recorded what it ran). The finder only records: it finds nothing, so imports
proceed as before, and it is consulted once per module, never on the data path. Self-contained on
purpose: importing FStream here would record it.
"""

import os
import sys

_DIR = os.environ.get("FSTREAM_PROVENANCE_RECORD")
_ROOTS = ("transfer_agent", "fstream_provider", "fstream_bench", "fstream_demo")


class _Recorder:
    def __init__(self, fd):
        self.fd = fd

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _ROOTS:
            try:
                os.write(self.fd, (name + "\n").encode())
            except OSError:
                pass
        return None


if _DIR and not any(type(f).__name__ == "_Recorder" for f in sys.meta_path):
    try:
        _fd = os.open(os.path.join(_DIR, "%d.imports" % os.getpid()), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    except OSError:
        _fd = None
    if _fd is not None:
        sys.meta_path.insert(0, _Recorder(_fd))
