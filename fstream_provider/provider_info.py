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
DOC_PAGES = ("index.md", "connection.md", "operators.md", "sensors.md", "triggers.md", "hooks.md", "live.md")
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


EXTRA_PLACEHOLDERS: dict[str, str] = {
    "url": "redis+sentinel://h1:26379,h2:26379/mymaster",
    "submitter": "lcls-daq",
    "submitter_key_file": "/etc/fstream/submitters/lcls-daq.key",
    "key": "default",
    "namespace": "fstream",
    "agent_group": "agents",
}
"""An example value of each free-text extra field, shown where Airflow 3.3's UI can show one.

The React connection form (``airflow/ui/dist``, ``FieldString``) gives an extra field no placeholder of
the provider's: it reads neither ``ui-field-behaviour`` placeholders (the api-server's ``hook_meta`` keeps
those for the six standard fields only) nor a ``placeholder`` in the schema. What it does show is the
field's ``description`` under the input and its ``schema.examples`` as the input's suggestion list (with
the placeholder "Start typing to see options"); so the example goes to both.
"""


def _string(name: str, label: str, description: str, *, default: str | None = "", **schema: Any) -> dict[str, Any]:
    """A free-text extra field, optional (``null`` in its type: Airflow's form marks a field required unless
    its type allows ``null``), with its example (``EXTRA_PLACEHOLDERS``) as ``examples`` and in the help text.

    ``default`` is what the UI pre-fills into the Extra Fields JSON and saves unless the user changes it
    (``""`` by default: a field without a default is pre-filled, and saved, as ``null``). ``None`` leaves the
    default out, for the masked field: the api-server redacts a non-null default of a sensitive-named
    field to ``"***"``, which the UI would then pre-fill and save as the key.
    """
    if example := EXTRA_PLACEHOLDERS.get(name):
        schema["examples"] = [example]
        if example != default:  # the field shows its default already
            description = f"{description} Example: {example}"
    if default is not None:
        schema["default"] = default
    return {"label": label, "description": description, "schema": {"type": ["string", "null"], **schema}}


CONN_FIELDS: dict[str, dict[str, Any]] = {
    "url": _string("url", "Redis URL", "A full Redis URL (redis://, rediss://, unix://, redis+sentinel://); "
                   "overrides host, port, login, password and database above.", format="url"),
    "submitter": _string("submitter", "Submitter id", "The identity the agents know this connection by; every "
                         "job submitted through it is signed with this submitter's key (agents refuse unsigned "
                         "jobs)."),
    "submitter_secret": _string("submitter_secret", "Submitter key", "The submitter's Ed25519 private key "
                                "itself (the PEM `fstream keys new submitter` writes, or its base64 body on one "
                                "line); Airflow masks it. Or give 'Submitter key file' instead.", default=None,
                                format="password"),
    "submitter_key_file": _string("submitter_key_file", "Submitter key file", "Path, on the Airflow workers and "
                                  "triggerer, of a 0600 file holding the submitter's Ed25519 private key "
                                  "(`fstream keys new submitter`; instead of the inline key)."),
    "key": _string("key", "Key id", "Id of the agents' keyring key the jobs authenticate to the receivers with "
                   "(jobs never name key files on the agents' hosts).", default="default"),
    "namespace": _string("namespace", "Key namespace", "Prefix of every FStream key on this Redis (several "
                         "deployments can share one server).", default="fstream"),
    "agent_group": _string("agent_group", "Agent group", "Name of the agent group on this bus (shown by Test "
                           "connection)."),
    "trusted_agents": _string("trusted_agents", "Trusted agents", "The agents whose signed job outcomes count: a "
                              "path on the workers and triggerer (a file of 'fstream-ed25519 ...' lines, or a "
                              "directory of .pub files), or the lines themselves. Empty: the local agent's "
                              "<state dir>/agent.key.pub. A success no trusted agent signed is not done."),
    "ssl": {"label": "Redis over TLS", "description": "Connect with rediss:// when host and port are given.",
            "schema": {"type": ["boolean", "null"], "default": False}},
}
"""The ``fstream`` connection's extra fields, in Airflow's ``conn-fields`` form (stored in ``Connection.extra``).

Airflow 3.3's form pre-fills the Extra Fields JSON with every field's ``default`` (``null`` where there is
none) and saves it as shown, a field cleared as ``null``; a provider cannot make it leave a key out. The hook reads
``""``, ``null`` and blanks alike as unset (``docs/airflow/connection.md``).
"""

UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden-fields": [],
    "relabeling": {
        "host": "Redis host",
        "port": "Redis port (required: 6379 is Redis's; Test connection fails without it)",
        "schema": "Redis database",
        "login": "Redis user (ACL, optional)",
        "password": "Redis password (optional)",
    },
    "placeholders": {
        "host": "redis.example.org",
        "port": "6379",
        "schema": "0",
        **EXTRA_PLACEHOLDERS,
    },
}
"""Relabels and placeholders of the connection form (``ui-field-behaviour``). Airflow 3.3's React form shows the
placeholders of the standard fields only; the extra fields' reach it as ``examples`` (``EXTRA_PLACEHOLDERS``)."""


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
