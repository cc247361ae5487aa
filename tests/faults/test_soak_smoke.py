"""Smoke test of ``fstream bench soak`` (issue 8): a short loopback soak ends with every invariant held.

Runs ``fstream bench soak --loopback --minutes 0.4`` as a subprocess (the injector's interval
scales with the duration, so every loopback fault kind is injected), then reads its JSON report.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from faultkit import CLI


@pytest.mark.slow
def test_loopback_soak_holds_invariants_under_every_fault_kind(tmp_path):
    results = tmp_path / "results"
    cp = subprocess.run([*CLI, "bench", "soak", "--loopback", "--minutes", "0.4", "--seed", "3", "--rate", "48Mbit",
                         "--drain-timeout", "20", "--final-timeout", "20", "--workdir", str(tmp_path),
                         "--results", str(results)], capture_output=True, text=True, timeout=90, check=False)
    reports = sorted(results.glob("soak-*.json"))
    assert reports, f"no report written (exit {cp.returncode}):\n{cp.stderr[-3000:]}"
    r = json.loads(reports[-1].read_text())["result"]
    assert cp.returncode == 0 and r["ok"], f"soak failed: {r['problems']}\n{cp.stdout[-2000:]}\n{cp.stderr[-2000:]}"
    assert {"sender_kill", "receiver_kill", "source_touch"} <= set(r["faults_by_kind"]), r["faults_by_kind"]
    assert r["files_produced"] > 0 and r["files_verified"] == r["files_produced"], r
    assert r["corrupted_visible"] == 0 and r["partial_visible"] == 0 and r["files_lost"] == 0, r
    assert r["final_send"]["rc"] == 0, r["final_send"]
    assert r["peak"]["sender"]["rss"] > 0 and r["peak"]["receiver"]["fds"] > 0, r["peak"]
    assert (results / reports[-1].name.replace(".json", ".md")).exists()
