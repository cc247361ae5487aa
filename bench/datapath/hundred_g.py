"""The road to 100 Gbit/s, computed from measurements (issue 29): cores and processes a 94 Gbit/s DTN pair needs.

Inputs, all measured in one ``fstream bench gil`` run (the newest ``bench/results/gil-*.json``, or ``--gil FILE``):
per side, CPU-seconds per GB and the GIL-held CPU per GB (an upper bound), and the same per 1,000 files. From them:

* **cores per side** at the target rate: CPU per GB × GB/s (CPU that parallelises: separate data connections
  are separate threads, and their hashing, receiving and writing run without the GIL);
* **processes per side**: one process holds the GIL at most ``GIL_BUSY_MAX`` of the time, so it moves at most
  ``GIL_BUSY_MAX / held-per-GB`` GB/s; the target rate over that, rounded up;
* **TCP streams**: at the published 15–35 Gbit/s per flow on 100G hosts (ESnet fasterdata), at least
  ``ceil(94 / per-flow)`` streams;
* the **simulator** (``tuning.sim``) run on a 94 Gbit/s, 50 ms path with the measured per-stream CPU rate as the
  per-thread storage limit and the processes' GIL cap as the aggregate limit: the throughput it predicts for one
  and for the planned number of receiver processes, against Globus's published 93 Gbit/s sustained.

Run: ``fstream bench hundred-g``; it writes ``bench/results/hundred-g-<stamp>.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from fstream_provider.tuning.fixed import FixedTuner
from fstream_provider.tuning.base import FileInfo, PathInfo
from fstream_provider.tuning.sim import StorageModel, simulate
from fstream_provider.tuning.workloads import Batch, Workload

MODULES = ("fstream_bench.datapath.hundred_g", "fstream_provider.tuning.sim")
TARGET_GBPS = 94.0  # what a 100G NIC carries as TCP payload (Globus reports 93 sustained)
GIL_BUSY_MAX = 0.8  # a process whose GIL is busier than this stalls its threads on the hand-offs
PER_FLOW_GBPS = (15.0, 35.0)  # ESnet fasterdata: one TCP flow on a tuned 100G host
RTT_S = 0.05


def _net(summary: dict, case: str, key: str, per_unit: float) -> float:
    """A case's median per unit, net of the 1-byte run's fixed cost per run (start-up, connect) when measured."""
    value = summary[case][key]["median"] if summary[case].get(key) else 0.0
    tiny = summary.get("tiny", {}).get(key)
    return max(0.0, value - (tiny["median"] / per_unit if tiny else 0.0))


def plan(gil_doc: dict[str, Any], target_gbps: float = TARGET_GBPS) -> dict[str, Any]:
    """The cores, processes and streams each side needs at ``target_gbps``, from one gil bench result.

    CPU and GIL-held CPU are per GB of the 1 GiB case and per 1,000 files of the 2000-file case, net of the
    1-byte run; the processes are computed from the sampled GIL-held CPU and, as the pessimistic case, from
    the bound.
    """
    summ = gil_doc["summary"]
    big_gb = gil_doc["runs"]["big"][0]["bytes"] / 1e9
    gb_per_s = target_gbps / 8
    out: dict[str, Any] = {"target_gbps": target_gbps, "gb_per_s": gb_per_s, "sides": {}}
    for side, name in (("tx", "sender"), ("rx", "receiver")):
        cpu = _net(summ, "big", f"{side}_cpu", big_gb)
        held = {kind: _net(summ, "big", f"{side}_{key}", big_gb)
                for kind, key in (("sampled", "held_sampled"), ("bound", "held"))}
        files = {kind: _net(summ, "small", f"{side}_{key}", 2.0) for kind, key in
                 (("sampled", "held_sampled"), ("bound", "held"))} if "small" in summ else {}
        out["sides"][name] = {
            "cpu_per_gb": cpu, "held_per_gb": held, "cores": cpu * gb_per_s,
            "one_process_gbps": {k: (GIL_BUSY_MAX / v * 8 if v > 0 else math.inf) for k, v in held.items()},
            "processes": {k: max(1, math.ceil(v * gb_per_s / GIL_BUSY_MAX)) for k, v in held.items()},
            "held_per_1k_files": files,
            "files_per_s_one_process": {k: (GIL_BUSY_MAX / (v / 1000) if v > 0 else math.inf)
                                        for k, v in files.items()},
        }
    out["streams"] = {f"at {g:g} Gbit/s per flow": math.ceil(target_gbps / g) for g in PER_FLOW_GBPS}
    return out


def simulated(p: dict[str, Any], processes: int, kind: str = "sampled", streams: int = 16) -> float:
    """Gbit/s the simulator predicts on a 94 Gbit/s path with the sides' measured limits and ``processes`` per side:
    one stream's rate is what one core moves (the receiver's CPU per GB), the aggregate at most what that many
    processes' GIL allows."""
    rx, tx = p["sides"]["receiver"], p["sides"]["sender"]
    per_stream_bps = 8e9 / max(rx["cpu_per_gb"], tx["cpu_per_gb"])
    cap_bps = min(rx["one_process_gbps"][kind], tx["one_process_gbps"][kind]) * 1e9 * processes
    path = PathInfo(bandwidth_bps=p["target_gbps"] * 1e9, rtt_s=RTT_S, tcp_buffer=512 << 20, max_p=64)
    storage = StorageModel(per_thread_bps=per_stream_bps * streams, max_bps=cap_bps)
    return _simulate(path, storage, streams)


def _simulate(path: PathInfo, storage: StorageModel | None, streams: int) -> float:
    files = [FileInfo(f"f{i}", 8 << 30) for i in range(64)]  # 512 GiB: a minute at the target, the ramp amortised
    res = simulate(FixedTuner(cc=1, p=streams, pp=1), Workload("hundred-g", [Batch(0.0, files)]), path,
                   storage=storage, max_time_s=3600.0)
    return res.throughput_bps / 1e9


def newest_gil(results: Path) -> Path:
    found = sorted(results.glob("gil-*.json"))
    if not found:
        raise SystemExit(f"fstream bench hundred-g: no gil-*.json in {results}: run `fstream bench gil` first")
    return found[-1]


def table(doc: dict[str, Any]) -> str:
    p = doc["plan"]
    rows = ["| side | CPU-s per GB | GIL-held per GB, sampled (bound) | cores at 94 Gbit/s | one process ≤ Gbit/s, "
            "sampled (bound) | processes, sampled (bound) | GIL-held per 1,000 files, sampled (bound) |",
            "|---|---|---|---|---|---|---|"]
    for name, s in p["sides"].items():
        h, o, n, f = s["held_per_gb"], s["one_process_gbps"], s["processes"], s["held_per_1k_files"]
        rows.append(f"| {name} | {s['cpu_per_gb']:.3f} | {h['sampled']:.3f} ({h['bound']:.3f}) | {s['cores']:.1f} | "
                    f"{o['sampled']:.0f} ({o['bound']:.0f}) | {n['sampled']} ({n['bound']}) | "
                    f"{f.get('sampled', 0):.3f} ({f.get('bound', 0):.3f}) |")
    rows.append("")
    rows.append(f"Streams: {p['streams']}. Simulator, 94 Gbit/s at 50 ms, 16 streams: "
                + "; ".join(f"{k}: {v:.1f} Gbit/s" for k, v in doc["simulated"].items()))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    from fstream_bench.core.saved import RESULTS_DIR, run_saved

    ap = argparse.ArgumentParser(prog="fstream bench hundred-g", description=__doc__.splitlines()[0])
    ap.add_argument("--gil", default=None, help="a gil bench result (default: the newest in bench/results)")
    ap.add_argument("--results", default=None)
    args = ap.parse_args(argv)
    src = Path(args.gil) if args.gil else newest_gil(Path(args.results or RESULTS_DIR))

    def compute() -> dict[str, Any]:
        gil_doc = json.loads(src.read_text())
        p = plan(gil_doc)
        sims = {}
        for kind in ("sampled", "bound"):
            need = max(p["sides"]["receiver"]["processes"][kind], p["sides"]["sender"]["processes"][kind])
            for n in sorted({1, need}):
                sims[f"{n} process(es) per side, GIL {kind}"] = simulated(p, n, kind)
        path = PathInfo(bandwidth_bps=p["target_gbps"] * 1e9, rtt_s=RTT_S, tcp_buffer=512 << 20, max_p=64)
        sims["no host limit (the path and TCP alone)"] = _simulate(path, None, 16)
        return {"gil_result": src.name, "plan": p, "simulated": sims}

    doc = run_saved("hundred-g", list(sys.argv[1:] if argv is None else argv), MODULES, compute, args.results)
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
