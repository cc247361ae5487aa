"""``fstream send --manifest FILE``: one JSON line per landed file, for the next step of a pipeline.

A workflow engine (Snakemake, Nextflow, a shell script) runs ``fstream send`` as one step and hands
what landed to the next. The manifest is JSON Lines, appended and flushed as each file lands (a
``--watch`` step can be tailed), and fsynced when the command ends::

    {"source": "/data/run7/a.h5", "path": "run7/a.h5", "url": "fstream://dtn2:9000/run7/a.h5",
     "size": 1048576, "checksum": "…", "algo": "xxh3_128", "status": "committed"}

``status`` is ``committed`` (sent and verified) or ``skipped`` (already at the destination with the
same size and checksum). ``checksum`` is a plain content digest anyone can check (``xxh3_128``,
computed in the same read pass as the keyed digest that verified the file); it is absent only with
``--no-verify``.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Callable

class Manifest:
    """Writes one JSON line per landed file to ``path`` (truncated at start)."""

    def __init__(self, path: str, destination_url: str) -> None:
        self.path = path
        self._base = destination_url.split("/", 3)[:3]  # fstream:, '', host:port
        try:
            self._f = open(path, "w", encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"--manifest {path}: cannot write it ({exc.strerror})") from None
        self.count = 0
        self._lock = threading.Lock()  # file events come from the transfer's control and hashing threads

    def record(self, data: dict[str, Any]) -> None:
        if data.get("status") not in ("committed", "skipped"):
            return
        row = {"source": data.get("source"), "path": data["path"], "url": "/".join([*self._base, data["path"]]),
               "size": data.get("size"), "checksum": data.get("checksum"), "algo": data.get("algo"),
               "status": data["status"]}
        line = json.dumps({k: v for k, v in row.items() if v is not None}) + "\n"
        with self._lock:
            self._f.write(line)
            self._f.flush()
            self.count += 1

    def close(self) -> None:
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
        finally:
            self._f.close()


def chain(first: Callable[[str, dict], None], manifest: Manifest | None) -> Callable[[str, dict], None]:
    """An ``on_event`` callback that feeds ``first`` and, for file events, the manifest."""
    if manifest is None:
        return first

    def on_event(kind: str, data: dict) -> None:
        if kind == "file":  # the manifest first: a failing progress display must not lose a line
            manifest.record(data)
        first(kind, data)

    return on_event
