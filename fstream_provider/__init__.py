"""FStream: streaming file transfer with online tuning; an Apache Airflow 3 provider (no Airflow import here)."""

from __future__ import annotations

__version__ = "0.1.0"


def get_provider_info() -> dict:
    """Describe this provider to Airflow (entry point ``apache_airflow_provider``)."""
    return {
        "package-name": "fstream",
        "name": "FStream",
        "description": "Stream files over tuned parallel TCP channels with the FStream transfer agent.",
        "versions": [__version__],
        "hooks": [],
        "operators": [],
        "sensors": [],
        "triggers": [],
        "connection-types": [],
    }
