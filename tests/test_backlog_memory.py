"""``fstream bench backlog-memory`` (issue 43): a real ``send --watch`` on a small backlog lands every file, the
plain run reports the sender's peak RSS, and the traced run says which lines and stacks hold the memory; the goal
rows read these results and the loopback's receivers."""

from __future__ import annotations

from pathlib import Path

from fstream_bench.datapath import backlog_memory as bm
from fstream_bench.datapath.readers import backlog_memory, receiver_vs_iperf3


def test_a_small_backlog_lands_and_the_trace_names_where_memory_went(tmp_path):
    doc = bm.run(tmp_path, files=400, size=1024, frames=4, timeout_s=240, traced=True, log=lambda s: None)
    plain, traced = doc["runs"]
    assert (plain["traced"], traced["traced"]) == (False, True)
    for r in (plain, traced):
        assert r["landed"] == 400 and r["sender_exit"] == 0, r["sender_log_tail"]
        assert r["sender_peak_rss"] > 10 << 20  # a Python process with the agent loaded
    trace = traced["trace"]
    assert trace["snapshot_bytes"] > 0 and trace["peak_bytes"] >= trace["snapshot_bytes"]
    assert any(row["where"].startswith(("transfer_agent/", "fstream_provider/")) for row in trace["by_line"])
    assert trace["by_stack"] and all(1 <= len(row["stack"]) <= 4 for row in trace["by_stack"])
    md = bm.markdown(doc, "fstream bench backlog-memory --files 400")
    assert "| plain | 400 | 0 |" in md and "The largest allocation stacks" in md


def test_the_goal_rows_read_the_plain_run_and_the_receivers_cpu():
    doc = {"files": 1_000_000, "size": 1024, "filesystem": "ext4",
           "runs": [{"traced": False, "sender_peak_rss": 1537 << 20, "landed": 1_000_000}]}
    text, verdict = backlog_memory(doc, Path("x.json"))
    assert "1,537 MiB" in text and verdict == "no"
    doc["runs"][0]["sender_peak_rss"] = 250e6
    assert backlog_memory(doc, Path("x.json"))[1] == "yes"
    runs = [{"case": "a: 1 GiB, p=4", "tool": tool, "repeat": i, "ok": True, "bytes": 1 << 30, "cpu_dst_s": cpu}
            for i in range(3) for tool, cpu in (("fstream", 1.0 + i / 10), ("iperf3", 0.25))]
    text, verdict = receiver_vs_iperf3({"results": runs}, Path("x.json"))
    assert text.startswith("4.40 (4.00–4.80, 3 runs)×") and verdict == "no"
