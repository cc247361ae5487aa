"""Receiver robustness (issue 8, defects 4, 5, 6 and 7): validated OPENs, owned teardown, no "busy" after a
crash or a checksum mismatch, backoff on retryable refusals, bytes counted over reconnects, orphan sweep."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentkit import GatedReceiver, make_files, part_files, send, start_receiver, wait_until
from transfer_agent.wire.auth import load_secret
from transfer_agent.sending.connector import Connector
from transfer_agent.errors import FStreamError
from transfer_agent.wire.protocol import Frame
from transfer_agent.wire.secure import ControlLink
from transfer_agent.receiving.receiver import Receiver

MiB = 1024 * 1024




class Ctl:
    """An authenticated control connection whose frames go through its link (MAC'd: raw frames are refused)."""

    def __init__(self, link: ControlLink) -> None:
        self.link, self.sock = link, link.sock

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "Ctl":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def control(port: int, secret: Path, job: str = "job", attempt: int = 1,
            sid: str | None = None) -> tuple[Ctl, Connector]:
    conn = Connector("127.0.0.1", port, load_secret(secret), None,
                     {"session": sid or uuid.uuid4().hex, "job": job, "attempt": attempt})
    return Ctl(conn.connect_link(role="control").link), conn


def request(ctl: Ctl, fid: int, body: dict[str, Any]) -> tuple[Frame, dict]:
    ctl.link.send(Frame.OPEN, body, fid)
    ftype, rfid, reply = ctl.link.recv(plain_error=True)
    assert rfid == fid
    return ftype, reply or {}


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- defect 4: validate the whole OPEN before opening anything ------------------------------------
BAD_OPENS = [
    {"path": "m/a.bin", "size": 10, "mtime_ns": "not-a-number", "algo": "blake3-keyed"},
    {"path": "m/b.bin", "size": 10, "mtime_ns": 1.5, "algo": "blake3-keyed"},
    {"path": "m/c.bin", "size": 10, "mtime_ns": True, "algo": "blake3-keyed"},
    {"path": "m/d.bin", "size": True, "mtime_ns": 1, "algo": "blake3-keyed"},
    {"path": "m/e.bin", "size": "10", "mtime_ns": 1, "algo": "blake3-keyed"},
    {"path": "m/f.bin", "size": 10, "mtime_ns": 1, "algo": ["blake3-keyed"]},
    {"path": "m/g.bin", "size": 10, "mtime_ns": 1, "algo": "blake3-keyed", "replace": "yes"},
    {"path": "m/i.bin", "size": 10, "mtime_ns": 1, "algo": "blake3-keyed", "verify": "no"},
    {"path": ["m", "h.bin"], "size": 10, "mtime_ns": 1, "algo": "blake3-keyed"},
]


def test_malformed_opens_leak_no_fd_and_leave_no_part(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    """300 authenticated OPENs with a malformed field: no descriptor kept, no empty .part, honest sends still work."""
    before = open_fds()
    sock, _ = control(rx.port, secret)
    try:
        for i in range(300):
            body = BAD_OPENS[i % len(BAD_OPENS)]
            try:
                ftype, reply = request(sock, i + 1, body)
            except (FStreamError, OSError):  # the receiver dropped the connection: carry on with a new one
                sock.close()
                sock, _ = control(rx.port, secret)
                continue
            assert ftype == Frame.ERROR and reply["kind"] == "refused" and reply["retryable"] is False, reply
    finally:
        sock.close()
    wait_until(lambda: not rx._sessions, what="sessions closed")
    assert open_fds() - before < 10, "the receiver kept descriptors of refused OPENs"
    assert not part_files(tmp_path / "dst") and not list((tmp_path / "dst").rglob("*.meta"))
    src = make_files(tmp_path / "src", {"ok.dat": 100_000})
    assert send(src, rx.port, secret).ok


def test_malformed_fields_are_named(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    sock, _ = control(rx.port, secret)
    with sock:
        ftype, reply = request(sock, 1, {"path": "t.bin", "size": True, "mtime_ns": 1, "algo": "blake3-keyed"})
        assert ftype == Frame.ERROR and "declared size True is not a valid file size" in reply["message"]
        ftype, reply = request(sock, 2, BAD_OPENS[0])
        assert ftype == Frame.ERROR and "mtime_ns 'not-a-number' is not an integer" in reply["message"]
        ftype, _ = request(sock, 3, {"path": "t.bin", "size": 1, "mtime_ns": 1, "algo": "blake3-keyed"})
        assert ftype == Frame.OPEN_OK  # the session is still served
    assert not (tmp_path / "dst" / "t.bin").exists()


def test_failure_after_the_part_is_opened_closes_it_and_removes_it(tmp_path: Path, secret: Path,
                                                                     rx: Receiver, monkeypatch) -> None:
    """Whatever fails once the new part's fd is open (here: the space reservation), the fd is closed and the
    new empty part removed."""
    from transfer_agent.storage import durable as storage

    def broken(fd: int, size: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(storage, "reserve", broken)
    before = open_fds()
    sock, _ = control(rx.port, secret)
    with sock:
        for i in range(20):
            ftype, reply = request(sock, i + 1, {"path": f"r{i}.bin", "size": 16 * MiB, "mtime_ns": 1,
                                                 "algo": "blake3-keyed"})
            assert ftype == Frame.ERROR and "Input/output error" in reply["message"]
        assert open_fds() - before < 5
    assert not part_files(tmp_path / "dst")


# -- defect 5: a refused duplicate session must not tear the real one down ------------------------
def test_duplicate_session_refused_without_removing_the_real_one(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    sid = uuid.uuid4().hex
    real, conn = control(rx.port, secret, sid=sid)
    with real:
        with pytest.raises(FStreamError):
            dup, _ = control(rx.port, secret, sid=sid)  # the receiver closes it (possibly before WELCOME)
            with dup:
                dup.link.recv(plain_error=True)
        wait_until(lambda: rx.stats["errors"] >= 1, what="duplicate refused")
        data = conn.connect(role="data", channel=1, stream=0)  # the real session still exists
        data.close()
        ftype, _ = request(real, 1, {"path": "d.bin", "size": 1, "mtime_ns": 1, "algo": "blake3-keyed"})
        assert ftype == Frame.OPEN_OK
        assert sid in rx._sessions


# -- defect 6: busy after a crash or a checksum mismatch ------------------------------------------
class SlowUnlinkReceiver(Receiver):
    """Removing a part takes a while (a large, preallocated file on a slow disk)."""

    def _remove_part(self, dir_fd: int, dkey: tuple[int, int], base: str, name: str) -> None:
        threading.Event().wait(0.3)  # a slow unlink, not a wait for an event
        super()._remove_part(dir_fd, dkey, base, name)


class CorruptingReceiver(SlowUnlinkReceiver):
    """Flips one hex digit of the first COMMIT's digest it takes, once: the checksum fails once. (The digest is
    computed from the blocks as they arrive since issue 29, so a byte flipped in the part after it was written
    is no longer what the check sees; a digest that does not match what arrived is.)"""

    corrupted = False

    def _request_commit(self, session, fid: int, body: dict[str, Any]) -> None:
        f = session.files.get(fid)
        if f is not None and not CorruptingReceiver.corrupted:
            CorruptingReceiver.corrupted = True
            sent = body["hash"]
            body = {**body, "hash": ("1" if sent[0] == "0" else "0") + sent[1:]}
        super()._request_commit(session, fid, body)


def test_checksum_mismatch_retry_is_not_refused_busy(tmp_path: Path, secret: Path) -> None:
    size = 12 * MiB
    src = make_files(tmp_path / "src", {"m.bin": size})
    CorruptingReceiver.corrupted = False
    rx = start_receiver(tmp_path / "dst", secret, cls=CorruptingReceiver)
    try:
        res = send(src, rx.port, secret, cc=1, p=2, block_size=1 * MiB)
    finally:
        rx.stop()
    assert CorruptingReceiver.corrupted
    assert res.ok and res.verified_files == 1, res.failures
    assert (tmp_path / "dst" / "out" / "m.bin").read_bytes() == (src / "m.bin").read_bytes()
    assert not part_files(tmp_path / "dst")


@pytest.mark.parametrize("slow_teardown", [True, False], ids=["dead-session-still-tearing-down", "plain"])
def test_sender_killed_and_restarted_at_once_resumes(tmp_path: Path, secret: Path, slow_teardown: bool) -> None:
    """SIGKILL an `fstream send` mid-file and restart it at once — also while the dead session is still being torn
    down (its data stream still busy, as on a WAN): the stale session is fenced and the restart resumes."""
    size = 48 * MiB
    src = make_files(tmp_path / "src", {"big.bin": size})
    rx = start_receiver(tmp_path / "dst", secret, cls=GatedReceiver, hold_after=size // 3)
    cmd = [sys.executable, "-m", "transfer_agent.cli", "send", str(src / "big.bin"), "--to",
           f"fstream://127.0.0.1:{rx.port}/out", "--secret-file", str(secret), "--tuner", "fixed",
           "--cc", "1", "--p", "2", "--block-size", "1MiB", "--json"]
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        assert rx.reached.wait(30), "the sender never got a third of the file across"
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        rx.hold_after = None  # later blocks pass; the one held stays held until the restart asked for the file
        if not slow_teardown:
            rx.gate.set()
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        if slow_teardown:
            wait_until(lambda: rx.stats.get("fenced", 0) >= 1 or procs[1].poll() is not None, timeout=20,
                       what="the restart finding the stale session")
            rx.gate.set()
        out, err = procs[1].communicate(timeout=30)
        assert procs[1].returncode == 0, err
        res = json.loads(out)
        assert res["ok"] and res["verified_files"] == 1
        assert res["resumed_bytes"] >= size // 4, "the restart must resend only the missing ranges"
        assert "busy" not in err
    finally:
        rx.gate.set()
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
        rx.stop()
    assert (tmp_path / "dst" / "out" / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
    assert not part_files(tmp_path / "dst")


def test_later_attempt_of_the_same_job_fences_the_holder(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    old, _ = control(rx.port, secret, job="J", attempt=1)
    new, _ = control(rx.port, secret, job="J", attempt=2)
    with old, new:
        body = {"path": "f.bin", "size": 1000, "mtime_ns": 1, "algo": "blake3-keyed"}
        assert request(old, 1, body)[0] == Frame.OPEN_OK
        ftype, reply = request(new, 1, body)
        assert ftype == Frame.OPEN_OK, reply
        assert rx.stats["fenced"] == 1
        old.sock.settimeout(5)
        with pytest.raises((FStreamError, OSError)):  # the fenced session's control connection was shut
            old.link.recv(plain_error=True)


def test_live_holder_of_another_job_means_busy_retryable(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    a, _ = control(rx.port, secret, job="A")
    b, _ = control(rx.port, secret, job="B")
    with a, b:
        body = {"path": "f.bin", "size": 1000, "mtime_ns": 1, "algo": "blake3-keyed"}
        assert request(a, 1, body)[0] == Frame.OPEN_OK
        t0 = time.monotonic()
        ftype, reply = request(b, 1, body)
        assert ftype == Frame.ERROR and "busy" in reply["message"] and reply["retryable"] is True
        assert time.monotonic() - t0 < 2
        assert request(a, 2, {**body, "path": "g.bin"})[0] == Frame.OPEN_OK  # the holder is untouched


def test_retryable_refusal_backs_off_with_jitter() -> None:
    """Retries of a file refused "busy" spread out exponentially (with jitter) within the bound, then stop."""
    from transfer_agent.sending import file_retry
    from transfer_agent.errors import ChecksumError
    from fstream_provider.watch.sources import SrcFile

    clock = [1000.0]
    sf = SrcFile("/s/x", "x", 1, 1)
    busy = FStreamError("receiver: 'x': busy: another session is receiving this file", retryable=True)
    delays = []
    while (d := file_retry.retry_delay(sf, busy, now=clock[0])) is not None:
        delays.append(d)
        clock[0] += d
    assert delays[0] < 0.2 and max(delays) <= file_retry.FILE_RETRY.cap_s
    assert sum(delays) <= file_retry.RETRY_BUDGET_S + 1e-6 and sum(delays) >= file_retry.RETRY_BUDGET_S - 1e-6
    assert 6 <= len(delays) <= 40
    assert all(delays[i] > delays[i - 1] * 0.3 for i in range(1, 5))  # growing, not a storm within ms
    sf2 = SrcFile("/s/y", "y", 1, 1)
    mism = ChecksumError("checksum mismatch", retryable=True)
    counted = [file_retry.retry_delay(sf2, mism, now=clock[0]) for _ in range(file_retry.MAX_FILE_TRIES)]
    assert counted[-1] is None and all(d is not None and d > 0 for d in counted[:-1])


class CountingReceiver(Receiver):
    opens = 0

    def _open(self, session, fid: int, body: dict[str, Any]) -> dict[str, Any]:
        CountingReceiver.opens += 1
        return super()._open(session, fid, body)  # the OPEN_OK's body (issue 29: the caller sends it)


def test_sender_waits_out_a_live_holder_with_backoff(tmp_path: Path, secret: Path) -> None:
    """Another live job holds the file: the sender is told "busy", backs off (no storm), and gets it once freed."""
    src = make_files(tmp_path / "src", {"h.bin": 200_000})
    rx = start_receiver(tmp_path / "dst", secret, cls=CountingReceiver)
    CountingReceiver.opens = 0
    result: dict[str, Any] = {}
    try:
        holder, _ = control(rx.port, secret, job="other")
        assert request(holder, 1, {"path": "out/h.bin", "size": 200_000, "mtime_ns": 1,
                                   "algo": "blake3-keyed"})[0] == Frame.OPEN_OK
        t = threading.Thread(target=lambda: result.update(r=send(src, rx.port, secret)))
        t.start()
        wait_until(lambda: CountingReceiver.opens >= 3, what="the sender asking again")
        threading.Event().wait(1.0)  # the other job keeps the file a while longer
        holder.close()
        t.join(30)
    finally:
        rx.stop()
    res = result["r"]
    assert res.ok and res.verified_files == 1, res.failures
    assert CountingReceiver.opens <= 12, f"{CountingReceiver.opens} OPENs in ~1.5 s: a retry storm"
    assert (tmp_path / "dst" / "out" / "h.bin").read_bytes() == (src / "h.bin").read_bytes()


# -- defect 7 -------------------------------------------------------------------------------------
def test_mtime_only_change_is_named(tmp_path: Path, secret: Path) -> None:
    size = 32 * MiB
    src = make_files(tmp_path / "src", {"touch.bin": size})
    rx = start_receiver(tmp_path / "dst", secret, cls=GatedReceiver, hold_after=2 * MiB)
    result: dict[str, Any] = {}
    try:
        t = threading.Thread(target=lambda: result.update(r=send(src / "touch.bin", rx.port, secret, cc=1, p=1,
                                                                  block_size=1 * MiB)))
        t.start()
        assert rx.reached.wait(30)
        st = os.stat(src / "touch.bin")
        os.utime(src / "touch.bin", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
        rx.gate.set()
        t.join(30)
    finally:
        rx.gate.set()
        rx.stop()
    res = result["r"]
    assert not res.ok and res.failed_files == 1
    reason = res.failures[0]["reason"]
    assert "mtime changed" in reason and f"size {size}→{size}" not in reason


def _cut_mid_file(tmp_path: Path, secret: Path, size: int) -> Any:
    src = make_files(tmp_path / "src", {"r.bin": size})
    rx = start_receiver(tmp_path / "dst", secret, cls=GatedReceiver, hold_after=size // 2)
    result: dict[str, Any] = {}
    try:
        t = threading.Thread(target=lambda: result.update(r=send(src / "r.bin", rx.port, secret, cc=1, p=1,
                                                                  block_size=1 * MiB)))
        t.start()
        assert rx.reached.wait(30)
        rx.hold_after = None
        for s in list(rx._sessions.values()):  # cut the session: the sender reconnects and resumes
            s.control.sock.shutdown(socket.SHUT_RDWR)
        rx.gate.set()
        t.join(30)
    finally:
        rx.gate.set()
        rx.stop()
    return result["r"]


def test_bytes_sent_counts_every_session(tmp_path: Path, secret: Path) -> None:
    size = 24 * MiB
    # the cut races the held data stream: once the gate opens, that stream (still connected) may land the rest of
    # the file before the sender notices, and the next session then finds it whole (skipped, nothing to resume;
    # seen once on a loaded CI machine). Up to three tries for the case this test is about: a resume.
    for k in range(3):
        res = _cut_mid_file(tmp_path / f"try{k}", secret, size)
        if res.resumed_bytes:
            break
    assert res.ok and res.resumed_bytes >= size // 4
    # the first session's bytes count too (a block cut off mid-send is not counted: at most one per stream)
    assert res.bytes_sent >= size - 1 * MiB, f"bytes sent over both sessions: {res.bytes_sent}, file {size}"
    assert res.bytes_sent > size - res.resumed_bytes
    assert (tmp_path / f"try{k}" / "dst" / "out" / "r.bin").read_bytes() == \
        (tmp_path / f"try{k}" / "src" / "r.bin").read_bytes()


def _orphans(root: Path, age: float) -> dict[str, Path]:
    (root / "d").mkdir(parents=True, exist_ok=True)
    made = {}
    for name, when in ((".old.bin.job1.1.part", age), (".old.bin.job1.1.part.meta", age),
                       (".lone.bin.job2.1.part.meta", age), (".new.bin.job3.1.part", 0)):
        p = root / "d" / name
        p.write_bytes(b"x" * 100)
        t = time.time() - when
        os.utime(p, (t, t))
        made[name] = p
    keep = root / "d" / "old.bin"  # final files are never touched, however old
    keep.write_bytes(b"final")
    os.utime(keep, (time.time() - age, time.time() - age))
    made["final"] = keep
    return made


def test_orphaned_parts_swept_on_start_busy_ones_kept(tmp_path: Path, secret: Path) -> None:
    dst = tmp_path / "dst"
    made = _orphans(dst, 8 * 86400)
    rx = start_receiver(dst, secret, part_max_age=3600)
    try:
        assert rx.swept.wait(10)
        assert not made[".old.bin.job1.1.part"].exists() and not made[".old.bin.job1.1.part.meta"].exists()
        assert not made[".lone.bin.job2.1.part.meta"].exists()
        assert made[".new.bin.job3.1.part"].exists() and made["final"].exists()
        sock, _ = control(rx.port, secret, job="busyjob")
        with sock:  # a part a session holds is never swept, however old it looks
            assert request(sock, 1, {"path": "d/held.bin", "size": 10, "mtime_ns": 1,
                                     "algo": "blake3-keyed"})[0] == Frame.OPEN_OK
            held = part_files(dst / "d")
            held = [p for p in held if p.name.startswith(".held.bin.")]
            assert len(held) == 1
            os.utime(held[0], (time.time() - 9e5, time.time() - 9e5))
            removed = rx.sweep_parts(0, whole_tree=False)  # the periodic sweep: directories written to
            assert held[0].exists() and "d/.new.bin.job3.1.part" in removed
    finally:
        rx.stop()


def test_receive_clean_sweeps_and_exits(tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    made = _orphans(dst, 2 * 86400)
    out = subprocess.run([sys.executable, "-m", "transfer_agent.cli", "receive", "--root", str(dst), "--clean",
                          "--max-part-age", "1d"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert str(made[".old.bin.job1.1.part"]) in out.stdout and "3 orphaned part file(s) removed" in out.stdout
    assert made[".new.bin.job3.1.part"].exists() and made["final"].exists()
    assert not made[".old.bin.job1.1.part"].exists()


def test_write_failure_removes_the_partial_and_releases_the_file(tmp_path: Path, secret: Path) -> None:
    """A write that fails (here EFBIG: the receiver runs under RLIMIT_FSIZE, as a full disk would) is a terminal
    error naming the cause; the partial file is removed and released at once; other files are fine."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (2 * MiB, 2 * MiB))

    src = make_files(tmp_path / "src", {"big.bin": 6 * MiB, "small.bin": 100_000})
    (tmp_path / "dst").mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "transfer_agent.cli", "receive", "--listen", "127.0.0.1:0",
                             "--root", str(tmp_path / "dst"), "--secret-file", str(secret), "--no-fsync"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=limit)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on "), line
        port = int(line.rsplit(":", 1)[1])
        res = send(src, port, secret, cc=1, p=2, block_size=1 * MiB, max_session_retries=1)
        assert res.verified_files == 1 and res.failed_files == 1
        assert "write failed: File too large" in res.failures[0]["reason"]
        assert "terminal" in res.failures[0]["reason"]
        assert not part_files(tmp_path / "dst") and not list((tmp_path / "dst").rglob("*.meta"))
        assert (tmp_path / "dst" / "out" / "small.bin").read_bytes() == (src / "small.bin").read_bytes()
    finally:
        proc.terminate()
        proc.wait(15)
        proc.stdout.close()


# -- fault row "receiver SIGKILL mid-rename": a sidecar whose part is gone is garbage at once -------------
def test_fresh_orphan_sidecar_removed_by_the_start_sweep(tmp_path: Path, secret: Path) -> None:
    """A receiver killed between a commit's rename and the sidecar's removal leaves ``.X.part.meta`` beside the
    final ``X``: it describes no bytes, so the sweep at start removes it however young it is."""
    d = tmp_path / "dst" / "d"
    d.mkdir(parents=True)
    (d / "done.bin").write_bytes(b"committed")
    orphan = d / ".done.bin.job1.1.part.meta"
    orphan.write_text(json.dumps({"path": "d/done.bin", "ranges": [[0, 9]]}))
    live = d / ".open.bin.job1.1.part"  # young part with its sidecar: kept (the age rule applies)
    live.write_bytes(b"x")
    (d / ".open.bin.job1.1.part.meta").write_text("{}")
    rx = start_receiver(tmp_path / "dst", secret, part_max_age=3600)
    try:
        assert rx.swept.wait(10)
        assert not orphan.exists(), "a sidecar without its part survived the sweep at start"
        assert live.exists() and (d / ".open.bin.job1.1.part.meta").exists()
        assert (d / "done.bin").read_bytes() == b"committed"
    finally:
        rx.stop()


def test_orphan_sidecar_removed_when_a_session_first_lists_the_directory(tmp_path: Path, secret: Path) -> None:
    """Without any sweep, the first listing of a directory by a session removes orphaned sidecars, and a part of a
    crashed attempt without a sidecar (no record of its bytes) is reclaimed when its file is opened again."""
    d = tmp_path / "dst" / "d"
    d.mkdir(parents=True)
    orphan = d / ".gone.bin.job1.1.part.meta"
    orphan.write_text("{}")
    bare = d / ".again.bin.job1.1.part"
    bare.write_bytes(b"y" * 10)
    (d / "have.bin").write_bytes(b"final")  # committed since; a bare part of an earlier attempt is left
    bare_of_final = d / ".have.bin.job0.1.part"
    bare_of_final.write_bytes(b"f")
    rx = start_receiver(tmp_path / "dst", secret, part_max_age=None)
    try:
        sock, _ = control(rx.port, secret, job="job1", attempt=2)
        with sock:
            ftype, reply = request(sock, 1, {"path": "d/again.bin", "size": 10, "mtime_ns": 1,
                                             "algo": "blake3-keyed"})
            assert ftype == Frame.OPEN_OK and reply["missing"] == [[0, 10]], reply
            assert not orphan.exists(), "a sidecar without its part survived the directory's first listing"
            assert not bare.exists(), "a part without a sidecar was neither resumed nor reclaimed"
            ftype, reply = request(sock, 2, {"path": "d/have.bin", "size": 5, "mtime_ns": 1,
                                             "algo": "blake3-keyed"})
            assert ftype == Frame.OPEN_OK and reply["existing_hash"], reply
            assert not bare_of_final.exists(), "a bare part beside a final file was left for ever"
            assert (d / "have.bin").read_bytes() == b"final"
    finally:
        rx.stop()


# -- fault row "source modified mid-send": blocks of a file given up are dropped, the connection stays -------
@pytest.mark.parametrize("encrypt", [False, True], ids=["plain", "sealed"])
def test_blocks_of_an_aborted_file_are_dropped_not_a_protocol_error(tmp_path: Path, secret: Path, rx: Receiver,
                                                                    encrypt: bool) -> None:
    """Data and control travel on different connections, so blocks the sender put on the wire before it aborted
    a file (its source changed) may arrive after the ABORT. They are read and dropped; the data connection stays
    and carries the next file. Data for a file id never opened still closes the connection."""
    from transfer_agent.wire.protocol import pack_header
    from transfer_agent.wire.secure import TAG_BYTES, DataSealer

    sid = uuid.uuid4().hex
    conn = Connector("127.0.0.1", rx.port, load_secret(secret), None,
                     {"session": sid, "job": "dropjob", "attempt": 1}, encrypt=encrypt)
    ctl = Ctl(conn.connect_link(role="control").link)
    hs = conn.connect_link(role="data", channel=0, stream=0)
    data = hs.link.sock
    sealer = DataSealer(hs.keys) if encrypt else None

    def block(fid: int, off: int, payload: bytes) -> None:
        if sealer is None:
            data.sendall(pack_header(Frame.DATA, fid, off, len(payload)) + payload)
        else:
            header = pack_header(Frame.DATA, fid, off, len(payload) + TAG_BYTES)
            data.sendall(header + sealer.seal(header, payload))

    def session_file(fid: int):
        s = rx._sessions.get(sid)
        return s and s.files.get(fid)

    with ctl:
        try:
            size = 256 << 10
            assert request(ctl, 1, {"path": "a/gone.bin", "size": size, "mtime_ns": 1,
                                    "algo": "blake3-keyed"})[0] == Frame.OPEN_OK
            block(1, 0, b"a" * (64 << 10))
            wait_until(lambda: session_file(1) and session_file(1).ranges.total() == 64 << 10, what="first block")
            ctl.link.send(Frame.ABORT, {"reason": "source modified"}, 1)
            wait_until(lambda: session_file(1) is None, what="the ABORT handled")
            dropped = rx.stats.get("blocks_dropped", 0)
            block(1, 64 << 10, b"b" * (64 << 10))  # already on its way when the sender gave up
            block(1, 128 << 10, b"c" * (128 << 10))
            # the same data connection still carries the next file
            assert request(ctl, 2, {"path": "a/next.bin", "size": 1000, "mtime_ns": 1,
                                    "algo": "blake3-keyed"})[0] == Frame.OPEN_OK
            block(2, 0, b"n" * 1000)
            wait_until(lambda: session_file(2) and session_file(2).ranges.total() == 1000,
                       what="the next file's block written over the same data connection")
            assert rx.stats["blocks_dropped"] == dropped + 2
            assert not [p for p in part_files(tmp_path / "dst" / "a") if p.name.startswith(".gone.bin.")]
            # a file id never opened in this session is still refused: the data connection closes
            block(99, 0, b"x" * 100)
            data.settimeout(10)
            try:
                got = data.recv(1)
            except ConnectionResetError:
                got = b""
            assert got == b"", "data for a never-opened file id did not close the data connection"
        finally:
            data.close()


def test_inflight_ranges_persisted_every_flush_interval_while_session_lives(tmp_path: Path, secret: Path) -> None:
    """A receiver killed mid-file can resume only from ranges it already wrote down: the flush loop must
    persist in-flight files' ranges every ``flush_interval`` while the session is alive, not only when it
    closes (regression: the periodic flush sat inside the sweep's error handler and never ran)."""
    size = 16 * MiB
    src = make_files(tmp_path / "src", {"big.bin": size})
    rx = start_receiver(tmp_path / "dst", secret, cls=GatedReceiver, hold_after=size // 2, flush_interval=0.1)
    cmd = [sys.executable, "-m", "transfer_agent.cli", "send", str(src / "big.bin"), "--to",
           f"fstream://127.0.0.1:{rx.port}/out", "--secret-file", str(secret), "--tuner", "fixed",
           "--cc", "1", "--p", "1", "--block-size", "1MiB", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert rx.reached.wait(60), "the sender never got half of the file across"
        meta: list[dict] = []

        def ranges_on_disk() -> bool:
            parts = part_files(tmp_path / "dst")
            side = Path(str(parts[0]) + ".meta") if parts else None
            if side is not None and side.exists():
                meta[:] = [json.loads(side.read_text())]
                return bool(meta[0].get("ranges"))
            return False

        wait_until(ranges_on_disk, timeout=10,
                   what="a ranges sidecar written while the session is alive and held mid-file")
        assert rx._sessions, "the session must still be open: the sidecar has to come from the periodic flush"
        got = sum(end - start for start, end in meta[0]["ranges"])
        assert 0 < got <= size // 2 + MiB
    finally:
        rx.hold_after = None
        rx.gate.set()
        try:
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.stdout.close()
            proc.stderr.close()
            rx.stop()
    assert (tmp_path / "dst" / "out" / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
