"""Fault rows on the emulated WAN (issue 8): sender SIGKILL at a random byte; the path black-holed 30 s.

Uses the module's ``fault_wan`` path (200 Mbit/s, 20 ms; skipped without root or tools). The
byte count is the delay line's own counter of what crossed the path (the bigger direction).

Must hold: nothing under a final name until complete; a restarted sender resends only the
missing ranges; after a 30 s black-hole the streams time out (the progress floor over
``--stall-timeout``), the session reconnects and resumes, and the job completes verified within
a bound; no temp files are left.
"""

from __future__ import annotations

import random
import signal
import time

import pytest
from faultkit import Agents, wait_for, write_files
from invariants import check, manifest

# serial: one emulated WAN at a time (namespaces, TUN delay line), and its stall and black-hole timings
pytestmark = pytest.mark.serial

STALL_S = 8.0
BLACKHOLE_S = 30.0


def _crossed(path) -> int:
    st = path.stats()
    return max(st["a_rx_bytes"], st["b_rx_bytes"])


def _workload(tmp_path, seed):
    rnd = random.Random(seed)
    sizes = {"big.bin": rnd.randint(48, 80) << 20}
    for i in range(rnd.randint(4, 8)):
        sizes[f"small/s{i}.bin"] = rnd.randint(256 << 10, 4 << 20)
    src = write_files(tmp_path / "src", sizes, seed)
    return src, sizes, manifest(src, "out")


@pytest.fixture
def wan_agents(tmp_path, fault_secret, fault_wan):
    a = Agents(tmp_path / "agents", fault_secret, wan=fault_wan)
    try:
        yield a
    finally:
        a.cleanup()
        fault_wan.blackhole(0)


def test_wan_sender_sigkill_at_random_byte_then_restart_resends_only_missing(tmp_path, wan_agents, fault_wan, seed):
    src, sizes, want = _workload(tmp_path, seed)
    total = sum(sizes.values())
    kill_byte = random.Random(seed * 7919).randint(total // 5, total * 7 // 10)
    rx = wan_agents.receiver(tmp_path / "dst")
    base = _crossed(fault_wan)
    tx = wan_agents.sender([src], rx.port, cc=2, p=2, pp=2)
    wait_for(lambda: _crossed(fault_wan) - base >= kill_byte or not tx.alive(), 60,
             f"{kill_byte} bytes to cross the WAN", step=0.005)
    tx.kill()
    rc, res, log = tx.wait(10)
    assert rc == -signal.SIGKILL, f"sender ended by itself before byte {kill_byte} (exit {rc}): {res}\n{log[-2000:]}"
    check(rx.root, want, job_ended=False).assert_ok()  # nothing under a final name until complete
    rc, res, log = wan_agents.send([src], rx.port, cc=2, p=2, pp=2, timeout=90)
    assert rc == 0 and res and res["ok"], f"restart did not complete (exit {rc}): {res and res['failures']}\n{log[-3000:]}"
    check(rx.root, want, results=[res], require=want).assert_ok()
    assert res["bytes_sent"] + res["resumed_bytes"] == res["bytes"], res
    assert res["resumed_bytes"] > 0 or res["skipped_files"] > 0, f"nothing resumed after {kill_byte} bytes: {res}"
    assert res["bytes_sent"] < total - kill_byte // 2, (
        f"restart re-sent {res['bytes_sent']} of {total} bytes although about {kill_byte} had crossed the path")


def test_wan_blackhole_30s_streams_time_out_reconnect_resume_and_complete(tmp_path, wan_agents, fault_wan, seed):
    src, sizes, want = _workload(tmp_path, seed)
    total = sum(sizes.values())
    at = random.Random(seed * 31).randint(total // 5, total // 2)
    rx = wan_agents.receiver(tmp_path / "dst")
    base = _crossed(fault_wan)
    tx = wan_agents.sender([src], rx.port, cc=2, p=2, pp=2, extra=("--stall-timeout", f"{STALL_S:.0f}s"))
    wait_for(lambda: _crossed(fault_wan) - base >= at or not tx.alive(), 60, f"{at} bytes to cross the WAN",
             step=0.005)
    assert tx.alive(), f"the transfer ended before the black-hole (test set-up): {tx.log_text()[-2000:]}"
    fault_wan.blackhole(BLACKHOLE_S)
    t_end = time.monotonic() + BLACKHOLE_S
    rc, res, log = tx.wait(BLACKHOLE_S + 90)
    after = time.monotonic() - t_end
    assert rc == 0 and res and res["ok"], f"exit {rc}: {res and res['failures']}\n{log[-3000:]}"
    assert after < 60, f"completed only {after:.0f} s after the path came back"
    assert "stalled" in log and "reconnecting" in log, f"no stall detected / no reconnect:\n{log[-3000:]}"
    check(rx.root, want, results=[res], require=want).assert_ok()
    assert res["resumed_bytes"] > 0 or res["skipped_files"] > 0, f"nothing that had arrived was kept: {res}"
    assert res["bytes_sent"] < 2 * total, f"the black-hole made it re-send far more than the job: {res}"
