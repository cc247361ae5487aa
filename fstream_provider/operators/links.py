"""Where the transfer plot goes (``ObjectStoragePath``: local, ``file://``, ``s3://``, ...) and the task's link to it.

The plot is served by the provider's Airflow plugin (``fstream_provider.ui``), drawn from the job's events
when first viewed; the extra link points there (``plot_url``). A task given ``plot_dir`` also writes the PNG
through Airflow's ``ObjectStoragePath`` (local, ``file://``, ``s3://``, ...) when it finishes.
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


def plot_url(dag_id: str, run_id: str, task_id: str, map_index: int | None) -> str | None:
    """The absolute URL of the task's plot on the api-server (the provider's plugin draws it when first viewed),
    or None when ``[api] base_url`` is not an absolute ``http(s)`` URL: a path alone would be taken by the
    UI for one of its own routes (issue 31: the old link, a file path, opened the UI's 404 page)."""
    from airflow.configuration import conf

    from fstream_provider.model.plot import plot_route

    base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
    if not base.startswith(("http://", "https://")):
        return None
    return base + plot_route(dag_id, run_id, task_id, -1 if map_index is None else map_index)


class FStreamPlotLink(BaseOperatorLink):
    """"Transfer plot" button of ``FStreamTransferOperator``: the plot served by the provider's plugin.

    Airflow 3 calls ``get_link`` once, in the worker when the task instance finishes, and stores the result
    as the XCom ``_link_FStreamPlotLink`` that the UI reads. The link is the absolute URL of the plugin's plot
    route (``plot_url``); with no absolute ``[api] base_url`` there is no link (the task instance's "Transfer
    plot" tab shows the plot anyway), and a file written to ``plot_dir`` is named in the task log and XCom.
    """

    name = "Transfer plot"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        if getattr(operator, "_report", None) is None:
            return ""  # only deferred so far: the link is made when the task finishes
        return plot_url(ti_key.dag_id, ti_key.run_id, ti_key.task_id, ti_key.map_index) or ""
