"""Smoke run of the benchmark harness: one small workload, two tools, loopback; plus the workload generator."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest

from fstream_bench.wan import harness
from fstream_bench.core.workload_gen import build, generate, materialize, release


def _digest(p: Path) -> str:
    return hashlib.blake2b(p.read_bytes(), digest_size=16).hexdigest()


def _tiny_workload(name: str = "w4"):
    # 10 Gbit/s, 0.1 ms: scale 0.0025, so a w4 batch is a few MB; 0.3 s between batches.
    return build(name, bandwidth_bps=10e9, rtt_s=0.0001, count_factor=0.02, interval_s=0.3, seed=7)


def test_workload_content_is_seeded_and_files_appear_complete(tmp_path):
    w = _tiny_workload("w3")
    a = materialize(w, tmp_path / "a", seed=7)
    b = materialize(w, tmp_path / "b", seed=7)
    c = materialize(w, tmp_path / "c", seed=8)
    f0 = w.files[0].path
    assert _digest(a.staging / f0) == _digest(b.staging / f0), "same seed must give the same bytes"
    assert _digest(a.staging / f0) != _digest(c.staging / f0), "another seed must give other bytes"
    digests = {_digest(a.staging / f.path) for f in w.files}
    assert len(digests) == len(w.files), "every file of a workload has distinct content"
    for f in w.files:
        assert (a.staging / f.path).stat().st_size == f.size

    # released over time: every name that is visible has all its bytes; nothing else is visible.
    src = tmp_path / "src"
    seen_partial: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        sizes = {f.path: f.size for f in w.files}
        while not stop.wait(0.01):
            for dirpath, _d, names in os.walk(src):
                for n in names:
                    rel = os.path.relpath(os.path.join(dirpath, n), src)
                    try:
                        if n.startswith(".") or os.stat(os.path.join(dirpath, n)).st_size != sizes[rel]:
                            seen_partial.append(rel)
                    except FileNotFoundError:
                        pass

    t = threading.Thread(target=watch)
    t.start()
    try:
        release(a, src)
    finally:
        stop.set()
        t.join()
    assert not seen_partial, f"partial or temp files were visible: {seen_partial[:3]}"
    assert [(k, n) for _t, k, n in [(r[0], r[1], r[2]) for r in a.released]] == \
        [(len(bt.files), bt.bytes) for bt in w.batches]
    times = [r[0] for r in a.released]
    assert all(t1 >= bt.t - 0.01 for t1, bt in zip(times, w.batches)), "a batch appeared before its time"

    # direct generation (temp name, then rename) gives the same bytes as the staged copy.
    gen = tmp_path / "gen"
    generate(w, gen, seed=7)
    assert all(_digest(gen / f.path) == _digest(a.staging / f.path) for f in w.files)
    assert not [p for p in gen.rglob(".*")], "temp files left behind"


def _pick_tools() -> list[str]:
    """Two file tools that can run here: the agent and GridFTP when present, else what exists."""
    preferred = ["fstream-static", "gridftp-globus", "rsync", "sftp"]
    usable = [t for t in preferred if harness.tool_available(t) is None]
    if len(usable) < 2:
        reasons = "; ".join(f"{t}: {harness.tool_available(t)}" for t in preferred if t not in usable)
        pytest.skip(f"need two benchmark tools, have {usable}: {reasons}")
    return usable[:2]


def test_smoke_two_tools_on_loopback(tmp_path):
    tools = _pick_tools()
    sc = harness.Scenario("smoke", "loopback", ["w4"], tools, bandwidth_bps=10e9, rtt_s=0.0001,
                          count_factor=0.02, interval_s=0.3, seed=7, sample_s=0.1, timeout_s=120,
                          fstream_watch={"interval": "0.2s", "idle_exit": "1s"})
    work = tmp_path / "work"
    out = harness.run_scenario(sc, tmp_path / "results", work, log=lambda m: None, keep=True)

    summary = json.loads((out / "summary.json").read_text())
    runs = {r["tool"]: r for r in summary["runs"]}
    assert set(runs) == set(tools)
    w = build("w4", bandwidth_bps=10e9, rtt_s=0.0001, count_factor=0.02, interval_s=0.3, seed=7)
    last_arrival = w.batches[-1].t
    for tool in tools:
        r = runs[tool]
        assert r["ok"], f"{tool}: {r['error']}"
        assert r["bytes"] == w.total_bytes and r["files"] == len(w.files)
        # a streaming workload cannot finish before its last batch arrives
        assert r["seconds"] >= last_arrival - 0.05
        assert r["throughput_bps"] == pytest.approx(r["bytes"] * 8 / r["seconds"])
        dst = work / "run" / "w4" / tool / "dst" / "in"
        for f in w.files:
            assert _digest(dst / f.path) == _digest(work / "staging" / "w4" / f.path), f"{tool}: {f.path} differs"

    csv_rows = (out / "samples.csv").read_text().splitlines()
    assert csv_rows[0].startswith("workload,tool,t,throughput_bps")
    for tool in tools:
        assert any(f",{tool}," in row for row in csv_rows[1:]), f"no samples for {tool}"

    from fstream_bench.core.report import render

    md = render(out)
    for tool in tools:
        assert f"| {tool} |" in md
    assert f"/ {tools[1]}" in md or f"/ {tools[0]}" in md, "ratio columns against peers"
    assert (out / "w4.png").stat().st_size > 1000


def test_bench_tool_names_select_tuner_variant_and_fixed_settings():
    from fstream_bench.peers.fstream import tool_tuner

    assert tool_tuner("fstream-fstream@thesis+jump") == ("fstream", {"variant": "thesis+jump"})
    assert tool_tuner("fstream-fixed:8x4x2") == ("fixed", {"cc": 8, "p": 4, "pp": 2})
    assert tool_tuner("fstream-fixed") == ("fixed", {"cc": 4, "p": 2, "pp": 8})
    assert "CCxPxPP" in harness.tool_available("fstream-fixed:8/4/2")
    assert "only fstream-fixed" in harness.tool_available("fstream-static:1x1x1")
    assert "unknown tool" in harness.tool_available("scp")


def test_pools_wan_reports_the_overlap_and_jains_index_of_two_agents():
    from fstream_bench.tuning.pools_wan import _overlap

    a = [(float(t), 500e6) for t in range(0, 40)]
    b = [(float(t), 300e6) for t in range(5, 45)]
    ma, mb, agg, jain = _overlap(a, b)
    assert (ma, mb, agg) == (500e6, 300e6, 800e6)
    assert jain == pytest.approx(0.941, abs=1e-3)  # (5+3)^2 / (2 (25+9))
    assert _overlap(a, [(50.0, 1e6), (60.0, 1e6)]) == (0.0, 0.0, 0.0, 0.0)  # they never ran together


def test_sched_wan_metrics_slowdown_jain_overlap_and_attempt_runs():
    from fstream_bench.scheduling.wan import _runs, bounded_slowdown, jain, overlap_rates

    assert bounded_slowdown(10.0, 5.0) == 2.0 and bounded_slowdown(0.5, 0.1) == 1.0  # bounded at 1 s, >= 1
    assert bounded_slowdown(3.0, 0.2) == 3.0
    assert jain([5.0, 5.0]) == 1.0 and jain([10.0, 0.0]) == 0.5 and jain([]) == 0.0
    a = [(t, 100.0) for t in range(0, 10)]
    b = [(t, 300.0) for t in range(5, 20)]
    assert overlap_rates(a, b) == (100.0, 300.0) and overlap_rates(a, []) == (0.0, 0.0)
    ev = [{"kind": "claimed", "ts": 101.0}, {"kind": "interval", "ts": 102.0}, {"kind": "preempted", "ts": 104.0},
          {"kind": "scheduled", "ts": 105.0}, {"kind": "claimed", "ts": 110.0}, {"kind": "done", "ts": 112.5}]
    assert _runs(ev, 100.0) == [(1.0, 4.0), (10.0, 12.5)]
