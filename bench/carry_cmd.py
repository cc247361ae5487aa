"""``fstream bench carry RESULT``: the command line of ``fstream_bench.core.carry`` with the smokes of ``smokes``."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from fstream_bench.core.carry import carry, result_doc
from fstream_bench.core.saved import RESULTS_DIR
from fstream_bench.smokes import SMOKES, smoke_for


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fstream bench carry", description=(
        "Run RESULT's smoke on its code and on today's, ABBA; re-stamp it when today's is within the noise"))
    ap.add_argument("result", help="a result file (or run directory) under bench/results")
    ap.add_argument("--pairs", type=int, default=3, help="ABBA pairs (default 3)")
    ap.add_argument("--results", default=str(RESULTS_DIR), help="where the carry record goes")
    a = ap.parse_args(argv)
    if a.pairs < 2:
        ap.error("--pairs must be at least 2: the noise is what one side shows against itself")
    path = Path(a.result)
    try:
        _, doc = result_doc(path)
    except (OSError, ValueError) as e:
        print(f"fstream bench carry: {path}: cannot read the result ({e})")
        return 2
    smoke = smoke_for(doc)
    if smoke is None:
        bench = " ".join(str(x) for x in ((doc.get("provenance") or {}).get("bench"), doc.get("part")) if x)
        print(f"fstream bench carry: {path} is a `{bench}` result and `{bench}` has no smoke variant "
              f"(bench/smokes.py: {', '.join(sorted(SMOKES))}): re-measure it")
        return 2
    try:
        ok, record = carry(path, smoke, pairs=a.pairs, results=Path(a.results))
    except (RuntimeError, ValueError, subprocess.CalledProcessError) as e:
        print(f"fstream bench carry: {e}")
        return 2
    body = json.loads(record.read_text())
    for m, v in body["metrics"].items():
        print(f"  {m}: today/then {v['median']:.3f} ({v['range'][0]:.3f}-{v['range'][1]:.3f}), "
              f"same-code noise ±{v['noise']:.3f}: {'within' if v['within'] else 'MOVED'}")
    print(f"fstream bench carry: {'carried' if ok else 'not carried: re-measure'} "
          f"({body['then'][:9]} -> {body['today'][:9]}); record {record}")
    return 0 if ok else 1
