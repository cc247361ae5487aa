"""QoS benchmark (issue 4): ``fstream send --tuner fstream --target-throughput`` held on the emulated WAN.

For each file mix (small, large, mixed) and each target (a fraction of the link) the agent
sends a dataset sized to last about ``--duration`` seconds at the target, ``fstream receive``
in the destination namespace, ``fstream send --json`` in the source namespace (both through
the path's ``ip netns exec`` prefix, as ``WanPath.exec`` runs them). From the agent's own
interval records the error against the target is computed per profiling window (the
controller's granularity: ``--profile-interval`` / ``--sample-interval`` one-second samples
summed) and per one-second sample; see :func:`qos_metrics` for the exact definitions.

Run: ``python -m fstream_bench.tuning.qos`` (root; ``--loopback`` for a smoke run).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import sys
from pathlib import Path

from fstream_bench.core import provenance
from fstream_bench.core.report import machine_info
from fstream_bench.wan.rig import (add_path_args, concurrent_benchmarks, machine_line, open_bench, result_dirs,
                                   selfcheck_line, send_json, write_summary)

from fstream_provider.model.units import parse_duration, parse_size

#: what a QoS result exercised (``provenance``): the agent and tuners, this benchmark (its simulator
#: view too), the WAN rig and testbed, the peers that run the agent, and the dataset writer
MODULES = (*provenance.AGENT, "fstream_bench.tuning.qos", "fstream_bench.wan.rig", "fstream_bench.wan",
           "fstream_bench.peers", "fstream_bench.core.report", "fstream_bench.core.workload_gen",
           "fstream_bench.core.cpu_meter")

MiB = 2**20
KINDS = ("small", "large", "mixed")
#: (low, high) bytes of the unique files each dataset hard-links to (at 1 Gbit/s a file is
#: "small" below ~50 MB: it would take < 0.4 s at the path's bandwidth).
SIZES = {"small": (1 * MiB, 4 * MiB), "large": (96 * MiB, 256 * MiB)}


# -- datasets ---------------------------------------------------------------------------------------
def _unique_files(kind: str, base: Path, n: int, seed: int) -> list[Path]:
    """``n`` distinct files of one size class (log-uniform sizes), written once."""
    import math
    import random

    from fstream_bench.core.workload_gen import content_block, write_file

    lo, hi = SIZES[kind]
    rng = random.Random(f"qos:{kind}:{seed}")
    block = content_block(seed)
    out = []
    for j in range(n):
        p = base / f"{kind}-{j:03d}.dat"
        size = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
        if not (p.is_file() and p.stat().st_size == size):
            write_file(p, size, block, key=f"qos:{kind}:{j}")
        out.append(p)
    return out


def build_dataset(kind: str, total_bytes: int, root: Path, uniq: Path, *, seed: int = 0) -> list[tuple[str, int]]:
    """Fill ``root`` with hard links to unique files until ``total_bytes``; return [(name, size)].

    ``mixed`` alternates small and large by bytes (half each). Names differ, so every link is a
    separate file to the agent; content repeats, which costs nothing on the wire or the disk.
    """
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    pools = {k: _unique_files(k, uniq, 48 if k == "small" else 8, seed) for k in ("small", "large")}
    kinds = ["small", "large"] if kind == "mixed" else [kind]
    got = {k: 0 for k in kinds}
    idx = {k: 0 for k in kinds}
    share = total_bytes / len(kinds)
    made: list[tuple[str, int]] = []
    for k in kinds:
        while got[k] < share:
            src = pools[k][idx[k] % len(pools[k])]
            idx[k] += 1
            name = f"{k}-{len(made):05d}.dat"
            os.link(src, root / name)
            size = src.stat().st_size
            got[k] += size
            made.append((name, size))
    return made


def simulate_case(files: list[tuple[str, int]], target_bps: float, bench, *, buffer_bytes: int,
                  window_s: float, variant: str | None = None) -> dict:
    """The simulator's view of one case (same files at t=0, same path, target and variant; ``calibration_rows``'
    defaults)."""
    from fstream_provider.tuning.base import FileInfo, PathInfo
    from fstream_provider.tuning.fstream import FStreamTuner
    from fstream_provider.tuning.sim import simulate
    from fstream_provider.tuning.variants import FStreamVariant
    from fstream_provider.tuning.workloads import Batch, Workload

    path = PathInfo(bench.bandwidth_bps, bench.rtt_s, tcp_buffer=buffer_bytes)
    w = Workload("qos", [Batch(0.0, [FileInfo(n, s, "dat") for n, s in files])])
    r = simulate(FStreamTuner(path=path, target_throughput_bps=target_bps, variant=FStreamVariant.parse(variant)),
                 w, path, profile_interval_s=min(window_s, 1.0), window_efficiency=0.65, startup_s=1.2)
    ivs, prev = [], 0.0
    for iv in r.intervals:
        ivs.append({"t": iv["t"], "dt": iv["t"] - prev, "bytes": iv["bytes"], "throughput_bps": iv["throughput_bps"],
                    "cc": iv["cc"]})
        prev = iv["t"]
    m = qos_metrics(ivs, target_bps, window_s=window_s)
    return {"seconds": r.total_time_s, "throughput_bps": r.throughput_bps, "metrics": m}


# -- metrics ----------------------------------------------------------------------------------------
def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def windows(intervals: list[dict], width_s: float) -> list[dict]:
    """Sum the agent's interval records into consecutive windows of ``width_s`` seconds (from t=0)."""
    out: list[dict] = []
    for iv in intervals:
        dt = float(iv.get("dt") or 0.0)
        if dt <= 0:
            continue
        k = int(max(0.0, float(iv["t"]) - 1e-6) // width_s)
        while len(out) <= k:
            out.append({"t": (len(out) + 1) * width_s, "bytes": 0.0, "dt": 0.0, "cc": 0})
        w = out[k]
        w["bytes"] += float(iv.get("bytes", iv.get("throughput_bps", 0.0) * dt / 8))
        w["dt"] += dt
        w["cc"] = iv.get("cc") or w["cc"]
    for w in out:
        w["throughput_bps"] = w["bytes"] * 8 / w["dt"] if w["dt"] > 0 else 0.0
    return [w for w in out if w["dt"] > 0]


def qos_metrics(intervals: list[dict], target_bps: float, *, window_s: float, tail_s: float | None = None,
                stay: int = 3) -> dict:
    """Error vs target, after convergence.

    - Records after the data ran out are dropped: the last ``tail_s`` seconds (default two
      windows) before the final record, when the remaining files no longer fill the channels.
    - Windows: the one-second records summed per ``window_s`` (the profiling interval).
    - Convergence: the 1-based index of the first window from which ``stay`` consecutive
      windows are all within 5 % of the target (None if that never happens).
    - Median / p90 of |throughput - target| / target over the windows from convergence on
      (from window 4 on if it never converged), and the same over one-second records.
    """
    ivs = [iv for iv in intervals if float(iv.get("dt") or 0) > 0]
    if not ivs:
        return {"error": "no interval records"}
    t_end = max(float(iv["t"]) for iv in ivs)
    tail_s = 2 * window_s if tail_s is None else tail_s
    body = [iv for iv in ivs if float(iv["t"]) <= t_end - tail_s]
    ws = [w for w in windows(body, window_s) if w["dt"] >= 0.8 * window_s]
    errs = [abs(w["throughput_bps"] - target_bps) / target_bps for w in ws]
    conv = None
    for i in range(len(errs)):
        run = errs[i:i + stay]
        if len(run) == stay and all(e <= 0.05 for e in run):
            conv = i + 1
            break
    start = (conv - 1) if conv else min(3, len(errs))
    after = errs[start:]
    t_from = ws[start]["t"] - window_s if start < len(ws) else t_end
    sec_errs = [abs(float(iv["throughput_bps"]) - target_bps) / target_bps for iv in body
                if float(iv["t"]) > t_from and float(iv["dt"]) >= 0.5]
    mean_thr = statistics.fmean(w["throughput_bps"] for w in ws[start:]) if ws[start:] else float("nan")
    return {"windows": len(errs), "converged_at": conv, "first_within_5pct": next(
                (i + 1 for i, e in enumerate(errs) if e <= 0.05), None),
            "median_err": statistics.median(after) if after else float("nan"), "p90_err": _pct(after, 0.9),
            "median_err_1s": statistics.median(sec_errs) if sec_errs else float("nan"),
            "p90_err_1s": _pct(sec_errs, 0.9), "mean_bps_after": mean_thr, "window_errs": [round(e, 4) for e in errs]}


def goals_met(m: dict) -> dict:
    """The issue's goals for one case: median <= 5 %, p90 <= 10 %, convergence within 3 intervals."""
    return {"median": m.get("median_err", 1) <= 0.05, "p90": m.get("p90_err", 1) <= 0.10,
            "convergence": bool(m.get("converged_at")) and m["converged_at"] <= 3}


# -- plot -------------------------------------------------------------------------------------------
def plot_case(png: Path, title: str, intervals: list[dict], target_bps: float, window_s: float) -> None:
    """Throughput (1 s and per window) vs the target over time, channel count on a second axis."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ivs = [iv for iv in intervals if float(iv.get("dt") or 0) > 0]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    ax.plot([iv["t"] for iv in ivs], [iv["throughput_bps"] / 1e6 for iv in ivs], lw=0.8, alpha=0.5,
            label="throughput (1 s records)")
    ws = windows(ivs, window_s)
    ax.step([w["t"] for w in ws], [w["throughput_bps"] / 1e6 for w in ws], where="pre", lw=1.6,
            label=f"throughput ({window_s:g} s windows)")
    ax.axhline(target_bps / 1e6, color="k", ls="--", lw=1, label="target")
    ax.axhspan(target_bps * 0.95 / 1e6, target_bps * 1.05 / 1e6, color="k", alpha=0.08, label="±5 %")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("Mbit/s")
    ax2 = ax.twinx()
    ax2.step([iv["t"] for iv in ivs], [iv.get("cc") or 0 for iv in ivs], where="post", color="tab:red",
             lw=1, label="cc")
    ax2.set_ylabel("channels (cc)", color="tab:red")
    ax2.set_ylim(bottom=0)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="lower right")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


# -- the run ----------------------------------------------------------------------------------------
def _md(summary: dict) -> str:
    lines = [f"# QoS on the emulated WAN ({summary['path']})", "", summary["machine_line"],
             summary["selfcheck_line"], "", f"reproduce: `{summary['command']}`", ""]
    if summary.get("concurrent"):
        lines += ["**Concurrent load**: other benchmark processes were running during this measurement:", ""]
        lines += [f"- `{c}`" for c in summary["concurrent"]] + [""]
    lines += [(f"Profiling interval {summary['profile_interval']}, sample interval {summary['sample_interval']}; "
               f"errors per {summary['window_s']:g} s window after convergence (1 s records in the last two columns)."),
              "", ("| files | target | data | time s | mean after conv. Mbit/s | converged at (window) | "
                   "median err | p90 err | goals (median/p90/conv) | median 1 s | p90 1 s |"),
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in summary["cases"]:
        m = c["metrics"]
        if "error" in m or not c["ok"]:
            lines.append(f"| {c['kind']} | {c['fraction']:.0%} | | | | | FAILED: "
                         f"{c.get('error', m.get('error'))[:120]} | | | | |")
            continue
        g = goals_met(m)
        lines.append(
            f"| {c['kind']} | {c['fraction']:.0%} ({c['target_bps'] / 1e6:.0f} Mbit/s) | "
            f"{c['files']} files, {c['bytes'] / 1e9:.2f} GB | {c['seconds']:.1f} | {m['mean_bps_after'] / 1e6:.0f} | "
            f"{m['converged_at'] or 'never'} | {m['median_err']:.1%} | {m['p90_err']:.1%} | "
            f"{'/'.join('yes' if g[k] else 'NO' for k in ('median', 'p90', 'convergence'))} | "
            f"{m['median_err_1s']:.1%} | {m['p90_err_1s']:.1%} |")
    lines += ["", ("Simulator vs measured for the same cases (`simulate_case`: files at t=0, same path and target, "
                   "window efficiency 0.65, start-up 1.2 s as in `simreport.calibration_rows`):"), "",
              ("| files | target | measured time s | simulated time s | sim / measured throughput | "
               "measured median err | simulated median err | simulated conv. |"), "|---|---|---|---|---|---|---|---|"]
    for c in summary["cases"]:
        sim = c.get("sim") or {}
        if "error" in sim or not c["ok"] or "metrics" not in sim:
            continue
        meas_bps = c["bytes"] * 8 / c["self_seconds"] if c.get("self_seconds") else float("nan")
        lines.append(f"| {c['kind']} | {c['fraction']:.0%} | {c['self_seconds']:.1f} | {sim['seconds']:.1f} | "
                     f"{sim['throughput_bps'] / meas_bps:.2f} | {c['metrics'].get('median_err', float('nan')):.1%} | "
                     f"{sim['metrics'].get('median_err', float('nan')):.1%} | {sim['metrics'].get('converged_at')} |")
    lines += ["", "Plots: " + ", ".join(f"`{c['png']}`" for c in summary["cases"] if c.get("png"))]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``fstream bench qos``: run the QoS cases and write ``qos-<stamp>/`` under ``--results``."""
    ap = argparse.ArgumentParser(prog="fstream bench qos", description=__doc__.splitlines()[0])
    add_path_args(ap, "tb4q")
    ap.add_argument("--kinds", default=",".join(KINDS), help="small,large,mixed")
    ap.add_argument("--fractions", default="0.3,0.6,0.9", help="targets as fractions of --rate")
    ap.add_argument("--duration", default="45s", help="each dataset is sized to last this long at the target")
    ap.add_argument("--profile-interval", default=None,
                    help="fstream's decision interval (default: the variant's own: 2 s at 40 ms, thesis 10 s)")
    ap.add_argument("--variant", default=None, help="fstream variant, e.g. thesis or default (issue #16)")
    ap.add_argument("--sample-interval", default="1s")
    ap.add_argument("--timeout", default="240s", help="per case")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    prov = provenance.start("qos", list(sys.argv[1:] if argv is None else argv), MODULES)
    from fstream_bench.peers import fstream as fs_peer

    out, work = result_dirs(args, "qos")
    duration = parse_duration(args.duration)
    bench = open_bench(args)
    from fstream_provider.tuning.variants import FStreamVariant

    window_s = (parse_duration(args.profile_interval) if args.profile_interval
                else FStreamVariant.parse(args.variant).interval_for(bench.rtt_s))
    summary = {"path": "loopback smoke" if args.loopback else f"{args.rate}, {args.rtt} RTT, {args.buffer} TCP buffer",
               "machine": machine_info(), "machine_line": machine_line(), "selfcheck": bench.selfcheck,
               "selfcheck_line": selfcheck_line(bench.selfcheck),
               "command": "python -m fstream_bench.tuning.qos " + " ".join(
                   shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)),
               "profile_interval": args.profile_interval or f"{window_s:g}s", "variant": args.variant or "default",
               "sample_interval": args.sample_interval,
               "window_s": window_s, "concurrent": concurrent_benchmarks(), "cases": [], "provenance": prov}
    print(summary["machine_line"], flush=True)
    print(summary["selfcheck_line"], flush=True)
    try:
        dst_root = work / "dst"
        with fs_peer.FStreamReceiver(sites=bench.sites, workdir=work / "rx", root=dst_root) as rx:
            for kind in [k.strip() for k in args.kinds.split(",") if k.strip()]:
                for frac in [float(f) for f in args.fractions.split(",") if f.strip()]:
                    target = frac * bench.bandwidth_bps
                    src = work / "src" / f"{kind}-{int(frac * 100)}"
                    made = build_dataset(kind, int(target * duration / 8), src, work / "uniq", seed=args.seed)
                    nfiles, nbytes = len(made), sum(sz for _, sz in made)
                    label = f"{kind}-{int(frac * 100)}"
                    shutil.rmtree(dst_root / label, ignore_errors=True)
                    opts = {"bandwidth": f"{bench.bandwidth_bps:.0f}bps", "rtt": f"{bench.rtt_s * 1e3:g}ms",
                            "target_throughput": f"{target:.0f}bps", "sample_interval": args.sample_interval}
                    opts.update({k: v for k, v in (("profile_interval", args.profile_interval),
                                                   ("variant", args.variant)) if v})
                    print(f"qos {label}: {nfiles} files, {nbytes / 1e9:.2f} GB, target {target / 1e6:.0f} Mbit/s",
                          flush=True)
                    r = send_json(bench.sites, rx, [src], label, tuner="fstream", options=opts,
                                  label=f"qos-{label}", timeout=parse_duration(args.timeout))
                    ivs = r.intervals
                    m = qos_metrics(ivs, target, window_s=window_s)
                    case = {"kind": kind, "fraction": frac, "target_bps": target, "files": nfiles, "bytes": nbytes,
                            "ok": r.ok, "error": r.error, "seconds": r.seconds, "self_seconds": r.self_seconds,
                            "self_throughput_bps": r.self_throughput_bps, "tuning": r.tuning,
                            "metrics": m, "intervals": ivs, "loadavg": os.getloadavg()}
                    try:
                        case["sim"] = simulate_case(made, target, bench, buffer_bytes=parse_size(args.buffer),
                                                    window_s=window_s, variant=args.variant)
                    except Exception as e:  # noqa: BLE001 - the measurement stands without the simulator's view
                        case["sim"] = {"error": f"{type(e).__name__}: {e}"}
                    if ivs:
                        png = out / f"{label}.png"
                        plot_case(png,
                                  f"QoS {kind} files, target {frac:.0%} of {args.rate} ({target / 1e6:.0f} Mbit/s)",
                                  ivs, target, window_s)
                        case["png"] = png.name
                    summary["cases"].append(case)
                    print(f"qos {label}: ok={r.ok} {r.seconds:.1f} s; conv {m.get('converged_at')}, median "
                          f"{m.get('median_err', float('nan')):.1%}, p90 {m.get('p90_err', float('nan')):.1%}"
                          f" {r.error[:200]}", flush=True)
                    shutil.rmtree(dst_root / label, ignore_errors=True)
                    shutil.rmtree(src, ignore_errors=True)
                    write_summary(out, summary)
    finally:
        bench.close()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
        summary["machine_line_end"] = machine_line()
        provenance.finish(prov)
        write_summary(out, summary, _md(summary))
    print(_md(summary))
    print(f"results: {out}")
    return 0 if all(c["ok"] for c in summary["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
