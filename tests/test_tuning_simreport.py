"""The simulator report: rows for tuners + oracle, and QoS rows, on a reduced grid."""

from __future__ import annotations

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


def test_calibration_rows_simulate_each_measured_run():
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
    assert all(0.5 < r["sim_over_measured"] < 2.0 for r in rows)
