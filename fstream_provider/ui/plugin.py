"""``FStreamPlugin``: what the provider adds to the Airflow 3 UI, registered by the ``airflow.plugins`` entry
point (a provider-info ``plugins`` entry is not loaded under lazy provider discovery).

- ``fastapi_apps``: ``fstream_provider.ui.app`` under ``/fstream`` (auth-guarded routes);
- ``external_views``: a top-level "FStream" entry in the UI's navigation (``destination`` ``nav`` with
  ``nav_top_level``), framing the live overview ``/fstream/live`` (agents, running and queued jobs, pools,
  the scheduler board; issue 27), and a "Transfer" tab on every task instance framing the job's live view
  with its plot (a task that ran no FStream job shows a one-line note saying so, and picks the job up when
  the task submits one).
- ``fastapi_root_middlewares``: ``doc_link.ProvidersPageLink``, which links ``fstream`` on the Providers page to
  the plugin's how-to pages as the api-server starts (setup.cfg names no Documentation URL: no web site).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from fstream_provider.ui.app import MOUNT, app
from fstream_provider.ui.doc_link import ProvidersPageLink
from fstream_provider.ui.live_routes import NAV_ROUTE, TAB_ROUTE


class FStreamPlugin(AirflowPlugin):
    name = "fstream"
    fastapi_apps = [{"app": app, "url_prefix": MOUNT, "name": "FStream"}]
    fastapi_root_middlewares = [{"middleware": ProvidersPageLink, "name": "FStream: the Providers page's link"}]
    external_views = [
        {
            "name": "FStream",
            "href": MOUNT + "/live",
            "destination": "nav",
            "nav_top_level": True,
            "url_route": NAV_ROUTE,
        },
        {
            "name": "Transfer",
            "href": MOUNT + "/page/{DAG_ID}/{RUN_ID}/{TASK_ID}/{MAP_INDEX}",
            "destination": "task_instance",
            "url_route": TAB_ROUTE,
        },
    ]
