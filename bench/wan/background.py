"""Background traffic: N long-lived iperf3 flows src->dst sharing the bottleneck, switchable mid-run."""

from __future__ import annotations

import subprocess
import tempfile
import time
from typing import TYPE_CHECKING

from fstream_bench.wan import netns
from fstream_bench.wan.netns import WanError

if TYPE_CHECKING:
    from fstream_bench.wan.path import WanPath

#: Port of the background iperf3 server inside the destination namespace.
BACKGROUND_PORT = 5290


def background_flows(path: "WanPath") -> int:
    """How many background flows are running now (0 if none)."""
    st = path.state
    bg = st.background if st else {}
    if bg and all(_is_iperf3(bg.get(k, 0)) for k in ("server", "client")):
        return int(bg.get("n", 0))
    return 0


def set_background(path: "WanPath", n: int, *, timeout: float = 10.0) -> None:
    """Stop any background flows, then start ``n`` of them (``n == 0`` only stops).

    The flows run as detached processes recorded in the path's state file, so
    ``fstream bench wan background off`` from another process stops them.
    """
    if n < 0:
        raise WanError(f"background flows: {n} is negative")
    st = path.state
    old = st.background if st else {}
    pids = [p for p in (old.get("client"), old.get("server")) if p and _is_iperf3(p)]
    if pids:
        left = netns.kill_and_wait(pids)
        if left:
            raise WanError(f"background iperf3 pid(s) {left} survived SIGKILL")
    path.update_state(background={})
    if n == 0:
        return
    from fstream_bench.wan.path import wait_listening

    server = path.exec("dst", ["iperf3", "-s", "-p", str(BACKGROUND_PORT)],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, start_new_session=True)
    path.update_state(background={"n": n, "server": server.pid, "client": 0})
    wait_listening(path, "dst", BACKGROUND_PORT, timeout=timeout)
    errf = tempfile.TemporaryFile()
    client = path.exec("src", ["iperf3", "-c", path.dst_ip, "-p", str(BACKGROUND_PORT),
                               "-P", str(n), "-t", "0", "-i", "0"],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=errf, start_new_session=True)
    path.update_state(background={"n": n, "server": server.pid, "client": client.pid})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.poll() is not None:
            errf.seek(0)
            err = errf.read().decode(errors="replace")
            errf.close()
            raise WanError(f"background iperf3 client exited ({client.returncode}): {err.strip()}")
        est = path.run("src", ["ss", "-Htn", "state", "established",
                               f"dport = :{BACKGROUND_PORT}"], check=False).stdout
        if len(est.splitlines()) >= n + 1:  # n data streams + iperf3's control connection
            errf.close()
            return
        time.sleep(0.05)
    raise WanError(f"background: {n} iperf3 flows not established within {timeout:.0f} s")


def _is_iperf3(pid: int) -> bool:
    argv = netns.pid_cmdline(pid) if pid else []
    return bool(argv) and netns.pid_alive(pid) and any(a.endswith("iperf3") for a in argv[:4])
