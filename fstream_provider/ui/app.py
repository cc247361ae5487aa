"""The FStream plugin's FastAPI app, mounted on the Airflow api-server under ``/fstream`` (issues 31, 27).

Every route is behind Airflow's auth manager, and a request without the UI's token is refused (401/403):
a task's routes by reading a task instance of the DAG named in the path (``requires_access_dag``), so a
user who may not see a DAG sees none of its transfers; the overview by the plugins view
(``requires_access_view``), filtered per DAG. Routes:

- ``GET /fstream/plot/{dag_id}/{run_id}/{task_id}/{map_index}.png``: the task's transfer plot (PNG), drawn
  from its job's events when first asked for (``plots``); 404 with the reason when there is none.
- the live views (``live_routes``): ``/fstream/live`` (the top-level "FStream" overview, its ``/data`` and
  ``/stream``), ``/fstream/page/{dag_id}/{run_id}/{task_id}/{map_index}`` (the task instance's "Transfer"
  tab: the job live, with its plot) with ``/fstream/job/...`` (JSON) and ``/fstream/stream/...``
  (server-sent events fed by the job's Redis event stream).
- ``GET /fstream/docs/{page}`` (and ``/fstream/docs/img/{name}``): the provider's how-to pages (the installed
  ``docs/airflow``), rendered, for any signed-in user: the Providers page links ``fstream/docs/index.md``
  (set by ``doc_link``) instead of an apache.org path that does not exist; ``/fstream/docs/project/{page}``: the
  project's pages they link to (``docs/*.md``), links rewritten to where they are served (``doc_pages``).
"""

from __future__ import annotations

import html
from pathlib import PurePosixPath

from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, Response

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import requires_access_dag, requires_authenticated

from fstream_provider.model.plot import PLOT_MOUNT
from fstream_provider.provider_info import DOC_PAGES, docs_dir
from fstream_provider.ui import doc_pages, plots
from fstream_provider.ui.live_routes import router as live_router

MOUNT = PLOT_MOUNT
READ_TI = [Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.TASK_INSTANCE))]
SIGNED_IN = [Depends(requires_authenticated())]

app = FastAPI(title="FStream", description="FStream transfers in the Airflow UI")
app.include_router(live_router)


@app.get("/plot/{dag_id}/{run_id}/{task_id}/{map_index}.png", dependencies=READ_TI,
         responses={200: {"content": {"image/png": {}}}})
def plot(dag_id: str, run_id: str, task_id: str, map_index: str, session: SessionDep) -> Response:
    ti = plots.TaskRef.parse(dag_id, run_id, task_id, map_index)
    try:
        job_id, conn_id = plots.job_of(ti, session)
        png = plots.draw(job_id, conn_id)
    except plots.PlotUnavailable as exc:
        raise HTTPException(status_code=404, detail=str(exc)) from None
    return Response(content=png, media_type="image/png", headers={"Cache-Control": "private, max-age=5"})


@app.get("/docs/{page}", dependencies=SIGNED_IN, response_class=HTMLResponse)
def doc_page(page: str) -> HTMLResponse:
    """One how-to page (``docs/airflow/*.md``, the installed copy), rendered with markdown-it (rich's)."""
    if page not in DOC_PAGES:
        raise HTTPException(status_code=404, detail=f"no FStream page {page!r} (pages: {', '.join(DOC_PAGES)})")
    return _html(page, doc_pages.render("airflow/" + page))


@app.get("/docs/" + doc_pages.PROJECT + "/{page}", dependencies=SIGNED_IN, response_class=HTMLResponse)
def project_doc_page(page: str) -> HTMLResponse:
    """One of the project's pages the how-to pages link to (``docs/*.md``: architecture, authorization, ...)."""
    if doc_pages.project_page(page) is None:
        raise HTTPException(status_code=404, detail=f"no FStream page {page!r}")
    return _html(page, doc_pages.render(page))


def _html(page: str, body: str) -> HTMLResponse:
    return HTMLResponse(f"<!doctype html><html><head><meta charset='utf-8'><title>FStream: {html.escape(page)}"
                        f"</title></head><body style='font-family:sans-serif;max-width:60em'>{body}</body></html>")


@app.get("/docs/img/{name}", dependencies=SIGNED_IN)
def doc_image(name: str) -> FileResponse:
    path = docs_dir() / "img" / PurePosixPath(name).name
    if not name.endswith(".png") or PurePosixPath(name).name != name or not path.is_file():
        raise HTTPException(status_code=404, detail=f"no FStream image {name!r}")
    return FileResponse(path, media_type="image/png")
