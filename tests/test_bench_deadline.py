"""``fstream bench deadline sim`` on a tiny configuration writes its rows, its summary and provenance; the WAN part's
scoring of an agent's interval records (ETA error, stream-seconds) on hand-made records."""

from __future__ import annotations

import json

import pytest

from fstream_bench.tuning.deadline import eta_points, main, stream_seconds


@pytest.mark.slow
def test_sim_part_writes_rows_summary_and_provenance(tmp_path, capsys):
    assert main(["sim", "--workloads", "w1", "--seeds", "1", "--scale", "0.05", "--results", str(tmp_path)]) == 0
    doc = json.loads(next(tmp_path.glob("deadline-sim-*.json")).read_text())
    assert doc["provenance"]["bench"] == "deadline" and doc["provenance"]["load_end"]
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
