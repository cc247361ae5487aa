"""Write a benchmark's result file: ``<results>/<name>-<UTC stamp>.json`` with its provenance and the machine.

``RESULTS_DIR`` (``bench/results``, defined in ``fstream_bench.core``) is where every benchmark writes unless told
otherwise; ``run_saved`` runs a benchmark under provenance and saves what it returns, ``save`` saves a
document whose provenance was started earlier (a benchmark that also saves what a failed run measured).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from fstream_bench.core import RESULTS_DIR, provenance, runstats
from fstream_bench.core.report import machine_info


def save(name: str, doc: dict, prov: dict, results: str | Path | None = None, *, machine: dict | None = None,
         log=None) -> Path:  # noqa: ANN001 - a text stream
    """Finish ``prov`` into ``doc`` (with ``machine``, taken now if not given, and the command), write it as
    ``<results>/<name>-<UTC stamp>.json`` (``RESULTS_DIR`` by default) and say where on ``log`` (stdout)."""
    doc["machine"] = machine if machine is not None else machine_info()
    doc["provenance"] = provenance.finish(prov)
    doc["command"] = prov["command"]
    out = Path(results or RESULTS_DIR) / f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"results: {out}", file=log or sys.stdout)
    return out


def run_saved(name: str, argv: list[str], modules: tuple[str, ...], fn,  # noqa: ANN001 - () -> dict
              results: str | Path | None = None) -> dict:
    """Run ``fn()`` (returning a JSON-able dict) under provenance; save and return the document."""
    machine = machine_info()
    prov = provenance.start(name, list(argv), modules)
    doc = fn()
    save(name, doc, prov, results, machine=machine)
    return doc


def save_with_markdown(name: str, doc: dict, prov: dict, results: str | Path,
                       markdown) -> tuple[Path, Path]:  # noqa: ANN001 - (doc, command) -> str
    """Finish ``prov`` into ``doc`` (the document carries its own ``machine``), write it and ``markdown(doc,
    command)`` beside it as ``<results>/<name>-<local stamp>.json`` and ``.md`` (``runstats.write_result``), print
    the markdown and where both went."""
    doc["provenance"] = provenance.finish(prov)
    doc["command"] = prov["command"]
    md = markdown(doc, doc["command"])
    jp, mp = runstats.write_result(results, name, doc, md)
    print(md)
    print(f"results: {jp}, {mp}")
    return jp, mp
