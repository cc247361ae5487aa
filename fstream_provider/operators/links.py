"""Where the transfer plot goes (``ObjectStoragePath``: local, ``file://``, ``s3://``, ...) and the task's link to it.

The plot is written through Airflow's ``ObjectStoragePath`` so a remote ``plot_dir`` works with distributed
executors (the worker that resumes the task need not share a disk with the UI). The operator extra link
shows where the plot is (also in the task's XCom ``plot``): its path when local, else its URL. The Airflow
UI opens only ``http(s)`` URLs as links; for a local path and object-store URLs (``s3://``, ``gs://``) the
button carries the location so the user can copy it, nothing more.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink, ObjectStoragePath

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.definitions.taskinstancekey import TaskInstanceKey

PLOT_XCOM_KEY = "plot"


def _safe(s: Any) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(s))


def plot_location(base: str, dag_id: str, run_id: str, task_id: str, job_id: str) -> ObjectStoragePath:
    """``base/dag/run/task-job.png`` as an ``ObjectStoragePath`` (each part made safe for any store)."""
    if not str(base).strip():
        raise ValueError("plot_dir is empty: give a local directory or a URL such as s3://bucket/plots")
    return ObjectStoragePath(str(base)) / _safe(dag_id) / _safe(run_id) / f"{_safe(task_id)}-{_safe(job_id)}.png"


def write_plot(path: ObjectStoragePath, data: bytes) -> str:
    """Write the PNG bytes at ``path`` (making its parents); return where it is.

    A local plot (a plain directory or ``file://``) is given as its absolute path, which a user can open or
    copy from the task log; anything else as its URL (``s3://bucket/plots/...``).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        fh.write(data)
    if path.protocol in ("", "file", "local"):
        return path.path
    return str(path)


class FStreamPlotLink(BaseOperatorLink):
    """"Transfer plot" button of ``FStreamTransferOperator``: the URL of the plot its run wrote.

    Airflow 3 calls ``get_link`` once, in the worker when the task instance finishes, and stores the result
    as the XCom ``_link_FStreamPlotLink`` that the UI reads. The URL is taken from the report the operator
    just built (the same value as its XCom ``plot``); when the task only deferred there is no report yet
    and the link is empty (looking the XCom up then would log a "not found" error on every deferral).
    """

    name = "Transfer plot"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        report = getattr(operator, "_report", None)
        return str((report or {}).get("plot") or "")
