"""The Airflow benchmark's statistics, size labels, machine line and result files."""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from fstream_bench.core import provenance, runstats

KIB, MIB = 2**10, 2**20

#: what an Airflow result exercised (``provenance``): the agent, the whole provider (operator, sensor,
#: trigger, hooks, bus), and the benchmark's own pieces (rig, timed classes, dataset writer, the receiver peer)
MODULES = (*provenance.AGENT, "fstream_provider", "fstream_bench.airflow.bench", "fstream_bench.airflow.latency",
           "fstream_bench.airflow.overhead", "fstream_bench.airflow.results", "fstream_bench.airflow.rig",
           "fstream_bench.airflow.timed", "fstream_bench.core.report", "fstream_bench.core.workload_gen",
           "fstream_bench.peers.base", "fstream_bench.peers.fstream", "fstream_bench.core.cpu_meter",
           "fstream_bench.core.runstats")


def start(args: argparse.Namespace) -> dict:
    """The provenance of a run that starts now (``args.raw_argv``: the words after ``fstream bench airflow``)."""
    return provenance.start("airflow", list(getattr(args, "raw_argv", None) or []), MODULES)


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))]


def summary(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "p50": statistics.median(xs), "p90": pct(xs, 90), "max": max(xs), "min": min(xs)}


def machine_line() -> str:
    from fstream_bench.core.report import machine_info

    m = machine_info()
    return (f"Machine: nproc {m['nproc']}, {m['cpu']}, kernel {m['kernel']}, load average {m['loadavg']}, "
            f"{m['date']}")


def say(*a: Any) -> None:
    print(*a, file=sys.stderr, flush=True)


def size_label(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB and n % MIB == 0 else f"{n // KIB} KiB"



def write_results(kind: str, res: dict[str, Any], md: str, args: argparse.Namespace,
                  prov: dict | None = None) -> int:
    """``airflow-KIND-<stamp>.json`` and ``.md``; the JSON carries ``provenance`` (``prov`` from
    :func:`start`, finished here; one started now if the caller had none)."""
    res["provenance"] = provenance.finish(prov if prov is not None else start(args))
    md += (f"\nProvenance: `{res['provenance']['command']}`, commit {res['provenance']['commit'][:12]}"
           f"{' (dirty)' if res['provenance']['dirty'] else ''}, code {res['provenance']['code_hash'][:19]}; "
           "every sample is in the JSON.\n")
    jp, mp = runstats.write_result(args.results, f"airflow-{kind}", res, md)
    print(md)
    print(f"results: {jp}, {mp}")
    return 0


