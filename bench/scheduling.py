"""``fstream bench scheduling``: replay a transfer trace through SEAL, STEAL and the baselines (issue #11).

    fstream bench scheduling --generate 45% --out trace.csv [--batch] [--scale 0.2] [--seed 1]
    fstream bench scheduling --trace trace.csv --json [--algorithms seal,basecc1] [--lambda 0.9]
    fstream bench scheduling --traces 25%,45%,60%,60%-hv --scale 0.5 --markdown out.md

``--json`` prints one JSON object per algorithm and line: ``avg_slowdown``, ``worst_slowdown``,
``avg_turnaround`` (and ``per_class`` by Table 2 category, ``batch_spare_fraction`` when the trace has
batch tasks), so other tools can read it. The simulator is ``fstream_provider.tuning.sched_sim``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from fstream_provider.tuning import sched_sim as S
from fstream_provider.tuning import trace as T


def _run(tasks, algorithms, *, window_s, lam: float, seed: int) -> list[dict]:
    out = []
    for alg in algorithms:
        cfg = {"lambda_": lam} if alg == "steal" else {}
        res = S.replay(tasks, S.make_scheduler(alg, **cfg), window_s=window_s, seed=seed)
        out.append(res.summary())
    return out


def _markdown(results: dict[str, list[dict]], args) -> str:
    lines = [f"<!-- fstream bench scheduling --traces {args.traces} --scale {args.scale} --seed {args.seed}; "
             f"load {os.getloadavg()[0]:.2f} -->", "",
             "| trace | algorithm | avg slowdown | worst slowdown | avg turnaround s | preemptions | batch spare used |",
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
    ap.add_argument("--traces", help="generate and replay these Table 2 traces (25%%,45%%,60%%,60%%-hv)")
    ap.add_argument("--generate", help="write a generated trace (25%%, 45%%, 60%%, 60%%-hv) to --out and exit")
    ap.add_argument("--out", help="where --generate writes")
    ap.add_argument("--batch", action="store_true", help="add STEAL's 50 GB batch tasks to generated traces")
    ap.add_argument("--scale", type=float, default=1.0, help="tasks, volume and duration x this (load kept)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--algorithms", default=",".join(S.ALGORITHMS))
    ap.add_argument("--lambda", dest="lam", type=float, default=1.0, help="STEAL's lambda (default 1)")
    ap.add_argument("--json", action="store_true", help="one JSON object per algorithm per line")
    ap.add_argument("--markdown", help="write a Markdown table here (with --traces)")
    args = ap.parse_args(argv)
    algorithms = [a for a in args.algorithms.split(",") if a]
    for a in algorithms:
        if a not in S.ALGORITHMS:
            ap.error(f"--algorithms: unknown {a!r} (known: {', '.join(S.ALGORITHMS)})")
    if args.generate:
        if not args.out:
            ap.error("--generate needs --out FILE")
        T.write_trace(T.generate(args.generate, scale=args.scale, seed=args.seed, batch=args.batch), args.out)
        print(f"wrote {args.out}")
        return 0
    if args.trace:
        try:
            tasks = T.read_trace(args.trace)
        except (OSError, ValueError) as exc:
            print(f"fstream bench scheduling: {exc}", file=sys.stderr)
            return 2
        rows = _run(tasks, algorithms, window_s=None, lam=args.lam, seed=args.seed)
        for r in rows:
            print(json.dumps(r) if args.json else f"{r['algorithm']}: avg slowdown {r.get('avg_slowdown', 0):.2f}, "
                  f"worst {r.get('worst_slowdown', 0):.1f}, avg turnaround {r.get('avg_turnaround', 0):.1f} s")
        return 0
    if args.traces:
        results = {}
        t0 = time.time()
        for name in args.traces.split(","):
            tasks = T.generate(name, scale=args.scale, seed=args.seed, batch=args.batch)
            results[name] = _run(tasks, algorithms, window_s=900 * args.scale, lam=args.lam, seed=args.seed)
            for r in results[name]:
                print(json.dumps({"trace": name, **r}) if args.json else
                      f"{name} {r['algorithm']}: avg slowdown {r.get('avg_slowdown', 0):.2f}, "
                      f"worst {r.get('worst_slowdown', 0):.1f}", flush=True)
        if args.markdown:
            with open(args.markdown, "w") as fh:
                fh.write(_markdown(results, args) + f"\nComputed in {time.time() - t0:.0f} s.\n")
        return 0
    ap.error("give --trace FILE, --traces LIST or --generate NAME --out FILE")
    return 2


if __name__ == "__main__":
    sys.exit(main())
