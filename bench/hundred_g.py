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

MODULES = ("fstream_bench.hundred_g", "fstream_provider.tuning.sim")
TARGET_GBPS = 94.0  # what a 100G NIC carries as TCP payload (Globus reports 93 sustained)
GIL_BUSY_MAX = 0.8  # a process whose GIL is busier than this stalls its threads on the hand-offs
PER_FLOW_GBPS = (15.0, 35.0)  # ESnet fasterdata: one TCP flow on a tuned 100G host
RTT_S = 0.05


def plan(gil_doc: dict[str, Any], target_gbps: float = TARGET_GBPS) -> dict[str, Any]:
    """The cores, processes and streams each side needs at ``target_gbps``, from one gil bench result."""
    big = gil_doc["summary"]["big"]
    small = gil_doc["summary"].get("small")
    gb_per_s = target_gbps / 8
    out: dict[str, Any] = {"target_gbps": target_gbps, "gb_per_s": gb_per_s, "sides": {}}
    for side, name in (("tx", "sender"), ("rx", "receiver")):
        cpu, held = big[f"{side}_cpu"]["median"], big[f"{side}_held"]["median"]
        procs = math.ceil(held * gb_per_s / GIL_BUSY_MAX) if held > 0 else 1
        out["sides"][name] = {
            "cpu_per_gb": cpu, "held_per_gb": held, "cores": cpu * gb_per_s,
            "one_process_gbps": GIL_BUSY_MAX / held * 8 if held > 0 else math.inf,
            "processes": procs,
            "files_per_s_one_process": (GIL_BUSY_MAX / (small[f"{side}_held"]["median"] / 1000)
                                        if small and small[f"{side}_held"]["median"] > 0 else None),
        }
    out["streams"] = {f"at {g:g} Gbit/s per flow": math.ceil(target_gbps / g) for g in PER_FLOW_GBPS}
    return out


def simulated(p: dict[str, Any], processes: int, streams: int = 16) -> float:
    """Gbit/s the simulator predicts on a 94 Gbit/s path with the receiver's measured limits and ``processes``."""
    rx = p["sides"]["receiver"]
    per_stream_bps = 8e9 / rx["cpu_per_gb"]  # one data connection's thread on one core
    cap_bps = min(rx["one_process_gbps"], p["sides"]["sender"]["one_process_gbps"]) * 1e9 * processes
    path = PathInfo(bandwidth_bps=p["target_gbps"] * 1e9, rtt_s=RTT_S, tcp_buffer=512 << 20, max_p=64)
    files = [FileInfo(f"f{i}", 8 << 30) for i in range(8)]
    work = Workload("hundred-g", [Batch(0.0, files)])
    storage = StorageModel(per_thread_bps=per_stream_bps * streams, max_bps=cap_bps)
    res = simulate(FixedTuner(cc=1, p=streams, pp=1), work, path, storage=storage, max_time_s=600.0)
    return res.throughput_bps / 1e9


def newest_gil(results: Path) -> Path:
    found = sorted(results.glob("gil-*.json"))
    if not found:
        raise SystemExit(f"fstream bench hundred-g: no gil-*.json in {results}: run `fstream bench gil` first")
    return found[-1]


def table(doc: dict[str, Any]) -> str:
    p = doc["plan"]
    rows = ["| side | CPU-s per GB | GIL-held ≤ per GB | cores at 94 Gbit/s | one process ≤ Gbit/s | processes |",
            "|---|---|---|---|---|---|"]
    for name, s in p["sides"].items():
        rows.append(f"| {name} | {s['cpu_per_gb']:.3f} | {s['held_per_gb']:.3f} | {s['cores']:.1f} | "
                    f"{s['one_process_gbps']:.0f} | {s['processes']} |")
    rows.append("")
    rows.append(f"Streams: {p['streams']}; simulator, 94 Gbit/s at 50 ms, 16 streams: "
                + ", ".join(f"{k} receiver process(es) {v:.1f} Gbit/s" for k, v in doc["simulated"].items()))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    from fstream_bench.saved import RESULTS_DIR, run_saved

    ap = argparse.ArgumentParser(prog="fstream bench hundred-g", description=__doc__.splitlines()[0])
    ap.add_argument("--gil", default=None, help="a gil bench result (default: the newest in bench/results)")
    ap.add_argument("--results", default=None)
    args = ap.parse_args(argv)
    src = Path(args.gil) if args.gil else newest_gil(Path(args.results or RESULTS_DIR))

    def compute() -> dict[str, Any]:
        gil_doc = json.loads(src.read_text())
        p = plan(gil_doc)
        procs = sorted({1, p["sides"]["receiver"]["processes"], p["sides"]["sender"]["processes"]})
        return {"gil_result": src.name, "plan": p, "simulated": {str(n): simulated(p, n) for n in procs}}

    doc = run_saved("hundred-g", list(sys.argv[1:] if argv is None else argv), MODULES, compute, args.results)
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
