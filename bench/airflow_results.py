"""The Airflow benchmark's statistics, size labels, machine line and result files."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

KIB, MIB = 2**10, 2**20


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))]


def summary(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "p50": statistics.median(xs), "p90": pct(xs, 90), "max": max(xs), "min": min(xs)}


def machine_line() -> str:
    from fstream_bench.report import machine_info

    m = machine_info()
    return (f"Machine: nproc {m['nproc']}, {m['cpu']}, kernel {m['kernel']}, load average {m['loadavg']}, "
            f"{m['date']}")


def say(*a: Any) -> None:
    print(*a, file=sys.stderr, flush=True)


def size_label(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB and n % MIB == 0 else f"{n // KIB} KiB"



def write_results(kind: str, res: dict[str, Any], md: str, args: argparse.Namespace) -> int:
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = out / f"airflow-{kind}-{stamp}"
    base.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    base.with_suffix(".md").write_text(md)
    print(md)
    print(f"results: {base}.json, {base}.md")
    return 0


