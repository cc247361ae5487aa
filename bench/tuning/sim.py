"""``fstream bench sim``: issue 4's simulator tables (``fstream_provider.tuning.simreport``) as a result file.

    fstream bench sim                         # both paths, every workload and tuner, the full oracle grid
    fstream bench sim --quick                 # simreport's smaller oracle grid
    fstream bench sim --paths 10G/40ms --workloads w4 --tuners static,fstream --grid "8,16;4;0,8" \\
        --qos-workloads w4 --qos-fractions 0.6 --qos-pacing on     # a tiny run (tests)

Runs the same tables as ``python -m fstream_provider.tuning.simreport`` (which still works on its
own): per path, every tuner and the grid oracle on every workload, the thesis-style breakdown and
the QoS errors. Pure computation and deterministic (the numbers do not depend on machine load); the
defaults take about 250 CPU-seconds on one core. Writes into ``--results`` (default
``bench/results``):

- ``sim-<stamp>.md``: simreport's tables, with the command and provenance on top;
- ``sim-<stamp>.json``: ``provenance``, ``config``, ``scenarios`` (each path and its profiling
  interval and workload scale), ``throughput`` (one row per path, workload and tuner incl.
  ``oracle``: ``throughput_bps`` and ``gbit_s``, ``of_oracle``, ``of_link``, ``seconds``, and the
  oracle's ``oracle_settings`` cc/p/pp), ``mean_of_oracle`` (per path and tuner: the tables' last row),
  ``breakdown`` (per path, workload and variant) and ``qos`` (per path, workload, target and pacing),
  ``cpu_seconds`` per path and table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from fstream_bench.core import provenance
from fstream_bench.core import RESULTS_DIR

#: what a sim result exercised (``provenance``): the simulator, tuners, workloads and simreport, and this driver
MODULES = ("fstream_provider.tuning", "fstream_bench.tuning.sim")
PARTS = ("throughput", "breakdown", "qos")


def _words(text: str) -> tuple[str, ...]:
    return tuple(w.strip() for w in text.split(",") if w.strip())


def parse_grid(text: str) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """``"CC;P;PP"``, each a comma list: ``"2,8;4;0,8"``."""
    parts = text.split(";")
    if len(parts) != 3:
        raise ValueError(f"grid {text!r}: expected CC;P;PP, each a comma-separated list")
    cc, p, pp = (tuple(int(x) for x in _words(part)) for part in parts)
    if not (cc and p and pp):
        raise ValueError(f"grid {text!r}: every axis needs at least one value")
    return cc, p, pp


def oracle_settings(note: str) -> dict[str, int] | None:
    """``"cc=16 p=1 pp=8"`` (simreport's oracle note) as ``{"cc": 16, "p": 1, "pp": 8}``; None: no oracle."""
    try:
        kv = dict(item.split("=", 1) for item in note.split())
        return {k: int(kv[k]) for k in ("cc", "p", "pp")}
    except (KeyError, ValueError):
        return None


def _num(v):
    """JSON-safe: NaN and infinities as None."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _plain(rows: list[dict]) -> list[dict]:
    return [{k: _num(v) for k, v in r.items()} for r in rows]


def run(*, paths: tuple[str, ...] = (), workloads: tuple[str, ...] | None = None,
        tuners: tuple[str, ...] | None = None, grid=None, parts: tuple[str, ...] = PARTS,
        qos_workloads: tuple[str, ...] = ("w1", "lcls", "w4"), qos_fractions: tuple[float, ...] = (0.3, 0.6, 0.9),
        qos_pacing: tuple[bool, ...] = (True, False), log=print) -> tuple[dict, str]:
    """Compute the tables; return the result document (without provenance) and the Markdown."""
    from fstream_provider.tuning import simreport as S
    from fstream_provider.tuning.profiler import recommended_interval
    from fstream_provider.tuning.workloads import default_scale

    workloads = tuple(workloads or S.WORKLOADS)
    tuners = tuple(tuners or S.TUNER_NAMES)
    grid = grid or S.FULL_GRID
    scns = [s for s in S.scenarios() if not paths or s.name in paths]
    unknown = set(paths) - {s.name for s in S.scenarios()}
    if unknown:
        raise ValueError(f"unknown path(s) {', '.join(sorted(unknown))}; known: "
                         + ", ".join(s.name for s in S.scenarios()))
    doc: dict = {"bench": "sim",
                 "config": {"paths": [s.name for s in scns], "workloads": list(workloads), "tuners": list(tuners),
                            "grid": {"cc": list(grid[0]), "p": list(grid[1]), "pp": list(grid[2])},
                            "parts": list(parts), "qos_workloads": list(qos_workloads),
                            "qos_fractions": list(qos_fractions), "qos_pacing": list(qos_pacing)},
                 "scenarios": [], "throughput": [], "mean_of_oracle": {}, "breakdown": [], "qos": [],
                 "cpu_seconds": {}}
    md: list[str] = []
    for scn in scns:
        p = scn.path
        doc["scenarios"].append({"name": scn.name, "bandwidth_bps": p.bandwidth_bps, "rtt_s": p.rtt_s,
                                 "tcp_buffer": p.tcp_buffer, "max_cc": p.max_cc, "max_p": p.max_p,
                                 "profile_interval_s": recommended_interval(p.rtt_s),
                                 "workload_scale": default_scale(p.bandwidth_bps, p.rtt_s)})
        cpu = doc["cpu_seconds"][scn.name] = {}
        if "throughput" in parts:
            t0 = time.process_time()
            rows = S.throughput_rows(scn, workloads=workloads, tuners=tuners, grid=grid)
            cpu["throughput"] = time.process_time() - t0
            oracle = {r["workload"]: oracle_settings(r["note"]) for r in rows if r["tuner"] == "oracle"}
            doc["throughput"] += [{**r, "gbit_s": r["throughput_bps"] / 1e9,
                                   "oracle_settings": oracle.get(r["workload"])} for r in _plain(rows)]
            doc["mean_of_oracle"][scn.name] = {t: statistics.mean(r["of_oracle"] for r in rows if r["tuner"] == t)
                                               for t in dict.fromkeys(r["tuner"] for r in rows)}
            md += [f"\n### {scn.name} (Gbit/s, ratio to oracle in brackets)\n", S._md_throughput(rows)]
            log(f"sim {scn.name}: throughput table in {cpu['throughput']:.0f} CPU-s")
        if "breakdown" in parts:
            t0 = time.process_time()
            rows = S.breakdown_rows(scn, workloads=workloads)
            cpu["breakdown"] = time.process_time() - t0
            doc["breakdown"] += [{**r, "gbit_s": r["throughput_bps"] / 1e9} for r in _plain(rows)]
            md += [f"\n### Breakdown {scn.name} (Gbit/s)\n", S._md_breakdown(rows)]
            log(f"sim {scn.name}: breakdown in {cpu['breakdown']:.0f} CPU-s")
        if "qos" in parts:
            t0 = time.process_time()
            rows = S.qos_rows(scn, workloads=qos_workloads, fractions=qos_fractions, pacing=qos_pacing)
            cpu["qos"] = time.process_time() - t0
            doc["qos"] += _plain(rows)
            md += [f"\n### QoS {scn.name}\n", S._md_qos(rows)]
            log(f"sim {scn.name}: QoS in {cpu['qos']:.0f} CPU-s")
    return doc, "\n".join(md) + "\n"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fstream bench sim", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="simreport's small oracle grid (--grid overrides)")
    ap.add_argument("--grid", default=None, help='oracle grid "CC;P;PP", e.g. "2,8;4;0,8" (default: the full grid)')
    ap.add_argument("--paths", default="", help="comma list of paths (10G/40ms, 100G/100ms; default both)")
    ap.add_argument("--workloads", default="", help="comma list (default w1,w2,w3,w4,sra,lcls)")
    ap.add_argument("--tuners", default="", help="comma list (default static,dynamic,globus,adaptivecc,fstream)")
    ap.add_argument("--parts", default=",".join(PARTS), help="comma list of throughput,breakdown,qos (default all)")
    ap.add_argument("--qos-workloads", default="w1,lcls,w4")
    ap.add_argument("--qos-fractions", default="0.3,0.6,0.9", help="targets as fractions of the path")
    ap.add_argument("--qos-pacing", default="on,off", help="on, off or on,off")
    ap.add_argument("--results", default=str(RESULTS_DIR))
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = _parser()
    a = ap.parse_args(argv)
    from fstream_provider.tuning.simreport import FULL_GRID, QUICK_GRID

    try:
        grid = parse_grid(a.grid) if a.grid else (QUICK_GRID if a.quick else FULL_GRID)
        parts = _words(a.parts)
        if not parts or set(parts) - set(PARTS):
            raise ValueError(f"--parts {a.parts!r}: expected a comma list of {', '.join(PARTS)}")
        pacing = tuple({"on": True, "off": False}[w] for w in _words(a.qos_pacing))
        fractions = tuple(float(x) for x in _words(a.qos_fractions))
    except (ValueError, KeyError) as exc:
        ap.error(str(exc))
    prov = provenance.start("sim", argv, MODULES)
    t0 = time.time()
    try:
        doc, md = run(paths=_words(a.paths), workloads=_words(a.workloads) or None, tuners=_words(a.tuners) or None,
                      grid=grid, parts=parts, qos_workloads=_words(a.qos_workloads), qos_fractions=fractions,
                      qos_pacing=pacing, log=lambda m: print(m, file=sys.stderr, flush=True))
    except ValueError as exc:
        print(f"fstream bench sim: {exc}", file=sys.stderr)
        return 2
    doc["wall_seconds"] = time.time() - t0
    doc = {"bench": doc.pop("bench"), "provenance": provenance.finish(prov), **doc}
    head = (f"<!-- {prov['command']}; commit {prov['commit'][:12]}{' (dirty)' if prov['dirty'] else ''}, code "
            f"{prov['code_hash'][:19]}; {sum(sum(c.values()) for c in doc['cpu_seconds'].values()):.0f} CPU-s; "
            f"deterministic (the same command gives the same tables) -->\n")
    md = head + md
    out = Path(a.results)
    out.mkdir(parents=True, exist_ok=True)
    base = out / f"sim-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    doc["markdown"] = base.name + ".md"
    base.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    base.with_suffix(".md").write_text(md)
    print(md)
    print(f"results: {base}.json, {base}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
