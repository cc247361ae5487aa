"""A checksum that finishes (or is cancelled) after its session settled the file: no COMMIT, no traceback.

Found by CI: a fenced agent's session closed every source while its hasher still ran; the done-callback
then raised ``CancelledError`` or hit EBADF on ``os.fstat`` of a closed (possibly reused) descriptor.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from fstream_provider.watch.sources import SrcFile
from transfer_agent.sending.control import ControlSession
from transfer_agent.sending.inflight import InFlight, settle


class _Writer:
    def __init__(self) -> None:
        self.frames: list[tuple[object, dict, int]] = []

    def send(self, ftype: object, body: dict, fid: int = 0) -> None:
        self.frames.append((ftype, body, fid))


def _session(verify: bool = True) -> tuple[ControlSession, _Writer, list[InFlight]]:
    cs = ControlSession.__new__(ControlSession)  # no socket: only the commit path is under test
    writer, finished = _Writer(), []
    cs.writer, cs.verify, cs.algo, cs.digest_key = writer, verify, "xxh3_128", None
    cs._files, cs._lock, cs.error, cs.failed = {}, threading.Lock(), None, threading.Event()
    cs.on_finished = finished.append
    return cs, writer, finished


def _inflight(tmp_path: Path, cs: ControlSession) -> InFlight:
    src = tmp_path / "a.bin"
    src.write_bytes(os.urandom(64 << 10))
    fd = os.open(src, os.O_RDONLY)
    st = os.fstat(fd)
    f = InFlight(SrcFile(str(src), "a.bin", st.st_size, st.st_mtime_ns), 1, fd, st.st_size, st.st_mtime_ns)
    cs._files[1] = f
    return f


def test_a_cancelled_checksum_of_a_settled_file_sends_nothing_and_raises_nothing(tmp_path: Path) -> None:
    cs, writer, _ = _session()
    f = _inflight(tmp_path, cs)
    fut: Future = Future()
    fut.cancel()
    settle(f)
    cs._commit(f, fut)  # raised concurrent.futures.CancelledError before the fix
    assert writer.frames == [] and not cs.failed.is_set()


def test_a_checksum_finishing_after_the_file_was_settled_does_not_touch_the_closed_descriptor(tmp_path: Path) -> None:
    cs, writer, _ = _session()
    f = _inflight(tmp_path, cs)
    fut: Future = Future()
    settle(f)  # the session closed: the descriptor is gone (its number may belong to another file now)
    reused = os.open(tmp_path / "a.bin", os.O_RDONLY)
    try:
        fut.set_result("digest")
        cs._commit(f, fut)  # fstat'ed the closed/reused descriptor and sent COMMIT before the fix
        assert writer.frames == [] and not cs.failed.is_set()
    finally:
        os.close(reused)


def test_the_hasher_holds_the_descriptor_so_settling_mid_hash_cannot_close_it(tmp_path: Path) -> None:
    cs, writer, finished = _session()
    f = _inflight(tmp_path, cs)
    with ThreadPoolExecutor(1) as pool:
        cs.hasher = pool
        gate = threading.Event()
        pool.submit(gate.wait)  # the hash waits behind this
        f.hash_future = pool.submit(cs._hash, f)
        settle(f)  # settled before the hash starts: it must not read a closed descriptor
        gate.set()
        assert f.hash_future.result(10) is None
    cs._commit(f, f.hash_future)
    assert writer.frames == [] and finished == []


def test_a_live_file_still_commits_with_its_digest(tmp_path: Path) -> None:
    cs, writer, _ = _session()
    f = _inflight(tmp_path, cs)
    with ThreadPoolExecutor(1) as pool:
        cs.hasher = pool
        f.hash_future = pool.submit(cs._hash, f)
        f.hash_future.result(10)
    cs._commit(f, f.hash_future)
    assert len(writer.frames) == 1 and writer.frames[0][1]["hash"] and writer.frames[0][2] == 1
    settle(f)
