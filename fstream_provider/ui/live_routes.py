"""The live views' routes on the plugin's app (issue 27); ``app`` includes ``router`` under ``/fstream``.

Overview (the top-level "FStream" page), behind ``requires_access_view(AccessView.PLUGINS)``, showing only
the jobs of DAGs the user may read, or every job to those who may read the bus's connection (``access``):

- ``GET /fstream/live``: the page (``pages/live.html``); ``?conn_id=`` picks another ``fstream``
  connection than ``fstream_default``: one the user may read (else 403) and that exists (``bus_conn``).
- ``GET /fstream/live/data``: the same data as JSON, once; ``GET /fstream/live/stream``: as server-sent events.

Job view (the task instance's "Transfer" tab), behind ``requires_access_dag`` on the task instance's DAG;
the job is the one the task recorded in its XComs (``plots.job_of``), on the connection it recorded:

- ``GET /fstream/page/{dag_id}/{run_id}/{task_id}/{map_index}``: the page (``pages/job.html``), with the
  plot PNG and links to the task's log; ``{MAP_INDEX}`` left unreplaced (an unmapped task) means -1.
- ``GET /fstream/job/...``: ``bus.live.job_detail`` as JSON; ``GET /fstream/stream/...``: server-sent events
  (``sse.job_stream``: a snapshot, then the job's events as Redis appends them).
"""

from __future__ import annotations

import asyncio
import html
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse

from airflow.api_fastapi.auth.managers.models.resource_details import AccessView, DagAccessEntity
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag, requires_access_view

from fstream_provider.bus.live import job_detail, overview
from fstream_provider.ui import access, bus_conn, plots, sse
from fstream_provider.ui.overview_feed import REFRESH_S, feed_for

PAGES = Path(__file__).resolve().parent / "pages"
TAB_ROUTE = "fstream-transfer"  # the task-instance tab's url_route (``plugin.FStreamPlugin``)
NAV_ROUTE = "fstream"  # the top-level page's url_route
READ_TI = [Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.TASK_INSTANCE))]
VIEW = [Depends(requires_access_view(AccessView.PLUGINS))]
_STREAM_ID = re.compile(r"^\d{1,20}-\d{1,20}$")

router = APIRouter()


@lru_cache(maxsize=4)
def _template(name: str) -> str:
    """A page with the pieces both pages share in place: the head (``head.html``) and the script (``common.js``)."""
    text = (PAGES / name).read_text(encoding="utf-8")
    return (text.replace("<!--__HEAD__-->", (PAGES / "head.html").read_text(encoding="utf-8").rstrip("\n"))
            .replace("/*__COMMON_JS__*/", (PAGES / "common.js").read_text(encoding="utf-8")))


def render(name: str, config: dict[str, Any], title: str, plot_html: str = "") -> HTMLResponse:
    """A page template with its config (JSON in a script element), title and plot element filled in."""
    blob = json.dumps(config, default=str).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    body = (_template(name).replace("__FSTREAM_CONFIG__", blob).replace("__FSTREAM_TITLE__", html.escape(title))
            .replace("<!--__PLOT__-->", plot_html))
    return HTMLResponse(body, headers={"Cache-Control": "no-store"})


def _parts(ti: plots.TaskRef) -> str:
    return "/".join(quote(str(p), safe="") for p in (ti.dag_id, ti.run_id, ti.task_id, ti.map_index))


def ui_task_path(ti: plots.TaskRef) -> str:
    """The task instance in Airflow's UI (its log is the default tab), relative to the UI's root."""
    q = lambda p: quote(p, safe="")  # noqa: E731
    path = f"dags/{q(ti.dag_id)}/runs/{q(ti.run_id)}/tasks/{q(ti.task_id)}"
    return path + (f"/mapped/{ti.map_index}" if ti.map_index >= 0 else "")


def _job_of(ti: plots.TaskRef) -> tuple[str, str]:
    from airflow.utils.session import create_session

    with create_session() as session:
        return plots.job_of(ti, session)


def _finished(conn_id: str, job_id: str) -> bool:
    """The job had ended when the page was drawn (its plot in the page is then the final one: the page does
    not fetch it again); False when that cannot be read now."""
    from fstream_provider.bus.client import REDIS_UNREACHABLE
    from fstream_provider.bus.job_state import TERMINAL_STATES

    try:
        bus = bus_conn.resolve(conn_id)
        return bus_conn.client(bus).hget(bus.keys.job(job_id), "state") in TERMINAL_STATES
    except (HTTPException, *REDIS_UNREACHABLE):
        return False


def _last_event_id(request: Request) -> str | None:
    value = request.headers.get("last-event-id") or ""
    return value if _STREAM_ID.match(value) else None


def _take_slot() -> None:
    if not sse.SLOTS.take():
        raise HTTPException(status_code=503, detail=f"{sse.SLOTS.size} FStream live streams are open in this "
                                                    "api-server process; try again later",
                            headers={"Retry-After": "5"})


# ---------------------------------------------------------------------------------------------------- overview
@router.get("/live", dependencies=VIEW, response_class=HTMLResponse)
async def live_page(user: GetUserDep, conn_id: str | None = None) -> HTMLResponse:
    bus = await asyncio.to_thread(access.bus_for, user, conn_id)
    q = f"?conn_id={quote(bus.conn_id, safe='')}" if conn_id else ""
    return render("live.html", {"stream": "live/stream" + q, "data": "live/data" + q, "root": "../",
                                "page": "page/", "tab_route": TAB_ROUTE, "conn_id": bus.conn_id,
                                "refresh_s": REFRESH_S},
                  "FStream transfers")


@router.get("/live/data", dependencies=VIEW)
async def live_data(user: GetUserDep, conn_id: str | None = None) -> JSONResponse:
    bus = await asyncio.to_thread(access.bus_for, user, conn_id)
    ov = await asyncio.to_thread(overview, bus_conn.client(bus), bus.keys)
    readable = await asyncio.to_thread(access.scope, user, bus.conn_id)
    return JSONResponse(access.visible_overview(ov, readable), headers={"Cache-Control": "no-store"})


@router.get("/live/stream", dependencies=VIEW)
async def live_stream(request: Request, user: GetUserDep, conn_id: str | None = None) -> StreamingResponse:
    bus = await asyncio.to_thread(access.bus_for, user, conn_id)
    _take_slot()
    return sse.response(sse.overview_stream(request, feed_for(bus), lambda: access.scope(user, bus.conn_id)))


# ---------------------------------------------------------------------------------------------------- one job
@router.get("/page/{dag_id}/{run_id}/{task_id}/{map_index}", dependencies=READ_TI, response_class=HTMLResponse)
async def job_page(dag_id: str, run_id: str, task_id: str, map_index: str) -> HTMLResponse:
    ti = plots.TaskRef.parse(dag_id, run_id, task_id, map_index)
    try:
        job_id, conn_id = await asyncio.to_thread(_job_of, ti)
        note = None
    except plots.PlotUnavailable as exc:
        job_id, conn_id, note = None, None, str(exc)
    final = bool(job_id) and await asyncio.to_thread(_finished, conn_id, job_id)
    parts = _parts(ti)
    # relative to this page (``/fstream/page/d/r/t/m``), so an Airflow served under a sub-path works too
    plot = "../../../../plot/" + parts + ".png"
    cfg = {"job_id": job_id, "note": note, "stream": "../../../../stream/" + parts, "plot": plot,
           "root": "../../../../../", "log": ui_task_path(ti), "final": final,
           "task": {"dag_id": ti.dag_id, "run_id": ti.run_id, "task_id": ti.task_id, "map_index": ti.map_index}}
    img = ""
    if job_id:  # the plot in the HTML itself (shown before the script runs, and without it)
        img = (f'<img id="plot" src="{html.escape(plot)}" alt="throughput, channels and parameter changes over '
               'time" style="max-width:100%">')
    return render("job.html", cfg, f"FStream transfer {ti.dag_id}.{ti.task_id}", img)


@router.get("/job/{dag_id}/{run_id}/{task_id}/{map_index}", dependencies=READ_TI)
async def job_data(dag_id: str, run_id: str, task_id: str, map_index: str) -> JSONResponse:
    ti = plots.TaskRef.parse(dag_id, run_id, task_id, map_index)
    try:
        job_id, conn_id = await asyncio.to_thread(_job_of, ti)
    except plots.PlotUnavailable as exc:
        raise HTTPException(status_code=404, detail=str(exc)) from None
    bus = await asyncio.to_thread(bus_conn.resolve, conn_id)
    detail = await asyncio.to_thread(job_detail, bus_conn.store(bus), job_id)
    if detail is None:
        raise HTTPException(status_code=404, detail=f"FStream job {job_id} is no longer on the bus")
    return JSONResponse(detail, headers={"Cache-Control": "no-store"})


@router.get("/stream/{dag_id}/{run_id}/{task_id}/{map_index}", dependencies=READ_TI)
async def job_stream(dag_id: str, run_id: str, task_id: str, map_index: str, request: Request) -> StreamingResponse:
    ti = plots.TaskRef.parse(dag_id, run_id, task_id, map_index)
    try:
        job_id, conn_id = await asyncio.to_thread(_job_of, ti)
    except plots.PlotUnavailable as exc:  # not submitted yet: the browser asks again after ``retry``
        once = sse.frame("nojob", {"message": str(exc)}, retry=5000)
        return StreamingResponse(iter([once]), media_type="text/event-stream", headers=sse.HEADERS)
    bus = await asyncio.to_thread(bus_conn.resolve, conn_id)
    _take_slot()
    return sse.response(sse.job_stream(request, bus, job_id, _last_event_id(request)))
