"""Fault row: a source file appended to, truncated or touched while it is being sent (issue 8).

Must hold: the file fails with "source modified" (naming the cause) or is cleanly re-sent; the
destination never holds a mix of old and new content; no temp files left.
"""

from __future__ import annotations

import os
import random

import pytest

from faultkit import Proxy, wait_for, write_files
from invariants import check, manifest, merge

CAUSE = r"source (modified|shrank|vanished)|modified while"


@pytest.mark.parametrize("mode", ["append", "truncate", "touch"])
def test_source_modified_mid_send_fails_clearly_or_resends_cleanly(tmp_path, agents, seed, mode):
    rnd = random.Random(seed)
    size = 24 << 20
    src = write_files(tmp_path / "src", {"data.bin": size, "other.bin": 300 << 10}, seed)
    before = manifest(src, "out")
    path = src / "data.bin"
    rx = agents.receiver(tmp_path / "dst")
    proxy = Proxy(("127.0.0.1", rx.port), rate=4e6)  # ~3 s for the file over 2 streams
    at = int(size * rnd.uniform(0.2, 0.6))
    try:
        tx = agents.sender([path, src / "other.bin"], proxy.port, cc=1, p=2, pp=1)
        wait_for(lambda: proxy.forwarded >= at, 30, f"{at} bytes of data.bin to be on their way")
        if mode == "append":
            with open(path, "ab") as f:
                f.write(rnd.randbytes(1 << 20))
        elif mode == "truncate":
            os.truncate(path, rnd.randint(size // 8, size // 2))
        else:
            st = os.stat(path)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        rc, res, log = tx.wait(float(os.environ.get("FAULT_WAIT", "60")))
    finally:
        proxy.close()
    assert res is not None, f"sender printed no result (exit {rc})\n{log[-3000:]}"
    want = merge(before, manifest(src, "out"))  # either version, never a mix
    rep = check(rx.root, want, results=[res], cause=CAUSE, require=["out/other.bin"]).assert_ok()
    if "out/data.bin" in rep.verified:
        assert rc == 0 and res["ok"], res
    else:
        assert rc == 1 and not res["ok"] and "out/data.bin" in rep.accounted, res
        assert all(not f["retryable"] for f in res["failures"]), res["failures"]
