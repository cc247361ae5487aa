"""FStream in the Airflow UI (an Airflow 3 plugin loaded through the ``airflow.plugins`` entry point).

``plugin.FStreamPlugin`` mounts ``app`` (a FastAPI app under ``/fstream`` on the api-server, every route
behind Airflow's auth manager) and adds a "Transfer plot" tab to task instances.
"""
