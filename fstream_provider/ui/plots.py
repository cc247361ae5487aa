"""A transfer task's plot, drawn from its job's events on Redis when it is first asked for (issue 31).

The task no longer draws it while it finishes (that took ~1 s of every task's ``execute_complete``); the
api-server draws it on the first view and keeps the PNG of a finished job (the timeline of a running job
is drawn again when it grew). The job is the one the task instance recorded in its XCom ``job_id``; the
Redis bus is the task's ``fstream`` connection (XCom ``fstream_conn_id``, default ``fstream_default``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

CACHE_SIZE = 64


class PlotUnavailable(LookupError):
    """No plot for this task instance; the message says why (shown to the user as is)."""


@dataclass(frozen=True)
class TaskRef:
    """A task instance as the UI names it (``map_index`` -1 for an unmapped task)."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int

    @classmethod
    def parse(cls, dag_id: str, run_id: str, task_id: str, map_index: str) -> "TaskRef":
        """The UI leaves ``{MAP_INDEX}`` unreplaced for unmapped tasks: anything not an integer is -1."""
        try:
            mi = int(map_index)
        except ValueError:
            mi = -1
        return cls(dag_id, run_id, task_id, mi)


class PlotCache:
    """PNG bytes per job id, with the number of events they were drawn from; a finished job's is final."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[int, bool, bytes]] = OrderedDict()
        self.size = size
        self.drawn = 0  # how many plots were drawn (tests and the log read it)

    def get(self, job_id: str, n_events: int) -> bytes | None:
        with self._lock:
            item = self._items.get(job_id)
            if item is None or (not item[1] and item[0] != n_events):
                return None
            self._items.move_to_end(job_id)
            return item[2]

    def put(self, job_id: str, n_events: int, final: bool, png: bytes) -> None:
        with self._lock:
            self._items[job_id] = (n_events, final, png)
            self._items.move_to_end(job_id)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


CACHE = PlotCache()


def job_of(ti: TaskRef, session: Any) -> tuple[str, str]:
    """``(job_id, conn_id)`` from the task instance's XComs; ``PlotUnavailable`` naming what is missing."""
    from sqlalchemy import select

    from airflow.models.xcom import XComModel

    rows = session.scalars(select(XComModel).where(
        XComModel.dag_id == ti.dag_id, XComModel.run_id == ti.run_id, XComModel.task_id == ti.task_id,
        XComModel.map_index == ti.map_index, XComModel.key.in_(("job_id", "fstream_conn_id")))).all()
    values = {r.key: XComModel.deserialize_value(r) for r in rows}
    if not values.get("job_id"):
        raise PlotUnavailable(f"task {ti.task_id} of {ti.dag_id} run {ti.run_id} (map index {ti.map_index}) has no "
                              "FStream job: it is not an FStream transfer, or it has not submitted one yet")
    return str(values["job_id"]), str(values.get("fstream_conn_id") or "fstream_default")


def draw(job_id: str, conn_id: str, cache: PlotCache = CACHE) -> bytes:
    """The job's plot: from the cache, or drawn from its events on the connection's Redis."""
    from airflow.models.connection import Connection

    from fstream_provider.bus.client import connect
    from fstream_provider.bus.jobs import JobStore
    from fstream_provider.bus.keys import Keys
    from fstream_provider.hooks.fstream import settings_from_connection
    from fstream_provider.model.plot import plot_png
    from fstream_provider.model.tasklog import intervals_from_events

    try:
        settings = settings_from_connection(Connection.get_connection_from_secrets(conn_id))
    except Exception as exc:  # AirflowNotFoundException, a bad connection: said, not raised as a 500
        raise PlotUnavailable(f"FStream connection {conn_id!r}: {exc}") from None
    client = connect(settings.redis_url)
    try:
        store = JobStore(client, keys=Keys(settings.namespace))
        job = store.get(job_id)
        if job is None:
            raise PlotUnavailable(f"FStream job {job_id} is no longer on the bus (expired or removed)")
        events = store.all_events(job_id)
        cached = cache.get(job_id, len(events))
        if cached is not None:
            return cached
        intervals = intervals_from_events(events)
        png = plot_png(intervals, job.spec.target_throughput_bps, title=f"FStream job {job_id}")
        if not png:
            raise PlotUnavailable(f"FStream job {job_id} has no interval records yet ({job.state})")
        cache.put(job_id, len(events), job.terminal, png)
        cache.drawn += 1
        return png
    finally:
        client.close()
