"""OpenLineage for a finished transfer: the source files read and the files landed at the receiver.

Datasets follow OpenLineage's naming: a local file is namespace ``file://<host>`` and name its absolute
path; a landed file is namespace ``fstream://<receiver host>:<port>`` and name its path under the
receiver's root. Built from the task's report (the landed files of the outcome a trusted agent signed), so it lists
exactly the files that moved, also for directory and glob sources. Needs
``apache-airflow-providers-openlineage`` (in the ``airflow`` extra); without it there is no lineage.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit


def agent_host(worker: str | None) -> str:
    """The source host from the agent's name (``<host>-<pid>`` by default; a custom name is kept whole)."""
    if not worker:
        return "localhost"
    return re.sub(r"-\d+$", "", worker) or worker


def lineage_datasets(report: dict[str, Any]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(inputs, outputs)`` as ``(namespace, name)`` pairs for the landed files of a transfer report."""
    dest = urlsplit(report.get("destination") or "")
    out_ns = f"fstream://{dest.hostname}:{dest.port}" if dest.hostname else "fstream://unknown"
    src_ns = f"file://{agent_host(report.get('agent'))}"
    inputs, outputs = [], []
    for f in report.get("landed_files") or []:
        if f.get("source"):
            inputs.append((src_ns, str(f["source"])))
        outputs.append((out_ns, urlsplit(f["destination"]).path if "://" in str(f.get("destination"))
                        else "/" + str(f.get("path", "")).lstrip("/")))
    return inputs, outputs


def operator_lineage(report: dict[str, Any] | None):
    """An ``OperatorLineage`` for the report, or ``None`` when the OpenLineage provider is not installed."""
    try:
        from airflow.providers.openlineage.extractors import OperatorLineage
        from openlineage.client.event_v2 import Dataset
    except ImportError:
        return None
    inputs, outputs = lineage_datasets(report or {})
    return OperatorLineage(inputs=[Dataset(namespace=ns, name=n) for ns, n in inputs],
                           outputs=[Dataset(namespace=ns, name=n) for ns, n in outputs])


def emit_asset_events(outlets: Any, context: Any, report: dict[str, Any]) -> None:
    """Each outlet asset's event gets ``extra`` = the landed files (destination URL, size) and the job id: the files of
    the outcome a trusted agent signed (issue 40), never ``file`` events."""
    outlet_events = context.get("outlet_events") if hasattr(context, "get") else None
    if outlet_events is None:  # not ``not``: the accessors are an empty mapping until an asset is looked up
        return
    from airflow.sdk import Asset

    extra = {"job_id": report["job_id"], "files": [{"destination": f["destination"], "size": f["size"]}
                                                   for f in report["landed_files"]]}
    for outlet in outlets or []:
        if isinstance(outlet, Asset):
            outlet_events[outlet].extra = extra
