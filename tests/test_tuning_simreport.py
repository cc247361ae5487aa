"""The simulator report: rows for tuners + oracle, QoS rows, and the simulator against committed WAN runs."""

from __future__ import annotations

import json
from pathlib import Path

from fstream_provider.tuning.simreport import qos_rows, scenarios, throughput_rows


def test_throughput_rows_include_the_oracle_and_fstream_beats_static_on_w2():
    scn = scenarios()[0]
    rows = throughput_rows(scn, workloads=("w2",), tuners=("static", "fstream"),
                           grid=((2, 8), (4,), (0, 8)))
    by = {r["tuner"]: r for r in rows}
    assert set(by) == {"static", "fstream", "oracle"}
    assert by["oracle"]["of_oracle"] == 1.0 and by["oracle"]["note"].startswith("cc=")
    assert by["fstream"]["throughput_bps"] > 1.2 * by["static"]["throughput_bps"]
    assert all(0 < r["of_link"] <= 1.0 for r in rows)


def test_qos_rows_report_median_error_and_convergence():
    (row,) = qos_rows(scenarios()[0], workloads=("w4",), fractions=(0.6,), pacing=(True,))
    assert row["median_err"] <= 0.05 and row["first_within_5pct"] <= 3


def test_calibration_rows_simulate_each_usable_run():
    """Which runs of a summary get a row (the comparison itself is checked against real runs below)."""
    from fstream_provider.tuning.simreport import calibration_rows

    summary = {"scenario": {"bandwidth_bps": 1e9, "rtt_s": 0.04, "tcp_buffer": 2**20, "count_factor": 0.02,
                            "interval_s": 2.0, "seed": 0},
               "runs": [{"workload": "w4", "tool": "fstream-static", "ok": True, "throughput_bps": 5e8},
                        {"workload": "w4", "tool": "gridftp-static", "ok": True, "throughput_bps": 4e8,
                         "settings": {"cc": 2, "p": 5, "pp": 0}},
                        {"workload": "w4", "tool": "iperf3", "ok": True, "throughput_bps": 9e8},
                        {"workload": "w4", "tool": "fstream-harp", "ok": False}]}
    rows = calibration_rows(summary)
    assert [r["tool"] for r in rows] == ["fstream-static", "gridftp-static"]
    assert [r["measured_bps"] for r in rows] == [5e8, 4e8]
    for r in rows:
        assert r["simulated_bps"] > 0 and r["sim_over_measured"] == r["simulated_bps"] / r["measured_bps"]


RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
BREAKDOWN_RUNS = ("breakdown-20261122-004002", "breakdown-20261122-004640", "breakdown-20261122-010642")
TUNED_BAND = (1.06, 1.14)


def test_the_simulator_against_the_committed_emulated_wan_runs():
    """Today's simulator against the emulated-WAN breakdown runs committed in ``bench/results/``
    (``BREAKDOWN_RUNS``: 1 Gbit/s, 40 ms, 1 MiB buffers; w2 and lcls), simulated as ``fstream bench
    breakdown`` does (``breakdown_bench.calibration``, profiling interval 2 s). BENCHMARKS.md, "Simulator
    vs emulated WAN (calibration)": about 10 % optimistic for tuned transfers, 2x for ``static`` on w2.

    The data: three runs, six rows each. For the five tuned rows (dynamic and fstream on both
    workloads, static on lcls, whose heuristic settings fill the path) the 15 sim/measured ratios are
    1.087-1.127, and the largest run-to-run spread of one row's measured throughput is 3.6 %
    (lcls fstream: 824-854 Mbit/s). So each tuned ratio must lie within 1.10 +- 0.04 (``TUNED_BAND``):
    a model that moves a tuned row by more than the measurements vary fails here.

    w2 static is the known outlier (the simulator stripes every file over p streams, the agent sends a
    block on one stream): sim/measured 2.02 in the two runs before the agent cut blocks to a file's share
    per stream, 1.41 in the one after. It must stay optimistic beyond the tuned band and within the worst
    committed ratio plus the same 0.04, or BENCHMARKS.md no longer describes the simulator.
    """
    from fstream_bench.tuning.breakdown import calibration

    summaries = [RESULTS / name / "summary.json" for name in BREAKDOWN_RUNS]
    tuned, outlier = [], []
    for path in summaries:
        summary = json.loads(path.read_text())
        rows = calibration(summary, profile_interval_s=2.0)
        assert {(r["workload"], r["tool"]) for r in rows} == {
            (w, f"fstream-{t}") for w in ("w2", "lcls") for t in ("static", "dynamic", "fstream")}, path
        for r in rows:
            assert r["measured_bps"] > 0 and r["simulated_bps"] > 0
            label = f"{path.parent.name} {r['workload']} {r['tool']}: sim/measured {r['sim_over_measured']:.3f}"
            (outlier if (r["workload"], r["tool"]) == ("w2", "fstream-static") else tuned).append(
                (r["sim_over_measured"], label))
    assert len(tuned) == 5 * len(summaries)
    lo, hi = TUNED_BAND
    assert all(lo <= ratio <= hi for ratio, _ in tuned), [label for ratio, label in tuned if not lo <= ratio <= hi]
    assert all(hi < ratio <= 2.02 + 0.04 for ratio, _ in outlier), [label for _, label in outlier]
