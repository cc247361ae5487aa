"""Measure a built path (TCP RTT, 1-stream and iperf3 -P 16 throughput) and fail loudly if it is off."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

from fstream_bench.wan import netns
from fstream_bench.wan.netns import WanError
from fstream_bench.wan.path import WanPath, wait_listening

PROBE_PORT = 5280
IPERF_PORT = 5281


class SelfcheckError(WanError):
    """The path is not what was asked for.

    :param message: which check failed and by how much.
    :param result: the full measurement (what ``selfcheck --json`` prints).
    """

    def __init__(self, message: str, result: dict[str, Any]) -> None:
        super().__init__(message)
        self.result = result


def selfcheck(path: WanPath, *, duration: float = 5.0, parallel: int = 16, rtt_samples: int = 20,
              rate_tolerance: float = 0.05, rtt_tolerance_ms: float = 2.0,
              raise_on_failure: bool = True) -> dict[str, Any]:
    """Measure ``path`` and compare it with its config.

    Checks: echo RTT within ``rtt_tolerance_ms`` of the configured RTT; ``iperf3 -P parallel``
    goodput within ``rate_tolerance`` of the rate less TCP/IP headers; one stream no faster
    than the TCP buffer allows (buffer / RTT, +10 %), i.e. the buffer cap is in force; with a
    destination disk limit, an fsync'ed write within -20 %/+5 % of the cap.
    Background flows must be off (the check measures the empty path).
    Raises :class:`SelfcheckError` (with ``.result``) when a check fails, unless
    ``raise_on_failure`` is False.
    """
    from fstream_bench.wan.background import background_flows

    cfg = path.config
    if background_flows(path):
        raise WanError(f"WAN path {cfg.run_id!r} has {background_flows(path)} background flow(s) "
                       "running: selfcheck measures the empty path, switch them off first")
    result: dict[str, Any] = {
        "run_id": cfg.run_id, "src_ns": path.src_ns, "dst_ns": path.dst_ns,
        "src_ip": path.src_ip, "dst_ip": path.dst_ip,
        "config": {"rate_bps": cfg.rate_bps, "rtt_ms": cfg.rtt_s * 1e3,
                   "buffer_bytes": cfg.buffer_bytes, "mtu": cfg.mtu, "offload": cfg.offload},
        "cc": netns.sysctl_get(path.src_ns, "net.ipv4.tcp_congestion_control"),
        "tcp_rmem": netns.sysctl_get(path.src_ns, "net.ipv4.tcp_rmem").split(),
        "tcp_wmem": netns.sysctl_get(path.src_ns, "net.ipv4.tcp_wmem").split(),
        "host_rmem_max": int(netns.sysctl_get(None, "net.core.rmem_max")),
        "duration_s": duration,
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
    result.update(_rtt(path, rtt_samples))
    single = _iperf(path, 1, duration)
    result["single_stream_bps"] = single["bps"]
    result["single_stream_intervals_bps"] = single["intervals_bps"]
    dl_pid = path.delayline_pid or (path.state.delayline_pid if path.state else None)
    cpu0, t0 = (netns.pid_cpu_times(dl_pid), time.monotonic()) if dl_pid else ((0.0, 0.0), 0.0)
    par = _iperf(path, parallel, duration)
    if dl_pid:
        # Mostly "system": writing a packet into the destination TUN runs that namespace's
        # receive stack (IP, TCP, ACKs) in the delay line's context, as a NIC's softirq would.
        (u1, s1), wall = netns.pid_cpu_times(dl_pid), time.monotonic() - t0
        result["delayline_cpu_percent"] = round(100 * (u1 + s1 - sum(cpu0)) / wall, 1)
        result["delayline_cpu_user_percent"] = round(100 * (u1 - cpu0[0]) / wall, 1)
    result["parallel"] = parallel
    result["parallel_bps"] = par["bps"]
    result["parallel_retransmits"] = par["retransmits"]
    result["parallel_intervals_bps"] = par["intervals_bps"]
    result["expected_goodput_bps"] = cfg.expected_goodput_bps
    result["buffer_limit_bps"] = cfg.buffer_bytes * 8 / cfg.rtt_s
    result["rate_ratio"] = round(par["bps"] / cfg.expected_goodput_bps, 4)
    result["rtt_error_ms"] = round(result["rtt_ms"] - cfg.rtt_s * 1e3, 3)
    try:
        st = path.stats()
        result["delayline_drops"] = {k: st[k] for k in ("drop_full", "drop_blackhole", "drop_write")}
    except WanError:
        pass

    if path.dst_dir and cfg.disk_rate_bps:
        from fstream_bench.wan.storage import measure_write_bps

        nbytes = int(min(256 << 20, max(16 << 20, cfg.disk_rate_bps / 8 * 3)))  # ~3 s of writing
        result["disk_dir"] = str(path.dst_dir)
        result["disk_rate_bps"] = cfg.disk_rate_bps
        result["disk_write_bps"] = measure_write_bps(path.dst_dir, nbytes=nbytes, cgroup=path.disk_cgroup)
        result["disk_ratio"] = round(result["disk_write_bps"] / cfg.disk_rate_bps, 4)
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    failures = []
    if abs(result["rtt_error_ms"]) > rtt_tolerance_ms:
        failures.append(f"RTT {result['rtt_ms']:.2f} ms, asked {cfg.rtt_s * 1e3:.2f} ms "
                        f"(tolerance ±{rtt_tolerance_ms} ms)")
    if abs(result["rate_ratio"] - 1) > rate_tolerance:
        failures.append(f"iperf3 -P {parallel}: {par['bps'] / 1e6:.1f} Mbit/s, expected "
                        f"{cfg.expected_goodput_bps / 1e6:.1f} Mbit/s goodput for a "
                        f"{cfg.rate_bps / 1e6:.1f} Mbit/s path (tolerance ±{rate_tolerance:.0%})"
                        + _load_hint(result))
    if "disk_ratio" in result and not 0.8 <= result["disk_ratio"] <= 1.05:
        failures.append(f"destination disk wrote {result['disk_write_bps'] / 8e6:.1f} MB/s, cap "
                        f"{cfg.disk_rate_bps / 8e6:.1f} MB/s (tolerance -20 %/+5 %)"
                        + _load_hint(result))
    if result["single_stream_bps"] > 1.1 * result["buffer_limit_bps"]:
        failures.append(f"one stream reached {result['single_stream_bps'] / 1e6:.1f} Mbit/s, above "
                        f"the {result['buffer_limit_bps'] / 1e6:.1f} Mbit/s a "
                        f"{cfg.buffer_bytes} B TCP buffer allows: the buffer cap is not in force")
    result["ok"] = not failures
    result["failures"] = failures
    if failures and raise_on_failure:
        raise SelfcheckError(f"WAN path {cfg.run_id!r} is not what was asked: " + "; ".join(failures),
                             result)
    return result


def _load_hint(result: dict[str, Any]) -> str:
    load = max(result["load_before"][0], result["load_after"][0])
    if load > (result["cpus"] or 1):
        return (f"; note: load average {load:.1f} on {result['cpus']} CPUs, the iperf3 "
                "endpoints were probably starved of CPU (the path may be fine: retry when idle)")
    return ""


def _probe_argv() -> list[str]:
    """The probe under SCHED_FIFO when possible: measure the path, not this machine's run queue."""
    base = [sys.executable, "-m", "fstream_bench.wan.probe"]
    if os.geteuid() == 0 and shutil.which("chrt"):
        return ["chrt", "-f", "10", *base]
    return base


def _rtt(path: WanPath, samples: int) -> dict[str, Any]:
    server = path.exec("dst", [*_probe_argv(), "serve", "--host", path.dst_ip,
                               "--port", str(PROBE_PORT)],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    try:
        wait_listening(path, "dst", PROBE_PORT)
        cp = path.run("src", [*_probe_argv(), "rtt",
                              "--host", path.dst_ip, "--port", str(PROBE_PORT),
                              "--count", str(samples)], timeout=60 + samples * 2)
        m = json.loads(cp.stdout)
    finally:
        netns.kill_and_wait([server.pid])
        server.wait()
    echo = sorted(m["echo_ms"])
    return {"rtt_ms": round(m["echo_median_ms"], 3), "rtt_min_ms": round(echo[0], 3),
            "rtt_max_ms": round(echo[-1], 3), "rtt_connect_ms": round(m["connect_median_ms"], 3),
            "rtt_samples": len(echo),
            # every sample, in the order taken: the medians above are read from these
            "rtt_echo_samples_ms": [round(x, 4) for x in m["echo_ms"]],
            "rtt_connect_samples_ms": [round(x, 4) for x in m["connect_ms"]]}


def _iperf(path: WanPath, streams: int, duration: float) -> dict[str, Any]:
    """One iperf3 run src->dst; goodput from the receiver side, the first second omitted."""
    server = path.exec("dst", ["iperf3", "-s", "-1", "-p", str(IPERF_PORT)],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    try:
        wait_listening(path, "dst", IPERF_PORT)
        cp = path.run("src", ["iperf3", "-c", path.dst_ip, "-p", str(IPERF_PORT), "-J",
                              "-P", str(streams), "-t", f"{duration:g}", "-O", "1"],
                      check=False, timeout=duration + 60)
        try:
            doc = json.loads(cp.stdout)
        except json.JSONDecodeError as exc:
            raise WanError(f"iperf3 -P {streams} gave no JSON (exit {cp.returncode}): "
                           f"{cp.stderr.strip() or cp.stdout[:300]}") from exc
        if "error" in doc:
            raise WanError(f"iperf3 -P {streams} failed: {doc['error']}")
        end = doc["end"]
        return {"bps": float(end["sum_received"]["bits_per_second"]),
                "retransmits": int(end.get("sum_sent", {}).get("retransmits", 0)),
                # the sender's per-second rate (the omitted first second excluded), for the record
                "intervals_bps": [float(iv["sum"]["bits_per_second"]) for iv in doc.get("intervals", [])
                                  if not iv.get("sum", {}).get("omitted")]}
    finally:
        netns.kill_and_wait([server.pid], timeout=2)
        server.wait()
