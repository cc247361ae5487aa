"""``fstream bench scheduling``: replay a transfer trace through SEAL, STEAL and the baselines (issue #11).

    fstream bench scheduling [--batch]          # the four Table 2 traces (--traces 25%,45%,60%,60%-hv)
    fstream bench scheduling --generate 45% --out trace.csv [--batch] [--scale 0.2] [--seed 1]
    fstream bench scheduling --trace trace.csv --json [--algorithms seal,basecc1] [--lambda 0.9]
    fstream bench scheduling --traces 25%,45%,60%,60%-hv --scale 0.5 --markdown out.md
    fstream bench scheduling --trace site.csv --endpoints endpoints.toml   # any hosts, their capacities given

A trace may name any endpoints. ``--endpoints FILE`` (JSON or TOML) gives their capacities: a mapping of
endpoint name to the most it moves in all, in bits/s (``dtn-a = 10e9``), or to a table
``{capacity = 10e9, unit = 1e9, overload = 0.1}`` (``unit``: what one stream moves on an idle path, bits/s,
default 1e9). A trace endpoint the file does not name is refused, naming it, the trace line and
the file. Without the file, the paper's six hosts have §6.1's capacities and any other endpoint's is
learned from the trace (``sched_sim.learn_endpoints``; printed on stderr).

``--json`` prints one JSON object per algorithm and line: ``avg_slowdown``, ``worst_slowdown``,
``avg_turnaround`` (and ``per_class`` by Table 2 category, ``batch_spare_fraction`` when the trace has
batch tasks), so other tools can read it. The simulator is ``fstream_provider.tuning.sched_sim``.

With ``--traces`` (the default) the run also writes ``scheduling-<stamp>.json`` (and ``.md``) into
``--results`` (default ``bench/results``): ``provenance``, the configuration and per trace its tasks
(``tasks``: class, category, size, arrival) and every algorithm's summary with each task's outcome
(``results[i].tasks``: end, slowdown, wait, preempted; rows in the trace's order). With ``--trace FILE``
it writes them only when ``--results`` is given.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import tomllib
from pathlib import Path

from fstream_bench.core import provenance
from fstream_provider.tuning import sched_model
from fstream_provider.tuning.common import fmt_bps
from fstream_provider.tuning import sched_sim as S
from fstream_provider.tuning import trace as T
from fstream_bench.core import RESULTS_DIR

DEFAULT_TRACES = "25%,45%,60%,60%-hv"
#: what a scheduling result exercised (``provenance``): the simulator and schedulers, and this driver
MODULES = ("fstream_provider.tuning", "fstream_bench.scheduling.replay")
#: the trace, once per trace in the result JSON: one row per task, in replay order
TRACE_COLUMNS = ("class", "category", "size", "arrival")
#: each task's outcome per algorithm, rows aligned with the trace's (``ReplayResult.tasks``)
TASK_COLUMNS = ("end", "slowdown", "wait", "preempted")


def _num(v):
    """JSON-safe and compact: NaN and infinities as None, floats to 6 significant digits."""
    if isinstance(v, float):
        return float(f"{v:.6g}") if math.isfinite(v) else None
    return v


def _table(rows: list[dict], columns: tuple[str, ...]) -> dict:
    return {"columns": list(columns), "rows": [[_num(t.get(c)) for c in columns] for t in rows]}


def load_endpoints(path: str | Path) -> dict[str, sched_model.EndpointCurve]:
    """An ``--endpoints`` file (``.json``, ``.toml``, else whichever parses) as curves; ``ValueError``
    naming the file, and the endpoint and the reason when an entry is bad."""
    where = f"endpoints file {path}"
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: cannot read it ({exc})") from None
    suffix = Path(path).suffix.lower()
    kinds = {".json": ("JSON",), ".toml": ("TOML",)}.get(suffix, ("JSON", "TOML"))
    errors = []
    for kind in kinds:
        try:
            data = json.loads(text) if kind == "JSON" else tomllib.loads(text)
            break
        except ValueError as exc:  # json.JSONDecodeError and tomllib.TOMLDecodeError are ValueErrors
            errors.append(f"not valid {kind} ({exc})")
    else:
        raise ValueError(f"{where}: {'; '.join(errors)}")
    return sched_model.endpoint_curves(data, where=where)


def _endpoints_note(curves, given) -> str | None:
    """What the replay's capacities are when they were learned from the trace (None when given or the paper's)."""
    if given is not None or curves.keys() <= S.paper_endpoints().keys():
        return None
    return "endpoint capacities learned from the trace (no --endpoints file): " + ", ".join(
        f"{name} {fmt_bps(c.capacity_bps)}" for name, c in sorted(curves.items()))


def _run(tasks, algorithms, *, window_s, lam: float, seed: int, raw: bool = False, endpoints=None) -> list[dict]:
    """One summary per algorithm; with ``raw`` each also carries every task's outcome (``tasks``)."""
    out = []
    for alg in algorithms:
        cfg = {"lambda_": lam} if alg == "steal" else {}
        t0 = time.process_time()
        res = S.replay(tasks, S.make_scheduler(alg, endpoints, **cfg), endpoints=endpoints, window_s=window_s,
                       seed=seed)
        row = res.summary()
        if raw:
            row = {**row, "cpu_seconds": time.process_time() - t0, "tasks": _table(res.tasks, TASK_COLUMNS)}
        out.append(row)
    return out


def _sanitize(x):
    if isinstance(x, dict):
        return {k: _sanitize(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_sanitize(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _trace_meta(tasks, window_s: float | None) -> dict:
    rows = [{"class": t.klass, "category": T.category_of(t.size), "size": t.size, "arrival": t.arrival_s}
            for t in tasks]
    return {"tasks_in_trace": len(tasks), "interactive": sum(t.klass == "interactive" for t in tasks),
            "batch": sum(t.klass == "batch" for t in tasks), "window_s": window_s,
            "tasks": _table(rows, TRACE_COLUMNS)}


def write_results(out_dir: Path, results: dict[str, list[dict]], config: dict, prov: dict, md: str,
                  traces_meta: dict[str, dict]) -> Path:
    """``scheduling-<stamp>.json`` and ``.md`` in ``out_dir``; returns the JSON's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / f"scheduling-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    doc = {"bench": "scheduling", "provenance": prov, "config": config,
           "traces": {name: {**traces_meta.get(name, {}), "results": rows} for name, rows in results.items()}}
    path = base.with_suffix(".json")
    path.write_text(json.dumps(_sanitize(doc), indent=None, separators=(",", ":")) + "\n")
    base.with_suffix(".md").write_text(md)
    return path


def _markdown(results: dict[str, list[dict]], args, command: str | None = None) -> str:
    command = command or f"fstream bench scheduling --traces {args.traces} --scale {args.scale} --seed {args.seed}"
    lines = [f"<!-- {command}; load {os.getloadavg()[0]:.2f} -->", "",
             "| trace | algorithm | avg slowdown | worst slowdown | avg turnaround s | preemptions "
             "| batch spare used |",
             "|---|---|---|---|---|---|---|"]
    for trace, rows in results.items():
        for r in rows:
            spare = r.get("batch_spare_fraction")
            lines.append(f"| {trace} | {r['algorithm']} | {r.get('avg_slowdown', float('nan')):.2f} | "
                         f"{r.get('worst_slowdown', float('nan')):.1f} | {r.get('avg_turnaround', float('nan')):.1f} | "
                         f"{r['preemptions']} | {'' if spare is None else f'{spare:.2f}'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fstream bench scheduling", description=__doc__.splitlines()[0])
    ap.add_argument("--trace", help="a trace CSV (arrival_s,source,destination,size_bytes,class)")
    ap.add_argument("--endpoints", metavar="FILE",
                    help="JSON or TOML: endpoint name -> capacity in bits/s (e.g. 10e9) or {capacity, unit, overload}; "
                         "default: the paper's hosts, other endpoints learned from the trace")
    ap.add_argument("--traces", help="generate and replay these Table 2 traces (25%%,45%%,60%%,60%%-hv)")
    ap.add_argument("--generate", help="write a generated trace (25%%, 45%%, 60%%, 60%%-hv) to --out and exit")
    ap.add_argument("--out", help="where --generate writes")
    ap.add_argument("--batch", action="store_true", help="add STEAL's 50 GB batch tasks to generated traces")
    ap.add_argument("--scale", type=float, default=1.0, help="tasks, volume and duration x this (load kept)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--algorithms", default=",".join(S.BASELINES + ("seal", "steal")),
                    help=f"comma list of {', '.join(S.ALGORITHMS)} (default: the paper's six)")
    ap.add_argument("--lambda", dest="lam", type=float, default=1.0, help="STEAL's lambda (default 1)")
    ap.add_argument("--json", action="store_true", help="one JSON object per algorithm per line")
    ap.add_argument("--markdown", help="write a Markdown table here (with --traces)")
    ap.add_argument("--results", default=None,
                    help="directory for scheduling-<stamp>.json/.md (default with --traces: bench/results; "
                         "with --trace: none written)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    if not (args.trace or args.traces or args.generate):
        args.traces = DEFAULT_TRACES
    algorithms = [a for a in args.algorithms.split(",") if a]
    for a in algorithms:
        if a not in S.ALGORITHMS:
            ap.error(f"--algorithms: unknown {a!r} (known: {', '.join(S.ALGORITHMS)})")
    if args.generate:
        if not args.out:
            ap.error("--generate needs --out FILE")
        if args.endpoints:
            ap.error("--endpoints applies to replays (--trace, --traces), not to --generate")
        T.write_trace(T.generate(args.generate, scale=args.scale, seed=args.seed, batch=args.batch), args.out)
        print(f"wrote {args.out}")
        return 0
    config = {"scale": args.scale, "seed": args.seed, "batch": args.batch, "algorithms": algorithms,
              "lambda": args.lam}
    given = None
    if args.endpoints:
        try:
            given = load_endpoints(args.endpoints)
        except ValueError as exc:
            print(f"fstream bench scheduling: {exc}", file=sys.stderr)
            return 2
        config["endpoints"] = {"file": args.endpoints, "capacity_bps": {k: c.capacity_bps for k, c in given.items()}}
    origin = f"endpoints file {args.endpoints}"
    if args.trace:
        try:
            tasks = T.read_trace(args.trace)
            curves = S.endpoints_for(tasks, given, origin=origin, trace_name=f"trace {args.trace}")
        except (OSError, ValueError) as exc:
            print(f"fstream bench scheduling: {exc}", file=sys.stderr)
            return 2
        note = _endpoints_note(curves, given)
        if note:
            print(note, file=sys.stderr)
            config["endpoints"] = {"file": None, "capacity_bps": {k: c.capacity_bps for k, c in curves.items()}}
        prov = provenance.start("scheduling", argv, MODULES) if args.results else None
        rows = _run(tasks, algorithms, window_s=None, lam=args.lam, seed=args.seed, raw=prov is not None,
                    endpoints=curves)
        for r in rows:
            r = {k: v for k, v in r.items() if k not in ("tasks", "cpu_seconds")}
            print(json.dumps(r) if args.json else f"{r['algorithm']}: avg slowdown {r.get('avg_slowdown', 0):.2f}, "
                  f"worst {r.get('worst_slowdown', 0):.1f}, avg turnaround {r.get('avg_turnaround', 0):.1f} s")
        if prov is not None:
            provenance.finish(prov)
            name = os.path.basename(args.trace)
            path = write_results(Path(args.results), {name: rows}, {**config, "trace": args.trace, "window_s": None},
                                 prov, _markdown({name: rows}, args, prov["command"]),
                                 {name: _trace_meta(tasks, None)})
            print(f"results: {path}", file=sys.stderr)
        return 0
    if args.traces:
        results, meta, replays = {}, {}, {}
        try:  # every trace generated and its endpoints checked before any replay
            for name in args.traces.split(","):
                tasks = T.generate(name, scale=args.scale, seed=args.seed, batch=args.batch)
                replays[name] = tasks, S.endpoints_for(tasks, given, origin=origin,
                                                       trace_name=f"generated trace {name}")
        except ValueError as exc:
            print(f"fstream bench scheduling: {exc}", file=sys.stderr)
            return 2
        prov = provenance.start("scheduling", argv, MODULES)
        t0 = time.time()
        for name, (tasks, curves) in replays.items():
            results[name] = _run(tasks, algorithms, window_s=900 * args.scale, lam=args.lam, seed=args.seed,
                                 raw=True, endpoints=curves)
            meta[name] = _trace_meta(tasks, 900 * args.scale)
            for r in results[name]:
                r = {k: v for k, v in r.items() if k not in ("tasks", "cpu_seconds")}
                print(json.dumps({"trace": name, **r}) if args.json else
                      f"{name} {r['algorithm']}: avg slowdown {r.get('avg_slowdown', 0):.2f}, "
                      f"worst {r.get('worst_slowdown', 0):.1f}", flush=True)
        provenance.finish(prov)
        md = _markdown(results, args, prov["command"]) + f"\nComputed in {time.time() - t0:.0f} s.\n"
        if args.markdown:
            with open(args.markdown, "w") as fh:
                fh.write(md)
        path = write_results(Path(args.results or RESULTS_DIR), results, {**config, "traces": args.traces.split(",")},
                             prov, md, meta)
        print(f"results: {path}", file=sys.stderr if args.json else sys.stdout)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
