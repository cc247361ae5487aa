"""Issue #11 on the emulated WAN: two agents share one path through an ADAPT stream pool, beside the same two without.

``python -m fstream_bench.tuning.pools_wan [--size 2GB] [--stagger 5s] [--s-pmax 16 --s-cmax 16 --s-i 4
--s-u 4]`` (root).

One receiver at the destination; one Redis reached over a unix socket from both namespaces; two
``fstream send --tuner fstream`` of equal datasets (large files) at the source, the second started
``--stagger`` after the first. Run twice: ``--pool`` (both hold grants from the pair's pool) and without.
Samples the pool's grants every 0.5 s (the report's Figures 5-8: streams per client over time) and
reports, from the agents' own interval records: the aggregate while both ran as a fraction of the
path's selfchecked ``iperf3 -P 16`` rate, and Jain's fairness index of their rates over that overlap.
Writes ``report.md``, ``summary.json`` and ``grants.png`` into a results directory.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from fstream_bench.core import provenance
from fstream_bench.core.unix_redis import UnixRedis
from fstream_bench.peers import fstream as fs_peer
from fstream_bench.tuning.qos import build_dataset
from fstream_bench.wan.rig import add_path_args, machine_line, open_bench, selfcheck_line, send_json
from fstream_provider.model.units import parse_duration, parse_size

#: what a pools-wan result exercised (``provenance``): the agents, the bus's pools, the WAN rig and testbed,
#: the peers and the dataset builder
MODULES = (*provenance.AGENT, "fstream_bench.tuning.pools_wan", "fstream_bench.tuning.qos", "fstream_bench.wan.rig",
           "fstream_bench.wan", "fstream_bench.peers", "fstream_bench.core.report", "fstream_bench.core.workload_gen",
           "fstream_bench.core.cpu_meter", "fstream_bench.core.children", "fstream_bench.core.unix_redis")


def _redis(workdir: Path) -> tuple[subprocess.Popen, str]:
    """A throw-away Redis on ``<workdir>/redis.sock`` (the embedded server's binary): its process and URL."""
    from fstream_provider.bus.embedded import find_redis_server

    srv = UnixRedis(workdir, exe=find_redis_server()).__enter__()
    return srv.proc, srv.url


def _rates(intervals: list[dict], t0: float) -> list[tuple[float, float]]:
    """(absolute end time, bits/s) per interval record of one sender, which started at ``t0``."""
    return [(t0 + iv["t"], iv["bytes"] * 8 / iv["dt"]) for iv in intervals if iv.get("dt")]


def jain(rates: list[float]) -> float:
    """Jain's fairness index of ``rates`` (1: all equal; 1/n: one takes everything)."""
    return sum(rates) ** 2 / (len(rates) * sum(r * r for r in rates)) if rates and any(rates) else 0.0


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]], *, lead_s: float = 2.0,
             tail_s: float = 1.0) -> tuple[float, float, float, float]:
    """Over the time both moved data (points are (time, bits/s)), less ``lead_s`` after the later start (its
    start-up) and ``tail_s`` before the earlier end: mean rate of each, the aggregate and Jain's index."""
    if not a or not b:
        return 0.0, 0.0, 0.0, 0.0
    lo = max(a[0][0], b[0][0]) + lead_s
    hi = min(a[-1][0], b[-1][0]) - tail_s
    ra = [r for t, r in a if lo <= t <= hi]
    rb = [r for t, r in b if lo <= t <= hi]
    if not ra or not rb:
        return 0.0, 0.0, 0.0, 0.0
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    return ma, mb, ma + mb, jain([ma, mb])


def _plot(samples: list[dict], runs: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    order: list[str] = []  # clients (job ids) by first grant: the agents started in that order
    for s in samples:
        order += [c for c in sorted(s["grants"]) if c not in order]
    for name, client in zip(("agent a", "agent b", "agent c", "agent d"), order):
        a1.step([s["t"] for s in samples], [s["grants"].get(client, 0) for s in samples], where="post",
                label=f"{name} (job {client[:8]})")
    a1.set_ylabel("streams granted")
    a1.set_title("stream pool grants over time (ADAPT Greedy, Redis) and each agent's rate")
    a1.legend(fontsize=8)
    for name, r in runs.items():
        pts = r["rates"]
        a2.plot([t for t, _ in pts], [v / 1e6 for _, v in pts], lw=1, label=name)
    a2.set_ylabel("Mbit/s")
    a2.set_xlabel("seconds")
    a2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_path_args(ap, "tb11p")
    ap.add_argument("--size", default="2GB", help="each agent's dataset (default 2GB)")
    ap.add_argument("--stagger", default="5s", help="the second agent starts this much later")
    ap.add_argument("--s-pmax", type=int, default=16)
    ap.add_argument("--s-cmax", type=int, default=16)
    ap.add_argument("--s-i", type=int, default=4)
    ap.add_argument("--s-u", type=int, default=4)
    args = ap.parse_args(argv)
    prov = provenance.start("pools-wan", list(sys.argv[1:] if argv is None else argv), MODULES)
    size, stagger = parse_size(args.size), parse_duration(args.stagger)
    out = Path(args.results) / f"pools-wan-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fstream-pools-", dir="/dev/shm"))
    bench = open_bench(args)
    redis_proc, url = _redis(work)
    summary: dict = {"machine_line": machine_line(), "selfcheck_line": selfcheck_line(bench.selfcheck),
                     "policy": {"s_pmax": args.s_pmax, "s_cmax": args.s_cmax, "s_i": args.s_i, "s_u": args.s_u},
                     "size_bytes": size, "stagger_s": stagger, "modes": {}, "provenance": prov}
    print(summary["machine_line"], flush=True)
    print(summary["selfcheck_line"], flush=True)
    link = bench.selfcheck.get("parallel_bps") or bench.bandwidth_bps
    try:
        from fstream_provider.bus.client import connect
        from fstream_provider.bus.keys import Keys
        from fstream_provider.bus.pools import StreamPools
        from fstream_provider.tuning.policy import GreedyPolicy

        pools = StreamPools(connect(url), Keys())
        srcs = {n: work / f"src-{n}" for n in ("a", "b")}
        for n, root in srcs.items():
            build_dataset("large", size, root, work / "uniq", seed=ord(n))
        with fs_peer.FStreamReceiver(sites=bench.sites, workdir=work / "rx", root=work / "dst") as rx:
            dst = f"{bench.sites.dst_host}:{rx.port}"
            pools.configure(socket.gethostname(), dst, GreedyPolicy(args.s_pmax, args.s_cmax, args.s_i, args.s_u))
            for mode in ("pool", "no pool"):
                runs: dict = {}
                samples: list[dict] = []
                stop = threading.Event()
                t0 = time.monotonic()

                def sample() -> None:
                    while not stop.wait(0.5):
                        st = pools.status(socket.gethostname(), dst)
                        samples.append({"t": round(time.monotonic() - t0, 2),
                                        "grants": {c: g["streams"] for c, g in st["grants"].items()}})

                def run(name: str) -> None:
                    start = time.monotonic()
                    opts = {"redis": url, "pool": mode == "pool", "bandwidth": args.rate, "rtt": args.rtt}
                    r = send_json(bench.sites, rx, [srcs[name]], f"{mode.replace(' ', '')}-{name}", tuner="fstream",
                                  options=opts, label=f"{mode.replace(' ', '-')}-{name}", timeout=900)
                    runs[f"agent {name}"] = {"ok": r.ok, "error": r.error, "seconds": r.self_seconds,
                                             "throughput_bps": r.self_throughput_bps,
                                             "rates": _rates(r.intervals, start - t0),
                                             "max_streams": max((sum(c["cc"] * c["p"] for c in iv["clusters"].values())
                                                                 for iv in r.intervals if iv.get("clusters")),
                                                                default=0)}

                sampler = threading.Thread(target=sample, daemon=True)
                sampler.start()
                ta = threading.Thread(target=run, args=("a",))
                ta.start()
                time.sleep(stagger)
                tb = threading.Thread(target=run, args=("b",))
                tb.start()
                ta.join()
                tb.join()
                stop.set()
                sampler.join(5)
                ma, mb, agg, jain = _overlap(runs["agent a"]["rates"], runs["agent b"]["rates"])
                summary["modes"][mode] = {"runs": runs, "samples": samples, "overlap_a_bps": ma, "overlap_b_bps": mb,
                                          "aggregate_bps": agg, "aggregate_of_link": agg / link if link else 0.0,
                                          "jain": jain,
                                          "left_in_pool": pools.status(socket.gethostname(), dst)["allocated"]}
                print(f"{mode}: aggregate {agg / 1e6:.0f} Mbit/s = {agg / link:.2f} of the link, Jain {jain:.3f}, "
                      f"max streams a/b {runs['agent a']['max_streams']}/{runs['agent b']['max_streams']}", flush=True)
                if mode == "pool":
                    _plot(samples, runs, out / "grants.png")
                for child in (work / "dst").iterdir():  # the receiver keeps its root: empty it
                    shutil.rmtree(child, ignore_errors=True)
    finally:
        redis_proc.terminate()
        redis_proc.wait(10)
        bench.close()
        shutil.rmtree(work, ignore_errors=True)
    provenance.finish(prov)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    lines = ["# Two agents, one path: stream pool vs none\n", summary["machine_line"], "", summary["selfcheck_line"],
             "",
             f"`python -m fstream_bench.tuning.pools_wan {' '.join(argv or [])}`; each agent {size / 1e9:.1f} GB of "
             f"large files, the second {stagger:g} s later; pool Greedy {summary['policy']}.", "",
             "| mode | agent a Mbit/s (overlap) | agent b | aggregate / link | Jain | max streams a / b "
             "| a, b total s |",
             "|---|---|---|---|---|---|---|"]
    for mode, m in summary["modes"].items():
        ra, rb = m["runs"]["agent a"], m["runs"]["agent b"]
        lines.append(f"| {mode} | {m['overlap_a_bps'] / 1e6:.0f} | {m['overlap_b_bps'] / 1e6:.0f} | "
                     f"{m['aggregate_of_link']:.2f} | {m['jain']:.3f} | {ra['max_streams']} / {rb['max_streams']} | "
                     f"{ra['seconds']}, {rb['seconds']} |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
