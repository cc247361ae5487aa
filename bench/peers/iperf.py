"""iperf3 memory-to-memory: the path's limit, measured in the same run as every file tool."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from fstream_bench.core.cpu_meter import wait_with_usage
from fstream_bench.peers.base import PeerError, PeerResult, Sites, run_client, spawn, stop, wait_listening


def available() -> str | None:
    """Return None when iperf3 is installed, else the reason it cannot run."""
    return None if shutil.which("iperf3") else "iperf3 is not installed (apt-get install iperf3)"


class Iperf3:
    """Runs one ``iperf3`` server at the destination and a client at the source per measurement.

    :param sites: where the client (src) and server (dst) run.
    :param workdir: directory for logs.
    :param port: server port (the default is fine inside a fresh namespace).
    """

    def __init__(self, *, sites: Sites, workdir: Path, port: int = 5201) -> None:
        self.sites = sites
        self.workdir = Path(workdir)
        self.port = port

    def measure(self, *, streams: int = 1, nbytes: int | None = None, seconds: float | None = None,
                interval: float = 0.5, label: str = "iperf3", timeout: float = 600.0) -> PeerResult:
        """Send ``nbytes`` (or for ``seconds``) over ``streams`` TCP streams; return the receiver's view."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = self.workdir / f"{label}.log"
        server = spawn(self.sites, "dst", ["iperf3", "-s", "-1", "-B", self.sites.dst_host, "-p", str(self.port)],
                       log_path=log)
        try:
            wait_listening(self.sites, "dst", self.port, server, "iperf3 server")
            argv = ["iperf3", "-c", self.sites.dst_host, "-p", str(self.port), "-P", str(streams), "-J",
                    "-i", str(interval)]
            argv += ["-n", str(nbytes)] if nbytes else ["-t", str(seconds or 10)]
            done = run_client(self.sites.argv("src", argv), timeout, log)
            status, wall, out = done.status, done.wall, done.out
            try:  # the server exits after one test (-1): its whole CPU, from wait4
                _, server_cpu = wait_with_usage(server, 10.0)
            except subprocess.TimeoutExpired:
                server_cpu = None
        finally:
            stop(server)
        settings = {"cc": 1, "p": streams, "pp": 0}
        try:
            doc = json.loads(out)
        except json.JSONDecodeError:
            return PeerResult(tool=label, settings=settings, ok=False,
                              error=f"iperf3 client: status {status}, no JSON output: {out[-300:]!r}")
        if status != 0 or "error" in doc:
            return PeerResult(tool=label, settings=settings, ok=False,
                              error=f"iperf3 client: status {status}: {doc.get('error', '')}")
        recv = doc["end"]["sum_received"]
        intervals = [{"t": round(iv["sum"]["end"], 3), "throughput_bps": iv["sum"]["bits_per_second"],
                      "cc": 1, "p": streams, "pp": 0} for iv in doc.get("intervals", [])]
        sent = doc["end"].get("sum_sent", {})
        return PeerResult(tool=label, settings=settings, files=0, bytes=int(recv["bytes"]),
                          seconds=float(recv["seconds"]), ok=True, verified=False, intervals=intervals,
                          extra={"wall_seconds": wall, "retransmits": sent.get("retransmits")},
                          cpu_src_s=done.cpu_s, cpu_dst_s=server_cpu)


def measure(sites: Sites, workdir: Path, **kw) -> PeerResult:
    """Convenience: one measurement with a fresh server."""
    why = available()
    if why:
        raise PeerError(why)
    return Iperf3(sites=sites, workdir=workdir).measure(**kw)
