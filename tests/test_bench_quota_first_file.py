"""``fstream bench quota-first-file`` (issue 40 item 7) runs end to end on a CI-sized subtree."""

from __future__ import annotations

import json
from pathlib import Path


def test_quota_first_file_bench_walks_once_then_reads_the_persisted_count(tmp_path: Path) -> None:
    from fstream_bench.datapath.quota_first_file import main

    assert main(["--files", "2000", "--repeats", "1", "--dir", str(tmp_path / "work"),
                 "--results", str(tmp_path / "results")]) == 0
    (out,) = (tmp_path / "results").glob("quota-first-file-*.json")
    doc = json.loads(out.read_text())
    s = doc["summary"]
    assert doc["files"] == 2000 and all(s[m]["ok"] for m in ("no-quota", "first-count", "persisted"))
    assert s["no-quota"]["walks"] == [0] and s["first-count"]["walks"] == [1] and s["persisted"]["walks"] == [0]
    # the tree's bytes, then one 4 KiB file more per run (no-quota, first-count, persisted: each left in place)
    assert doc["runs"]["first-count"][0]["used"] == 2000 + 2 * 4096
    assert doc["runs"]["persisted"][0]["used"] == 2000 + 3 * 4096
    assert doc["provenance"]["code_hash"] and not (tmp_path / "work").exists()
