"""HARP benchmark (issue 10): calibrate one emulated WAN path, then HARP against the heuristic under load and a wrong buffer.

1. ``fstream calibrate`` seeds an empty Redis with probes on the path, background traffic off.
2. Each dataset (default: 2 MB files, a *small* chunk, and 16 MB files, *medium*; about 1.5 GB each) is sent
   by ``static`` (the heuristic, kept), ``harp`` (sample transfer + regression over the history),
   ``fstream`` without history (heuristic start + online profiling) and ``fstream`` with the history
   (HARP's prediction as its start) under three conditions: ``quiet``; ``background`` (N iperf3 flows
   share the bottleneck); ``buffer`` (the tuners are told an 8 MiB TCP buffer while the path caps at 1 MiB).
3. In-process on the same history: the Optimizer's time per chunk and the paper's validation accuracy.

First-interval throughput = bytes over the first ``--first-window`` seconds after the settings were
applied: HARP's allocation (its samples excluded), else the tuner's first decision (so the ~1 s a
history-reading tuner spends loading pandas, scikit-learn and the history is not in the window, but it
is in the total time). The amortisation size is Eq. 6–7 of the
paper solved for D with the measured Thr_0 (static), Thr_S (the sample) and Thr_H (after the sample).

Run: ``python -m fstream_bench.harp_bench`` (root; ``--loopback`` for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

from fstream_bench.breakdown_bench import UnixRedis
from fstream_bench.wan_rig import add_path_args, concurrent_benchmarks, machine_line, open_bench, selfcheck_line, send_json
from fstream_bench.report import machine_info

from fstream_provider.model.units import parse_duration, parse_size

TUNERS = ("static", "harp", "fstream", "fstream+harp")
CONDITIONS = ("quiet", "background", "buffer")
DATASETS = {"small": (2_000_000, 750), "medium": (16_000_000, 96)}  # BDP 5 MB: small < BDP <= medium < 10 BDP


def make_dataset(root: Path, size: int, count: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    block = os.urandom(1 << 20)
    for i in range(count):
        with open(root / f"f{i:05d}.dat", "wb") as f:
            left = size
            while left > 0:
                n = min(left, len(block))
                f.write(block[:n])
                left -= n
            f.seek(0)
            f.write(i.to_bytes(8, "big") + os.urandom(8))  # distinct content per file
    return root


def window_bps(intervals: list[dict], start: float, seconds: float) -> float:
    """Rate over [start, start + seconds]: each interval record (ending at ``t``, lasting ``dt``) counts with
    the share of its bytes that falls in the window (records are not evenly spaced: the sender's loop
    writes none while it opens channels)."""
    end = start + seconds
    got = 0.0
    for r in intervals:
        a, b = r["t"] - r["dt"], r["t"]
        overlap = min(b, end) - max(a, start)
        if r["dt"] > 0 and overlap > 0:
            got += r["bytes"] * overlap / r["dt"]
    return got * 8 / seconds


def harp_times(tuning: list[dict]) -> tuple[float | None, str]:
    """(time of HARP's channel allocation, its reason); (None, "") when it never allocated."""
    for d in tuning:
        r = d.get("reason", "")
        if r.startswith("harp:") and re.search(r"(?:^harp: |; )start ", r):
            return d["t"], r
    return None, ""


def amortisation_bytes(thr0: float, thr_h: float, thr_s: float, ds: float, c: float) -> float | None:
    """Smallest dataset (bytes) for which Eq. 7's t_H beats Eq. 6's t_0; None when HARP is not faster."""
    if thr_h <= thr0 or thr_s <= 0:
        return None
    b0, bh, bs = 8 / thr0, 8 / thr_h, 8 / thr_s  # seconds per byte
    return max(0.0, (ds * (bs - bh) + c) / (b0 - bh))


def optimizer_report(redis_url: str, bench, datasets: dict) -> list[dict]:
    """The Optimizer's time and validation accuracy per dataset chunk, on the calibrated history."""
    import redis

    from fstream_provider.bus.transfer_history import TransferHistory
    from fstream_provider.tuning.harp_history import chunk_of
    from fstream_provider.tuning.harp_model import HarpOptimizer, validation_accuracy
    from fstream_provider.tuning.harp_similarity import HarpRequest

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    frame = TransferHistory(client).frame()
    out = []
    for name, (size, count) in datasets.items():
        chunk = chunk_of(size, bench.bandwidth_bps * bench.rtt_s / 8)
        req = HarpRequest(bandwidth_bps=bench.bandwidth_bps, rtt_s=bench.rtt_s, tcp_buffer=1 << 20, chunk=chunk,
                          avg_file_size=size, file_count=count)
        opt = HarpOptimizer()
        t0 = time.perf_counter()
        fitted = opt.fit(frame, req)
        pred = opt.predict(fitted, None)
        secs = time.perf_counter() - t0
        val = validation_accuracy(frame, req)
        out.append({"dataset": name, "chunk": chunk, "rows": len(frame), "optimizer_seconds": secs,
                    "prediction": {"cc": pred.cc, "p": pred.p, "pp": pred.pp, "bps": pred.throughput_bps,
                                   "fallback": pred.fallback, "reason": pred.reason},
                    "validation": val})
    return out


def report(summary: dict) -> str:
    """The markdown tables: per dataset and condition, each tuner's time, throughput and first window."""
    lines = [f"# HARP on {summary['path']}", "", summary["machine_line"], summary.get("machine_line_end", ""),
             summary["selfcheck_line"], "", "    " + summary["command"], ""]
    cal = summary.get("calibration", {})
    lines += [f"Calibration: status {cal.get('status')}, {cal.get('seconds', 0):.0f} s.", ""]
    lines += ["| dataset | chunk | history rows | optimizer (s) | validation accuracy | prediction |", "|---|---|---:|---:|---:|---|"]
    for o in summary.get("optimizer", []):
        acc = o["validation"].get("accuracy")
        pr = o["prediction"]
        shown = "fallback" if pr["fallback"] else "cc={cc} p={p} pp={pp}".format(**pr)
        accuracy = "-" if acc is None else f"{acc:.1%}"
        lines.append(f"| {o['dataset']} | {o['chunk']} | {o['rows']} | {o['optimizer_seconds']:.2f} | "
                     f"{accuracy} ({o['validation'].get('reason', '')}) | {shown} |")
    first = parse_duration(summary.get("first_window", "2s"))
    for r in summary.get("runs", []):  # recomputed here, so a report can be rebuilt from summary.json
        r["first_bps"] = window_bps(r.get("intervals", []), r["settings_at"], first)
    lines += ["", "| dataset | condition | tuner | ok | seconds | Mbit/s | first window Mbit/s (from t) | settings |",
              "|---|---|---|---|---:|---:|---:|---|"]
    runs = summary.get("runs", [])
    for r in runs:
        last = r["tuning"][-1]["layouts"] if r.get("tuning") else {}
        shown = ", ".join(f"{c} {v['cc']}/{v['p']}/{v['pp']}" for c, v in last.items())
        lines.append(f"| {r['dataset']} | {r['condition']} | {r['tuner']} | {r['ok']} | {r['seconds'] or 0:.1f} | "
                     f"{(r['throughput_bps'] or 0) / 1e6:.0f} | {r['first_bps'] / 1e6:.0f} ({r['settings_at']:.1f} s) | "
                     f"{shown} |")
    lines += ["", "| dataset | condition | harp first / static first | fstream+harp first / fstream first | "
              "harp total / static total | amortisation size (x BW-seconds) |", "|---|---|---:|---:|---:|---:|"]
    by = {(r["dataset"], r["condition"], r["tuner"]): r for r in runs if r["ok"]}
    for d in dict.fromkeys(r["dataset"] for r in runs):
        for c in dict.fromkeys(r["condition"] for r in runs):
            st, hp, fs, fh = (by.get((d, c, t)) for t in ("static", "harp", "fstream", "fstream+harp"))
            def ratio(a, b, key):
                return f"{a[key] / b[key]:.2f}" if a and b and b[key] else "-"
            amort = "-"
            if st and hp and hp.get("settings_at"):
                thr_s = hp.get("sample_bps")
                thr_h = hp.get("after_bps")
                if thr_s and thr_h and hp.get("sample_bytes"):
                    a = amortisation_bytes(st["throughput_bps"], thr_h, thr_s, hp["sample_bytes"], 0.0)
                    bw = summary.get("bandwidth_bps", 1e9) / 8
                    amort = "never (HARP not faster)" if a is None else f"{a / bw:.1f}"
            lines.append(f"| {d} | {c} | {ratio(hp, st, 'first_bps')} | {ratio(fh, fs, 'first_bps')} | "
                         f"{ratio(hp, st, 'seconds')} | {amort} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fstream_bench.harp_bench", description=__doc__.splitlines()[0])
    add_path_args(ap, "tb10h")
    ap.add_argument("--budget", default="8m", help="calibration budget (default 8m)")
    ap.add_argument("--grid", default="cc=1,2,4,8,16:p=1,2,4,8:pp=0,4", help="calibration grid")
    ap.add_argument("--probe-seconds", default="0.5s", help="data per calibration probe")
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--conditions", default=",".join(CONDITIONS))
    ap.add_argument("--tuners", default=",".join(TUNERS))
    ap.add_argument("--background-flows", type=int, default=4)
    ap.add_argument("--told-buffer", default="8MiB", help="what the tuners are told in the 'buffer' condition")
    ap.add_argument("--first-window", default="2s")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the dataset file counts")
    ap.add_argument("--timeout", default="300s", help="per run")
    ap.add_argument("--report-only", metavar="SUMMARY_JSON", help="rebuild report.md from a summary.json")
    ap.add_argument("--history-csv", metavar="FILE", help="import this history instead of calibrating")
    args = ap.parse_args(argv)
    if args.report_only:
        summary_path = Path(args.report_only)
        summary = json.loads(summary_path.read_text())
        (summary_path.parent / "report.md").write_text(report(summary))
        print(report(summary))
        return 0
    from fstream_bench.peers import fstream as fs_peer
    from fstream_bench.peers.base import run_timed

    datasets = {k: (DATASETS[k][0], max(2, int(DATASETS[k][1] * args.scale))) for k in args.datasets.split(",")}
    conditions = [c for c in args.conditions.split(",") if c]
    tuners = [t for t in args.tuners.split(",") if t]
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out = Path(args.results) / f"harp-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.workdir or f"/dev/shm/fstream-harp-{stamp}")
    first = parse_duration(args.first_window)
    bench = open_bench(args)
    summary: dict = {"machine": machine_info(), "machine_line": machine_line(), "selfcheck_line": selfcheck_line(bench.selfcheck),
                     "command": "python -m fstream_bench.harp_bench " + " ".join(
                         shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)),
                     "path": "loopback smoke" if args.loopback else f"{args.rate}, {args.rtt} RTT, {args.buffer} TCP buffer",
                     "concurrent": concurrent_benchmarks(), "runs": [], "datasets": datasets,
                     "first_window": args.first_window}
    print(summary["machine_line"], flush=True)
    print(summary["selfcheck_line"], flush=True)
    base = {"bandwidth": f"{bench.bandwidth_bps:.0f}bps", "rtt": f"{bench.rtt_s * 1e3:g}ms",
            "profile_interval": "2s", "sample_interval": "0.5s"}
    try:
        with UnixRedis(work / "redis") as redis_srv, \
                fs_peer.FStreamReceiver(sites=bench.sites, workdir=work / "rx", root=work / "dst") as rx:
            chunks = sorted({__import__("fstream_provider.tuning.harp_history", fromlist=["chunk_of"]).chunk_of(
                s, bench.bandwidth_bps * bench.rtt_s / 8) for s, _ in datasets.values()})
            cal = [*fs_peer.fstream_argv(), "calibrate", "--to", rx.url("calibration"), "--secret-file", str(rx.secret),
                   "--redis", redis_srv.url, "--budget", args.budget, "--bandwidth", base["bandwidth"], "--rtt", base["rtt"],
                   "--chunks", ",".join(chunks), "--grid", args.grid, "--probe-seconds", args.probe_seconds,
                   "--passes", "10", "--json"]
            print("calibrating:", " ".join(cal[-12:]), flush=True)
            t0 = time.monotonic()
            if args.history_csv:  # a history exported by an earlier run: no calibration
                cal = [*fs_peer.fstream_argv(), "history", "import", "--redis", redis_srv.url, args.history_csv]
            status, wall, text = run_timed(bench.sites.argv("src", cal), parse_duration(args.budget) + 300,
                                           out / "calibrate.log", env={**os.environ})
            summary["calibration"] = {"status": status, "seconds": time.monotonic() - t0, "tail": text[-2000:]}
            print(f"calibration: status {status} in {time.monotonic() - t0:.0f} s", flush=True)
            if status != 0:
                raise SystemExit(f"calibration failed (status {status}): {text[-1500:]}")
            summary["optimizer"] = optimizer_report(redis_srv.url, bench, datasets)
            import redis as redis_py

            from fstream_provider.bus.transfer_history import TransferHistory
            TransferHistory(redis_py.Redis.from_url(redis_srv.url, decode_responses=True)).frame().to_csv(
                out / "history.csv", index=False)  # the calibrated history: fstream history import reruns it
            for row in summary["optimizer"]:
                print(f"optimizer {row['dataset']}: {row['optimizer_seconds']:.2f} s, "
                      f"validation {row['validation'].get('accuracy')}", flush=True)
            for dname, (size, count) in datasets.items():
                src = make_dataset(work / "src" / dname, size, count)
                for cond in conditions:
                    if cond == "background" and bench.path is not None:
                        from fstream_bench.wan.background import set_background
                        set_background(bench.path, args.background_flows)
                    try:
                        for tuner in tuners:
                            opts = dict(base)
                            if tuner in ("harp", "fstream+harp"):
                                import redis as redis_py  # each run starts from the calibrated history alone:
                                r0 = redis_py.Redis.from_url(redis_srv.url)  # no profiling history of the last
                                for k in r0.scan_iter(match="{fstream}:profiling:*"):
                                    r0.delete(k)
                                opts["redis"] = redis_srv.url  # evaluation runs read the calibrated history
                                opts["no_history"] = True      # and add nothing: every run sees the same one
                            if cond == "buffer":
                                opts["tcp_buffer"] = args.told_buffer
                            label = f"{dname}-{cond}-{tuner.replace('+', '-')}"
                            r = send_json(bench.sites, rx, [src], label, tuner=tuner.split("+")[0], options=opts,
                                          label=label, timeout=parse_duration(args.timeout))
                            shutil.rmtree(work / "dst" / label, ignore_errors=True)
                            t_alloc, why = harp_times(r.tuning) if tuner == "harp" else (None, "")
                            # the first window starts when the settings under test were applied: HARP's
                            # allocation (after its samples), else the tuner's first decision
                            start = t_alloc if t_alloc is not None else (r.tuning[0]["t"] if r.tuning else 0.0)
                            sample_bytes = sum(iv["bytes"] for iv in r.intervals if t_alloc and iv["t"] <= t_alloc)
                            after_bytes = sum(iv["bytes"] for iv in r.intervals if t_alloc and iv["t"] > t_alloc)
                            total_s = r.intervals[-1]["t"] if r.intervals else 0.0
                            rec_extra = {} if not t_alloc else {
                                "sample_bytes": sample_bytes, "sample_bps": sample_bytes * 8 / t_alloc,
                                "after_bps": after_bytes * 8 / max(total_s - t_alloc, 1e-3)}
                            rec = {**rec_extra, "dataset": dname, "condition": cond, "tuner": tuner, "ok": r.ok,
                                   "error": r.error,
                                   "seconds": r.self_seconds, "throughput_bps": r.self_throughput_bps,
                                   "first_bps": window_bps(r.intervals, start, first), "settings_at": start,
                                   "first_reason": (r.tuning[0]["reason"] if r.tuning else ""),
                                   "harp_reason": why, "tuning": r.tuning, "loadavg": os.getloadavg()}
                            summary["runs"].append(rec)
                            rec["intervals"] = r.intervals
                            print(f"{label}: ok={r.ok} {rec['seconds'] or 0:.1f} s "
                                  f"{(rec['throughput_bps'] or 0) / 1e6:.0f} Mbit/s, first {rec['first_bps'] / 1e6:.0f} "
                                  f"Mbit/s from t={start:.1f}", flush=True)
                            (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
                    finally:
                        if cond == "background" and bench.path is not None:
                            from fstream_bench.wan.background import set_background
                            set_background(bench.path, 0)
                shutil.rmtree(src, ignore_errors=True)
    finally:
        bench.close()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
        summary["machine_line_end"] = machine_line()
        summary["bandwidth_bps"] = bench.bandwidth_bps
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        (out / "report.md").write_text(report(summary))
    print(f"results: {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
