"""The provider description Airflow reads through the ``apache_airflow_provider`` entry point (no Airflow import)."""

from __future__ import annotations

from typing import Any


def provider_info(version: str) -> dict[str, Any]:
    """Every hook, operator, sensor and trigger module of the provider, and the ``fstream`` connection type."""
    integration = "FStream"
    return {
        "package-name": "fstream",
        "name": "FStream",
        "description": "Stream files over tuned parallel TCP channels with the FStream transfer agent: "
                       "a deferrable transfer operator, a new-file sensor and an asset-watcher event trigger.",
        "versions": [version],
        "integrations": [
            {
                "integration-name": integration,
                "external-doc-url": "https://airflow.apache.org/docs/apache-airflow/stable/authoring-and-scheduling/"
                                    "event-scheduling.html",
                "tags": ["protocol", "software"],
            }
        ],
        "hooks": [
            {
                "integration-name": integration,
                "python-modules": ["fstream_provider.hooks.fstream", "fstream_provider.hooks.fstream_async",
                                   "fstream_provider.hooks.sftp"],
            }
        ],
        "operators": [{"integration-name": integration, "python-modules": ["fstream_provider.operators.transfer"]}],
        "sensors": [{"integration-name": integration, "python-modules": ["fstream_provider.sensors.new_files"]}],
        "triggers": [
            {
                "integration-name": integration,
                "python-modules": ["fstream_provider.triggers.transfer", "fstream_provider.triggers.new_files"],
            }
        ],
        "connection-types": [
            {
                "connection-type": "fstream",
                "hook-class-name": "fstream_provider.hooks.fstream.FStreamHook",
                "hook-name": "FStream",
            }
        ],
    }
