"""The provider description Airflow reads through the ``apache_airflow_provider`` entry point (no Airflow import).

It is the ``provider.yaml`` of an official provider in code: versions, the integration and where its docs
are, every hook, operator, sensor and trigger module, and the ``fstream`` connection type with its form
(``conn-fields`` and ``ui-field-behaviour``: Airflow 3.2+ builds the connection form from these without
importing the hook, and skips the hook's ``get_ui_field_behaviour`` when the FAB provider is absent).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

INTEGRATION = "FStream"
DOC_PAGES = ("index.md", "connection.md", "operators.md", "sensors.md", "triggers.md", "hooks.md")
"""The how-to pages under ``docs/airflow/``; installed with the wheel in ``share/doc/fstream/airflow``."""


def docs_dir() -> Path:
    """Where the how-to pages are on this machine: the installed copy, or ``docs/airflow`` of a source checkout.

    The project has no public web site, so the integration's doc URL is the ``file:`` URI of these pages
    rather than an invented address.
    """
    installed = Path(sys.prefix) / "share" / "doc" / "fstream" / "airflow"
    if (installed / "index.md").is_file():
        return installed
    return Path(__file__).resolve().parent.parent / "docs" / "airflow"


def _string(label: str, description: str, **schema: Any) -> dict[str, Any]:
    return {"label": label, "description": description, "schema": {"type": ["string", "null"], **schema}}


CONN_FIELDS: dict[str, dict[str, Any]] = {
    "url": _string("Redis URL", "A full Redis URL (redis://, rediss://, unix://, redis+sentinel://h1:26379,h2:26379/"
                   "mymaster); overrides host, port, login, password and database above.", format="url"),
    "submitter": _string("Submitter id", "The identity the agents know this connection by; every job submitted "
                         "through it is signed with this submitter's key (agents refuse unsigned jobs)."),
    "submitter_secret": _string("Submitter key", "The submitter's key itself (at least 16 bytes); Airflow masks "
                                "it. Or give 'Submitter key file' instead.", format="password"),
    "submitter_key_file": _string("Submitter key file", "Path, on the Airflow workers and triggerer, of a 0600 file "
                                  "holding the submitter's key (instead of the inline key)."),
    "key": _string("Key id", "Id of the agents' keyring key the jobs authenticate to the receivers with (jobs "
                   "never name key files on the agents' hosts).", default="default"),
    "namespace": _string("Key namespace", "Prefix of every FStream key on this Redis (several deployments can "
                         "share one server).", default="fstream"),
    "agent_group": _string("Agent group", "Name of the agent group on this bus (shown by Test connection)."),
    "ssl": {"label": "Redis over TLS", "description": "Connect with rediss:// when host and port are given.",
            "schema": {"type": ["boolean", "null"], "default": False}},
}
"""The ``fstream`` connection's extra fields, in Airflow's ``conn-fields`` form (stored in ``Connection.extra``)."""

UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden-fields": [],
    "relabeling": {
        "host": "Redis host",
        "port": "Redis port",
        "schema": "Redis database",
        "login": "Redis user (ACL, optional)",
        "password": "Redis password (optional)",
    },
    "placeholders": {
        "host": "redis.example.org",
        "port": "6379",
        "schema": "0",
        "url": "redis+sentinel://h1:26379,h2:26379/mymaster",
        "submitter": "lcls-daq",
        "submitter_key_file": "/etc/fstream/submitters/lcls-daq.key",
        "key": "default",
        "namespace": "fstream",
        "agent_group": "agents",
    },
}
"""Relabels and placeholders of the standard connection form fields (``ui-field-behaviour``)."""


def provider_info(version: str) -> dict[str, Any]:
    """Every hook, operator, sensor and trigger module of the provider, and the ``fstream`` connection type."""
    docs = docs_dir()
    return {
        "package-name": "fstream",
        "name": "FStream",
        "description": "Stream files over tuned parallel TCP channels with the FStream transfer agent: "
                       "a deferrable transfer operator, a new-file sensor and an asset-watcher event trigger.",
        "versions": [version],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": (docs / "index.md").as_uri(),
                "how-to-guide": [(docs / page).as_uri() for page in DOC_PAGES[1:]],
                "tags": ["protocol", "software"],
            }
        ],
        "hooks": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["fstream_provider.hooks.fstream", "fstream_provider.hooks.fstream_async",
                                   "fstream_provider.hooks.sftp"],
            }
        ],
        "operators": [{"integration-name": INTEGRATION,
                       "python-modules": ["fstream_provider.operators.transfer", "fstream_provider.operators.links",
                                          "fstream_provider.operators.lineage"]}],
        "extra-links": ["fstream_provider.operators.links.FStreamPlotLink"],
        "sensors": [{"integration-name": INTEGRATION, "python-modules": ["fstream_provider.sensors.new_files"]}],
        "triggers": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["fstream_provider.triggers.transfer", "fstream_provider.triggers.new_files"],
            }
        ],
        "connection-types": [
            {
                "connection-type": "fstream",
                "hook-class-name": "fstream_provider.hooks.fstream.FStreamHook",
                "hook-name": "FStream",
                "conn-fields": CONN_FIELDS,
                "ui-field-behaviour": UI_FIELD_BEHAVIOUR,
            }
        ],
    }
