"""Fault rows: the receiver SIGKILLed mid-block and mid-rename, restarted at once (issue 8).

Must hold: never a torn file visible; stale temps reclaimed or resumed (none left when the job
ends); the sender reconnects to the restarted receiver and the transfer ends verified.
"""

from __future__ import annotations

import random
import signal

import pytest

from faultkit import Proxy, wait_for, write_files
from invariants import check, manifest


def _workload(tmp_path, seed, big=True):
    rnd = random.Random(seed)
    sizes = {"big.bin": rnd.randint(16, 32) << 20} if big else {}
    for i in range(rnd.randint(6, 12)):
        sizes[f"small/s{i:02d}.bin"] = rnd.randint(16 << 10, 768 << 10)
    src = write_files(tmp_path / "src", sizes, seed)
    return src, sizes, manifest(src, "out")


def _restart(agents, rx, **kw):
    rc = wait_for(lambda: rx.popen.poll() is not None and (rx.popen.returncode,), 30, "the receiver to die")[0]
    assert rc == -signal.SIGKILL, f"receiver exited {rc}, not by SIGKILL\n{rx.log_text()[-2000:]}"
    return agents.receiver(rx.root, port=rx.port, **kw)


def test_receiver_sigkill_mid_block_then_restart_resumes(tmp_path, agents, seed):
    src, sizes, want = _workload(tmp_path, seed)
    total = sum(sizes.values())
    kill_byte = random.Random(seed * 104729).randint(total // 10, total * 8 // 10)
    rx = agents.receiver(tmp_path / "dst")
    proxy = Proxy(("127.0.0.1", rx.port), rate=12e6)
    try:
        tx = agents.sender([src], proxy.port)
        proxy.kill_at(kill_byte, rx.pid)
        rx2 = _restart(agents, rx)
        check(rx.root, want, job_ended=False).assert_ok()  # never a torn file visible
        rc, res, log = tx.wait(90)
    finally:
        proxy.close()
    assert rc == 0 and res and res["ok"], (f"sender did not resume after the receiver restarted (exit {rc}): "
                                            f"{res and res['failures']}\n{log[-3000:]}")
    rx2.kill()
    check(rx.root, want, results=[res], require=want).assert_ok()


@pytest.mark.parametrize("point", ["commit.before_rename", "commit.between_renames"])
def test_receiver_sigkill_mid_rename_then_restart(tmp_path, agents, seed, point):
    src, sizes, want = _workload(tmp_path, seed, big=False)
    rnd = random.Random(seed)
    # late enough that the receiver's 2 s range flush wrote .meta sidecars of files still open
    nth = rnd.randint(2, 3) if point == "commit.before_rename" else rnd.randint(len(sizes) // 2, len(sizes) - 1)
    rx = agents.receiver(tmp_path / "dst", faultpoint=f"{point}:{nth}")
    # paced so files stay open past the receiver's 2 s range flush: their .meta sidecars exist at the kill
    proxy = Proxy(("127.0.0.1", rx.port), rate=0.4e6)
    try:
        tx = agents.sender([src], proxy.port, cc=1, p=2, pp=8)
        rx2 = _restart(agents, rx)
        check(rx.root, want, job_ended=False).assert_ok()  # never a torn file visible
        rc, res, log = tx.wait(90)
    finally:
        proxy.close()
    assert rc == 0 and res and res["ok"], (f"sender did not finish after the receiver restarted (exit {rc}): "
                                           f"{res and res['failures']}\n{log[-3000:]}")
    rx2.kill()
    check(rx.root, want, results=[res], require=want).assert_ok()
