"""Render benchmark results: machine header, markdown tables with ratios, Fig. 4.3-style PNG plots."""

from __future__ import annotations

import csv
import json
import os
import platform
import time
from pathlib import Path


def machine_info() -> dict:
    """nproc, kernel, CPU model, RAM and the UTC date: the header every table carries."""
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = 0.0
    return {"nproc": os.cpu_count(), "kernel": platform.release(), "cpu": cpu, "mem_gib": mem,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg())}


PEERS = ("gridftp-globus", "gridftp-static", "rsync", "sftp")


def _load(run_dir: Path) -> tuple[dict, list[dict]]:
    summary = json.loads((run_dir / "summary.json").read_text())
    rows: list[dict] = []
    csv_path = run_dir / "samples.csv"
    if csv_path.exists():
        with open(csv_path, newline="") as f:
            for r in csv.DictReader(f):
                rows.append({"workload": r["workload"], "tool": r["tool"], "t": float(r["t"]),
                             "throughput_bps": float(r["throughput_bps"]),
                             "cc": int(float(r["cc"] or 0))})
    return summary, rows


def _selfcheck_text(c: dict) -> str:
    if "rtt_ms" not in c:
        return json.dumps(c)
    return (f"RTT {c['rtt_ms']:.1f} ms, one stream {c['single_stream_bps'] / 1e6:.0f} Mbit/s, "
            f"iperf3 -P {c.get('parallel')} {c['parallel_bps'] / 1e6:.0f} Mbit/s "
            f"({c.get('rate_ratio', 0):.3f} of expected goodput), congestion control {c.get('cc')}, "
            f"{'ok' if c.get('ok') else 'FAILED: ' + '; '.join(c.get('failures', []))}")


def _fmt_ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "–"


def tables(summary: dict) -> str:
    """Markdown: header (command, machine, path selfcheck, iperf3), then one table per workload."""
    m = summary["machine"]
    sc = summary["scenario"]
    out = [f"Machine: {m['nproc']} CPUs ({m['cpu']}), kernel {m['kernel']}, {m['mem_gib']:.0f} GiB RAM; "
           f"run {m['date']}.  ",
           f"Path: {sc['path']} — told to tuners as {sc['bandwidth_bps'] / 1e9:g} Gbit/s, "
           f"{sc['rtt_s'] * 1000:g} ms RTT, {sc['tcp_buffer'] / 2**20:g} MiB TCP buffer; "
           f"selfcheck: {_selfcheck_text(summary.get('selfcheck', {}))}.  ",
           *(["Merged from runs: " + ", ".join(f"{wl}: {v['run']} ({v['machine']['date']})"
                                                 for wl, v in summary["sources"].items()) + ".  "]
             if summary.get("sources") else []),
           f"Workloads: count factor {sc['count_factor']}, {sc['interval_s']:g} s between batches, seed {sc['seed']}."]
    if summary.get("selfcheck", {}).get("forced"):
        out.insert(0, f"**WARNING: the WAN selfcheck failed and the run was forced: "
                      f"{summary['selfcheck'].get('error', '')}**\n")
    for rb in summary.get("path_rebuilt", []):
        out.append(f"- the WAN path was torn down by another process and rebuilt at {rb['at']}; "
                   f"selfcheck then: {_selfcheck_text(rb['selfcheck'])}")
    ip = summary.get("iperf3")
    ip_bps = ip["throughput_bps"] if ip and ip.get("ok") else None
    if ip_bps:
        out.append(f"iperf3 memory-to-memory, 8 streams, same path: **{ip_bps / 1e6:.0f} Mbit/s** (the path's limit).")
    for tool, why in summary.get("skipped", {}).items():
        out.append(f"- skipped {tool}: {why}")
    by_wl: dict[str, list[dict]] = {}
    for r in summary["runs"]:
        by_wl.setdefault(r["workload"], []).append(r)
    for wl, runs in by_wl.items():
        tp = {r["tool"]: r["throughput_bps"] for r in runs if r["ok"]}
        orc = summary.get("oracle", {}).get(wl) or {}
        orc_bps = orc.get("throughput_bps")
        peers = [p for p in PEERS if any(r["tool"] == p for r in runs)]
        bound = _arrival_bound(sc, wl, ip_bps)
        out += ["", f"**{wl}** (oracle: {_oracle_text(orc)}){bound}", "",
                "| tool | settings | time (s) | Mbit/s | / iperf3 | / oracle | " +
                " | ".join(f"/ {p}" for p in peers) + " |",
                "|---|---|---|---|---|---|" + "---|" * len(peers)]
        for r in runs:
            me = tp.get(r["tool"])
            settings = ", ".join(f"{k}={v}" for k, v in r["settings"].items() if k not in ("why",))
            status = f"{r['seconds']:.1f}" if r["ok"] else f"FAILED ({r['error'][:80]})"
            out.append(f"| {r['tool']} | {settings} | {status} | {me / 1e6:.0f} |" if me else
                       f"| {r['tool']} | {settings} | {status} | – |")
            out[-1] += (f" {_fmt_ratio(me, ip_bps)} | {_fmt_ratio(me, orc_bps)} | " +
                        " | ".join(_fmt_ratio(me, tp.get(p)) for p in peers) + " |")
    return "\n".join(out) + "\n"


def _arrival_bound(sc: dict, wl: str, limit_bps: float | None) -> str:
    """What no tool can beat: the last batch arrives at t_last and still has to cross the path."""
    if not limit_bps:
        return ""
    try:
        from fstream_bench.core.workload_gen import build

        w = build(wl, bandwidth_bps=sc["bandwidth_bps"], rtt_s=sc["rtt_s"], seed=sc["seed"],
                  interval_s=sc["interval_s"], count_factor=sc["count_factor"])
    except Exception:  # an unknown workload name: no bound to show
        return ""
    last = w.batches[-1]
    t = last.t + last.bytes * 8 / limit_bps
    return (f"; {len(w.files)} files, {w.total_bytes / 1e9:.2f} GB; arrival bound "
            f"{w.total_bytes * 8 / t / 1e6:.0f} Mbit/s ({t:.1f} s: last batch at {last.t:g} s, then "
            f"{last.bytes / 1e6:.0f} MB at the iperf3 rate)")


def _oracle_text(orc: dict) -> str:
    if not orc:
        return "not run"
    if not orc.get("throughput_bps"):
        return f"failed: {orc.get('error', '')[:100]}"
    best = "; ".join(f"batch {b['batch']}: cc={b['cc']} p={b['p']} pp={b['pp']}" for b in orc.get("best", []))
    return f"{orc['throughput_bps'] / 1e6:.0f} Mbit/s with the best fixed settings per batch ({best})"


def plots(run_dir: Path, summary: dict, rows: list[dict]) -> list[Path]:
    """One PNG per workload like the thesis' Fig. 4.3: throughput and channel count over time, a line per tool."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    for wl in dict.fromkeys(r["workload"] for r in rows):
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
        for tool in dict.fromkeys(r["tool"] for r in rows if r["workload"] == wl):
            pts = [r for r in rows if r["workload"] == wl and r["tool"] == tool]
            ts = [r["t"] for r in pts]
            ax1.plot(ts, [r["throughput_bps"] / 1e6 for r in pts], label=tool, linewidth=1.2)
            ax2.step(ts, [r["cc"] for r in pts], where="post", label=tool, linewidth=1.2)
        ip = summary.get("iperf3")
        if ip and ip.get("ok"):
            ax1.axhline(ip["throughput_bps"] / 1e6, color="grey", linestyle="--", linewidth=0.8, label="iperf3 limit")
        for k in range(4):
            t = k * summary["scenario"]["interval_s"]
            ax1.axvline(t, color="grey", linestyle=":", linewidth=0.6)
            ax2.axvline(t, color="grey", linestyle=":", linewidth=0.6)
        ax1.set_ylabel("throughput (Mbit/s)")
        ax1.text(0.01, 0.97, "agent: its interval records; others: bytes landed at the destination",
                 transform=ax1.transAxes, fontsize=7, va="top")
        ax1.set_title(f"{wl}: throughput and channels over time (dotted: batch arrivals)")
        ax1.legend(fontsize=7, ncol=2)
        ax2.set_ylabel("channels (cc)")
        ax2.set_xlabel("time since first batch (s)")
        fig.tight_layout()
        p = run_dir / f"{wl}.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        made.append(p)
    return made


def render(run_dir: Path) -> str:
    """Write ``report.md`` and the PNGs into ``run_dir``; return the markdown."""
    run_dir = Path(run_dir)
    summary, rows = _load(run_dir)
    md = tables(summary)
    try:
        pngs = plots(run_dir, summary, rows)
        md += "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in pngs) + "\n"
    except ImportError as e:
        md += f"\n(plots skipped: matplotlib not installed: {e})\n"
    (run_dir / "report.md").write_text(md)
    return md


def latest_run(results: Path) -> Path:
    runs = sorted((p for p in Path(results).iterdir() if (p / "summary.json").exists()),
                  key=lambda p: p.stat().st_mtime)
    if not runs:
        raise FileNotFoundError(f"no run with a summary.json under {results}")
    return runs[-1]


def merge(run_dirs: list[Path], out: Path) -> Path:
    """Combine runs into ``out``: a later run's results for a workload replace an earlier run's.

    For re-running one workload that a disturbance spoiled without re-running everything; the
    merged summary lists its sources so the report says which numbers came from which run.
    """
    merged: dict | None = None
    rows: list[dict] = []
    header: list[str] = []
    for d in run_dirs:
        summary = json.loads((Path(d) / "summary.json").read_text())
        wls = {r["workload"] for r in summary["runs"]}
        with open(Path(d) / "samples.csv", newline="") as f:
            rd = csv.DictReader(f)
            header = list(rd.fieldnames or header)
            new_rows = list(rd)
        if merged is None:
            merged = {**summary, "sources": {}}
            rows = new_rows
        else:
            merged["runs"] = [r for r in merged["runs"] if r["workload"] not in wls] + summary["runs"]
            merged["oracle"] = {**merged.get("oracle", {}), **summary.get("oracle", {})}
            rows = [r for r in rows if r["workload"] not in wls] + new_rows
        for wl in wls:
            merged["sources"][wl] = {"run": Path(d).name, "machine": summary["machine"],
                                     "selfcheck": summary.get("selfcheck", {})}
    assert merged is not None
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(merged, indent=1, default=str))
    with open(out / "samples.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=header, extrasaction="ignore")
        wr.writeheader()
        wr.writerows(rows)
    return out


def main(args) -> int:
    """Entry for ``fstream bench report [RUN_DIR ...]`` (several: merged, later runs win per workload)."""
    dirs = [Path(d) for d in (args.run_dir or [])]
    if not dirs:
        run_dir = latest_run(Path(args.results))
    elif len(dirs) == 1:
        run_dir = dirs[0]
    else:
        run_dir = merge(dirs, Path(args.results) / f"combined-{time.strftime('%Y%m%d-%H%M%S')}")
    print(render(run_dir))
    print(f"report: {run_dir / 'report.md'}")
    return 0
