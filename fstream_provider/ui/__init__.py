"""FStream in the Airflow UI (an Airflow 3 plugin loaded through the ``airflow.plugins`` entry point).

``plugin.FStreamPlugin`` mounts ``app`` (a FastAPI app under ``/fstream`` on the api-server, every route
behind Airflow's auth manager), adds a top-level "FStream" page (the live overview) and a "Transfer" tab to
task instances (the job live, with its plot).
"""
