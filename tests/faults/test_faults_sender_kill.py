"""Fault rows: the sender SIGKILLed at a random byte and during commit, restarted at once (issue 8).

Must hold: nothing under a final name until complete; the restart resends only the missing
ranges (``bytes_sent + resumed_bytes == bytes`` and less than everything is sent again); the job
ends verified with no temp files left.
"""

from __future__ import annotations

import random
import signal

from faultkit import Proxy, write_files
from invariants import check, manifest


def _workload(tmp_path, seed):
    rnd = random.Random(seed)
    sizes = {"big.bin": rnd.randint(16, 32) << 20}
    for i in range(rnd.randint(4, 8)):
        sizes[f"small/s{i}.bin"] = rnd.randint(64 << 10, 1536 << 10)
    src = write_files(tmp_path / "src", sizes, seed)
    return src, sizes, manifest(src, "out")


def test_sender_sigkill_at_random_byte_then_restart_resends_only_missing(tmp_path, agents, seed):
    src, sizes, want = _workload(tmp_path, seed)
    total = sum(sizes.values())
    kill_byte = random.Random(seed * 7919).randint(total // 10, total * 8 // 10)
    rx = agents.receiver(tmp_path / "dst")
    proxy = Proxy(("127.0.0.1", rx.port), rate=12e6)  # ~50 MB/s over 4 streams: the kill lands mid-file
    try:
        tx = agents.sender([src], proxy.port)
        proxy.kill_at(kill_byte, tx.pid)
        rc, res, log = tx.wait(60)
        assert rc == -signal.SIGKILL, f"sender was not killed at byte {kill_byte} (exit {rc}): {res}\n{log[-2000:]}"
        check(rx.root, want, job_ended=False).assert_ok()  # nothing under a final name until complete
    finally:
        proxy.close()
    rc, res, log = agents.send([src], rx.port, timeout=60)
    assert rc == 0 and res and res["ok"], f"restart did not complete (exit {rc}): {res and res['failures']}\n{log[-3000:]}"
    check(rx.root, want, results=[res], require=want).assert_ok()
    assert res["verified_files"] + res["skipped_files"] == len(sizes)
    # only missing ranges are sent again: every byte not already at the receiver, once
    assert res["bytes_sent"] + res["resumed_bytes"] == res["bytes"], res
    assert res["resumed_bytes"] > 0 or res["skipped_files"] > 0, f"nothing resumed after {kill_byte} bytes: {res}"
    assert res["bytes_sent"] < total - (kill_byte // 2), (
        f"restart re-sent {res['bytes_sent']} of {total} bytes although {kill_byte} had been forwarded")


def test_sender_sigkill_during_commit_then_restart_resumes(tmp_path, agents, seed):
    src, sizes, want = _workload(tmp_path, seed)
    nth = random.Random(seed).randint(1, len(sizes))
    rx = agents.receiver(tmp_path / "dst")
    rc, res, log = agents.send([src], rx.port, faultpoint=f"commit.before_send:{nth}", timeout=60)
    assert rc == -signal.SIGKILL, f"fault point commit.before_send:{nth} did not fire (exit {rc})\n{log[-2000:]}"
    check(rx.root, want, job_ended=False).assert_ok()
    rc, res, log = agents.send([src], rx.port, timeout=60)
    assert rc == 0 and res and res["ok"], f"restart did not complete (exit {rc}): {res and res['failures']}\n{log[-3000:]}"
    check(rx.root, want, results=[res], require=want).assert_ok()
    assert res["bytes_sent"] + res["resumed_bytes"] == res["bytes"], res
    total = sum(sizes.values())
    assert res["bytes_sent"] < total, f"restart re-sent everything: {res}"
