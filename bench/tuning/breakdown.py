"""Breakdown benchmark (issue 4, thesis Fig. 4.4-4.5): static -> dynamic -> fstream -> fstream + history.

Each workload (default w2 and lcls, from ``fstream_bench.core.workload_gen``) is released into a
fresh source directory batch by batch at its arrival times (hard links from a staging copy,
identical for every variant) while ``fstream send --watch --idle-exit`` runs in the source
namespace and ``fstream receive`` in the destination namespace of our own emulated WAN path.
Time is from the first batch's release to the first destination sample where every file is
present under its final name with all its bytes (``DestSampler``, as in ``bench/wan/harness.py``).

Variants, in this order per workload: ``static``, ``dynamic``, ``fstream`` without ``--redis``
(online profiling only), a warm-up ``fstream --redis`` run on the same workload shape with
another seed (it fills the profiling history in an empty Redis; not scored), then the scored
``fstream --redis`` run that starts from that history.

Run: ``python -m fstream_bench.tuning.breakdown`` (root; ``--loopback`` for a smoke run).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import threading
import time
from pathlib import Path

from fstream_bench.wan.rig import (
    add_path_args,
    concurrent_benchmarks,
    machine_line,
    open_bench,
    result_dirs,
    selfcheck_line,
    send_json,
    write_summary,
)
from fstream_bench.core.unix_redis import UnixRedis
from fstream_bench.core.report import machine_info

from fstream_provider.model.units import parse_duration

VARIANTS = ("static", "dynamic", "fstream", "fstream-warmup", "fstream+history")




def run_variant(bench, rx, staged, src: Path, dst_root: Path, label: str, *, tuner: str, opts: dict, watch: dict,
                timeout: float) -> dict:
    """Release ``staged`` into ``src`` over time while the agent streams it; return the run's record."""
    from fstream_bench.peers.base import DestSampler
    from fstream_bench.core.workload_gen import release

    w = staged.workload
    dst = dst_root / label
    for d in (src, dst):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    shutil.rmtree(src.parent / f".incoming-{src.name}", ignore_errors=True)
    sampler = DestSampler(root=dst, expect_bytes=w.total_bytes, expect_files=len(w.files), period=0.25)
    stop = threading.Event()
    err: list[BaseException] = []
    staged.released.clear()
    t0 = time.monotonic()
    sampler.start(t0)

    def rel() -> None:
        try:
            release(staged, src, stop=stop, t0=t0)
        except Exception as e:  # noqa: BLE001 - reported with the run's result below
            err.append(e)

    th = threading.Thread(target=rel, name="breakdown-release", daemon=True)
    th.start()
    try:
        r = send_json(bench.sites, rx, [src], label, tuner=tuner, options=opts, watch=watch, label=label,
                      timeout=timeout)
    finally:
        stop.set()
        th.join(30)
        sampler.stop()
    ok = r.ok and not err and sampler.complete_at is not None
    error = r.error or (f"release failed: {err[0]}" if err else "") or (
        "" if sampler.complete_at is not None else "not every byte landed")
    secs = sampler.complete_at if sampler.complete_at is not None else float("nan")
    shutil.rmtree(dst, ignore_errors=True)
    return {"label": label, "tuner": tuner, "ok": ok, "error": error, "seconds": secs,
            "throughput_bps": w.total_bytes * 8 / secs if ok and secs > 0 else 0.0, "bytes": w.total_bytes,
            "files": len(w.files), "agent_seconds": r.self_seconds, "wall_seconds": r.seconds,
            "intervals": r.intervals, "tuning": r.tuning, "loadavg": os.getloadavg()}


def plot_breakdown(png: Path, workload: str, runs: dict[str, dict]) -> None:
    """Thesis Fig. 4.4-style: throughput over time per variant (left), average throughput bars (right)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.4), gridspec_kw={"width_ratios": [2.2, 1]})
    for name, r in runs.items():
        ivs = [iv for iv in r.get("intervals", []) if float(iv.get("dt") or 0) > 0]
        if ivs:
            a1.plot([iv["t"] for iv in ivs], [iv["throughput_bps"] / 1e6 for iv in ivs], lw=1, label=name)
    a1.set_xlabel("agent time (s)")
    a1.set_ylabel("Mbit/s (1 s records)")
    a1.legend(fontsize=7)
    a1.set_title(f"{workload}: throughput over time", fontsize=9)
    names = list(runs)
    a2.bar(range(len(names)), [runs[n]["throughput_bps"] / 1e6 for n in names],
           color=[f"C{i}" for i in range(len(names))])
    a2.set_xticks(range(len(names)), names, rotation=20, fontsize=7)
    a2.set_ylabel("Mbit/s (bytes / makespan)")
    a2.set_title("average", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def calibration(summary: dict, profile_interval_s: float) -> list[dict]:
    """Simulator vs measured for every scored run (``simreport.calibration_rows`` on our summary)."""
    from fstream_provider.tuning.simreport import calibration_rows

    sim_summary = {"scenario": summary["scenario"],
                   "runs": [{"workload": r["workload"], "tool": f"fstream-{r['tuner']}", "settings": {},
                             "ok": r["ok"], "throughput_bps": r["throughput_bps"]}
                            for r in summary["runs"] if r["variant"] in ("static", "dynamic", "fstream")]}
    rows = calibration_rows(sim_summary, profile_interval_s=profile_interval_s)
    return rows


def _md(summary: dict) -> str:
    lines = [f"# Tuning breakdown on the emulated WAN ({summary['path']})", "", summary["machine_line"],
             summary["selfcheck_line"], "", f"reproduce: `{summary['command']}`", ""]
    if summary.get("concurrent"):
        lines += ["**Concurrent load**: other benchmark processes were running during this measurement:", ""]
        lines += [f"- `{c}`" for c in summary["concurrent"]] + [""]
    sc = summary["scenario"]
    lines += [(f"Workloads at scale {sc['scale']:g}, count factor {sc['count_factor']:g}, a batch every "
               f"{sc['interval_s']:g} s; agent `--watch --interval {summary['watch']['interval']} --idle-exit "
               f"{summary['watch']['idle_exit']}`, profiling interval {summary['profile_interval']}. "
               "Throughput = bytes / time from the first release to the last byte landed. "
               "'+ history': after a warm-up `--redis` run on the same workload with seed+1 (not scored), "
               "a second `--redis` run, scored."), "",
              "| workload | data | static | dynamic | fstream (no history) | fstream + history | fstream / static |",
              "|---|---|---|---|---|---|---|"]
    for wname in summary["workloads"]:
        rs = {r["variant"]: r for r in summary["runs"] if r["workload"] == wname}

        def cell(v: str, rs: dict = rs) -> str:
            r = rs.get(v)
            if r is None:
                return "—"
            if not r["ok"]:
                return f"FAILED ({r['error'][:60]})"
            return f"{r['throughput_bps'] / 1e6:.0f} Mbit/s ({r['seconds']:.1f} s)"
        any_r = next(iter(rs.values()), None)
        data = f"{any_r['files']} files, {any_r['bytes'] / 1e9:.2f} GB" if any_r else ""
        ratio = ""
        if rs.get("static", {}).get("ok") and rs.get("fstream", {}).get("ok"):
            ratio = f"{rs['fstream']['throughput_bps'] / rs['static']['throughput_bps']:.2f}×"
            if rs.get("fstream+history", {}).get("ok"):
                hist = rs["fstream+history"]["throughput_bps"] / rs["static"]["throughput_bps"]
                ratio += f" (with history {hist:.2f}×)"
        lines.append(f"| {wname} | {data} | {cell('static')} | {cell('dynamic')} | {cell('fstream')} | "
                     f"{cell('fstream+history')} | {ratio} |")
    warm = [r for r in summary["runs"] if r["variant"] == "fstream-warmup"]
    if warm:
        lines += ["", "Warm-up runs (fill the history, not scored): " + "; ".join(
            f"{r['workload']}: {r['throughput_bps'] / 1e6:.0f} Mbit/s, "
            f"{r.get('history_keys_after', '?')} Redis keys after" for r in warm)]
    if summary.get("calibration"):
        lines += ["", ("Simulator vs this run (`simreport.calibration_rows`, same workloads and path, "
                       f"profiling interval {summary['profile_interval']}):"), "",
                  "| workload | tool | measured Mbit/s | simulated Mbit/s | sim / measured |", "|---|---|---|---|---|"]
        for r in summary["calibration"]:
            lines.append(f"| {r['workload']} | {r['tool']} | {r['measured_bps'] / 1e6:.0f} | "
                         f"{r['simulated_bps'] / 1e6:.0f} | {r['sim_over_measured']:.2f} |")
    lines += ["", "Plots: " + ", ".join(f"`{p}`" for p in summary.get("plots", []))]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``fstream bench breakdown``: run the variants on each workload; write ``breakdown-<stamp>/``."""
    ap = argparse.ArgumentParser(prog="fstream bench breakdown", description=__doc__.splitlines()[0])
    add_path_args(ap, "tb4b")
    ap.add_argument("--workloads", default="w2,lcls")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    ap.add_argument("--count-factor", type=float, default=0.25, help="thins workload file counts")
    ap.add_argument("--interval", default="5s", help="seconds between batches")
    ap.add_argument("--profile-interval", default="2s")
    ap.add_argument("--sample-interval", default="1s")
    ap.add_argument("--watch-interval", default="1s")
    ap.add_argument("--idle-exit", default="4s")
    ap.add_argument("--timeout", default="300s", help="per run")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from fstream_bench.peers import fstream as fs_peer
    from fstream_bench.core.workload_gen import build, materialize

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"unknown variant(s) {bad}: expected some of {', '.join(VARIANTS)}")
    out, work = result_dirs(args, "breakdown")
    interval_s = parse_duration(args.interval)
    watch = {"interval": args.watch_interval, "idle_exit": args.idle_exit}
    bench = open_bench(args)
    from fstream_provider.tuning.workloads import default_scale
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    summary: dict = {
        "path": "loopback smoke" if args.loopback else f"{args.rate}, {args.rtt} RTT, {args.buffer} TCP buffer",
        "machine": machine_info(), "machine_line": machine_line(), "selfcheck": bench.selfcheck,
        "selfcheck_line": selfcheck_line(bench.selfcheck),
        "command": "python -m fstream_bench.tuning.breakdown " + " ".join(
            shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)),
        "scenario": {"bandwidth_bps": bench.bandwidth_bps, "rtt_s": bench.rtt_s, "tcp_buffer": 2**20,
                     "seed": args.seed, "interval_s": interval_s, "count_factor": args.count_factor,
                     "scale": default_scale(bench.bandwidth_bps, bench.rtt_s)},
        "workloads": workloads, "variants": variants, "watch": watch, "profile_interval": args.profile_interval,
        "concurrent": concurrent_benchmarks(), "runs": [], "plots": []}
    from fstream_provider.model.units import parse_size
    summary["scenario"]["tcp_buffer"] = parse_size(args.buffer)
    print(summary["machine_line"], flush=True)
    print(summary["selfcheck_line"], flush=True)
    base_opts = {"bandwidth": f"{bench.bandwidth_bps:.0f}bps", "rtt": f"{bench.rtt_s * 1e3:g}ms",
                 "profile_interval": args.profile_interval, "sample_interval": args.sample_interval}
    try:
        with UnixRedis(work / "redis") as redis_srv, \
                fs_peer.FStreamReceiver(sites=bench.sites, workdir=work / "rx", root=work / "dst") as rx:
            for wname in workloads:
                def staged_for(seed: int, wname: str = wname):
                    w = build(wname, bandwidth_bps=bench.bandwidth_bps, rtt_s=bench.rtt_s, seed=seed,
                              interval_s=interval_s, count_factor=args.count_factor)
                    return materialize(w, work / "staging" / f"{wname}-{seed}", seed=seed)
                staged = staged_for(args.seed)
                w = staged.workload
                print(f"breakdown {wname}: {len(w.files)} files, {w.total_bytes / 1e9:.2f} GB in "
                      f"{len(w.batches)} batches", flush=True)
                scored: dict[str, dict] = {}
                for v in variants:
                    opts = dict(base_opts)
                    st = staged
                    if v == "fstream-warmup":
                        redis_srv.flush()
                        st = staged_for(args.seed + 1)
                    if v in ("fstream-warmup", "fstream+history"):
                        opts["redis"] = redis_srv.url
                    tuner = "fstream" if v.startswith("fstream") else v
                    label = f"{wname}-{v.replace('+', '-')}"
                    rec = run_variant(bench, rx, st, work / "src" / label, work / "dst", label, tuner=tuner,
                                      opts=opts, watch=watch, timeout=parse_duration(args.timeout))
                    rec.update({"workload": wname, "variant": v, "history_keys_after": redis_srv.keys(),
                                "seed": args.seed + 1 if v == "fstream-warmup" else args.seed})
                    summary["runs"].append(rec)
                    if v != "fstream-warmup":
                        scored[v] = rec
                    print(f"breakdown {wname} {v}: ok={rec['ok']} {rec['seconds']:.1f} s "
                          f"{rec['throughput_bps'] / 1e6:.0f} Mbit/s; redis keys {rec['history_keys_after']} "
                          f"{rec['error'][:200]}", flush=True)
                    if v == "fstream-warmup":
                        shutil.rmtree(st.staging, ignore_errors=True)
                    write_summary(out, summary)
                png = out / f"{wname}.png"
                plot_breakdown(png, wname, scored)
                summary["plots"].append(png.name)
                shutil.rmtree(staged.staging, ignore_errors=True)
    finally:
        bench.close()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
        summary["machine_line_end"] = machine_line()
        try:
            summary["calibration"] = calibration(summary, parse_duration(args.profile_interval))
        except Exception as e:  # noqa: BLE001 - the measurement stands without the simulator's view
            summary["calibration_error"] = f"{type(e).__name__}: {e}"
        write_summary(out, summary, _md(summary))
    print(_md(summary))
    print(f"results: {out}")
    return 0 if all(r["ok"] for r in summary["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
