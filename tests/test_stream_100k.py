"""Issue 28, CI's size of the million-file stream: 100,000 files through one real ``fstream send --watch``.

The benchmark's own code (``fstream_bench.scale.stream_million.run``) with 4 KiB files, unpinned: every file
lands exactly once (a consumer deletes them as they land, so each is counted once), idle rescans of the
full tree list nothing, and a restarted stream lands exactly the files added while it was down (the
landed journal skipped all 100,000 others). Rates and memory are the benchmark's business
(``fstream bench stream``, BENCHMARKS.md §16), not asserted here.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fstream_bench.scale.stream_million import run


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_100k_file_stream_lands_everything_once_and_a_restart_skips_it(tmp_path: Path) -> None:
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    work = base / f"fstream-test-stream-{tmp_path.name}"
    try:
        doc = run(work, files=100_000, size=4096, batch=2000, window=20_000, checkpoints=(50_000, 100_000),
                  restart_new=2000, interval="1s", pin=False, log=lambda *_: None)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert doc["landed"] == 100_000 + 2000
    assert [c["files"] for c in doc["checkpoints"]] == [50_000, 100_000]
    assert doc["idle_scans"]["n"] >= 1 and doc["idle_scans"]["listed_max"] == 0
    r = doc["restart"]
    assert r["landed_after_restart"] == 2000 and r["landed_new"] == 2000 and r["landed_old_again"] == 0
    assert r["first_new_s"] is not None
