"""FStream: streaming file transfer with online tuning; an Apache Airflow 3 provider (no Airflow import here)."""

from __future__ import annotations

__version__ = "0.1.0"


def get_provider_info() -> dict:
    """Describe this provider to Airflow (entry point ``apache_airflow_provider``)."""
    from fstream_provider.provider_info import provider_info

    return provider_info(__version__)
