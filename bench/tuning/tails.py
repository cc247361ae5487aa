"""``fstream bench tails``: the default tuner against the best fixed setting on backlogged mixes (issue 44).

    fstream bench tails                  # root: the emulated WAN; 3 fresh seeds, one transfer per tool and seed
    fstream bench tails --seeds 7,8 --sim-only
    fstream bench tails --figure bench/results/tails-STAMP.json docs/figures/tails.png

Each seed draws one ``tails`` workload (``tuning.workloads``: 2-6 large files among 600-2000 small ones, all
present at the start; the shape comes from the seed, which is recorded). The simulator ranks the oracle grid
(``ablation.ORACLE_GRID``) on it. On the emulated WAN (1 Gbit/s, 40 ms, 1 MiB buffers; root) the workload is staged
once and each round runs one ``fstream send`` (one shot, every file present) per tool, in the same order:
``static``, the default ``fstream``, the default without the tail floor (``fstream@default-tail-floor``: the
ablation), and the simulator's two best grid points of at most 32 streams as ``fixed``. A tool's time is the send's
wall time, process start included, the same for every tool. The best fixed setting of a round is the fastest of
the fixed points and ``static``; every tool is reported as a fraction of it, within its round.
``--sim-only`` does the same in the simulator alone, against the whole grid's best.

Writes ``tails-<stamp>.json`` (+ ``.md``) into ``--results``, with every round's runs and the tuners' reasons.
The goals table reads it (``fstream_bench.tuning.readers.tails_default_vs_fixed``); ``--figure`` draws every run
of a result (nothing chosen).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from fstream_bench.core import RESULTS_DIR, provenance
from fstream_bench.core.seeds import add_seed_args, seeds_from
from fstream_bench.core.runstats import write_result
from fstream_bench.core.workload_gen import build, describe
from fstream_provider.tuning.workloads import TAILS

COMMAND = "tails"
MODULES = (*provenance.AGENT, "fstream_bench.tuning.tails", "fstream_bench.tuning.wan", "fstream_bench.wan.harness",
           "fstream_bench.peers", "fstream_bench.wan", "fstream_bench.core.workload_gen",
           "fstream_bench.core.cpu_meter", "fstream_bench.wan.oracle", "fstream_bench.core.seeds")
BW, RTT, BUF = 1e9, 0.040, 2 ** 20
DEFAULT, ABLATION, STATIC = "fstream-fstream", "fstream-fstream@default-tail-floor", "fstream-static"
LABELS = {DEFAULT: "default", ABLATION: "default without the tail floor", STATIC: "static"}


def _sim_row(w, rank: list) -> dict:
    """The three tuners and the grid in the simulator: each as a fraction of the grid's best."""
    from fstream_provider.tuning.ablation import Setup
    from fstream_provider.tuning.base import PathInfo
    from fstream_provider.tuning.registry import make_tuner, tuner_variant
    from fstream_provider.tuning.sim import dtn_storage

    setup = Setup(path=PathInfo(BW, RTT, tcp_buffer=BUF, max_cc=32, max_p=16), storage=dtn_storage(BW))
    best_bps, (cc, p, pp) = rank[0]
    out = {"best_fixed": f"{cc}x{p}x{pp}", "best_fixed_bps": best_bps, "of_best": {}}
    for tool in (STATIC, DEFAULT, ABLATION):
        name, _, variant = tool.removeprefix("fstream-").partition("@")
        kw = {"variant": tuner_variant(name, variant)} if variant else {}
        r = setup.run(make_tuner(name, path=setup.path, **kw), w)
        out["of_best"][LABELS[tool]] = r.throughput_bps / best_bps if r.completed else 0.0
    return out


def _stage(w, root: Path) -> Path:
    """Write ``w``'s files under ``root`` (random bytes, one block reused: the receiver hashes whatever it gets)."""
    block = os.urandom(8 << 20)
    root.mkdir(parents=True, exist_ok=True)
    for f in w.files:
        p = root / f.path
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "wb") as out:
            left = f.size
            while left > 0:
                n = min(left, len(block))
                out.write(block[:n])
                left -= n
    return root / TAILS


def fixed_candidates(rank: list, streams: int = 32, top: int = 2) -> list[tuple[int, int, int]]:
    """The simulator's best ``top`` grid points with at most ``streams`` streams (cc x p): the simulator charges
    nothing per stream, and on this 2-core machine its favourites with 256-512 streams ran at 0.1-0.4 of the link
    (a first run of this bench), so they would not be anyone's best fixed setting."""
    return [pt for _, pt in rank if pt[0] * pt[1] <= streams][:top]


def one_seed(seed: int, *, sim_only: bool, rx=None, work: Path | None = None, repeat: int = 1,
             timeout_s: float = 300.0) -> dict:
    from fstream_bench.tuning.wan import ranked

    w = build(TAILS, bandwidth_bps=BW, rtt_s=RTT, seed=seed, interval_s=0.0)
    rank = ranked(w, BW, RTT, BUF)
    row = {"seed": seed, "workload": describe(w), "files": len(w.files), "bytes": w.total_bytes,
           "sim": _sim_row(w, rank)}
    if sim_only:
        return row
    from fstream_bench.peers.fstream import send

    src = _stage(w, work / "src" / str(seed))
    fixed = {f"fstream-fixed:{cc}x{p}x{pp}": {"cc": cc, "p": p, "pp": pp} for cc, p, pp in fixed_candidates(rank)}
    opts = {"bandwidth": f"{BW:.0f}bps", "rtt": f"{RTT * 1000:g}ms"}
    rounds = []
    for k in range(repeat):  # every tool once per round, in the same order: ratios are taken within a round
        got = {}
        for tool in (STATIC, DEFAULT, ABLATION, *fixed):
            name, _, variant = tool.removeprefix("fstream-").partition("@")
            tuner = name.partition(":")[0]
            extra = {**opts, **fixed.get(tool, {}), **({"variant": variant} if variant else {})}
            dest = f"s{seed}-r{k}-{tool.replace(':', '_').replace('@', '_')}"
            r = send(rx, [src], dest, tuner=tuner, options=extra, label=tool, timeout=timeout_s)
            shutil.rmtree(Path(rx.root) / dest, ignore_errors=True)
            got[tool] = {"ok": r.ok, "throughput_bps": r.throughput_bps if r.ok else 0.0, "seconds": r.seconds,
                         "error": r.error[:300], "cpu_src_s": r.cpu_src_s,
                         "reasons": [iv["reason"] for iv in r.intervals] if tool in (DEFAULT, ABLATION) else None,
                         "tail_decisions": sum("tails:" in iv["reason"] for iv in r.intervals)}
            print(f"  seed {seed} round {k + 1}: {tool}: {'ok' if r.ok else 'FAILED'} {r.seconds:.1f} s, "
                  f"{got[tool]['throughput_bps'] / 1e6:.0f} Mbit/s", flush=True)
        cands = {t: v["throughput_bps"] for t, v in got.items() if v["ok"] and (t in fixed or t == STATIC)}
        best_tool = max(cands, key=cands.get) if cands else None
        best = cands.get(best_tool, 0.0) if best_tool else 0.0
        for v in got.values():
            v["of_best"] = v["throughput_bps"] / best if best else 0.0
        rounds.append({"best_fixed": best_tool, "best_fixed_bps": best, "runs": got})
    shutil.rmtree(src.parent, ignore_errors=True)
    row["wan"] = rounds
    return row


def _line(row: dict) -> str:
    sim = row["sim"]
    text = (f"seed {row['seed']}: {row['files']} files, {row['bytes'] / 1e9:.2f} GB; simulator (best fixed "
            f"{sim['best_fixed']}): " + ", ".join(f"{k} {v:.3f}" for k, v in sim["of_best"].items()))
    for k, wan in enumerate(row.get("wan", [])):
        text += (f"; WAN round {k + 1} (best fixed {(wan['best_fixed'] or '-').replace('fstream-', '')}, "
                 f"{wan['best_fixed_bps'] / 1e6:.0f} Mbit/s): "
                 + ", ".join(f"{LABELS[t]} {wan['runs'][t]['of_best']:.3f}" for t in (DEFAULT, ABLATION, STATIC)
                             if t in wan["runs"]))
    return text


def figure(result: Path, png: Path) -> None:
    """Every run of ``result``: each tuner's fraction of the best fixed setting, WAN and simulator."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads(result.read_text())
    fig, ax = plt.subplots(figsize=(8, 4))
    for k, (where, label) in enumerate((("wan", "WAN"), ("sim", "simulator"))):
        for j, tool in enumerate((DEFAULT, ABLATION, STATIC)):
            ys = ([rd["runs"][tool]["of_best"] for r in doc["rows"] for rd in r.get("wan", []) if tool in rd["runs"]]
                  if where == "wan" else [r["sim"]["of_best"][LABELS[tool]] for r in doc["rows"]])
            x = k * 4 + j
            ax.scatter([x] * len(ys), ys, s=18, color=f"C{j}", label=LABELS[tool] if k == 0 else None)
    ax.axhline(0.95, color="grey", ls="--", lw=1)
    ax.set_xticks([1, 5], ["WAN (1 Gbit/s, 40 ms)", "simulator"])
    ax.set_ylabel("throughput / best fixed setting")
    ax.set_title(f"backlogged mixes, every run (seeds {', '.join(str(s) for s in doc['seeds'])})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _on_wan(seeds: list[int], rows: list[dict], args: argparse.Namespace) -> dict:
    """Build the emulated WAN once, check it, and run every seed on it; returns the selfcheck."""
    from fstream_bench.peers.base import Sites
    from fstream_bench.peers.fstream import FStreamReceiver
    from fstream_bench.wan import netns
    from fstream_bench.wan.path import WanConfig, WanPath
    from fstream_bench.wan.selfcheck import selfcheck

    work = Path("/dev/shm") / f"fstream-tails-{os.getpid()}"
    path = WanPath(WanConfig(rate_bps=BW, rtt_s=RTT, buffer_bytes=BUF, run_id="tl"))
    path.up()
    try:
        check = selfcheck(path, duration=3.0)
        sites = Sites(src_host=path.src_ip, dst_host=path.dst_ip, src_prefix=tuple(netns.ns_exec_argv(path.src_ns, [])),
                      dst_prefix=tuple(netns.ns_exec_argv(path.dst_ns, [])), name="wan")
        with FStreamReceiver(sites=sites, workdir=work / "rx", root=work / "dst") as rx:
            for seed in seeds:
                rows.append(one_seed(seed, sim_only=False, rx=rx, work=work, repeat=args.repeat,
                                     timeout_s=args.timeout))
                print(_line(rows[-1]), flush=True)
    finally:
        path.down()
        shutil.rmtree(work, ignore_errors=True)
    return check


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"fstream bench {COMMAND}", description=__doc__.splitlines()[0])
    add_seed_args(ap)
    ap.add_argument("--sim-only", action="store_true", help="the simulator only (no root, no WAN)")
    ap.add_argument("--timeout", type=float, default=300.0, help="per tool and seed on the WAN (seconds)")
    ap.add_argument("--results", default=str(RESULTS_DIR))
    ap.add_argument("--repeat", type=int, default=2, help="rounds per seed on the WAN (every tool once per round)")
    ap.add_argument("--figure", nargs=2, metavar=("RESULT", "PNG"), help="draw a result file and exit")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    if args.figure:
        figure(Path(args.figure[0]), Path(args.figure[1]))
        print(f"figure: {args.figure[1]}")
        return 0
    seeds = seeds_from(ap, args)
    if not args.sim_only and os.geteuid() != 0:
        ap.error("the WAN needs root (network namespaces); --sim-only runs the simulator alone")
    prov = provenance.start(COMMAND, argv, MODULES)
    rows, check = [], None
    if args.sim_only:
        for seed in seeds:
            rows.append(one_seed(seed, sim_only=True))
            print(_line(rows[-1]), flush=True)
    else:
        check = _on_wan(seeds, rows, args)
    provenance.finish(prov)
    doc = {"bench": COMMAND, "provenance": prov, "seeds": seeds, "seeds_fresh": not args.seeds,
           "selfcheck": check,
           "config": {"sim_only": args.sim_only, "repeat": args.repeat,
                      "path": {"bandwidth_bps": BW, "rtt_s": RTT, "tcp_buffer": BUF},
                      "load_average": os.getloadavg(), "started": time.strftime("%Y-%m-%d %H:%M:%S")},
           "rows": rows}
    path, _md = write_result(args.results, COMMAND, doc, "\n".join(f"- {_line(r)}" for r in rows))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
