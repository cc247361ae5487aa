"""systemd's watchdog (issue 39): with ``WatchdogSec=`` the daemons send ``WATCHDOG=1`` every half of
``$WATCHDOG_USEC`` from their own loop (the agent's main loop, also while it runs a job; the receiver's flush loop),
and a loop that hangs stops the pings while the rest of the process goes on, so systemd restarts it.

Real daemons (``fstream agent``, ``fstream receive``) and a real ``NOTIFY_SOCKET`` datagram socket; the loop is
wedged through its stall point (``transfer_agent.faultpoints.stall``: the loop blocks while a file exists)."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import authkit
import unitkit
from agentkit import PacedReceiver, make_files, start_receiver, wait_until, write_secret
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.model.spec import TransferSpec
from transfer_agent.service.sdnotify import Watchdog

FSTREAM = (sys.executable, "-m", "transfer_agent.cli")


# -- sd_watchdog_enabled(3) ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("env", "period"), [
    ({}, None),                                                     # no WatchdogSec=
    ({"WATCHDOG_USEC": "30000000"}, 15.0),                          # every half of it
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"}, 15.0),  # for us
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),     # for another process (a parent's variables)
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "soon"}, None),
])
def test_watchdog_is_enabled_as_sd_watchdog_enabled_says(env: dict[str, str], period: float | None) -> None:
    wd = Watchdog.from_env(env, pid=4242)
    assert (wd.period if wd is not None else None) == period


def test_kick_pings_when_due_and_only_from_the_owning_loop() -> None:
    now = [100.0]
    sent: list[float] = []
    wd = Watchdog(2_000_000, send=lambda: sent.append(now[0]), clock=lambda: now[0]).own()
    assert wd.kick() and sent == [100.0]                 # the first pass pings
    now[0] = 100.5
    assert not wd.kick() and wd.due_in() == pytest.approx(0.5)
    now[0] = 101.0
    assert wd.kick() and sent == [100.0, 101.0]           # one period (half of WatchdogSec) on
    now[0] = 102.5
    other = threading.Thread(target=lambda: sent.append(-1.0) if wd.kick() else None)
    other.start()
    other.join()
    assert sent == [100.0, 101.0]                         # another thread's kick keeps nothing alive
    assert wd.kick() and sent[-1] == 102.5


# -- real daemons ------------------------------------------------------------------------------------------------
TIMEOUT_S = 2.0  # the WatchdogSec the tests give: pings every 1 s
WATCHDOG_ENV = {"WATCHDOG_USEC": str(int(TIMEOUT_S * 1e6))}


class Daemon:
    """A daemon started as systemd would for ``WatchdogSec=2s`` (``NOTIFY_SOCKET``, ``WATCHDOG_USEC``), with its
    loop's stall point armed on ``wedge``."""

    def __init__(self, argv: list[str], tmp_path: Path, point: str, env: dict[str, str] | None = None) -> None:
        self.wedge = tmp_path / "wedge"
        self.notify = unitkit.NotifySocket(tmp_path / "notify.sock")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **WATCHDOG_ENV, **(env or {}), "NOTIFY_SOCKET": self.notify.path,
                                          "FSTREAM_STALL": f"{point}={self.wedge}"})
        self.out = unitkit.Output(self.proc.stdout)
        self.point = point
        self.ready_at, _ = self.notify.wait_for("READY", timeout=60, proc=self.proc)

    def pings(self, after: float = float("-inf")) -> list[float]:
        return self.notify.times("WATCHDOG", after)

    def wait_pings(self, n: int, after: float, timeout: float = 30.0) -> list[float]:
        return wait_until(lambda: p[:n] if len(p := self.pings(after)) >= n else None, timeout, f"{n} pings")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        finally:
            self.close()

    def close(self) -> None:
        unitkit.stop(self.proc)
        self.notify.close()


def _check_cadence(pings: list[float]) -> None:
    gaps = [b - a for a, b in zip(pings, pings[1:])]
    assert max(gaps) < TIMEOUT_S, gaps                       # systemd never sees the timeout pass
    assert 0.8 <= statistics.median(gaps) <= 1.3, gaps      # every half of it


def _wedge_and_resume(d: Daemon, alive_meanwhile: Any) -> None:
    """Wedge the loop; see it stalled, the rest of the process alive, no ping for longer than WatchdogSec; let it go
    and see the pings come back."""
    d.wedge.touch()
    d.out.wait_for(rf"fault point {d.point}: stalled")
    alive_meanwhile()  # not a frozen process: its other threads work while the loop is stuck
    before = d.pings()[-1]
    wait_until(lambda: time.monotonic() - before > 1.5 * TIMEOUT_S, 10, "the watchdog timeout to pass unpinged")
    assert d.pings(after=before) == []                       # systemd would have killed it by now
    d.wedge.unlink()
    d.out.wait_for(rf"fault point {d.point}: going on")
    after = d.wait_pings(3, after=before)
    assert after[0] - before > 1.5 * TIMEOUT_S  # the gap, measured: the loop's stall, longer than WatchdogSec
    _check_cadence(after)


def test_agent_pings_from_its_main_loop_and_a_wedged_loop_stops_them(tmp_path: Path, redis_url: str,
                                                                     redis_client: Any) -> None:
    src = tmp_path / "src"
    src.mkdir()
    d = Daemon([*FSTREAM, "agent", "--redis", redis_url, "--namespace", "wd", "--name", "wd-agent", "--root",
                str(src)], tmp_path, "agent.loop")
    try:
        d.out.wait_for(r"systemd watchdog: WATCHDOG=1 every 1 s \(WatchdogSec=2 s\), from the main loop")
        _check_cadence(d.wait_pings(5, after=d.ready_at - 1))

        def heartbeat_goes_on() -> None:
            seen = float(redis_client.hget("{wd}:agent:wd-agent", "seen"))
            wait_until(lambda: float(redis_client.hget("{wd}:agent:wd-agent", "seen")) > seen, 10, "a heartbeat")

        _wedge_and_resume(d, heartbeat_goes_on)
        assert d.stop() == 0, d.out.text
    finally:
        d.close()


def test_receiver_pings_from_its_flush_loop_and_a_wedged_loop_stops_them(tmp_path: Path) -> None:
    secret = write_secret(tmp_path / "secret")
    d = Daemon([*FSTREAM, "receive", "--listen", "127.0.0.1:0", "--root", str(tmp_path / "dst"), "--secret-file",
                str(secret), "--metrics-listen", "127.0.0.1:0"], tmp_path, "receiver.flush",
               env={"FSTREAM_STATE_DIR": str(tmp_path / "state")})
    try:
        d.out.wait_for(r"systemd watchdog: WATCHDOG=1 every 1 s \(WatchdogSec=2 s\), from the flush loop")
        _check_cadence(d.wait_pings(5, after=d.ready_at - 1))
        _t, m = d.out.wait_for(r"metrics on (http://\S+)/metrics")

        def health_answers() -> None:
            with urllib.request.urlopen(m.group(1) + "/healthz", timeout=10) as r:
                assert r.status == 200

        _wedge_and_resume(d, health_answers)
        assert d.stop() == 0, d.out.text
    finally:
        d.close()


def test_agent_pings_while_its_main_thread_runs_a_job(tmp_path: Path, redis_url: str, redis_client: Any) -> None:
    """A job runs on the agent's main thread (its transfer's loop): the job's progress records ping, so a long
    transfer is not taken for a hung agent."""
    secret = write_secret(tmp_path / "secret")
    src = make_files(tmp_path / "src", {f"f{i:03d}.bin": 64 * 1024 for i in range(100)}, seed=3)
    rcv = start_receiver(tmp_path / "dst", secret, cls=PacedReceiver, rate=1e6)  # ~6.5 s of transfer
    store = JobStore(redis_client, keys=Keys("wdjob"), signer=authkit.signer())
    d = None
    try:
        job_id, _ = store.submit(TransferSpec(sources=[str(src)], destination=f"fstream://127.0.0.1:{rcv.port}/out",
                                              tuner="fixed", cc=1, p=1, pp=1))
        d = Daemon([*FSTREAM, "agent", "--redis", redis_url, "--namespace", "wdjob", "--name", "wd-job",
                    "--policy", authkit.policy_file(tmp_path, secret, destinations=authkit.receiver(rcv.port))],
                   tmp_path, "agent.loop",
                   env={"WATCHDOG_USEC": "4000000"})  # WatchdogSec=4s: the job pings with its 1 s records
        t_started, _ = d.out.wait_for(rf"job {job_id} attempt 1: started")
        wait_until(lambda: store.get(job_id).state == "succeeded", 60, "the job to finish")
        t_done, _ = d.out.wait_for(rf"audit: job {job_id} from submitter .*: succeeded")
        assert t_done - t_started > 4.0, "the job was too short to show the cadence"
        pings = d.pings()
        last_before = max(t for t in pings if t <= t_started)
        during = [t for t in pings if t_started < t <= t_done]
        gaps = [b - a for a, b in zip([last_before, *during], [*during, t_done])]
        assert len(during) >= 2 and max(gaps) < 4.0, gaps  # never the timeout without a ping while it ran
        assert d.stop() == 0, d.out.text
    finally:
        if d is not None:
            d.close()
        rcv.stop()


def test_listing_a_jobs_sources_feeds_the_watchdog(tmp_path: Path, redis_url: str, redis_client: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Listing a job's sources runs on the agent's main thread before any progress record: millions of files on a
    slow file system would outlast WatchdogSec and get a working agent killed. The listing feeds the watchdog
    (``watch.sources.listing_progress``): with a clock on which every kick is due, pings are sent while the real
    agent's job lists its 40 directories, once per directory at least."""
    from fstream_provider.watch import sources
    from transfer_agent.daemon.worker import Agent

    secret = write_secret(tmp_path / "secret")
    src = make_files(tmp_path / "src", {f"d{i:02d}/f{j}.bin": 1024 for i in range(40) for j in range(2)}, seed=5)
    rcv = start_receiver(tmp_path / "dst", secret)
    listing, pings = [False], []
    real_walk = sources.walk_files

    def walk(root: str):  # the real listing, seen from outside: while it runs, `listing` is set
        listing[0] = True
        try:
            yield from real_walk(root)
        finally:
            listing[0] = False

    monkeypatch.setattr(sources, "walk_files", walk)
    now = [0.0]

    def clock() -> float:  # ten seconds pass between two looks: every kick finds a ping due
        now[0] += 10.0
        return now[0]

    wd = Watchdog(2_000_000, send=lambda: pings.append(listing[0]), clock=clock)
    keys = Keys("wdlist")
    store = JobStore(redis_client, keys=keys, signer=authkit.signer())
    job_id, _ = store.submit(TransferSpec(sources=[str(src)], destination=f"fstream://127.0.0.1:{rcv.port}/out",
                                          tuner="fixed", cc=1, p=1, pp=1))
    try:
        Agent(redis_url, name="wd-list", keys=keys, policy=authkit.policy(str(secret)), watchdog=wd,
              block_ms=100).run(once=True)
    finally:
        rcv.stop()
    assert store.get(job_id).state == "succeeded"
    assert sum(pings) >= 41, f"{sum(pings)} of {len(pings)} pings while listing"  # 40 directories and the root


def test_listings_tick_per_directory_and_per_1024_entries_only_inside_the_block(tmp_path: Path) -> None:
    """``listing_progress``: the one-shot listing (``expand_sources``) and the stream's lister (``TreeLister``) call
    the tick once per directory and every 1,024 entries of one, on this thread only, and not after the block."""
    from fstream_provider.watch.sources import PROGRESS_EVERY, expand_sources, listing_progress
    from fstream_provider.watch.tree import TreeLister

    big = tmp_path / "src" / "big"
    big.mkdir(parents=True)
    for i in range(2500):
        (big / f"f{i:04d}").touch()
    (tmp_path / "src" / "small").mkdir()
    (tmp_path / "src" / "small" / "one").touch()
    ticks: list[str] = []
    with listing_progress(lambda: ticks.append(threading.current_thread().name)):
        assert len(expand_sources([str(tmp_path / "src")], "/out")) == 2501
        assert len(ticks) == 3 + 2500 // PROGRESS_EVERY  # src, big, small; two full runs of 1,024 entries in big
        elsewhere = threading.Thread(target=lambda: expand_sources([str(tmp_path / "src")], "/out"), name="other")
        elsewhere.start()
        elsewhere.join()
        ticks.clear()
        assert len(TreeLister([str(tmp_path / "src")], "/out", use_inotify=False).scan()) == 2501
        assert len(ticks) == 3 + 2500 // PROGRESS_EVERY and set(ticks) == {threading.current_thread().name}
    expand_sources([str(tmp_path / "src")], "/out")
    assert len(ticks) == 3 + 2500 // PROGRESS_EVERY  # nothing after the block
