"""The short variant of each benchmark that ``fstream bench carry`` runs on a result's code and on today's.

A smoke runs the same subcommand as the result, smaller, and reads the numbers that would move if the
code's behaviour or cost changed (``fstream_bench.core.carry``). Simulators are deterministic, so their
smokes compare every number for equality. A benchmark without a smoke here cannot be carried: re-measure
it (``fstream bench refresh``).
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from fstream_bench.core.carry import Smoke

#: never compared: how the run went on this machine, not what the code computed
NOT_COMPUTED = frozenset({"provenance", "machine", "markdown", "config", "command", "cpu_seconds", "wall_seconds",
                          "load_start", "load_end", "loadavg", "loadavg_end", "memory", "started", "elapsed_s"})


def flat_numbers(doc, prefix: str = "") -> dict[str, float]:
    """Every number in ``doc`` by its path (``a/b/0/c``), but what ``NOT_COMPUTED`` names."""
    out: dict[str, float] = {}
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        if k in NOT_COMPUTED:
            continue
        path = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, bool):
            out[path] = float(v)
        elif isinstance(v, (int, float)):
            out[path] = float(v)
        elif isinstance(v, (dict, list)):
            out.update(flat_numbers(v, path))
    return out


def loopback_metrics(doc: dict) -> dict[str, float]:
    """Per case, FStream's median throughput and each side's CPU-seconds per GB over the smoke's repeats."""
    per: dict[str, list[dict]] = defaultdict(list)
    for r in doc["results"]:
        if r.get("tool") == "fstream" and r.get("ok"):
            per[r["case"]].append(r)
    if not per:
        raise ValueError("the loopback smoke has no successful fstream run")
    out = {}
    for case, rs in sorted(per.items()):
        out[f"{case}: throughput"] = statistics.median(r["throughput_bps"] for r in rs)
        out[f"{case}: sender CPU-s/GB"] = statistics.median(r["cpu_src_s"] / r["bytes"] * 1e9 for r in rs)
        out[f"{case}: receiver CPU-s/GB"] = statistics.median(r["cpu_dst_s"] / r["bytes"] * 1e9 for r in rs)
    return out


def smoke_for(doc: dict) -> Smoke | None:
    """The smoke that carries a result document: its benchmark's and part's (``deadline sim``), else its
    benchmark's when that smoke is for every part; None when there is none."""
    bench = (doc.get("provenance") or {}).get("bench")
    smoke = SMOKES.get(f"{bench} {doc.get('part')}") or SMOKES.get(str(bench))
    return smoke if smoke is not None and (not smoke.part or smoke.part == doc.get("part")) else None


SMOKES: dict[str, Smoke] = {s.key: s for s in (
    # the cases with bytes enough for CPU-seconds to count (the 1-byte cases' CPU per GB is quantisation noise)
    Smoke("loopback", ("--big-bytes", "512M", "--small-count", "1000", "--small-bytes", "256K", "--tools", "fstream",
                       "--cases", "a:,b:", "--repeat", "2"), loopback_metrics),
    Smoke("sim", ("--quick", "--workloads", "w1,lcls", "--paths", "10G/40ms", "--parts", "throughput"),
          lambda d: flat_numbers({"throughput": d["throughput"]}), exact=True),
    Smoke("scheduling", ("--traces", "25%,60%", "--scale", "0.2"), lambda d: flat_numbers(d["traces"]), exact=True),
    # the deadline tuner and the ETA in the simulator: one workload, 5 % of its size (seconds); no WAN smoke. One
    # recorded seed replayed (``--seed``): ``--seeds 1`` draws a fresh seed per run, and no two runs were equal
    Smoke("deadline", ("sim", "--workloads", "w3", "--seed", "1", "--scale", "0.05"),
          lambda d: flat_numbers({"summary": d["summary"], "eta": d["eta"]}), exact=True, part="sim"),
)}
