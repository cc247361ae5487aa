"""Issue 4's path-filling checks on the emulated WAN: large files vs ``iperf3 -P 16``; 1000 × 1 MiB vs the link and
GridFTP.

``fstream bench pathfill`` builds its own path (run id ``pf``), measures in one run:
``iperf3 -P 16`` (the path's limit), ``fstream send --tuner fstream`` on a path-filling set of
large files, ``fstream send --tuner fstream`` on 1000 × 1 MiB files, and ``globus-url-copy``
with Globus-like presets on the same 1000 files; it prints a markdown table and writes JSON.
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
from fstream_bench.core import RESULTS_DIR
from fstream_provider.model.units import parse_duration, parse_rate, parse_size

#: what a pathfill result exercised (``provenance``): the agent, this benchmark, its peers (fstream,
#: GridFTP, iperf3), the WAN testbed (path, delay line driver, selfcheck) and the harness pieces
MODULES = (*provenance.AGENT, "fstream_bench.tuning.pathfill", "fstream_bench.peers", "fstream_bench.wan",
           "fstream_bench.core.cpu_meter", "fstream_bench.core.report", "fstream_bench.core.workload_gen",
           "fstream_bench.core.runstats")


def _dataset(root: Path, count: int, size: int, seed: int) -> list[Path]:
    """``count`` files of ``size`` bytes: one random block, hard-linked copies cost no disk or CPU."""
    root.mkdir(parents=True, exist_ok=True)
    proto = root.parent / f".proto-{size}-{seed}"
    if not proto.exists():
        rnd = os.urandom(min(size, 8 << 20))
        with open(proto, "wb") as f:
            left = size
            while left > 0:
                f.write(rnd[: min(left, len(rnd))])
                left -= min(left, len(rnd))
    out = []
    for i in range(count):
        p = root / f"f{i:05d}.dat"
        if not p.exists():
            os.link(proto, p)
        out.append(p)
    return out


def pathfill_ratios(rows: list[dict], link_bps: float) -> dict[str, list[float]]:
    """Per round: fstream's large files over iperf3 -P 16, its 1000 x 1 MiB over the link's payload rate and
    over GridFTP's (Globus presets); a round missing a tool (or with a failed run) gives no ratio for it."""
    out: dict[str, list[float]] = {"large / iperf3": [], "small / link": [], "small / gridftp-globus": []}
    for k in sorted({r["round"] for r in rows}):
        by = {r["tool"]: r for r in rows if r["round"] == k and r.get("ok")}
        ip, lg = by.get("iperf3-P16"), by.get("fstream (large files)")
        sm, gf = by.get("fstream (1000 x 1 MiB)"), by.get("gridftp-globus (1000 x 1 MiB)")
        if ip and lg:
            out["large / iperf3"].append(lg["throughput_bps"] / ip["throughput_bps"])
        if sm:
            out["small / link"].append(sm["throughput_bps"] / link_bps)
        if sm and gf and gf["throughput_bps"]:
            out["small / gridftp-globus"].append(sm["throughput_bps"] / gf["throughput_bps"])
    return out


def pathfill_summary(rows: list[dict], link_bps: float) -> dict[str, str]:
    from fstream_bench.core.runstats import med_range

    return {k: med_range(v) for k, v in pathfill_ratios(rows, link_bps).items()}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="fstream bench pathfill", description=__doc__)
    ap.add_argument("--rate", default="1Gbit")
    ap.add_argument("--rtt", default="40ms")
    ap.add_argument("--buffer", default="1MiB")
    ap.add_argument("--large-count", type=int, default=8)
    ap.add_argument("--large-size", default="512MiB")
    ap.add_argument("--small-count", type=int, default=1000)
    ap.add_argument("--small-size", default="1MiB")
    ap.add_argument("--profile-interval", default="2s")
    ap.add_argument("--repeat", type=int, default=3,
                    help="rounds; each runs iperf3, fstream on both sets and GridFTP, ratios taken within a round")
    ap.add_argument("--results", default=str(RESULTS_DIR))
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("fstream bench pathfill: needs root (network namespaces)", file=sys.stderr)
        return 2
    from fstream_bench.peers.base import Sites
    from fstream_bench.peers.fstream import FStreamReceiver, send
    from fstream_bench.peers.gridftp import GridFTPServer, copy, globus_preset
    from fstream_bench.peers.iperf import Iperf3
    from fstream_bench.core.report import machine_info
    from fstream_bench.wan import netns
    from fstream_bench.wan.path import WanConfig, WanPath
    from fstream_bench.wan.selfcheck import selfcheck

    rate, rtt, buf = parse_rate(args.rate), parse_duration(args.rtt), parse_size(args.buffer)
    work = Path("/dev/shm") / f"fstream-pathfill-{os.getpid()}"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out_dir = Path(args.results)
    out_dir.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    prov = provenance.start("pathfill", argv, MODULES)
    path = WanPath(WanConfig(rate_bps=rate, rtt_s=rtt, buffer_bytes=buf, run_id="pf"))
    path.up()
    rows: list[dict] = []
    try:
        check = selfcheck(path, duration=3.0)
        sites = Sites(src_host=path.src_ip, dst_host=path.dst_ip, src_prefix=tuple(netns.ns_exec_argv(path.src_ns, [])),
                      dst_prefix=tuple(netns.ns_exec_argv(path.dst_ns, [])), name="wan")
        large = _dataset(work / "src" / "large", args.large_count, parse_size(args.large_size), 1)
        small = _dataset(work / "src" / "small", args.small_count, parse_size(args.small_size), 2)
        opts = {"bandwidth": args.rate, "rtt": args.rtt, "profile_interval": args.profile_interval}
        preset = globus_preset(parse_size(args.small_size))
        for k in range(args.repeat):
            ip = Iperf3(sites=sites, workdir=work / "iperf").measure(streams=16, seconds=10, label="iperf3-P16")
            rows.append({"round": k, "case": "path limit", **ip.to_dict()})
            with FStreamReceiver(sites=sites, workdir=work / "rx", root=work / "dst") as rx:
                for case, files in (("large files", large), ("1000 x 1 MiB", small)):
                    r = send(rx, [files[0].parent], case.replace(" ", "_"), tuner="fstream", options=opts,
                             label=f"fstream ({case})")
                    rows.append({"round": k, "case": case, **r.to_dict()})
                    shutil.rmtree(work / "dst" / case.replace(" ", "_"), ignore_errors=True)
            with GridFTPServer(sites=sites, workdir=work / "gridftp") as gs:
                shutil.rmtree(work / "gdst", ignore_errors=True)
                (work / "gdst").mkdir(parents=True, exist_ok=True)
                g = copy(gs, small, small[0].parent, work / "gdst", preset, label="gridftp-globus (1000 x 1 MiB)")
                rows.append({"round": k, "case": "1000 x 1 MiB", **g.to_dict()})
    finally:
        path.down()
        shutil.rmtree(work, ignore_errors=True)
    link = rate * 1448 / 1500
    lines = [f"# Path filling on the emulated WAN ({args.rate}, {args.rtt}, {args.buffer} TCP buffer)", "",
             "machine: nproc {nproc}, {cpu}, kernel {kernel}; ".format(**machine_info())
             + f"load average at start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             f"selfcheck: rtt {check.get('rtt_ms')} ms, iperf3 -P 16 {check.get('parallel_bps', 0) / 1e6:.0f} Mbit/s, "
             f"one stream {check.get('single_stream_bps', 0) / 1e6:.0f} Mbit/s, cc {check.get('cc')}", "",
             f"reproduce: `{prov['command']}`", "",
             "| round | case | tool | ok | files | GB | s | Mbit/s | / iperf3 -P 16 (same round) | / link payload |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        bps = r["throughput_bps"]
        ipbps = next(x["throughput_bps"] for x in rows if x["round"] == r["round"] and x["tool"] == "iperf3-P16")
        lines.append(f"| {r['round'] + 1} | {r['case']} | {r['tool']} | {r['ok']} | {r['files']} | "
                     f"{r['bytes'] / 1e9:.2f} | {r['seconds']:.1f} | {bps / 1e6:.0f} | {bps / ipbps:.2f} "
                     f"| {bps / link:.2f} |")
    summary = pathfill_summary(rows, link)
    lines += ["", "Over all rounds (median, min–max): " + "; ".join(f"{k} {v}" for k, v in summary.items())]
    provenance.finish(prov)
    lines += ["", f"provenance: commit {prov['commit'][:12]}{' (dirty)' if prov['dirty'] else ''}, code "
              f"{prov['code_hash'][:19]}, load {prov['load_start'][0]:.2f} at start, {prov['load_end'][0]:.2f} "
              "at end; every run is in the JSON's `rows`"]
    md = "\n".join(lines) + "\n"
    (out_dir / f"pathfill-{stamp}.md").write_text(md)
    config = {"rate": args.rate, "rtt": args.rtt, "buffer": args.buffer, "large_count": args.large_count,
              "large_size": args.large_size, "small_count": args.small_count, "small_size": args.small_size,
              "profile_interval": args.profile_interval, "link_payload_bps": link, "repeat": args.repeat}
    (out_dir / f"pathfill-{stamp}.json").write_text(json.dumps(
        {"bench": "pathfill", "provenance": prov, "config": config, "selfcheck": check, "rows": rows,
         "summary": summary},
        indent=1, default=str))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
