"""Fault row: the destination disk fills up (a 16 MiB tmpfs) (issue 8).

Must hold: a clear terminal error naming the cause ("disk full"/"no space"), no retry storm,
the partial removed (no temp files left), the other (smaller) files verified.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from faultkit import Proxy, wait_for, write_files
from invariants import check, manifest

CAUSE = r"disk full|no space"


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("destination disk full: mounting a 16 MiB tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    cp = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if cp.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {cp.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_destination_disk_full_is_terminal_partial_removed_others_fine(tmp_path, agents, small_disk, seed):
    (small_disk / "filler.bin").write_bytes(os.urandom(6 << 20))  # 10 MiB left: the two 6 MiB files cannot both fit
    sizes = {"big.bin": 24 << 20, "mid1.bin": 6 << 20, "mid2.bin": 6 << 20}
    sizes.update({f"s{i}.bin": 128 << 10 for i in range(4)})
    src = write_files(tmp_path / "src", sizes, seed)
    want = manifest(src, "out")
    rx = agents.receiver(small_disk / "dst")
    order = ["big.bin", "mid1.bin", "mid2.bin", *sorted(k for k in sizes if k.startswith("s"))]
    # one file at a time (striped over 2 streams): the small files come after the write that ran out of space
    rc, res, log = agents.send([src / n for n in order], rx.port, cc=1, p=2, pp=0, timeout=60)
    assert res is not None, f"sender printed no result (exit {rc})\n{log[-3000:]}"
    assert rc == 1 and not res["ok"], res
    rep = check(rx.root, want, results=[res], cause=CAUSE,
                require=[f"out/s{i}.bin" for i in range(4)]).assert_ok()
    assert "out/big.bin" in rep.accounted, "the file larger than the free space was not refused"
    assert any(r.startswith("out/mid") for r in rep.accounted), "no write ran out of space (test set-up)"
    for f in res["failures"]:
        assert f["retryable"] is False, f"disk full reported as retryable: {f}"
    # no retry storm: the refused files are not retried, the session is not torn down for them
    assert len(re.findall(r"retrying .*(big|mid)", log)) == 0, log[-3000:]
    assert "reconnecting" not in log, log[-3000:]
    rxlog = rx.log_text()
    assert len(re.findall(CAUSE, rxlog, re.I)) <= 6, rxlog[-3000:]


def _fill(path):
    """Write ``path`` until the disk is full (another process filling the destination disk)."""
    chunk = os.urandom(64 << 10)
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass


def test_disk_fills_up_mid_write_partial_removed_others_fine(tmp_path, agents, small_disk, seed):
    sizes = {"mid1.bin": 6 << 20, **{f"s{i}.bin": 128 << 10 for i in range(4)}}
    src = write_files(tmp_path / "src", sizes, seed)
    want = manifest(src, "out")
    rx = agents.receiver(small_disk / "dst")
    proxy = Proxy(("127.0.0.1", rx.port), rate=1e6)  # mid1 takes ~3 s over 2 streams
    try:
        tx = agents.sender([src / n for n in sorted(sizes)], proxy.port, cc=1, p=2, pp=0)

        def part_written():
            parts = list((small_disk / "dst" / "out").glob(".mid1.bin.*.part"))
            return parts and parts[0].stat().st_blocks * 512 >= (1 << 20)

        wait_for(part_written, 30, "mid1.bin's part to hold 1 MiB")
        _fill(small_disk / "filler.bin")  # the disk is now full: mid1's next write fails
        rc, res, log = tx.wait(60)
    finally:
        proxy.close()
    assert res is not None, f"sender printed no result (exit {rc})\n{log[-3000:]}"
    assert rc == 1 and not res["ok"], res
    rep = check(rx.root, want, results=[res], cause=CAUSE,
                require=[f"out/s{i}.bin" for i in range(4)]).assert_ok()
    assert list(rep.accounted) == ["out/mid1.bin"], rep.accounted
    assert "write failed" in rep.accounted["out/mid1.bin"]
    assert res["failures"][0]["retryable"] is False
    assert len(re.findall(r"retrying .*mid1", log)) == 0, log[-3000:]
    assert "reconnecting" not in log, f"the session was torn down for one file's disk full:\n{log[-3000:]}"
    assert len(re.findall(CAUSE, rx.log_text(), re.I)) <= 2, rx.log_text()[-3000:]
