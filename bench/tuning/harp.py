"""HARP benchmark (issue 10): calibrate one emulated WAN path, then HARP against the heuristic under load and a wrong
buffer.

1. ``fstream calibrate`` seeds an empty Redis with probes on the path, background traffic off.
2. Each dataset (default: 2 MB files, a *small* chunk, and 16 MB files, *medium*; about 1.5 GB each) is sent
   by ``static`` (the heuristic, kept), ``harp`` (sample transfer + regression over the history),
   ``fstream`` without history (heuristic start + online profiling) and ``fstream`` with the history
   (HARP's prediction as its start) under three conditions: ``quiet``; ``background`` (N iperf3 flows
   share the bottleneck); ``buffer`` (the tuners are told an 8 MiB TCP buffer while the path caps at 1 MiB).
3. In-process on the same history: the Optimizer's time per chunk and the paper's validation accuracy.

Every tuner is measured alike from its own interval records (``fstream_bench.tuning.harp_windows``): from the
transfer's first byte (connection set-up and a tuner's start-up before it excluded for all) to the last byte
landed (every file committed). The headline is that **total time**, HARP's sample transfer included, as
the median and range of every repeat. The "first window" is the rate over the first ``--first-window``
seconds after each transfer's own first byte (the same length for every tuner); the "allocation-offset
window" measures every tuner of a repeat over the same ``--first-window`` seconds starting as long after
its own first byte as HARP's allocation came after HARP's. Ratios are taken within a repeat. The
amortisation size is Eq. 6–7 of the paper solved for D with the measured Thr_0 (static), Thr_S (the
sample) and Thr_H (after the sample), all from the first byte.

Held-out transfers (issue 44): ``--generated`` replaces the fixed datasets by ``heldout`` workloads
(``tuning.workloads``: 1-3 groups of files from BDP/20 to 20 BDP, 0.5-1 GB on this path) drawn from fresh seeds
(``--fresh N``, or ``--seeds``), each recorded in the summary; HARP never saw these shapes.

Run: ``fstream bench harp`` or ``python -m fstream_bench.tuning.harp`` (root; ``--loopback`` for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from fstream_bench.core import provenance
from fstream_bench.core.seeds import add_seed_args, seeds_from
from fstream_bench.core.unix_redis import UnixRedis
from fstream_bench.tuning.harp_windows import PAIRS, med_range, run_metrics, summarize
from fstream_bench.wan.rig import (add_path_args, concurrent_benchmarks, machine_line, open_bench, result_dirs,
                                   selfcheck_line, send_json, write_summary)
from fstream_bench.core.report import machine_info

from fstream_provider.model.units import parse_duration

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


def chunks_of(spec, bdp: float) -> list[tuple[str, float, int]]:
    """(chunk, average size, count) of a dataset: a fixed ``(size, count)`` or a generated ``Workload``."""
    from fstream_provider.tuning.harp_history import chunk_of

    if isinstance(spec, tuple):
        return [(chunk_of(spec[0], bdp), float(spec[0]), int(spec[1]))]
    groups: dict[str, list[int]] = {}
    for f in spec.files:
        groups.setdefault(chunk_of(f.size, bdp), []).append(f.size)
    return [(c, sum(v) / len(v), len(v)) for c, v in sorted(groups.items())]


def stage(spec, root: Path, seed: int = 0) -> Path:
    """Write a dataset's files under ``root``: fixed ``(size, count)`` or a generated ``Workload``."""
    if isinstance(spec, tuple):
        return make_dataset(root, *spec)
    from fstream_bench.core.workload_gen import materialize

    materialize(spec, root, seed=seed)
    return root


def generated(seeds: list[int], bandwidth_bps: float, rtt_s: float) -> dict:
    """``heldout`` workloads, one per seed, named ``heldout-<seed>``."""
    from fstream_bench.core.workload_gen import build
    from fstream_provider.tuning.workloads import HELDOUT

    return {f"heldout-{s}": build(HELDOUT, bandwidth_bps=bandwidth_bps, rtt_s=rtt_s, seed=s, interval_s=0.0)
            for s in seeds}


def describe_dataset(spec) -> dict:
    if isinstance(spec, tuple):
        return {"size": spec[0], "count": spec[1], "bytes": spec[0] * spec[1]}
    return {"files": len(spec.files), "bytes": spec.total_bytes,
            "groups": [{"chunk": c, "avg_size": a, "count": n} for c, a, n in chunks_of(spec, 5e6)]}


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
    for name, spec in datasets.items():
        for chunk, size, count in chunks_of(spec, bench.bandwidth_bps * bench.rtt_s / 8):
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
                        "validation": val, "chunk_avg_size": size, "chunk_files": count})
    return out


#: the modules a run exercises (provenance's code hash): the agent, this benchmark and its rig
MODULES = (*provenance.AGENT, "fstream_bench.tuning.harp", "fstream_bench.tuning.harp_windows", "fstream_bench.wan.rig",
           "fstream_bench.tuning.breakdown", "fstream_bench.peers", "fstream_bench.wan", "fstream_bench.core.report",
           "fstream_bench.core.cpu_meter", "fstream_bench.core.workload_gen", "fstream_bench.core.children",
           "fstream_bench.core.unix_redis", "fstream_bench.core.seeds")


def _settings(r: dict) -> str:
    last = r["tuning"][-1]["layouts"] if r.get("tuning") else {}
    return ", ".join(f"{c} {v['cc']}/{v['p']}/{v['pp']}" for c, v in last.items())


def _load(prov: dict, key: str) -> str:
    v = prov.get(key)
    return f"{v[0]:.2f}" if v else "?"


def report(summary: dict) -> str:
    """The markdown: total time per case (the headline), the aligned windows, then every run.

    Recomputed from the runs' interval records, so a report can be rebuilt from any summary.json.
    """
    w = parse_duration(summary.get("first_window", "2s"))
    wtxt = f"{w:g} s"
    runs = summary.get("runs", [])
    cases = summarize(runs, w, summary.get("bandwidth_bps", 1e9))
    prov = summary.get("provenance", {})
    lines = [f"# HARP on {summary['path']}", "", summary["machine_line"], summary.get("machine_line_end", ""),
             summary["selfcheck_line"], "", "    " + summary["command"], ""]
    if prov:
        lines += [f"Commit {prov.get('commit', '?')[:12]}{' (dirty)' if prov.get('dirty') else ''}, code "
                  f"{prov.get('code_hash', '?')[:19]}, load average {_load(prov, 'load_start')} at the start, "
                  f"{_load(prov, 'load_end')} at the end.", ""]
    cal = summary.get("calibration", {})
    lines += [f"Calibration: status {cal.get('status')}, {cal.get('seconds', 0):.0f} s.", ""]
    lines += ["| dataset | chunk | history rows | optimizer (s) | validation accuracy | prediction |",
              "|---|---|---:|---:|---:|---|"]
    for o in summary.get("optimizer", []):
        acc = o["validation"].get("accuracy")
        pr = o["prediction"]
        shown = "fallback" if pr["fallback"] else "cc={cc} p={p} pp={pp}".format(**pr)
        accuracy = "-" if acc is None else f"{acc:.1%}"
        lines.append(f"| {o['dataset']} | {o['chunk']} | {o['rows']} | {o['optimizer_seconds']:.2f} | "
                     f"{accuracy} ({o['validation'].get('reason', '')}) | {shown} |")
    tuners = list(dict.fromkeys(r["tuner"] for r in runs))
    lines += ["", "## Total time (the headline)", "",
              "Seconds from the transfer's first byte to its last byte landed (the sender's last interval record, "
              "written once every file is committed), for every tuner alike: HARP's sample transfer is inside it; "
              "connection set-up and any tuner's start-up before the first byte are not. The first byte is located "
              "inside the first interval record that carries bytes by the next record's rate. Each cell is the "
              "median (min–max, n runs) of every repeat that succeeded; ratios are taken within a repeat.", "",
              "| dataset | condition | " + " | ".join(f"`{t}` s" for t in tuners) + " | "
              + " | ".join(f"{a} / {b} total" for a, b in PAIRS) + " |",
              "|---|---|" + "---:|" * (len(tuners) + len(PAIRS))]
    for c in cases:
        cells = [med_range(c["tuners"][t]["total_s"], "{:.1f}") if t in c["tuners"] else "-" for t in tuners]
        cells += [med_range(c["ratios"][f"{a}/{b} total"]) for a, b in PAIRS]
        lines.append(f"| {c['dataset']} | {c['condition']} | " + " | ".join(cells) + " |")
    lines += ["", "## Windows aligned on each transfer's own first byte", "",
              f"*First window*: the rate over the first {wtxt} after each transfer's own first byte (same length "
              f"for every tuner; HARP is then in its sample transfer at the heuristic's settings). *At HARP's "
              f"allocation offset*: in each repeat, a = HARP's allocation - HARP's first byte, and every tuner "
              f"of that repeat is measured over [its first byte + a, + {wtxt}] (HARP's own settings against the "
              f"others at the same stage of their transfers). A window is cut at the last byte when the transfer "
              f"is shorter. Mbit/s; median (min–max, n runs).", "",
              "| dataset | condition | tuner | first window | at HARP's allocation offset "
              "| first byte (s after start) |",
              "|---|---|---|---:|---:|---:|"]
    for c in cases:
        for t, v in c["tuners"].items():
            lines.append(f"| {c['dataset']} | {c['condition']} | `{t}` | "
                         f"{med_range(v['first_window_bps'], '{:.0f}', 1e-6)} "
                         f"| {med_range(v['alloc_offset_window_bps'], '{:.0f}', 1e-6)} "
                         f"| {med_range(v['first_byte_s'], '{:.2f}')} |")
    lines += ["", "| dataset | condition | harp / static first window | fstream+harp / fstream first window | "
              "harp / static at allocation offset | HARP allocated at (s after its first byte) | "
              "amortisation size (x BW-seconds) |", "|---|---|---:|---:|---:|---:|---:|"]
    for c in cases:
        am = med_range(c["amortisation_bw_seconds"], "{:.1f}")
        if c["amortisation_never"]:
            am += f"; never (HARP not faster) in {c['amortisation_never']}"
        lines.append(f"| {c['dataset']} | {c['condition']} | {med_range(c['ratios']['harp/static first_window'])} | "
                     f"{med_range(c['ratios']['fstream+harp/fstream first_window'])} | "
                     f"{med_range(c['ratios']['harp/static alloc_offset_window'])} | "
                     f"{med_range(c['harp_alloc_after_first_byte_s'], '{:.1f}')} | {am} |")
    failed = [f"{c['dataset']}/{c['condition']}: {', '.join(c['failed'])}" for c in cases if c["failed"]]
    if failed:
        lines += ["", "Failed runs (left out of every median): " + "; ".join(failed) + "."]
    lines += ["", "## Every run", "",
              "| dataset | condition | repeat | tuner | ok | first byte s | total s | Mbit/s | first window Mbit/s | "
              "HARP allocated (s after first byte) | agent s (start to end) | settings |",
              "|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in runs:
        m = run_metrics(r.get("intervals", []), r.get("tuning", []), r["tuner"], w)
        def f(x, fmt):
            return "-" if x is None else fmt.format(x)
        lines.append(f"| {r['dataset']} | {r['condition']} | {r.get('repeat', 0)} | {r['tuner']} | {r['ok']} | "
                     f"{f(m['first_byte_s'], '{:.2f}')} | {f(m['total_s'], '{:.1f}')} | "
                     f"{f(m['total_bps'] and m['total_bps'] / 1e6, '{:.0f}')} | "
                     f"{f(m['first_window_bps'] and m['first_window_bps'] / 1e6, '{:.0f}')} | "
                     f"{f(m['alloc_after_first_byte_s'], '{:.1f}')} | {f(r.get('seconds'), '{:.1f}')} | "
                     f"{_settings(r)} |")
    return "\n".join(lines) + "\n"


def _one_run(bench, rx, redis_srv, src: Path, base: dict, args, dname: str, cond: str, tuner: str, k: int,
             pos: int, first: float, work: Path) -> dict:
    """One ``fstream send`` of ``src``; its record keeps the agent's raw interval records and decisions."""
    opts = dict(base)
    name = tuner  # as the summary names it
    tuner, _, variant = tuner.partition("@")  # harp@default-sample-pays: a variant (the ablation)
    if variant:
        opts["variant"] = variant
    if tuner == "harp-no-history":  # HARP's chunks at the heuristic, no model: what the history itself adds
        import redis as redis_py
        redis_py.Redis.from_url(redis_srv.url + "?db=1").flushdb()
        tuner, opts["redis"], opts["no_history"] = "harp", redis_srv.url + "?db=1", True
    elif tuner in ("harp", "fstream+harp"):
        import redis as redis_py  # each run starts from the calibrated history alone:
        r0 = redis_py.Redis.from_url(redis_srv.url)  # no profiling history of the last
        for key in r0.scan_iter(match="{fstream}:profiling:*"):
            r0.delete(key)
        opts["redis"] = redis_srv.url  # evaluation runs read the calibrated history
        opts["no_history"] = True      # and add nothing: every run sees the same one
    if cond == "buffer":
        opts["tcp_buffer"] = args.told_buffer
    label = f"{dname}-{cond}-{name.replace('+', '-').replace('@', '-')}-r{k}"
    r = send_json(bench.sites, rx, [src], label, tuner=tuner.split("+")[0], options=opts,
                  label=label, timeout=parse_duration(args.timeout))
    shutil.rmtree(work / "dst" / label, ignore_errors=True)
    m = run_metrics(r.intervals, r.tuning, name, first)
    rec = {"dataset": dname, "condition": cond, "tuner": name, "repeat": k, "order": pos, "ok": r.ok,
           "error": r.error, **{key: v for key, v in m.items()},
           "seconds": r.self_seconds, "throughput_bps": r.self_throughput_bps, "process_seconds": r.seconds,
           "first_reason": (r.tuning[0]["reason"] if r.tuning else ""), "loadavg": os.getloadavg(),
           "tuning": r.tuning, "intervals": r.intervals}
    mbit = lambda x: "-" if x is None else f"{x / 1e6:.0f}"  # noqa: E731
    secs = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
    print(f"{label}: ok={r.ok} first byte {secs(m['first_byte_s'])} s, total {secs(m['total_s'])} s "
          f"({mbit(m['total_bps'])} Mbit/s), first {first:g} s {mbit(m['first_window_bps'])} Mbit/s"
          + ("" if m["alloc_after_first_byte_s"] is None else
             f", HARP allocated {m['alloc_after_first_byte_s']:.1f} s after its first byte"), flush=True)
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fstream bench harp", description=__doc__.splitlines()[0])
    add_path_args(ap, "tb10h")
    ap.add_argument("--budget", default="8m", help="calibration budget (default 8m)")
    ap.add_argument("--grid", default="cc=1,2,4,8,16:p=1,2,4,8:pp=0,4", help="calibration grid")
    ap.add_argument("--probe-seconds", default="0.5s", help="data per calibration probe")
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--conditions", default=",".join(CONDITIONS))
    ap.add_argument("--tuners", default=",".join(TUNERS))
    ap.add_argument("--background-flows", type=int, default=4)
    ap.add_argument("--told-buffer", default="8MiB", help="what the tuners are told in the 'buffer' condition")
    ap.add_argument("--first-window", default="2s",
                    help="window after each transfer's own first byte, the same for every tuner (default 2s)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each (dataset, condition, tuner); the report gives the median and range of all "
                         "(default 3; the tuners' order rotates from one repeat to the next)")
    ap.add_argument("--sample-interval", default="0.1s",
                    help="the sender's interval records: what locates the first byte and the windows (default 0.1s)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the dataset file counts")
    ap.add_argument("--timeout", default="300s", help="per run")
    ap.add_argument("--report-only", metavar="SUMMARY_JSON", help="rebuild report.md from a summary.json")
    ap.add_argument("--history-csv", metavar="FILE", help="import this history instead of calibrating")
    ap.add_argument("--generated", action="store_true",
                    help="held-out 'heldout' workloads from fresh seeds (--fresh N / --seeds) instead of --datasets")
    add_seed_args(ap)
    raw_args = list(sys.argv[1:] if argv is None else argv)  # the words after ``fstream bench harp``
    args = ap.parse_args(raw_args)
    if args.report_only:
        summary_path = Path(args.report_only)
        summary = json.loads(summary_path.read_text())
        (summary_path.parent / "report.md").write_text(report(summary))
        print(report(summary))
        return 0
    prov = provenance.start("harp", raw_args, MODULES)
    from fstream_bench.peers import fstream as fs_peer
    from fstream_bench.peers.base import run_timed

    seeds = seeds_from(ap, args) if args.generated else []
    conditions = [c for c in args.conditions.split(",") if c]
    tuners = [t for t in args.tuners.split(",") if t]
    out, work = result_dirs(args, "harp")
    first = parse_duration(args.first_window)
    repeat = max(1, args.repeat)
    bench = open_bench(args)
    datasets = (generated(seeds, bench.bandwidth_bps, bench.rtt_s) if args.generated else
                {k: (DATASETS[k][0], max(2, int(DATASETS[k][1] * args.scale))) for k in args.datasets.split(",")})
    summary: dict = {"seeds": seeds, "seeds_fresh": bool(args.generated and not args.seeds),
                     "dataset_shapes": {k: describe_dataset(v) for k, v in datasets.items()},
                     "machine": machine_info(), "machine_line": machine_line(),
                     "selfcheck_line": selfcheck_line(bench.selfcheck),
                     "command": prov["command"], "provenance": prov,
                     "path": ("loopback smoke" if args.loopback
                              else f"{args.rate}, {args.rtt} RTT, {args.buffer} TCP buffer"),
                     "concurrent": concurrent_benchmarks(), "runs": [],
                     "datasets": {k: (v if isinstance(v, tuple) else "generated") for k, v in datasets.items()},
                     "first_window": args.first_window, "repeat": repeat, "sample_interval": args.sample_interval,
                     "cases": []}
    print(summary["machine_line"], flush=True)
    print(summary["selfcheck_line"], flush=True)
    base = {"bandwidth": f"{bench.bandwidth_bps:.0f}bps", "rtt": f"{bench.rtt_s * 1e3:g}ms",
            "profile_interval": "2s", "sample_interval": args.sample_interval}
    try:
        with UnixRedis(work / "redis") as redis_srv, \
                fs_peer.FStreamReceiver(sites=bench.sites, workdir=work / "rx", root=work / "dst") as rx:
            chunks = sorted({c for spec in datasets.values()
                             for c, _, _ in chunks_of(spec, bench.bandwidth_bps * bench.rtt_s / 8)})
            cal = [*fs_peer.fstream_argv(), "calibrate", "--to", rx.url("calibration"), "--secret-file", str(rx.secret),
                   "--redis", redis_srv.url, "--budget", args.budget, "--bandwidth", base["bandwidth"], "--rtt",
                   base["rtt"],
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
            for k_data, (dname, spec) in enumerate(datasets.items()):
                src = stage(spec, work / "src" / dname, seeds[k_data] if seeds else 0)
                for cond in conditions:
                    if cond == "background" and bench.path is not None:
                        from fstream_bench.wan.background import set_background
                        set_background(bench.path, args.background_flows)
                    try:
                        for k in range(repeat):
                            order = tuners[k % len(tuners):] + tuners[:k % len(tuners)]  # no tuner always first
                            for pos, tuner in enumerate(order):
                                summary["runs"].append(_one_run(bench, rx, redis_srv, src, base, args, dname, cond,
                                                                tuner, k, pos, first, work))
                                summary["cases"] = summarize(summary["runs"], first, bench.bandwidth_bps)
                                write_summary(out, summary)
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
        summary["cases"] = summarize(summary["runs"], first, bench.bandwidth_bps)
        summary["provenance"] = provenance.finish(prov)
        write_summary(out, summary, report(summary))
    print(f"results: {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
