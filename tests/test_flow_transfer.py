"""Python flows shipping files through the real agent over loopback, in-process and through Redis jobs."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import xxhash

from agentkit import GatedReceiver, make_files, part_files, start_receiver, wait_until
from fstream_provider.flow import FlowError, Landed, channel
from transfer_agent.receiving.receiver import Receiver

import authkit


def _visible(root: Path) -> list[str]:
    """Files a user of the destination sees (hidden per-attempt .part names excluded)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


def _check(rec: Landed, root: Path) -> None:
    landed = root / rec.path
    assert landed.read_bytes() == Path(rec.source).read_bytes(), rec
    assert rec.size == landed.stat().st_size
    assert rec.algo == "xxh3_128" and rec.checksum == xxhash.xxh3_128(landed.read_bytes()).hexdigest()


def test_a_flow_ships_files_while_a_writer_creates_them(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    src = tmp_path / "daq"
    (src / "run1").mkdir(parents=True)
    names = [f"run1/shot{i:02d}.h5" if i % 3 else f"shot{i:02d}.h5" for i in range(12)]

    def writer() -> None:  # 12 files over ~2.4 s, each written in pieces
        for rel in names:
            with open(src / rel, "wb") as f:
                for _ in range(4):
                    f.write(os.urandom(64 << 10))
                    time.sleep(0.03)
            (src / f"{rel}.log").write_text("not shipped")
            time.sleep(0.08)

    w = threading.Thread(target=writer)
    w.start()
    root = Path(rx.root)
    recs: list[Landed] = []
    try:
        flow = (channel.watch_path(str(src / "**/*.h5"), interval=0.5)
                .buffer(size=4, duration=0.5)
                .transfer(to=f"fstream://127.0.0.1:{rx.port}/lcls", secret_file=str(secret), tuner="fixed", cc=2)
                .take(len(names)))
        for rec in flow:
            recs.append(rec)
    finally:
        w.join()
    assert sorted(r.path for r in recs) == sorted(f"lcls/{n}" for n in names)  # each once, relative paths kept
    for rec in recs:
        _check(rec, root)
        assert rec.status == "committed" and rec.url == f"fstream://127.0.0.1:{rx.port}/{rec.path}"
    assert _visible(root) == sorted(f"lcls/{n}" for n in names)


def test_from_path_transfer_collect_and_a_second_run_skips(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    src = make_files(tmp_path / "s", {"a.dat": 1 << 20, "b/c.dat": 5000, "b/d.txt": 10})
    ch = channel.from_path(str(src / "**/*.dat")).transfer(to=f"fstream://127.0.0.1:{rx.port}/o",
                                                           secret_file=str(secret))
    first = ch.collect()
    assert sorted(r.path for r in first) == ["o/a.dat", "o/b/c.dat"]
    for rec in first:
        _check(rec, Path(rx.root))
    again = {r.path: r for r in ch.collect()}  # the same recipe, run again: already there
    assert {r.status for r in again.values()} == {"skipped"}
    assert {p: r.checksum for p, r in again.items()} == {r.path: r.checksum for r in first}


def test_breaking_out_leaves_no_partial_file_visible(tmp_path: Path, secret: Path) -> None:
    rx = start_receiver(tmp_path / "dst", secret, cls=GatedReceiver, hold_after=8 << 20)
    src = make_files(tmp_path / "s", {"a_small.dat": 1000, "b_big.dat": 64 << 20})
    root = Path(rx.root)
    try:
        ch = channel.from_path(str(src / "*.dat")).transfer(
            to=f"fstream://127.0.0.1:{rx.port}/o", secret_file=str(secret), tuner="fixed", cc=1, p=1, pp=1,
            block_size="1MiB")
        t0 = time.monotonic()
        for rec in ch:
            assert rec.path == "o/a_small.dat"
            wait_until(rx.reached.is_set, 20, "the big file held mid-way at the receiver")
            break  # the big file is in flight
        assert time.monotonic() - t0 < 30
        rx.gate.set()  # the held blocks go on: whatever the sender still does now reaches the disk
        # the sender hung up: its session is closed at the receiver, so no COMMIT can come any more ...
        wait_until(lambda: not rx._sessions, 20, "the cancelled transfer's session closed at the receiver")
    finally:
        rx.gate.set()
        rx.stop()  # ... and stop() returns once every commit already queued has finished
    assert _visible(root) == ["o/a_small.dat"]
    # the big file was cut mid-way: it is there only as a hidden part the next run resumes
    (part,) = part_files(root)
    assert part.name.startswith(".b_big.dat") and 0 < part.stat().st_size <= 64 << 20


def test_a_failing_file_is_raised_where_the_user_iterates_naming_it(tmp_path: Path, secret: Path,
                                                                    rx: Receiver) -> None:
    src = make_files(tmp_path / "s", {"good.dat": 100, "bad.dat": 100})
    (Path(rx.root) / "o" / "bad.dat").mkdir(parents=True)  # a directory where the file must land
    with pytest.raises(FlowError, match=r"bad\.dat"):
        list(channel.from_path(str(src / "*.dat")).transfer(to=f"fstream://127.0.0.1:{rx.port}/o",
                                                            secret_file=str(secret)))
    with pytest.raises(FlowError, match="not a file path"):
        list(channel.of(42).transfer(to=f"fstream://127.0.0.1:{rx.port}/o", secret_file=str(secret)))


def test_through_redis_jobs_run_by_a_real_agent(tmp_path: Path, secret: Path, rx: Receiver, redis_url: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The jobs name the agent's key by id and are signed as the submitter of ``$FSTREAM_SUBMITTER`` (issue 32)."""
    from fstream_provider.bus.keys import Keys
    from transfer_agent.daemon.worker import Agent

    monkeypatch.setenv("FSTREAM_SUBMITTER", authkit.SUBMITTER)
    monkeypatch.setenv("FSTREAM_SUBMITTER_KEY_FILE", authkit.key_file())
    src = make_files(tmp_path / "s", {"x1.dat": 3000, "sub/x2.dat": 1 << 20, "sub/x3.dat": 10})
    agent = Agent(redis_url, policy=authkit.policy(secret), name="flow-agent", poll_interval=0.2, block_ms=100,
                  flush_interval=0.1, heartbeat_ttl=3, keys=Keys("flowtest"))
    t = threading.Thread(target=agent.run, name="flow-agent")
    t.start()
    try:
        recs = (channel.from_path(str(src / "**/*.dat")).buffer(size=2)
                .transfer(to=f"fstream://127.0.0.1:{rx.port}/remote", key="default", redis=redis_url,
                          namespace="flowtest", max_in_flight=1)
                .collect())
        from fstream_provider.bus.client import connect
        from fstream_provider.bus.jobs import JobStore

        jobs = JobStore(connect(redis_url), keys=Keys("flowtest")).list()
    finally:
        agent.stop()
        t.join(30)
    assert sorted(r.path for r in recs) == ["remote/sub/x2.dat", "remote/sub/x3.dat", "remote/x1.dat"]
    for rec in recs:
        _check(rec, Path(rx.root))
        assert rec.to_dict()["url"] == rec.url == f"fstream://127.0.0.1:{rx.port}/{rec.path}"
    # the batch [sub/x2, sub/x3] is split: a job never holds more files than max_in_flight
    assert sorted(len(j.spec.sources) for j in jobs) == [1, 1, 1] and {j.state for j in jobs} == {"succeeded"}
    assert {j.spec.key for j in jobs} == {"default"} and {j.spec.secret_file for j in jobs} == {None}


@pytest.mark.parametrize("files", [{"secret_file": "/etc/fstream/secret"},
                                   {"tls_cert": "/etc/fstream/c.pem", "tls_key": "/etc/fstream/c.key"}])
def test_through_redis_key_files_are_refused_naming_them(tmp_path: Path, files: dict) -> None:
    """A job may not name files on the agent's host (issue 32): refused before anything is submitted (the Redis
    URL is never even connected to), naming the options and what to pass instead."""
    with pytest.raises(ValueError) as exc:
        channel.of(tmp_path).transfer(to="fstream://127.0.0.1:9/o", redis="redis://127.0.0.1:1/0", **files)
    msg = str(exc.value)
    assert all(f"{name}=" in msg for name in files) and "key=ID" in msg, msg


def test_max_in_flight_below_the_batch_does_not_hang(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    """Review finding: a feeder waiting for min(batch, 64) free slots when only 2 can ever be free hung."""
    src = make_files(tmp_path / "s", {f"f{i}.dat": 1000 for i in range(5)})
    got: list[Landed] = []
    run = (channel.from_path(str(src / "*.dat")).buffer(size=5)
           .transfer(to=f"fstream://127.0.0.1:{rx.port}/o", secret_file=str(secret), max_in_flight=2)
           .subscribe(got.append))
    try:
        assert run.wait(30), "the flow hung with max_in_flight below the batch size"
    finally:
        run.cancel()
    assert sorted(r.path for r in got) == [f"o/f{i}.dat" for i in range(5)]


def test_transfer_refuses_options_that_belong_to_the_channel(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    url = f"fstream://127.0.0.1:{rx.port}/o"
    for opt in ({"until": 1.0}, {"watch": True}, {"idle_exit": "5s"}):
        with pytest.raises(ValueError, match=r"\.until\(\) or \.take\(\)"):
            channel.of(tmp_path).transfer(to=url, secret_file=str(secret), **opt)
    src = make_files(tmp_path / "s", {"a.dat": 10})
    with pytest.raises(FlowError, match=r"Landed\(.*is not a file path"):  # a record is not a batch of paths
        list(channel.from_path(str(src / "*.dat")).transfer(to=url, secret_file=str(secret))
             .transfer(to=url, secret_file=str(secret)))


def test_a_channel_transfer_through_redis_names_no_key_files():
    """Issue 32, with the names from ``spec_fields.KEY_FILE_FIELDS`` (issue 42): every key file given is named."""
    from fstream_provider.flow.transfer import transfer_opener

    with pytest.raises(ValueError, match=r"transfer\(secret_file=\.\.\., tls_ca=\.\.\., redis=\.\.\.\): jobs may "
                                         r"not name key files"):
        transfer_opener(None, "fstream://127.0.0.1:9/x", redis="redis://127.0.0.1:9/0", secret_file="/s", tls_ca="/c")
