"""The words for ETA, lag and deadlines (issue 27) in the CLI line, the task log lines and the XCom report."""

from __future__ import annotations

import logging

from fstream_provider.model.live_text import deadline_text, eta_text, lag_text, live_text
from fstream_provider.model.tasklog import build_report, format_interval, live_event_line, summary_table

REC = {"t": 12.0, "dt": 1.0, "bytes": 10, "throughput_bps": 8e8, "cc": 2, "p": 1, "pp": 4, "files_done": 3,
       "files_pending": 7, "eta": {"s": 42.4, "lo": 38.0, "hi": 47.2, "rate_bps": 8e8, "basis": "rate"},
       "lag": {"oldest_s": 3.2, "p50_s": 2.0, "p99_s": 5.0, "landed": 3},
       "deadline": {"at": 1795716000.0, "state": "on-track", "target_bps": 5e8, "message": "deadline in 60 s"}}


def test_the_texts():
    assert eta_text(REC["eta"]) == "ETA 42s (38s..47s)"
    assert eta_text({"basis": "done", "s": 0, "lo": 0, "hi": 0}) == "ETA done"
    assert lag_text(REC["lag"]) == "lag 3.2s p50 2.0s p99 5.0s"
    assert deadline_text(REC["deadline"]) == "deadline 18:00:00Z on-track"
    assert eta_text(None) == lag_text(None) == deadline_text(None) == live_text({}) == ""
    assert eta_text({"s": 7200, "lo": 3599, "hi": 10800, "basis": "rate"}) == "ETA 2h00m (59m59s..3h00m)"


def test_interval_lines_carry_them_and_a_risky_deadline_is_a_warning():
    line = format_interval(REC)
    assert "ETA 42s (38s..47s), lag 3.2s p50 2.0s p99 5.0s, deadline 18:00:00Z on-track" in line
    level, text = live_event_line({"kind": "deadline", "state": "infeasible", "message": "about 30 s late"})
    assert level == logging.WARNING and text == "deadline infeasible: about 30 s late"
    assert live_event_line({"kind": "deadline", "state": "on-track", "message": "x"})[0] == logging.INFO


def test_the_report_and_summary_keep_the_last_lag_and_deadline():
    events = [("1-0", {"kind": "interval", **REC}),
              ("2-0", {"kind": "done", "state": "succeeded", "result": {"files": 3, "bytes": 30, "seconds": 1.0}})]
    report = build_report("j1", events, None)
    assert report["lag"]["p99_s"] == 5.0 and report["deadline"]["state"] == "on-track"
    table = summary_table(report, [REC])
    assert "p50 2.0 s, p99 5.0 s over the last 3 file(s)" in table and "deadline 18:00:00Z on-track" in table
