"""Micro-benchmark of the per-process transfer history cache (issue 28): load, refresh, and a job's model ready.

A throw-away ``redis-server`` (``bus.embedded.RedisServer``) gets ``rows`` synthetic ``HistoryRow``s (transfer
intervals of many jobs over a few paths, and a calibration pass now and then), written as agents write them
(``TransferHistory.append``). Then, in this one process:

1. **load**: the cache's first read of the window a job uses (``limit``, the agent's ``HISTORY_LOAD_LIMIT``)
   and of the whole stream (``all_rows``): seconds, RSS growth and the cache's own buffers;
2. **refresh**: ``new_rows`` appended, then one incremental refresh (median of ``repeat``);
3. **jobs**: from "job starts" (``BackgroundHistory`` created) to "model ready" (``HarpOptimizer.fit`` done
   for one chunk) for the first and the second job of a process, ``new_rows`` appended between them
   (the first job's intervals); and, as the peer, the same two jobs as they were before the cache
   (``TransferHistory.frame`` parsed for each job, every group fitted each time).

scikit-learn is imported before anything is timed (the agent imports it in the loader thread; its ~1.4 s
is the same with and without the cache). Run: ``python -m fstream_bench.scale.history_cache --rows 20000``.
"""

from __future__ import annotations


import argparse
import gc
import json
import logging
import statistics
import sys
import time
from typing import Any

import numpy as np

from fstream_provider.bus.client import connect
from fstream_provider.bus.embedded import RedisServer
from fstream_provider.bus.history_cache import HistoryCache, HistoryCaches
from fstream_provider.bus.keys import Keys
from fstream_provider.bus.transfer_history import TransferHistory
from fstream_provider.tuning.base import PathInfo
from fstream_provider.tuning.harp import optimizer_for, request_for
from fstream_provider.tuning.harp_history import CALIBRATION_GRID, SIZE_OF_CHUNK, HistoryRow, chunk_of
from transfer_agent.sending.history_io import HISTORY_LOAD_LIMIT, BackgroundHistory

#: what a result exercised (``provenance``)
MODULES = ("fstream_provider.bus", "fstream_provider.tuning", "transfer_agent.sending.history_io",
           "fstream_bench.scale.history_cache")

log = logging.getLogger("fstream.bench.history_cache")

#: (source, destination, bandwidth bits/s, RTT s, TCP buffer bytes): the synthetic facility's paths
PATHS = (("dtn0", "rx0:7000", 10e9, 0.012, 1 << 26), ("dtn0", "rx1:7000", 1e9, 0.040, 1 << 24),
         ("dtn1", "rx0:7000", 10e9, 0.075, 1 << 26), ("dtn2", "rx2:7000", 1e9, 0.002, 1 << 22))
FILL_BATCH = 10_000


def _rate(bw: float, cc: Any, p: Any, pp: Any, load: Any) -> Any:
    """A path's throughput law: streams fill what the background leaves, too many streams cost."""
    streams = cc * p
    link = bw * load
    fill = link * (1 - np.exp(-streams * 0.03 * bw / link))
    return np.maximum(fill - (streams / 48.0) ** 2 * 0.05 * link + 1e6 * np.minimum(pp, 4), 1e6)


def synthetic_rows(n: int, *, seed: int = 0, t0: float | None = None) -> list[HistoryRow]:
    """``n`` history rows: jobs of 20-120 intervals per cluster on the four ``PATHS`` and, every ~25,000 rows,
    a calibration pass of one path and chunk over ``CALIBRATION_GRID``; newest within the last ~60 days."""
    rng = np.random.default_rng(seed)
    dt = min(5.0, 60 * 86_400 / max(1, n))
    t0 = time.time() - n * dt if t0 is None else t0
    g = CALIBRATION_GRID
    grid = [(cc, p, pp) for cc in g["cc"] for p in g["p"] for pp in g["pp"]]
    out: list[HistoryRow] = []
    job = 0
    while len(out) < n:
        src, dst, bw, rtt, buf = PATHS[int(rng.integers(len(PATHS)))]
        bdp = bw * rtt / 8
        if job % 200 == 199:  # a calibration pass: one chunk over the grid
            chunk = ("tiny", "small", "medium", "large")[int(rng.integers(4))]
            size = SIZE_OF_CHUNK[chunk] * bdp
            load = float(rng.uniform(0.5, 1.0))
            for cc, p, pp in grid[:n - len(out)]:
                thr = float(_rate(bw, cc, p, pp, load) * rng.normal(1, 0.03))
                out.append(HistoryRow(src, dst, bw, rtt, buf, chunk, size, 200, cc, p, pp, max(thr, 1e3),
                                      t0 + len(out) * dt, 1.0, f"calibrate:{src}:{dst}:{chunk}:pass{job}",
                                      kind="probe"))
        else:
            size = float(10 ** rng.uniform(4, 9.5))
            files = int(rng.integers(10, 5000))
            load = float(rng.uniform(0.3, 1.0))
            cc, p, pp = int(rng.integers(1, 17)), int(rng.integers(1, 9)), int(rng.integers(0, 9))
            for _ in range(min(int(rng.integers(20, 121)), n - len(out))):
                cc = int(np.clip(cc + rng.integers(-2, 3), 1, 32))  # a tuner walking around
                thr = float(_rate(bw, cc, p, pp, load) * rng.normal(1, 0.05))
                out.append(HistoryRow(src, dst, bw, rtt, buf, chunk_of(size, bdp), size, files, cc, p, pp,
                                      max(thr, 1e3), t0 + len(out) * dt, 2.0, f"job{job}:{chunk_of(size, bdp)}",
                                      source_limited=bool(rng.random() < 0.05)))
        job += 1
    return out


def _rss() -> int:
    import psutil

    gc.collect()
    return int(psutil.Process().memory_info().rss)


def _job(client: Any, caches: HistoryCaches | None, path: PathInfo, request: Any, limit: int) -> dict:
    """One job's start: its history source, then one chunk's model; ``caches`` None: as before the cache."""
    t0 = time.perf_counter()
    if caches is None:
        frame, fit_cache = TransferHistory(client).frame(limit=limit), None
    else:
        src = BackgroundHistory(client, log, limit=limit, caches=caches)
        frame, fit_cache = src.wait(3600), src.fit_cache
    history_s = time.perf_counter() - t0
    fitted = optimizer_for(path, fit_cache=fit_cache).fit(frame, request)
    return {"history_s": round(history_s, 4), "model_ready_s": round(time.perf_counter() - t0, 4),
            "fit_s": round(fitted.fit_seconds, 4), "rows": len(frame), "similar": fitted.entries,
            "groups": len(fitted.groups) + len(fitted.dropped), "groups_reused": fitted.reused}


def run(rows: int = 1_000_000, *, limit: int = HISTORY_LOAD_LIMIT, new_rows: int = 100, repeat: int = 5,
        all_rows: bool = True, baseline: bool = True, seed: int = 0) -> dict:
    """Fill a private Redis with ``rows`` synthetic rows and measure the cache (see the module docstring).

    :param rows: history rows written first.
    :param limit: the window a job reads (the agent's default).
    :param new_rows: rows appended before each incremental refresh and between the two jobs.
    :param repeat: incremental refreshes timed (the median is reported).
    :param all_rows: also load the whole stream into a cache (its memory at ``rows`` rows).
    :param baseline: also time the two jobs as they ran before the cache (parse everything, fit every group).
    """
    import fstream_provider.tuning.harp_model  # noqa: F401 - scikit-learn's import is not what is measured

    out: dict[str, Any] = {"rows": rows, "limit": limit, "new_rows": new_rows}
    server = RedisServer().start()
    client = connect(server.url)
    try:
        store = TransferHistory(client, keys=Keys(), max_rows=0, max_age_s=0)
        t = time.perf_counter()
        data = synthetic_rows(rows + (repeat + 2) * new_rows, seed=seed)
        extra = data[rows:]
        for i in range(0, rows, FILL_BATCH):
            store.append(data[i:min(i + FILL_BATCH, rows)])
        out["fill_s"] = round(time.perf_counter() - t, 2)
        del data
        src, dst, bw, rtt, buf = PATHS[1]
        path = PathInfo(bandwidth_bps=bw, rtt_s=rtt, tcp_buffer=buf, max_cc=32)
        request = request_for(path, "small", 1e6, 500, src, dst)

        loads = {}
        for name, window in (("all", None), ("job_window", limit)) if all_rows else (("job_window", limit),):
            rss0 = _rss()
            cache = HistoryCache(Keys().history(), limit=window)
            r = cache.refresh(client)
            frame = cache.frame()
            loads[name] = {"seconds": round(r.seconds, 3), "entries": cache.entries,
                           "rss_delta_mb": round((_rss() - rss0) / 2**20, 1),
                           "buffers_mb": round(cache.nbytes / 2**20, 1),
                           "frame_mb": round(int(frame.memory_usage(deep=True).sum()) / 2**20, 1),
                           "capacity": cache.capacity,
                           "bytes_per_entry": round(cache.nbytes / max(1, cache.capacity), 1)}
            del frame
            if name == "job_window":
                times = []
                for k in range(repeat):
                    store.append(extra[k * new_rows:(k + 1) * new_rows])
                    times.append(cache.refresh(client).seconds)
                out["refresh"] = {"median_s": round(statistics.median(times), 5), "max_s": round(max(times), 5),
                                  "repeat": repeat}
            del cache
        out["load"] = loads

        jobs = {}
        kinds = (("cached", HistoryCaches()), ("before", None)) if baseline else (("cached", HistoryCaches()),)
        for name, caches in kinds:
            first = _job(client, caches, path, request, limit)
            store.append(extra[repeat * new_rows:(repeat + 1) * new_rows])  # the first job's intervals
            second = _job(client, caches, path, request, limit)
            jobs[name] = {"first": first, "second": second}
        out["jobs"] = jobs
        if baseline:
            out["second_job_speedup"] = round(jobs["before"]["second"]["model_ready_s"]
                                              / max(1e-9, jobs["cached"]["second"]["model_ready_s"]), 1)
    finally:
        client.close()
        server.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="history_cache_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--limit", type=int, default=HISTORY_LOAD_LIMIT)
    ap.add_argument("--new-rows", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-all-rows", action="store_true", help="skip loading the whole stream into a cache")
    ap.add_argument("--no-baseline", action="store_true", help="skip the jobs as they ran before the cache")
    ap.add_argument("--results", default=None, help="directory of the result file (default bench/results)")
    args = ap.parse_args(argv)
    from fstream_bench.core.saved import run_saved

    result = run_saved("history-cache", list(sys.argv[1:] if argv is None else argv), MODULES,
                       lambda: run(args.rows, limit=args.limit, new_rows=args.new_rows, repeat=args.repeat,
                                   all_rows=not args.no_all_rows, baseline=not args.no_baseline), args.results)
    json.dump({k: v for k, v in result.items() if k not in ("machine", "provenance")}, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
