"""Write a benchmark's result file: ``<results>/<name>-<UTC stamp>.json`` with its provenance and the machine."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fstream_bench.core import provenance
from fstream_bench.core.report import machine_info

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


def run_saved(name: str, argv: list[str], modules: tuple[str, ...], fn, results: str | Path | None = None) -> dict:  # noqa: ANN001
    """Run ``fn()`` (returning a JSON-able dict) under provenance; save and return the document."""
    machine = machine_info()
    prov = provenance.start(name, list(argv), modules)
    doc = fn()
    doc["machine"] = machine
    doc["provenance"] = provenance.finish(prov)
    doc["command"] = prov["command"]
    out = Path(results or RESULTS_DIR) / f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"results: {out}")
    return doc
