"""``fstream bench live-view`` runs end to end on a tiny configuration: delays from both kinds of page, three
CPU phases (no timing is asserted: the numbers are the benchmark's, on its own machine)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("airflow")
pytest.importorskip("playwright")


@pytest.mark.slow
def test_live_view_bench_measures_both_views_and_three_cpu_phases(tmp_path):
    from fstream_bench.airflow.live_view import CHROMIUM, main

    if not Path(CHROMIUM).exists():
        if os.environ.get("FSTREAM_REQUIRE_WAN", "") not in ("", "0"):
            raise AssertionError(f"{CHROMIUM} is missing although bench/install-deps.sh should have installed it")
        pytest.skip(f"{CHROMIUM} is not installed (bench/install-deps.sh installs it)")
    assert main(["--jobs", "3", "--pages", "2", "--seconds", "8", "--warmup", "2", "--results", str(tmp_path)]) == 0
    (out,) = tmp_path.glob("live-view-*.json")
    doc = json.loads(out.read_text())
    for kind in ("overview", "job"):
        f = doc["freshness"][kind]
        assert f["delays_ms"] and all(d > 0 for d in f["delays_ms"]), (kind, f["summary"])
        assert f["summary"]["n"] == len(f["delays_ms"]) <= f["summary"]["expected"]
    assert [(p["phase"], p["pages"]) for p in doc["cpu"]["phases"]] == [("a", 0), ("b", 2), ("c", 0)]
    assert all(p["wall_s"] > 0 and p["api_cpu_s"] >= 0 for p in doc["cpu"]["phases"])
    assert doc["provenance"]["code_hash"] and doc["provenance"]["load_end"]
    assert (tmp_path / out.name.replace(".json", ".md")).read_text().startswith("Command: `fstream bench live-view")
