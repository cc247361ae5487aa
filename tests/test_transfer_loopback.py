"""Real sender and receiver over loopback: bytes identical, verified, resumable, and refused when they should be."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agentkit import (GatedReceiver, PacedReceiver, make_files, part_files, send, start_receiver, trees_identical,
                      wait_until, write_secret)
from fstream_provider.tuning.base import ClusterLayout, FileInfo, Observation, Suggestion
from transfer_agent.receiving.receiver import Receiver

KiB, MiB = 1024, 1024 * 1024


def test_many_small_files(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    src = make_files(tmp_path / "src", {f"d{i % 7}/f{i}.dat": 4 * KiB + i for i in range(400)})
    res = send(src, rx.port, secret, cc=4, p=1, pp=8)
    assert res.ok, res.failures[:3]
    assert res.verified_files == 400 and res.failed_files == 0
    assert trees_identical(src, tmp_path / "dst" / "out")
    assert not part_files(tmp_path / "dst")


def test_large_file_striped_over_streams(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    src = make_files(tmp_path / "src", {"big.bin": 48 * MiB + 123})
    res = send(src / "big.bin", rx.port, secret, cc=1, p=4, pp=0, block_size=1 * MiB)
    assert res.ok and res.verified_files == 1
    assert (tmp_path / "dst" / "out" / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
    assert res.intervals and res.intervals[-1]["p"] == 4


def test_mixed_dataset_with_fstream_tuner(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    sizes = {f"small/s{i}.h5": 16 * KiB for i in range(150)} | {f"large/l{i}.h5": 24 * MiB for i in range(3)}
    src = make_files(tmp_path / "src", sizes)
    res = send(src, rx.port, secret, tuner="fstream", bandwidth="1Gbit", profile_interval="0.3s")
    assert res.ok, res.failures[:3]
    assert res.verified_files == 153
    assert trees_identical(src, tmp_path / "dst" / "out")
    assert res.tuning and all(d["reason"] for d in res.tuning)  # every decision says why


def test_second_send_skips_identical_files(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    src = make_files(tmp_path / "src", {f"f{i}": 100 * KiB for i in range(20)})
    assert send(src, rx.port, secret).ok
    (src / "f3").write_bytes(os.urandom(100 * KiB))  # one file changed since
    res = send(src, rx.port, secret)
    assert res.ok and res.skipped_files == 19 and res.verified_files == 1
    assert res.bytes_sent == 100 * KiB  # only the changed file moved
    assert trees_identical(src, tmp_path / "dst" / "out")  # and no temp part is left beside the skipped ones
    assert not part_files(tmp_path / "dst")


def test_directory_and_file_placement(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    src = make_files(tmp_path / "src", {"run1/a.dat": 10, "run1/sub/b.dat": 20, "c.dat": 30})
    assert send([src / "run1", src / "c.dat"], rx.port, secret, dest="dest/x").ok
    out = tmp_path / "dst" / "dest" / "x"
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == ["a.dat", "c.dat", "sub/b.dat"]


def test_wrong_secret_refused_nothing_written(tmp_path: Path, secret: Path, rx: Receiver, caplog) -> None:
    src = make_files(tmp_path / "src", {"a": 1000})
    wrong = write_secret(tmp_path / "wrong")
    res = send(src, rx.port, wrong, max_session_retries=0)
    assert not res.ok
    assert "authentication failed" in (res.error or "") and "terminal" in (res.error or "")
    assert res.failures and res.failures[0]["path"].endswith("/a")
    assert not any((tmp_path / "dst").rglob("*"))
    assert rx.stats["sessions"] == 0


def test_receiver_refuses_to_run_unauthenticated(tmp_path: Path) -> None:
    from transfer_agent.errors import FStreamError

    with pytest.raises(FStreamError, match="unauthenticated"):
        Receiver(listen=("127.0.0.1", 0), root=str(tmp_path))


def test_sender_without_secret_refuses(tmp_path: Path, rx: Receiver) -> None:
    from fstream_provider.model.spec import TransferSpec
    from transfer_agent.errors import AuthError
    from transfer_agent.sending.sender import Transfer

    make_files(tmp_path / "src", {"a": 10})
    spec = TransferSpec(sources=[str(tmp_path / "src")], destination=f"fstream://127.0.0.1:{rx.port}/o", tuner="fixed")
    with pytest.raises(AuthError, match="secret"):
        Transfer(spec).run()


def test_resume_after_sigkill_of_sender(tmp_path: Path, secret: Path) -> None:
    size = 64 * MiB
    src = make_files(tmp_path / "src", {"big.bin": size})
    rx = start_receiver(tmp_path / "dst", secret, cls=GatedReceiver, hold_after=size // 3)
    try:
        cmd = [sys.executable, "-m", "transfer_agent.cli", "send", str(src / "big.bin"), "--to",
               f"fstream://127.0.0.1:{rx.port}/out", "--secret-file", str(secret), "--tuner", "fixed",
               "--cc", "1", "--p", "2", "--block-size", "1MiB", "--json"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert rx.reached.wait(60), "sender never got a third of the file across"
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.stdout.close()
            proc.stderr.close()
        rx.hold_after = None
        rx.gate.set()
        # the receiver closes the dead session and persists the part's ranges (only then is the listing final)
        wait_until(lambda: not rx._sessions, 10, "the dead sender's session closed at the receiver")
        parts = part_files(tmp_path / "dst")
        assert len(parts) == 1, "the interrupted file must stay as one resumable part"
        assert json.loads(Path(str(parts[0]) + ".meta").read_text())["ranges"], "its received ranges persisted"
        assert not (tmp_path / "dst" / "out" / "big.bin").exists(), "never visible before it is complete"
        res = send(src / "big.bin", rx.port, secret, cc=1, p=2, block_size=1 * MiB)
        assert res.ok and res.verified_files == 1
        assert res.resumed_bytes >= size // 4
        assert res.bytes_sent <= size - res.resumed_bytes
        assert (tmp_path / "dst" / "out" / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
        assert not part_files(tmp_path / "dst")
    finally:
        rx.gate.set()
        rx.stop()


def test_source_modified_while_sending_is_not_committed(tmp_path: Path, secret: Path) -> None:
    size = 64 * MiB  # far more than socket buffers hold: the sender is still sending when the file changes
    src = make_files(tmp_path / "src", {"grow.bin": size})
    rx = start_receiver(tmp_path / "dst", secret, cls=GatedReceiver, hold_after=2 * MiB)
    result = {}
    try:
        t = threading.Thread(target=lambda: result.update(r=send(src / "grow.bin", rx.port, secret, cc=1, p=1,
                                                                  block_size=1 * MiB)))
        t.start()
        assert rx.reached.wait(60)
        with open(src / "grow.bin", "ab") as f:
            f.write(b"appended while in flight")
        rx.gate.set()
        t.join(60)
    finally:
        rx.gate.set()
        rx.stop()
    res = result["r"]
    assert not res.ok and res.failed_files == 1
    assert "source modified" in res.failures[0]["reason"] or "source shrank" in res.failures[0]["reason"]
    assert not (tmp_path / "dst" / "out" / "grow.bin").exists()


def test_live_retuning_changes_channels_mid_transfer(tmp_path: Path, secret: Path) -> None:
    class Scripted:
        """Starts with one channel, then asks for three channels of two streams."""

        name = "scripted"

        def __init__(self) -> None:
            self.n = 0

        def update(self, observation: Observation) -> None:
            self.n += 1

        def suggest(self) -> Suggestion:
            if self.n == 1:
                return Suggestion((ClusterLayout("all", 1, 1, 2),), "start small", True)
            if self.n == 2:
                return Suggestion((ClusterLayout("all", 3, 2, 2),), "observed headroom: cc 1->3, p 1->2", True)
            return Suggestion((ClusterLayout("all", 3, 2, 2),), "", False)

        def cluster_of(self, file: FileInfo) -> str:
            return "all"

    src = make_files(tmp_path / "src", {f"f{i}.dat": 2 * MiB for i in range(12)})
    rx = start_receiver(tmp_path / "dst", secret, cls=PacedReceiver, rate=40 * MiB)
    try:
        res = send(src, rx.port, secret, tuner=Scripted(), profile_interval="0.2s", sample_interval="0.1s")
    finally:
        rx.stop()
    assert res.ok and trees_identical(src, tmp_path / "dst" / "out")
    layouts = {(iv["cc"], iv["p"]) for iv in res.intervals}
    assert (1, 1) in layouts and (3, 2) in layouts, layouts
    assert [d["reason"] for d in res.tuning] == ["start small", "observed headroom: cc 1->3, p 1->2"]
    assert any(iv["reason"] == "observed headroom: cc 1->3, p 1->2" for iv in res.intervals)


def test_watch_mode_ships_files_as_they_land(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    src = tmp_path / "src"
    src.mkdir()
    make_files(src, {"early.dat": 50 * KiB})
    stop = threading.Event()

    def producer() -> None:
        for i in range(5):
            if stop.wait(0.15):
                return
            tmp = src / f".incoming{i}"
            tmp.write_bytes(os.urandom(30 * KiB))
            tmp.rename(src / f"late{i}.dat")

    t = threading.Thread(target=producer)
    t.start()
    try:
        res = send(src, rx.port, secret, watch=True, interval="0.1s", idle_exit="1s")
    finally:
        stop.set()
        t.join()
    assert res.ok
    names = sorted(p.name for p in (tmp_path / "dst" / "out").iterdir())
    assert "early.dat" in names and all(f"late{i}.dat" in names for i in range(5))
    assert not any(n.startswith(".") for n in names), "a producer's hidden temp files are never shipped"
    for n in names:
        assert (tmp_path / "dst" / "out" / n).read_bytes() == (src / n).read_bytes()
    # every interval reports what the last scan of the source cost: a measured time, and at most the
    # entries the source ever held (early.dat, late0..4, one producer temp at a time)
    assert res.intervals
    assert all(iv["scan_seconds"] > 0 and 0 <= iv["scan_listed"] <= 7 for iv in res.intervals), res.intervals


def test_cli_send_json_and_exit_codes(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    src = make_files(tmp_path / "src", {"a.dat": 1000, "b.dat": 2000})
    base = [sys.executable, "-m", "transfer_agent.cli", "send", str(src), "--secret-file", str(secret), "--json",
            "--tuner", "fixed"]
    ok = subprocess.run(base + ["--to", f"fstream://127.0.0.1:{rx.port}/o"], capture_output=True, text=True,
                        timeout=60)
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    for key in ("files", "bytes", "seconds", "throughput_bps", "verified_files", "failed_files", "intervals"):
        assert key in out
    assert out["verified_files"] == 2 and out["bytes"] == 3000
    assert {"t", "throughput_bps", "cc", "p", "pp", "reason"} <= set(out["intervals"][0])
    bad = subprocess.run(base + ["--to", "http://nowhere/x"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "scheme must be fstream://" in bad.stderr


@pytest.mark.serial  # measures the rate held against a target (median error < 20 %): needs the cores to itself
def test_qos_target_is_held_by_the_agent(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    """The fstream tuner's QoS controller, applied by the real sender (channels and pacing), holds a target."""
    import statistics

    src = make_files(tmp_path / "src", {f"f{i}.bin": 8 * MiB for i in range(12)})  # ~4 s at the target
    target = 200e6
    res = send(src, rx.port, secret, tuner="fstream", target_throughput=target, bandwidth="2Gbit",
               profile_interval="0.5s", sample_interval="0.5s")
    assert res.ok and trees_identical(src, tmp_path / "dst" / "out")
    steady = [iv["throughput_bps"] for iv in res.intervals[2:-1]]  # after convergence, before the tail
    assert len(steady) >= 3
    err = statistics.median(abs(x - target) / target for x in steady)
    assert err < 0.2, (err, [round(x / 1e6) for x in steady])
    assert any(l.get("rate_bps") for d in res.tuning for l in d["layouts"].values())
    assert all(iv["target_bps"] == target for iv in res.intervals)


def test_stall_is_detected_by_the_progress_floor(tmp_path: Path, secret: Path) -> None:
    """A receiver that stops writing (held at a gate) is reported as a retryable stall, not waited on forever."""
    src = make_files(tmp_path / "src", {"big.bin": 64 * MiB})
    rx = start_receiver(tmp_path / "dst", secret, cls=GatedReceiver, hold_after=2 * MiB)
    try:
        res = send(src, rx.port, secret, cc=1, p=1, block_size=1 * MiB, stall_timeout=1.5, max_session_retries=0)
    finally:
        rx.gate.set()
        rx.stop()
    assert not res.ok
    assert "stalled" in (res.error or "") and "progress floor" in res.error and "retryable" in res.error
    assert not (tmp_path / "dst" / "out" / "big.bin").exists()


def test_profiling_history_is_saved_for_later_streams(tmp_path: Path, secret: Path, redis_client) -> None:
    from fstream_provider.bus.profiling_store import load_history
    from fstream_provider.model.spec import TransferSpec
    from transfer_agent.sending.sender import Transfer

    src = make_files(tmp_path / "src", {f"f{i}.h5": 4 * MiB for i in range(24)})
    rx = start_receiver(tmp_path / "dst", secret, cls=PacedReceiver, rate=24 * MiB)  # ~4 s: two profiling windows
    try:
        assert len(load_history(redis_client)) == 0
        spec = TransferSpec.from_options([str(src)], f"fstream://127.0.0.1:{rx.port}/o", tuner="fstream",
                                         bandwidth="1Gbit", profile_interval="0.5s", secret_file=str(secret))
        assert Transfer(spec, redis=redis_client).run().ok
    finally:
        rx.stop()
    saved = load_history(redis_client)
    assert len(saved) > 0 and all(r.ftype == "h5" and r.cc >= 1 for r in saved.records())


def test_blocks_are_cut_so_every_stream_gets_a_share() -> None:
    from transfer_agent.sending.inflight import MIN_STRIPE, cut_blocks

    # a 3 MiB file on 4 streams with 4 MiB blocks: four 768 KiB blocks, not one 3 MiB block
    assert cut_blocks([(0, 3 * MiB)], 4, 4 * MiB) == [(i * 768 * KiB, 768 * KiB) for i in range(4)]
    # large files keep the configured block size; tiny files are not cut below MIN_STRIPE
    assert {n for _o, n in cut_blocks([(0, 64 * MiB)], 4, 4 * MiB)} == {4 * MiB}
    assert cut_blocks([(0, 100 * KiB)], 8, 4 * MiB) == [(0, 100 * KiB)]
    assert all(n <= MIN_STRIPE for _o, n in cut_blocks([(0, MIN_STRIPE * 2)], 8, 4 * MiB))
    # resumed files: only the missing ranges, covered exactly once
    blocks = cut_blocks([(0, MiB), (5 * MiB, 9 * MiB)], 2, 4 * MiB)
    covered = sorted(blocks)
    assert sum(n for _o, n in covered) == 5 * MiB and covered[0][0] == 0 and covered[-1][0] + covered[-1][1] == 9 * MiB


def test_a_cluster_that_ran_out_of_files_gives_its_channels_back(tmp_path: Path, secret: Path) -> None:
    # the few small files are done within the first second; the large ones take ~4 s more
    sizes = {f"s{i}.dat": 64 * KiB for i in range(5)} | {f"l{i}.dat": 12 * MiB for i in range(8)}
    src = make_files(tmp_path / "src", sizes)
    rx = start_receiver(tmp_path / "dst", secret, cls=PacedReceiver, rate=24 * MiB)
    try:
        # told 100 Mbit/s, the 12 MiB files are "large" (> 0.4 s each) and the 64 KiB ones "small"
        res = send(src, rx.port, secret, tuner="fstream", bandwidth="100Mbit", profile_interval="0.3s",
                   sample_interval="0.3s")
    finally:
        rx.stop()
    assert res.ok and trees_identical(src, tmp_path / "dst" / "out")
    first = res.intervals[0]["clusters"]
    assert "small" in first or any("small" in d["layouts"] for d in res.tuning)
    # The small files can take seconds (they share the receiver's paced rate, and channels reassigned to them
    # mid-file finish their large file first), so "the last second" was not always after the give-back: the
    # property is that the tuner's last decision gives the small cluster nothing and the last intervals run
    # without it.
    assert "small" not in res.tuning[-1]["layouts"] and "large" in res.tuning[-1]["layouts"], res.tuning[-1]
    late = res.intervals[-2:]
    assert all("small" not in iv["clusters"] for iv in late), [iv["clusters"] for iv in late]


def test_a_tuner_that_fails_mid_transfer_keeps_the_layout_and_loses_nothing(tmp_path: Path, secret: Path) -> None:
    class Failing:
        """Starts with two channels, then raises on every later update (a tuner bug)."""

        name = "failing"

        def __init__(self) -> None:
            self.n = 0

        def update(self, observation: Observation) -> None:
            self.n += 1
            if self.n > 1:
                raise ValueError("allocate_channels: chunk 'small' needs a unit throughput > 0")

        def suggest(self) -> Suggestion:
            return Suggestion((ClusterLayout("all", 2, 1, 2),), "start", True)

        def cluster_of(self, file: FileInfo) -> str:
            return "all"

    src = make_files(tmp_path / "src", {f"f{i}.dat": 1 * MiB for i in range(12)})
    rx = start_receiver(tmp_path / "dst", secret, cls=PacedReceiver, rate=20 * MiB)
    try:
        res = send(src, rx.port, secret, tuner=Failing(), profile_interval="0.1s", sample_interval="0.1s")
    finally:
        rx.stop()
    assert res.ok and res.verified_files == 12 and trees_identical(src, tmp_path / "dst" / "out")
    assert any("tuner error, layout kept: ValueError" in iv["reason"] for iv in res.intervals)


def test_without_verification_the_receiver_hashes_nothing(tmp_path: Path, secret: Path, rx: Receiver,
                                                          monkeypatch) -> None:
    """``--no-verify``: the OPEN says so and the receiver neither hashes a large file while it arrives nor
    an existing copy for a skip check (issue 13: it did both and threw the digests away, ~0.3 CPU-s per
    GiB). With verification the same files are hashed, so the count below can fail."""
    from transfer_agent.receiving import control as rx_control
    from transfer_agent.storage import checksum

    hashed: list[str] = []

    class CountingPrefixHasher(checksum.PrefixHasher):
        def advance(self, fd: int, upto: int) -> None:
            hashed.append("ahead")
            super().advance(fd, upto)

    def counting_hash_fd(*a, **k):
        hashed.append("existing")
        return checksum.hash_fd(*a, **k)

    monkeypatch.setattr(rx_control, "PrefixHasher", CountingPrefixHasher)
    monkeypatch.setattr(rx_control, "hash_fd", counting_hash_fd)
    src = make_files(tmp_path / "src", {"big.bin": 40 * MiB, "small.bin": 10 * KiB})
    res = send(src, rx.port, secret, cc=1, p=2, pp=1, verify=False)
    assert res.ok and res.files == 2
    res = send(src, rx.port, secret, cc=1, p=2, pp=1, verify=False)  # both exist now: replaced, not hashed
    assert res.ok and trees_identical(src, tmp_path / "dst" / "out")
    assert hashed == []
    res = send(src, rx.port, secret, cc=1, p=2, pp=1)  # verifying: the existing copies are hashed and skipped
    assert res.ok and res.skipped_files == 2 and hashed.count("existing") == 2
