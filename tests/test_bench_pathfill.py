"""``fstream bench pathfill``'s summary: ratios taken within a round, the median and range of every round."""

from fstream_bench.tuning.pathfill import pathfill_ratios, pathfill_summary


def _row(k, tool, bps, ok=True):
    return {"round": k, "tool": tool, "throughput_bps": bps, "ok": ok}


def test_ratios_are_within_a_round_and_the_summary_covers_every_round():
    rows = [_row(0, "iperf3-P16", 1000), _row(0, "fstream (large files)", 900), _row(0, "fstream (1000 x 1 MiB)", 800),
            _row(0, "gridftp-globus (1000 x 1 MiB)", 100),
            _row(1, "iperf3-P16", 500), _row(1, "fstream (large files)", 480), _row(1, "fstream (1000 x 1 MiB)", 700),
            _row(1, "gridftp-globus (1000 x 1 MiB)", 0, ok=False),
            _row(2, "iperf3-P16", 1000), _row(2, "fstream (large files)", 950), _row(2, "fstream (1000 x 1 MiB)", 850),
            _row(2, "gridftp-globus (1000 x 1 MiB)", 170)]
    r = pathfill_ratios(rows, link_bps=1000)
    assert r["large / iperf3"] == [0.9, 0.96, 0.95]  # round 1's iperf3 was 500: its own round's, not another's
    assert r["small / link"] == [0.8, 0.7, 0.85]
    assert r["small / gridftp-globus"] == [8.0, 5.0]  # the failed GridFTP run gives no ratio
    s = pathfill_summary(rows, link_bps=1000)
    assert s["large / iperf3"] == "0.95 (0.90–0.96, 3 runs)"
    assert s["small / gridftp-globus"] == "6.50 (5.00–8.00, 2 runs)"
