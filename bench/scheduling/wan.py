"""Issue #11 on the emulated WAN: a burst of mixed jobs through several agents, first come first served vs STEAL.

``python -m fstream_bench.scheduling.wan [--agents 8] [--batch 1.5GB] [--interactive 300MB] [--small 30MB]`` (root;
``--loopback`` for a smoke run).

One receiver at the destination; one Redis over a unix socket; ``--agents`` ``fstream agent`` processes at
the source, all with ``--scheduler fifo`` in one run and ``--scheduler steal`` in the other (same jobs, same
order, a namespace per run). Every job holds a grant from the pair's stream pool (``--pool``), so the
agents share the path's streams either way. The fifo run is FStream without priorities: its jobs are
submitted without a class (all interactive), so the pool is plain Greedy; under ``steal`` they carry their
class, and the pool too lets interactive jobs take streams from batch ones. The burst, submitted from the host:
two batch jobs at t=0, two equal interactive jobs at t=3 s, three small interactive jobs at t=6 s. The scheduler's
model is given the path (``fstream schedule set``: the selfchecked ``iperf3 -P 16`` rate as the maximum, one
stream's rate as the unit).

Reported per run: each job's turnaround and bounded slowdown (turnaround / max(1 s, ideal), ideal = size at
the path's rate + 1 s start-up), averages per class, the aggregate over the burst (all bytes / first claim
to last done) as a fraction of the path, Jain's index of the two equal interactive jobs over their overlap,
preemptions, and for every preempted job whether its last attempt sent only what was missing
(``bytes_sent + resumed_bytes + skipped files' bytes == size``). Writes ``report.md``, ``summary.json``,
``slowdown.png`` and ``timeline.png`` (jobs running over time, stream grants) into a results directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from fstream_bench.core import provenance
from fstream_bench.peers import fstream as fs_peer
from fstream_bench.tuning.pools_wan import _overlap, _redis, jain
from fstream_bench.tuning.qos import build_dataset
from fstream_bench.wan.rig import add_path_args, machine_line, open_bench, selfcheck_line
from fstream_provider.model.units import parse_size

#: what a sched-wan result exercised (``provenance``): the agents and their scheduler over the bus, the
#: WAN rig and testbed, the peers, the pools bench's helpers and the dataset builder
MODULES = (*provenance.AGENT, "fstream_bench.scheduling.wan", "fstream_bench.tuning.pools_wan",
           "fstream_bench.tuning.qos", "fstream_bench.wan.rig", "fstream_bench.wan", "fstream_bench.peers",
           "fstream_bench.core.report", "fstream_bench.core.workload_gen", "fstream_bench.core.cpu_meter",
           "fstream_bench.core.children", "fstream_bench.core.unix_redis")

# (name, class, dataset kind, size option, submitted at s)
BURST = [("batch-1", "batch", "large", "batch", 0.0), ("batch-2", "batch", "large", "batch", 0.0),
         ("inter-1", "interactive", "large", "interactive", 3.0),
         ("inter-2", "interactive", "large", "interactive", 3.0),
         ("small-1", "interactive", "small", "small", 6.0), ("small-2", "interactive", "small", "small", 6.0),
         ("small-3", "interactive", "small", "small", 6.0)]


def bounded_slowdown(turnaround_s: float, ideal_s: float, bound_s: float = 1.0) -> float:
    """SEAL §6's metric: turnaround over the ideal time, the ideal bounded below by ``bound_s``, at least 1."""
    return max(1.0, turnaround_s / max(bound_s, ideal_s))


def overlap_rates(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> tuple[float, float]:
    """Mean rate of each of two jobs over the whole time both moved data (points are (time, bits/s))."""
    ma, mb, _agg, _jain = _overlap(a, b, lead_s=0.0, tail_s=0.0)
    return ma, mb


def _policy(logdir: Path, secret: Path, roots: list[Path], destination: str,
            allow_hardlinks: bool = False) -> tuple[Path, Path]:
    """The agents' policy file (issues 32, 40: roots, the receiver as the one destination, the receiver's key, the
    bench as the one submitter with its Ed25519 public key) and the bench's submitter private key.
    ``allow_hardlinks``: for datasets whose names are hard links to a few contents (issue 40 refuses them
    otherwise)."""
    from fstream_provider.authz.ed25519 import ensure_pair

    key = logdir / "bench-submitter.key"
    ensure_pair(key, "bench")
    policy = logdir / "policy.toml"
    policy.write_text(f'[agent]\nroots = {json.dumps([str(r) for r in roots])}\n'
                      f'destinations = {json.dumps([destination])}\n'
                      + ("allow_hardlinks = true\n" if allow_hardlinks else "")
                      + f'[agent.keys]\ndefault = "{secret}"\n'
                      f'[submitters.bench]\npublic_key_file = "{key}.pub"\n')
    return policy, key


def _agents(bench, url: str, ns: str, mode: str, n: int, policy: Path, logdir: Path,
            extra: list[str] = ()) -> list[subprocess.Popen]:
    procs = []
    for i in range(n):
        argv = fs_peer.fstream_argv() + ["agent", "--redis", url, "--namespace", ns, "--scheduler", mode,
                                         "--name", f"{mode}-{i}", "--policy", str(policy), "--no-history",
                                         *(extra if mode != "fifo" else ())]
        log = open(logdir / f"agent-{mode}-{i}.log", "w")
        env = {**os.environ, "FSTREAM_STATE_DIR": str(logdir / f"state-{mode}-{i}")}
        procs.append(subprocess.Popen(bench.sites.argv("src", argv), stdout=log, stderr=subprocess.STDOUT, env=env))
    return procs


def run_burst(bench, url: str, rx, srcs: dict[str, tuple[Path, int]], mode: str, n_agents: int, link: float,
              unit: float, logdir: Path, agent_args: list[str] = ()) -> dict:
    from fstream_provider.bus.client import connect
    from fstream_provider.bus.jobs import JobStore
    from fstream_provider.bus.keys import Keys
    from fstream_provider.bus.pools import StreamPools
    from fstream_provider.model.spec import TransferSpec
    from fstream_provider.tuning.policy import GreedyPolicy

    ns = f"sched-{mode}"
    keys = Keys(ns)
    client = connect(url)
    dst = f"{bench.sites.dst_host}:{rx.port}"
    client.hset(keys.sched_config(), mapping={f"cap:{dst}": link, f"unit:{dst}": unit,
                                              f"cap:{socket.gethostname()}": link,
                                              f"unit:{socket.gethostname()}": unit})
    pools = StreamPools(client, keys)
    pools.configure(socket.gethostname(), dst, GreedyPolicy(s_pmax=16, s_cmax=16, s_i=4, s_u=4))
    from fstream_provider.authz.signing import Signer

    policy, key = _policy(logdir, rx.secret, [p for p, _ in srcs.values()], rx.url(""))
    store = JobStore(client, keys=keys, signer=Signer.from_file("bench", str(key)))
    procs = _agents(bench, url, ns, mode, n_agents, policy, logdir, agent_args)
    samples: list[dict] = []
    stop = threading.Event()
    jobs: dict[str, str] = {}
    t0 = time.time()

    def sample() -> None:
        while not stop.wait(0.5):
            st = pools.status(socket.gethostname(), dst)
            running = [j for j in jobs.values() if (store.get(j) or None) and store.get(j).state == "running"]
            samples.append({"t": round(time.time() - t0, 2), "running": running,
                            "grants": {c: g["streams"] for c, g in st["grants"].items()}})

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        time.sleep(2.0)  # agents up
        t0 = time.time()
        sampler.start()
        for name, klass, _kind, _opt, at in BURST:
            time.sleep(max(0.0, t0 + at - time.time()))
            src, _size = srcs[name]
            spec = TransferSpec.from_options([str(src)], f"fstream://{dst}/{mode}/{name}",
                                             tuner="fstream", pool=True, label=name,
                                             priority_class=klass if mode != "fifo" else "interactive",
                                             bandwidth=bench.bandwidth_bps, rtt=bench.rtt_s)
            jobs[name], _ = store.submit(spec)
        done = {name: store.wait(j, timeout=1200) for name, j in jobs.items()}
    finally:
        stop.set()
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    out: dict = {"jobs": {}, "samples": samples, "t0": t0}
    first_claim, last_done, total = None, 0.0, 0
    for name, klass, _k, _o, _at in BURST:
        st, size = done[name], srcs[name][1]
        events = [e for _, e in store.events(jobs[name], count=100_000)]
        claims = [e["ts"] for e in events if e["kind"] == "claimed"]
        first_claim = min([first_claim or claims[0]] + claims[:1]) if claims else first_claim
        last_done = max(last_done, st.updated_at)
        total += size
        ideal = size * 8 / link + 1.0
        turnaround = st.updated_at - st.created_at
        res = st.result or {}
        rates = [(e["ts"] - t0, e["throughput_bps"]) for e in events if e["kind"] == "interval" and e.get("dt")]
        out["jobs"][name] = {
            "class": klass, "size": size, "state": st.state, "turnaround_s": turnaround, "ideal_s": ideal,
            "slowdown": bounded_slowdown(turnaround, ideal), "attempts": st.attempt, "preemptions": st.preemptions,
            "resent_nothing": res.get("bytes_sent", 0) + res.get("resumed_bytes", 0) + _skipped(events) == size,
            "skipped_bytes": _skipped(events),
            "resumed_bytes": res.get("resumed_bytes", 0), "bytes_sent": res.get("bytes_sent", 0),
            "runs": _runs(events, t0), "rates": rates,
            "preempted_by": [e.get("by") for e in events if e["kind"] == "preempted"]}
    span = last_done - (first_claim or t0)
    out["aggregate_bps"] = total * 8 / span if span > 0 else 0.0
    out["aggregate_of_link"] = out["aggregate_bps"] / link
    a, b = overlap_rates(out["jobs"]["inter-1"]["rates"], out["jobs"]["inter-2"]["rates"])
    out["jain_interactive"] = jain([a, b])
    for klass in ("batch", "interactive"):
        sl = [j["slowdown"] for j in out["jobs"].values() if j["class"] == klass]
        out[f"avg_slowdown_{klass}"] = sum(sl) / len(sl)
        out[f"worst_slowdown_{klass}"] = max(sl)
    return out


def _skipped(events: list[dict]) -> int:
    """Bytes of the files the last attempt skipped (verified at the destination by an earlier attempt)."""
    last = max((i for i, e in enumerate(events) if e["kind"] == "claimed"), default=0)
    return sum(int(e.get("size", 0)) for e in events[last:] if e["kind"] == "file" and e.get("status") == "skipped")


def _runs(events: list[dict], t0: float) -> list[tuple[float, float]]:
    """(start, end) of each attempt, seconds after ``t0``: claimed -> preempted/released/done."""
    runs, start = [], None
    for e in events:
        if e["kind"] == "claimed":
            start = e["ts"] - t0
        elif e["kind"] in ("preempted", "released", "done") and start is not None:
            runs.append((start, e["ts"] - t0))
            start = None
    return runs


def _plots(summary: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(summary["modes"])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.35
    for i, klass in enumerate(("interactive", "batch")):
        vals = [summary["modes"][m][f"avg_slowdown_{klass}"] for m in modes]
        ax.bar([x + i * width for x in range(len(modes))], vals, width, label=klass)
    ax.set_xticks([x + width / 2 for x in range(len(modes))], modes)
    ax.set_ylabel("average bounded slowdown")
    ax.set_title("burst of mixed jobs on the emulated WAN: slowdown per class")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "slowdown.png", dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(len(modes), 1, figsize=(10, 2.6 * len(modes)), sharex=True)
    for ax, m in zip(axes if len(modes) > 1 else [axes], modes):
        jobs = summary["modes"][m]["jobs"]
        for y, (name, j) in enumerate(jobs.items()):
            color = "tab:orange" if j["class"] == "batch" else "tab:blue"
            ax.broken_barh([(s, e - s) for s, e in j["runs"]], (y - 0.35, 0.7), color=color)
        ax.set_yticks(range(len(jobs)), list(jobs))
        ax2 = ax.twinx()
        sm = summary["modes"][m]["samples"]
        ax2.step([s["t"] for s in sm], [sum(s["grants"].values()) for s in sm], where="post", color="k", lw=0.8)
        ax2.set_ylabel("streams granted")
        ax.set_title(f"{m}: jobs running (orange batch, blue interactive; gaps = preempted) and pool grants")
    axes_last = axes[-1] if len(modes) > 1 else axes
    axes_last.set_xlabel("seconds after the first submission")
    fig.tight_layout()
    fig.savefig(out / "timeline.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_path_args(ap, "tb11s")
    ap.add_argument("--agents", type=int, default=8,
                    help="agents at the source (default 8, more than the burst's 7 jobs: an agent runs one job at a "
                         "time, and the scheduler, not the number of agents, should decide what runs)")
    ap.add_argument("--batch", default="1.5GB", help="each batch job (default 1.5GB)")
    ap.add_argument("--interactive", default="300MB", help="each equal interactive job (default 300MB)")
    ap.add_argument("--small", default="30MB", help="each small interactive job (default 30MB)")
    ap.add_argument("--modes", default="fifo,steal", help="agent schedulers to compare (default fifo,steal)")
    ap.add_argument("--agent-args", default="", help="more `fstream agent` options for the seal/steal agents")
    args = ap.parse_args(argv)
    prov = provenance.start("sched-wan", list(sys.argv[1:] if argv is None else argv), MODULES)
    sizes = {"batch": parse_size(args.batch), "interactive": parse_size(args.interactive),
             "small": parse_size(args.small)}
    out = Path(args.results) / f"sched-wan-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fstream-sched-", dir="/dev/shm"))
    bench = open_bench(args)
    redis_proc, url = _redis(work)
    summary: dict = {"machine_line": machine_line(), "selfcheck_line": selfcheck_line(bench.selfcheck),
                     "agents": args.agents, "sizes": sizes, "modes": {}, "load_before": os.getloadavg()}
    print(summary["machine_line"], flush=True)
    print(summary["selfcheck_line"], flush=True)
    link = bench.selfcheck.get("parallel_bps") or bench.bandwidth_bps
    unit = bench.selfcheck.get("single_stream_bps") or link / 8
    try:
        srcs: dict[str, tuple[Path, int]] = {}
        for i, (name, _klass, kind, opt, _at) in enumerate(BURST):
            root = work / "src" / name
            build_dataset(kind, sizes[opt], root, work / "uniq", seed=100 + i)
            srcs[name] = (root, sum(p.stat().st_size for p in root.rglob("*") if p.is_file()))
        with fs_peer.FStreamReceiver(sites=bench.sites, workdir=work / "rx", root=work / "dst") as rx:
            for mode in args.modes.split(","):
                m = run_burst(bench, url, rx, srcs, mode, args.agents, link, unit, work, args.agent_args.split())
                summary["modes"][mode] = m
                print(f"{mode}: aggregate {m['aggregate_of_link']:.2f} of the link; slowdown interactive avg "
                      f"{m['avg_slowdown_interactive']:.2f} worst {m['worst_slowdown_interactive']:.2f}, batch avg "
                      f"{m['avg_slowdown_batch']:.2f}; Jain(inter-1, inter-2) {m['jain_interactive']:.3f}; "
                      f"preemptions {sum(j['preemptions'] for j in m['jobs'].values())}", flush=True)
                for child in (work / "dst").iterdir():
                    shutil.rmtree(child, ignore_errors=True)
    finally:
        for log in work.glob("agent-*.log"):  # the agents' own account of every decision
            shutil.copy(log, out / log.name)
        redis_proc.terminate()
        redis_proc.wait(10)
        bench.close()
        shutil.rmtree(work, ignore_errors=True)
    summary["load_after"] = os.getloadavg()
    summary["provenance"] = provenance.finish(prov)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    _plots(summary, out)
    lines = ["# A burst of mixed jobs through several agents: fifo vs STEAL\n", summary["machine_line"], "",
             summary["selfcheck_line"], "",
             f"`python -m fstream_bench.scheduling.wan {' '.join(argv or [])}`; {args.agents} agents, every job with "
             f"`--pool` (Greedy 16/16/4/4); load average before {summary['load_before'][0]:.2f}.", "",
             "| scheduler | interactive avg / worst slowdown | batch avg / worst | aggregate / link | "
             "Jain (2 equal interactive) | preemptions | preempted jobs resent nothing |",
             "|---|---|---|---|---|---|---|"]
    for mode, m in summary["modes"].items():
        pre = [j for j in m["jobs"].values() if j["preemptions"]]
        lines.append(f"| {mode} | {m['avg_slowdown_interactive']:.2f} / {m['worst_slowdown_interactive']:.2f} | "
                     f"{m['avg_slowdown_batch']:.2f} / {m['worst_slowdown_batch']:.2f} | {m['aggregate_of_link']:.2f} "
                     f"| {m['jain_interactive']:.3f} | {sum(j['preemptions'] for j in pre)} | "
                     f"{sum(j['resent_nothing'] for j in pre)}/{len(pre)} |")
    lines += ["", "| scheduler | job | class | MB | turnaround s | slowdown | attempts |",
              "|---|---|---|---|---|---|---|"]
    for mode, m in summary["modes"].items():
        for name, j in m["jobs"].items():
            lines.append(f"| {mode} | {name} | {j['class']} | {j['size'] / 1e6:.0f} | {j['turnaround_s']:.1f} | "
                         f"{j['slowdown']:.2f} | {j['attempts']} |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
