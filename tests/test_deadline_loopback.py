"""Issue 27 on real agents over loopback: a deadline steers the rate, what the records say (bytes, ETA, lag,
deadline), and on_deadline_risk=fail stopping a transfer that cannot make it."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from agentkit import PacedReceiver, make_files, send, start_receiver, write_file, write_secret
from transfer_agent.receiving.receiver import Receiver


@pytest.fixture
def rig(tmp_path):
    secret = write_secret(tmp_path / "secret")
    rx = start_receiver(tmp_path / "dst", secret)
    yield tmp_path, secret, rx
    rx.stop()


@pytest.mark.serial  # a latency goal: paced to land within 6 s of wall time, neither late nor flat out
def test_a_deadline_paces_the_transfer_to_land_before_it(rig):
    tmp, secret, rx = rig
    src = make_files(tmp / "src", {f"f{i:02d}.bin": 1_000_000 for i in range(40)})  # 320 Mbit
    events: list = []
    deadline = time.time() + 6.0
    r = send(src, rx.port, secret, tuner="fstream", deadline=deadline, bandwidth="2Gbit", sample_interval="0.5s",
             on_event=lambda k, d: events.append((k, d)))
    assert r.ok and r.verified_files == 40
    landed = time.time()
    assert landed <= deadline
    assert r.seconds >= 3.0  # steered to ~60 Mbit/s, not flat out (loopback does it in well under a second)
    ivs = [d for k, d in events if k == "interval"]
    assert ivs[-1]["bytes_done"] == ivs[-1]["bytes_total"] == 40_000_000 and ivs[-1]["bytes_left"] == 0
    assert ivs[-1]["deadline"]["state"] == "met" and ivs[-1]["deadline"]["at"] == deadline
    mid = [d for d in ivs if d["eta"] and d["eta"]["basis"] == "rate"]
    assert mid, "an ETA once two busy intervals moved bytes"
    e = mid[len(mid) // 2]
    assert e["eta"]["lo"] <= e["eta"]["s"] <= e["eta"]["hi"] and e["eta"]["rate_bps"] > 0
    news = [d for k, d in events if k == "deadline"]
    assert news and news[0]["state"] == "on-track" and news[0]["target_bps"] < 2e9
    assert any("deadline on-track" in t["reason"] for k, t in events if k == "tuning")


def test_on_deadline_risk_fail_stops_an_infeasible_transfer_early(rig, caplog):
    tmp, secret, rx = rig
    src = make_files(tmp / "src", {f"f{i:02d}.bin": 1_000_000 for i in range(40)})
    events: list = []
    # the path is said to do 10 Mbit/s: 320 Mbit cannot land in 5 s
    r = send(src, rx.port, secret, tuner="fstream", deadline=time.time() + 5.0, bandwidth="10Mbit",
             on_deadline_risk="fail", on_event=lambda k, d: events.append((k, d)))
    assert not r.ok and "deadline cannot be met" in r.error and not r.retryable
    assert [d["state"] for k, d in events if k == "deadline"] == ["infeasible"]
    assert any(rec.levelname == "WARNING" and "deadline infeasible" in rec.getMessage() for rec in caplog.records)


def test_on_deadline_risk_warn_keeps_going_and_says_so(rig, caplog):
    tmp, secret, rx = rig
    src = make_files(tmp / "src", {f"f{i:02d}.bin": 200_000 for i in range(10)})
    events: list = []
    r = send(src, rx.port, secret, tuner="fstream", deadline=time.time() + 0.05, bandwidth="1Mbit",
             on_event=lambda k, d: events.append((k, d)))
    assert r.ok and r.verified_files == 10
    states = [d["state"] for k, d in events if k == "deadline"]
    assert states[0] in ("infeasible", "missed")
    assert any(rec.levelname == "WARNING" and "deadline" in rec.getMessage() for rec in caplog.records)


def test_a_watched_stream_reports_its_lag(tmp_path):
    """A receiver writing 400 kB/s holds each 100 kB file a quarter second, so records are taken while one waits."""
    tmp, secret = tmp_path, write_secret(tmp_path / "secret")
    rx = start_receiver(tmp / "dst", secret, cls=PacedReceiver, rate=400_000)
    src = tmp / "run"
    src.mkdir()
    events: list = []
    stop = threading.Event()

    def writer() -> None:
        for i in range(6):
            write_file(src / f"img_{i}.h5", b"x" * 100_000, mtime=time.time() - 3.0)  # closed 3 s ago
            time.sleep(0.3)

    th = threading.Thread(target=writer)
    th.start()
    try:
        r = send(src, rx.port, secret, tuner="fstream", watch=True, interval="0.2s", idle_exit="2s",
                 sample_interval="0.1s", on_event=lambda k, d: events.append((k, d)), cancel=stop)
    finally:
        th.join()
        rx.stop()
    assert r.ok and r.verified_files == 6
    lags = [d["lag"] for k, d in events if k == "interval" and d.get("lag")]
    assert lags and lags[-1]["landed"] == 6
    assert 3.0 <= lags[-1]["p50_s"] < 30 and lags[-1]["p99_s"] >= lags[-1]["p50_s"]
    assert any(l["oldest_s"] >= 3.0 for l in lags[:-1]) and lags[-1]["oldest_s"] == 0.0


def test_the_deadline_and_the_live_eta_share_one_fit_per_interval(rig, monkeypatch):
    """Issue 42: with a deadline, the live ETA and the deadline's plan come from one estimator fed by the interval
    records, and a window is fitted once: before, each kept its own and both fitted every interval."""
    import numpy as np

    from fstream_provider.tuning import ols

    real, fits = ols.fit, []

    def counting(y: Any, X: Any) -> Any:
        fits.append(1 if np.ndim(X) == 1 else np.shape(X)[1])  # 1 column: the rate fit; 2: bytes + files
        return real(y, X)

    monkeypatch.setattr(ols, "fit", counting)
    tmp, secret, rx = rig
    src = make_files(tmp / "src", {f"f{i:02d}.bin": 500_000 for i in range(20)})  # 80 Mbit
    events: list = []
    r = send(src, rx.port, secret, tuner="fstream", deadline=time.time() + 2.5, bandwidth="2Gbit",
             sample_interval="0.2s", profile_interval="0.2s", on_event=lambda k, d: events.append((k, d)))
    assert r.ok and r.verified_files == 20
    ivs = [d for k, d in events if k == "interval"]
    assert sum(1 for d in ivs if d["eta"] and d["eta"]["basis"] != "done") >= 3  # the live ETA was fitted
    assert any("deadline on-track" in t["reason"] for k, t in events if k == "tuning")  # and the deadline planned
    assert 0 < fits.count(1) <= len(ivs), f"{fits.count(1)} rate fits for {len(ivs)} interval records"
    assert fits.count(2) <= len(ivs)


class _SlowCommits(Receiver):
    """A real receiver whose commits take 1 s (a slow fsync): every byte of a file is sent, and counted, long
    before the sender hears it landed."""

    def _commit_batch(self, batch):
        time.sleep(1.0)
        super()._commit_batch(batch)


def test_the_last_record_is_the_verdict_even_when_every_byte_was_counted_before_the_commits(tmp_path):
    """Seen on the WAN: 2 of 10 deadline runs ended with a last record that said "on-track" (and an ETA) for a
    transfer that had landed, because the last sample was taken while the commits were outstanding and no byte
    moved after it, so no closing record was written."""
    secret = write_secret(tmp_path / "secret")
    rx = start_receiver(tmp_path / "dst", secret, cls=_SlowCommits)
    try:
        src = make_files(tmp_path / "src", {f"f{i}.bin": 400_000 for i in range(2)})
        events: list = []
        r = send(src, rx.port, secret, tuner="fstream", deadline=time.time() + 8, bandwidth="2Gbit",
                 sample_interval="0.2s", on_event=lambda k, d: events.append((k, d)))
        assert r.ok and r.verified_files == 2
        ivs = [d for k, d in events if k == "interval"]
        waiting = [d for d in ivs if d["bytes_left"] == 0 and d["active_files"] > 0]
        assert waiting, "a record taken with every byte counted and the commits outstanding"
        last = ivs[-1]
        assert last["deadline"]["state"] == "met" and last["active_files"] == 0
        assert last["eta"]["basis"] == "done"
    finally:
        rx.stop()
