"""``FStreamPlugin``: what the provider adds to the Airflow 3 UI, registered by the ``airflow.plugins`` entry
point (a provider-info ``plugins`` entry is not loaded under lazy provider discovery).

- ``fastapi_apps``: ``fstream_provider.ui.app`` under ``/fstream`` (auth-guarded routes);
- ``external_views``: a "Transfer plot" tab on every task instance, framing the plot page (a task that ran
  no FStream job shows a one-line note saying so).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from fstream_provider.ui.app import MOUNT, app


class FStreamPlugin(AirflowPlugin):
    name = "fstream"
    fastapi_apps = [{"app": app, "url_prefix": MOUNT, "name": "FStream"}]
    external_views = [{
        "name": "Transfer plot",
        "href": MOUNT + "/page/{DAG_ID}/{RUN_ID}/{TASK_ID}/{MAP_INDEX}",
        "destination": "task_instance",
        "url_route": "fstream-plot",
    }]
