"""``fstream bench deadline``: issue 27's ETA and deadline goals, in the simulator and on the emulated WAN.

    fstream bench deadline sim                   # every workload x 3 fresh seeds: deadlines at 1.2/1.5/2x the oracle's
                                                 # minimum and one infeasible (0.8x); ETA error at 25/50/75 %
    fstream bench deadline wan                   # (root) 1 Gbit/s, 40 ms, 1 MiB: ETA error of backlogged runs,
                                                 # 10 deadline runs, the fewest-stream fixed setting, infeasible

Simulator (``fstream_provider.tuning.deadline_report``): the minimum is the fastest fixed (cc, p, pp) of
the grid; a run meets its deadline when everything landed by then; its stream-seconds are compared with
the grid setting that meets the same deadline with the fewest stream-seconds. Both deadline rules run
(``streams``, the default; issue 27's ``target``) in the simulator calibrated to the emulated WAN, on seeds
drawn fresh per run (recorded; deterministic given the seeds).

WAN: each workload runs once with the default ``fstream`` tuner (its time is the minimum we use: the
oracle's grid is not re-run on the WAN, see ``tuning_wan``; the tuner is within a few % of it there), and
its interval records score the ETA; then ``--runs`` deadline runs cycle through the factors, the
simulator's fewest-stream fixed setting for each factor runs once for the stream-seconds comparison, and
one 0.7x deadline measures when "infeasible" is first said. Writes ``deadline-<stamp>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

from fstream_bench.core import provenance
from fstream_bench.core import RESULTS_DIR

MODULES = (*provenance.AGENT, "fstream_bench.tuning.deadline", "fstream_bench.wan", "fstream_bench.wan.rig",
           "fstream_bench.peers", "fstream_bench.core.workload_gen", "fstream_bench.core.report")
FACTORS = (1.2, 1.5, 2.0)
#: what a backlogged run keeps of each interval record (the raw data to re-score an ETA rule offline)
RECORD_KEYS = ("t", "dt", "bytes", "bytes_total", "bytes_left", "files_pending", "active_files", "eta", "cc", "p",
               "throughput_bps", "target_bps", "deadline")


def _med(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)} if xs else {"n": 0}


def eta_points(intervals: list[dict], seconds: float, at=(0.25, 0.5, 0.75)) -> dict:
    """Relative ETA error of an agent's interval records when 25/50/75 % of the bytes had moved (``bytes_left``:
    the measure the ETA itself uses, bytes in flight counted as moved)."""
    out = {}
    for frac in at:
        rec = next((r for r in intervals if r.get("eta") and r.get("bytes_total") and r["eta"].get("basis") != "done"
                    and r["bytes_total"] - r.get("bytes_left", r["bytes_total"] - r["bytes_done"])
                    >= frac * r["bytes_total"]), None)
        if rec is None:
            out[str(frac)] = None
            continue
        truth = seconds - rec["t"]
        e = rec["eta"]
        out[str(frac)] = {"t": rec["t"], "eta_s": e["s"], "truth_s": truth,
                          "rel_error": abs(e["s"] - truth) / truth if truth > 0 else 0.0,
                          "covered": e["lo"] <= truth <= e["hi"], "basis": e["basis"]}
    return out


def stream_seconds(intervals: list[dict]) -> float:
    """Streams open (cc x p per cluster) times the interval, from an agent's records."""
    return sum(sum(c["cc"] * c["p"] for c in (r.get("clusters") or {}).values()) * float(r.get("dt") or 0)
               for r in intervals)


def eta_summary(cases: list[dict]) -> dict:
    by: dict[str, list[float]] = {}
    cov: dict[str, list[bool]] = {}
    for c in cases:
        for k, v in (c.get("eta") or {}).items():
            if v:
                by.setdefault(k, []).append(v["rel_error"])
                cov.setdefault(k, []).append(v["covered"])
    return {k: {**_med(v), "covered": sum(cov[k]) / len(cov[k])} for k, v in by.items()}


# -- the simulator ------------------------------------------------------------------------------------------------
def run_sim(args) -> dict:
    """Every workload x seed: both ``Deadline`` rules (``streams``, the default, and issue 27's ``target``)
    against the same fixed grid, in the simulator calibrated to the emulated WAN (``ablation.SIM_KW``: a
    stream keeps 0.65 of its window, measured there) unless ``--uncalibrated``. Seeds are drawn fresh per run
    and recorded (``--seed`` replays one)."""
    import random

    from fstream_provider.tuning.ablation import SIM_KW
    from fstream_provider.tuning.base import PathInfo
    from fstream_provider.tuning.deadline import STEERS
    from fstream_provider.tuning.deadline_report import case, eta_errors
    from fstream_provider.tuning.workloads import make_workload

    path = PathInfo(args.bandwidth, args.rtt, tcp_buffer=args.buffer, max_cc=32)
    sim_kw = {} if args.uncalibrated else dict(SIM_KW)
    seeds = args.seed or [random.SystemRandom().randrange(2**31) for _ in range(args.seeds)]
    rows, etas = [], []
    for seed in seeds:
        for name in args.workloads.split(","):
            w = make_workload(name, scale=args.scale, seed=seed, interval_s=0.0)
            t0 = time.process_time()
            for r in case(w, path, factors=FACTORS, infeasible=0.8, steers=STEERS, sim_kw=sim_kw):
                rows.append({**r, "seed": seed})
            etas.append({"workload": name, "seed": seed, "eta": eta_errors(w, path, sim_kw=sim_kw)})
            print(f"sim {name} seed {seed}: {time.process_time() - t0:.1f} CPU-s", flush=True)
    summary = {}
    for steer in STEERS:
        feasible = [r for r in rows if r["factor"] >= 1.0 and r["steer"] == steer]
        infeasible = [r for r in rows if r["factor"] < 1.0 and r["steer"] == steer]
        summary[steer] = {
            "met": sum(r["met"] for r in feasible), "feasible": len(feasible),
            "stream_ratio": {str(k): _med([r["stream_ratio"] for r in feasible if r["factor"] == k]) for k in FACTORS},
            "infeasible_reported_s": _med([r["infeasible_reported_s"] for r in infeasible
                                           if r["infeasible_reported_s"] is not None]),
            "infeasible_reported": sum(r["infeasible_reported_s"] is not None for r in infeasible),
            "infeasible_runs": len(infeasible)}
    return {"path": {"bandwidth_bps": args.bandwidth, "rtt_s": args.rtt, "tcp_buffer": args.buffer},
            "calibration": sim_kw, "seeds": seeds, "scale": args.scale, "rows": rows, "eta": etas,
            "summary": {**summary[STEERS[0]], "steers": summary, "eta": eta_summary(etas)}}


# -- the emulated WAN ---------------------------------------------------------------------------------------------
def run_wan(args) -> dict:
    from fstream_bench.peers import fstream as fs_peer
    from fstream_bench.wan.rig import open_bench, selfcheck_line, send_json
    from fstream_bench.core.workload_gen import build, materialize
    from fstream_provider.tuning.base import PathInfo
    from fstream_provider.tuning.deadline_report import fixed_runs
    from fstream_provider.tuning.sim import dtn_storage

    bench = open_bench(args)
    work = Path(args.workdir or f"/dev/shm/fstream-deadline-{os.getpid()}")
    out = {"selfcheck": selfcheck_line(bench.selfcheck), "backlogged": [], "deadline": [], "fixed": [],
           "infeasible": None, "path": {"bandwidth_bps": bench.bandwidth_bps, "rtt_s": bench.rtt_s}}
    base = {"bandwidth": f"{bench.bandwidth_bps:.0f}bps", "rtt": f"{bench.rtt_s * 1e3:g}ms",
            "sample_interval": "1s"}
    try:
        with fs_peer.FStreamReceiver(sites=bench.sites, workdir=work / "rx", root=work / "dst") as rx:
            def send(label: str, src: Path, tuner: str = "fstream", **opts):
                shutil.rmtree(work / "dst" / label, ignore_errors=True)
                r = send_json(bench.sites, rx, [src], label, tuner=tuner, options={**base, **opts}, label=label,
                              timeout=args.timeout)
                shutil.rmtree(work / "dst" / label, ignore_errors=True)
                return r

            staged = {}
            out["seed"] = seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
            for name in args.workloads.split(","):  # sizes drawn from a seed fresh per run (recorded)
                w = build(name, bandwidth_bps=bench.bandwidth_bps, rtt_s=bench.rtt_s, interval_s=0.0,
                          count_factor=args.count_factor, seed=seed)
                staged[name] = (w, materialize(w, work / "stage" / name).staging)
                r = send(f"min-{name}", staged[name][1])
                secs = r.self_seconds or r.seconds
                out["backlogged"].append({"workload": name, "files": len(w.files), "bytes": w.total_bytes,
                                          "ok": r.ok, "seconds": secs, "eta": eta_points(r.intervals, secs),
                                          "stream_seconds": stream_seconds(r.intervals), "error": r.error[:300],
                                          "records": [{k: iv.get(k) for k in RECORD_KEYS} for iv in r.intervals]})
                print(f"wan {name}: {secs:.1f} s, eta {out['backlogged'][-1]['eta']}", flush=True)
            name = args.deadline_workload
            w, src = staged[name]
            minimum = next(b["seconds"] for b in out["backlogged"] if b["workload"] == name)
            path = PathInfo(bench.bandwidth_bps, bench.rtt_s, tcp_buffer=args.buffer, max_cc=32)
            from fstream_provider.tuning.ablation import SIM_KW  # the simulator calibrated to this testbed

            runs = fixed_runs(w, path, storage=dtn_storage(bench.bandwidth_bps), **SIM_KW)
            for k in FACTORS:  # the simulator's fewest-stream setting that meets k x minimum, measured for real
                meeting = [f for f in runs if f.seconds <= k * minimum] or runs
                f = min(meeting, key=lambda f: f.stream_seconds)
                r = send(f"fixed-{k}", src, tuner="fixed", cc=f.cc, p=f.p, pp=f.pp)
                out["fixed"].append({"factor": k, "cc": f.cc, "p": f.p, "pp": f.pp, "ok": r.ok,
                                     "seconds": r.self_seconds or r.seconds, "met": r.ok and (r.self_seconds or
                                                                                          r.seconds) <= k * minimum,
                                     "stream_seconds": stream_seconds(r.intervals)})
            for i in range(args.runs):
                k = FACTORS[i % len(FACTORS)]
                deadline = k * minimum
                t0 = time.time()
                r = send(f"deadline-{i}", src, deadline=f"{deadline:.3f}s")
                landed = time.time() - t0
                last = next((iv["deadline"] for iv in reversed(r.intervals) if iv.get("deadline")), {})
                out["deadline"].append({"run": i, "factor": k, "deadline_s": deadline, "ok": r.ok,
                                        "seconds": r.self_seconds or r.seconds, "wall_s": landed,
                                        "met": r.ok and last.get("state") == "met",
                                        "stream_seconds": stream_seconds(r.intervals), "state": last.get("state"),
                                        "eta": eta_points(r.intervals, r.self_seconds or r.seconds),
                                        "records": [{k: iv.get(k) for k in RECORD_KEYS} for iv in r.intervals]})
                print(f"wan deadline {i} ({k}x = {deadline:.1f} s): {out['deadline'][-1]['seconds']:.1f} s, "
                      f"{last.get('state')}", flush=True)
            r = send("infeasible", src, deadline=f"{0.7 * minimum:.3f}s")
            first = next((iv["t"] for iv in r.intervals if (iv.get("deadline") or {}).get("state") == "infeasible"),
                         None)
            out["infeasible"] = {"deadline_s": 0.7 * minimum, "reported_at_s": first, "ok": r.ok}
    finally:
        bench.close()
        shutil.rmtree(work, ignore_errors=True)
    fixed = {f["factor"]: f["stream_seconds"] for f in out["fixed"]}
    out["summary"] = {
        "met": sum(d["met"] for d in out["deadline"]), "runs": len(out["deadline"]),
        "stream_ratio": {str(k): _med([d["stream_seconds"] / fixed[k] for d in out["deadline"]
                                       if d["factor"] == k and fixed.get(k)]) for k in FACTORS},
        "eta": eta_summary(out["backlogged"]), "infeasible_reported_at_s": out["infeasible"]["reported_at_s"]}
    return out


# -- the ETA replayed over committed records ----------------------------------------------------------------------
def replay_eta(records: list[dict], seconds: float, *, restart: bool, at=(0.25, 0.5, 0.75),
               link_bps: float | None = None) -> dict:
    """The live ETA's relative error at 25/50/75 % of the bytes, replayed from a run's trimmed interval records
    through ``EtaEstimator`` as the sender feeds it, with (``restart``) or without the window's restart at a
    layout change, and with the stated path rate as its floor (``link_bps``) or without."""
    from fstream_provider.tuning.eta import EtaEstimator, record_streams

    est, out = EtaEstimator(link_bps=link_bps), {}
    for r in records:
        if not r.get("dt"):
            continue
        est.add(r["t"], r["dt"], r["bytes"], busy=bool(r.get("bytes")) or bool(r.get("files_pending")),
                streams=record_streams(r) if restart else None)
        left, total = r.get("bytes_left"), r.get("bytes_total")
        if left is None or not total:
            continue
        e = est.estimate(left, (r.get("files_pending") or 0) + (r.get("active_files") or 0))
        for frac in at:
            if str(frac) not in out and e is not None and e.basis != "done" and total - left >= frac * total:
                truth = seconds - r["t"]
                out[str(frac)] = abs(e.s - truth) / truth if truth > 0 else 0.0
    return out


REPLAY_MODES = ("window", "restart", "link")  # issue 27's window; + the restart (issue 44); + the link floor


def run_replay(args) -> dict:
    """Every committed WAN result's backlogged runs, the ETA without and with the restart, and with the restart and
    the stated path rate as a floor (no transfer runs). The path rate is the result's ``path`` (recorded since the
    floor landed), else the WAN rig's default ``--rate`` of 1 Gbit/s, which every earlier result ran at."""
    import glob

    runs = []
    for f in sorted(glob.glob(str(Path(args.results) / "deadline-wan-*.json"))):
        doc = json.loads(Path(f).read_text())
        link = float((doc.get("path") or {}).get("bandwidth_bps") or 1e9)
        for b in doc.get("backlogged", []):
            if b.get("records"):
                runs.append({"result": Path(f).name, "workload": b["workload"],
                             **{mode: replay_eta(b["records"], b["seconds"], restart=mode != "window",
                                                 link_bps=link if mode == "link" else None)
                                for mode in REPLAY_MODES}})
    summary = {mode: {k: {**_med([r[mode][k] for r in runs if k in r[mode]]),
                          "over_10pct": sum(r[mode].get(k, 0) > 0.10 for r in runs),
                          "by_workload": {w: _med([r[mode][k] for r in runs if k in r[mode] and r["workload"] == w])
                                          for w in sorted({r["workload"] for r in runs})}}
                      for k in ("0.25", "0.5", "0.75")} for mode in REPLAY_MODES}
    return {"runs": runs, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    from fstream_bench.core.report import machine_info
    from fstream_bench.wan.rig import add_path_args
    from fstream_provider.model.units import parse_duration, parse_rate, parse_size

    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="fstream bench deadline", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="part", required=True)
    s = sub.add_parser("sim", help="the simulator's table (deterministic)")
    s.add_argument("--workloads", default="w1,w2,w3,w4,sra,lcls")
    s.add_argument("--seeds", type=int, default=3, help="fresh seeds drawn per run (recorded)")
    s.add_argument("--seed", type=int, action="append", help="replay this seed (repeatable) instead")
    s.add_argument("--uncalibrated", action="store_true", help="the simulator's whole-window streams (issue 27's)")
    s.add_argument("--scale", type=float, default=0.25, help="workload size scale (0.25: 3-5 minute runs at 1 Gbit/s)")
    s.add_argument("--bandwidth", default="1Gbit")
    s.add_argument("--rtt", default="40ms")
    s.add_argument("--buffer", default="1MiB")
    s.add_argument("--results", default=str(RESULTS_DIR))
    wn = sub.add_parser("wan", help="(root) the emulated WAN")
    add_path_args(wn, "tb27d")
    wn.add_argument("--workloads", default="w1,w3,sra,lcls")
    wn.add_argument("--deadline-workload", default="w1")
    wn.add_argument("--count-factor", type=float, default=0.3)
    wn.add_argument("--runs", type=int, default=10)
    wn.add_argument("--seed", type=int, help="the workloads' seed (default: drawn fresh, recorded)")
    wn.add_argument("--timeout", type=float, default=600.0)
    rp = sub.add_parser("replay", help="the live ETA with and without its restart, over committed WAN records")
    rp.add_argument("--results", default=str(RESULTS_DIR))
    args = ap.parse_args(argv)
    prov = provenance.start("deadline", argv, MODULES)
    if args.part == "replay":
        doc = run_replay(args)
    elif args.part == "sim":
        args.bandwidth, args.rtt = parse_rate(args.bandwidth), parse_duration(args.rtt)
        args.buffer = parse_size(args.buffer)
        doc = run_sim(args)
    else:
        args.buffer = parse_size(args.buffer)
        doc = run_wan(args)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    doc = {"part": args.part, "command": "fstream bench deadline " + " ".join(argv), "machine": machine_info(),
           "loadavg_end": os.getloadavg(), **doc, "provenance": provenance.finish(prov)}
    path = Path(args.results) / f"deadline-{args.part}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps(doc["summary"], indent=1, default=str))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
