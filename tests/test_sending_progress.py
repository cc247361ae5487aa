"""``transfer_agent.sending.progress``: what interval records carry for watchers (issue 27), driven by hand."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from fstream_provider.tuning.deadline import DeadlineStatus
from transfer_agent.errors import FStreamError
from transfer_agent.sending.progress import DeadlineNews, LiveProgress


def sf(name: str, size: int, closed: float) -> SimpleNamespace:
    return SimpleNamespace(src=f"/run/{name}", size=size, mtime_ns=int(closed * 1e9))


def rec(t: float, nbytes: int, pending: int = 0) -> dict:
    return {"t": t, "dt": 1.0, "bytes": nbytes, "files_pending": pending, "active_files": 0}


def test_bytes_lag_and_a_failed_file_leaving_the_totals():
    p = LiveProgress(streaming=True)
    a, b, c = sf("a", 100, 1000.0), sf("b", 200, 1001.0), sf("c", 50, 1002.0)
    p.added([a, b, c])
    p.added([a])  # listed again (a new session): counted once
    p.landed(a, ok=True, now=1003.0)
    p.landed(c, ok=False, now=1003.0)
    out = p.fields(rec(1.0, 100, pending=1), busy=True, now=1004.0)
    assert (out["bytes_total"], out["bytes_done"], out["bytes_left"]) == (300, 100, 200)
    assert out["lag"] == {"oldest_s": 3.0, "p50_s": 3.0, "p99_s": 3.0, "landed": 1}  # b, closed at 1001, waits
    assert "deadline" not in out


def test_bytes_left_counts_bytes_in_flight_and_skipped_files():
    """Found on the emulated WAN (bench deadline wan): with only landed files counted, a large file's bytes in
    flight were all "left" until its commit, and the ETA ran 20-50 % long at 75 % of the sra workload."""
    p = LiveProgress(streaming=False)
    big, small = sf("big", 1000, 0.0), sf("small", 100, 0.0)
    p.added([big, small])
    p.landed(small, ok=True, sent=False, now=1.0)  # already at the destination: landed, never sent
    out = p.fields(rec(1.0, 600), busy=True, now=1.0)  # 600 of the big file's bytes sent, not committed yet
    assert (out["bytes_done"], out["bytes_left"]) == (100, 400)
    p.landed(big, ok=True, now=2.0)
    assert p.fields(rec(2.0, 400), busy=False, now=2.0)["bytes_left"] == 0


def test_the_deadline_verdict_once_everything_landed():
    p = LiveProgress(streaming=False, deadline_at=2000.0)
    f = sf("a", 100, 0.0)
    p.added([f])
    status = DeadlineStatus("on-track", 1e6, 9e5, 1e9, 10.0, "deadline in 10 s")
    running = p.fields(rec(1.0, 50), busy=True, deadline=status, now=1990.0)
    assert running["deadline"]["state"] == "on-track" and running["deadline"]["at"] == 2000.0
    p.landed(f, ok=True, now=1995.0)
    assert p.fields(rec(2.0, 50), busy=False, deadline=status, now=1995.0)["deadline"]["state"] == "met"
    assert p.fields(rec(3.0, 0), busy=False, deadline=status, now=2001.0)["deadline"]["state"] == "missed"
    assert "lag" not in running  # not a stream


def test_deadline_news_says_each_change_once_and_fail_stops():
    events, log = [], logging.getLogger("t")
    news = DeadlineNews("fail", log, lambda k, d: events.append((k, d)))
    ok = DeadlineStatus("on-track", 1e6, 9e5, 1e9, 10.0, "fine")
    news(ok, 2000.0)
    news(ok, 2000.0)
    assert [d["state"] for _, d in events] == ["on-track"]
    with pytest.raises(FStreamError, match="deadline cannot be met .*on_deadline_risk=fail") as e:
        news(DeadlineStatus("infeasible", None, 2e9, 1e9, 10.0, "about 10 s late"), 2000.0)
    assert not e.value.retryable and events[-1][1]["state"] == "infeasible"
    warn = DeadlineNews("warn", log, lambda k, d: events.append((k, d)))
    warn(DeadlineStatus("infeasible", None, 2e9, 1e9, 10.0, "late"), 2000.0)  # says it, keeps going
