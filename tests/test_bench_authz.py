"""``fstream bench authz`` runs end to end on a tiny tree and writes a result the goals table can read."""

from __future__ import annotations

import json


def test_authz_bench_writes_every_run_and_the_goal_reader_reads_it(tmp_path):
    from fstream_bench.datapath.authz import main
    from fstream_bench.datapath.readers import authz_cost

    assert main(["--files", "30", "--size", "16KiB", "--repeats", "1", "--decisions", "5",
                 "--results", str(tmp_path)]) == 0
    (out,) = tmp_path.glob("authz-*.json")
    doc = json.loads(out.read_text())
    assert [r["mode"] for r in doc["guard"]["runs"]] == ["plain", "guarded"]
    assert all(r["ok"] and r["files"] == 30 for r in doc["guard"]["runs"])
    assert len(doc["decide"]["ms"]) == 5 and doc["provenance"]["code_hash"]
    measured, met = authz_cost(doc, out)
    assert "× unguarded (30 × 16 KiB)" in measured and met in ("yes", "no")
