"""``fstream bench deadline sim`` on a tiny configuration writes its rows, its summary and provenance; the WAN part's
scoring of an agent's interval records (ETA error, stream-seconds) on hand-made records."""

from __future__ import annotations

import json

import pytest

from fstream_bench.tuning.deadline import eta_points, main, stream_seconds


@pytest.mark.slow
def test_sim_part_writes_rows_summary_and_provenance(tmp_path, capsys):
    assert main(["sim", "--workloads", "w1", "--seed", "1", "--scale", "0.05", "--results", str(tmp_path)]) == 0
    doc = json.loads(next(tmp_path.glob("deadline-sim-*.json")).read_text())
    assert doc["provenance"]["bench"] == "deadline" and doc["provenance"]["load_end"]
    assert doc["seeds"] == [1] and doc["calibration"]["window_efficiency"] == 0.65
    assert set(doc["summary"]["steers"]) == {"streams", "target"}  # the ablation in the same run
    assert {r["steer"] for r in doc["rows"]} == {"streams", "target"}
    s = doc["summary"]
    assert s["feasible"] == 3 and s["met"] == 3  # the simulator is deterministic: 1.2, 1.5 and 2x all met
    assert s["infeasible_reported"] == 1 and s["infeasible_reported_s"]["median"] <= 10.0
    assert {r["factor"] for r in doc["rows"]} == {0.8, 1.2, 1.5, 2.0}
    assert set(s["eta"]) == {"0.25", "0.5", "0.75"} and all(v["median"] < 0.1 for v in s["eta"].values())


def test_eta_points_and_stream_seconds_from_agent_records():
    ivs = [{"t": float(t), "dt": 1.0, "bytes_done": 0, "bytes_left": 100 - t * 10, "bytes_total": 100,
            "clusters": {"large": {"cc": 2, "p": 2}},
            "eta": {"s": 10.0 - t + (1 if t == 5 else 0), "lo": 8.0 - t, "hi": 12.0 - t, "basis": "rate"}}
           for t in range(1, 11)]
    pts = eta_points(ivs, 10.0)
    assert pts["0.25"]["t"] == 3.0 and pts["0.25"]["rel_error"] == 0.0 and pts["0.25"]["covered"]
    assert pts["0.5"]["t"] == 5.0 and abs(pts["0.5"]["rel_error"] - 0.2) < 1e-9
    assert stream_seconds(ivs) == 40.0


def _wan_doc(seed, code, ratios_by_factor, met=True):
    fixed = [{"factor": k, "stream_seconds": 100.0} for k in (1.2, 1.5, 2.0)]
    runs = [{"factor": k, "stream_seconds": 100.0 * x, "met": met} for k, xs in ratios_by_factor.items() for x in xs]
    etas = {"0.25": {"rel_error": 0.05}}
    return {"seed": seed, "provenance": {"code_hash": code}, "fixed": fixed, "deadline": runs,
            "backlogged": [{"workload": "w1", "eta": etas}, {"workload": "w3", "eta": {"0.25": {"rel_error": 0.2}}}]}


def test_wan_rows_read_every_run_of_the_same_code_and_the_figure_draws_them(tmp_path):
    from fstream_bench.tuning.deadline_figure import figure
    from fstream_bench.tuning.deadline_readers import deadline_streams_wan, eta_25_wan

    docs = {"deadline-wan-20260101-000001.json": _wan_doc(1, "A", {1.2: [0.9], 1.5: [1.0], 2.0: [1.1]}),
            "deadline-wan-20260101-000002.json": _wan_doc(2, "A", {1.2: [1.0], 1.5: [1.0], 2.0: [1.3]}),
            "deadline-wan-20260101-000003.json": _wan_doc(3, "B", {1.2: [9.0], 1.5: [9.0], 2.0: [9.0]}, met=False),
            "deadline-wan-20260101-000004.json": _wan_doc(4, "A", {1.2: [1.1], 1.5: [0.8], 2.0: [1.2]})}
    for name, d in docs.items():
        (tmp_path / name).write_text(json.dumps(d))
    newest = tmp_path / "deadline-wan-20260101-000004.json"
    measured, met = deadline_streams_wan(docs[newest.name], newest)
    assert "3 runs, seeds 1, 2, 4" in measured and "met 9/9" in measured  # code B's run is not one of them
    assert "2.0×: 1.20 (1.10–1.30, 3 runs)" in measured and met == "no"  # 2x's median is over 1.15
    eta, eta_met = eta_25_wan(docs[newest.name], newest)
    assert "w3 20.0%" in eta and eta_met == "no"
    sim = tmp_path / "deadline-sim.json"
    sim.write_text(json.dumps({"seeds": [5], "rows": [
        {"steer": s, "factor": k, "stream_ratio": 1.0 + i / 10, "met": True}
        for i, s in enumerate(("streams", "target")) for k in (1.2, 1.5, 2.0)]}))
    figure(sim, newest, tmp_path / "fig.png")
    assert (tmp_path / "fig.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_replay_scores_the_link_floor_against_the_restart_on_committed_records(tmp_path):
    """``deadline replay`` over a WAN result whose window read 1.6 Gbit/s on its 1 Gbit/s path (send buffers
    filling): the "link" mode's ETA at 25 % is the bytes left at 1 Gbit/s, the "restart" mode's is seconds short."""
    import argparse

    from fstream_bench.tuning.deadline import run_replay

    total, rec, done, t = 2_000_000_000, [], 0, 0.0
    for mbps in (1600, 1600, 1600, 1600, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000):
        nbytes = min(total - done, mbps * 1e6 / 8)
        t, done = t + 1.0, done + nbytes
        rec.append({"t": t, "dt": 1.0, "bytes": nbytes, "bytes_total": total, "bytes_left": total - done,
                    "files_pending": 10, "active_files": 4, "cc": 4, "p": 4})
    doc = {"path": {"bandwidth_bps": 1e9}, "backlogged": [{"workload": "w3", "records": rec, "seconds": 16.8}]}
    (tmp_path / "deadline-wan-20260101-000001.json").write_text(json.dumps(doc))
    out = run_replay(argparse.Namespace(results=str(tmp_path)))
    run = out["runs"][0]
    # at 25 % (t=3: 0.6 GB moved, 1.4 GB left): 7 s at the window's 1.6 Gbit/s, 11.2 s at the link, 13.8 s true
    assert run["restart"]["0.25"] == pytest.approx(abs(7.0 - 13.8) / 13.8, rel=1e-3)
    assert run["link"]["0.25"] == pytest.approx(abs(11.2 - 13.8) / 13.8, rel=1e-3)
    assert out["summary"]["link"]["0.25"]["by_workload"]["w3"]["median"] == run["link"]["0.25"]
