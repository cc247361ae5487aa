"""Authorization for tests that are not about it (issues 32, 40): one test submitter with an Ed25519 pair, an agent
policy that serves it, and the connection extras that make Airflow sign as it. Tests of authorization itself build
their own."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from urllib.parse import quote

from fstream_provider.authz.ed25519 import ensure_pair
from fstream_provider.authz.signing import Signer

SUBMITTER = "tests"


def key_file() -> str:
    """The test submitter's private key: one 0600 PKCS#8 file per user (its public key beside it, ``.pub``), shared
    by the test processes (Airflow subprocesses and pytest-xdist workers too: ``ensure_pair`` links it in whole)."""
    d = Path(tempfile.gettempdir()) / f"fstream-tests-{os.getuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    p = d / "submitter-ed25519.key"
    ensure_pair(p, SUBMITTER)
    return str(p)


def public_key_file() -> str:
    """The test submitter's public key file (what agents hold)."""
    return key_file() + ".pub"


def signer() -> Signer:
    return Signer.from_file(SUBMITTER, key_file())


def policy(secret_file: object = None, roots: tuple[str, ...] = ("/",)):
    """An agent policy serving ``roots`` (default: everything) for the test submitter, with ``secret_file`` as
    its ``default`` key: the single-user form (any destination the key opens), as ``fstream agent --root``."""
    from transfer_agent.daemon.authorize import AgentPolicy

    return AgentPolicy.local(list(roots), secret_file, submitter=SUBMITTER, public_key=public_key_file())


def trusted_agents() -> str:
    """The public key of the agents tests run in this process (issue 40: clients believe only outcomes a trusted agent
    signed): an agent without a configured key signs with ``<state dir>/agent.key``, made here if none made it yet. An
    Airflow subprocess has a state dir of its own, so its connection names this file (``conn_query``)."""
    from fstream_provider.authz.outcome import default_agent_key

    ensure_pair(default_agent_key())
    return str(default_agent_key()) + ".pub"


def conn_query() -> str:
    """The ``fstream`` connection's query string (extras) that signs jobs as the test submitter and trusts the
    outcomes of this process's agents."""
    return (f"submitter={SUBMITTER}&submitter_key_file={quote(key_file(), safe='')}"
            f"&trusted_agents={quote(trusted_agents(), safe='')}")


def receiver(port: int) -> tuple[str, ...]:
    """``policy_file``'s destinations for a test receiver on 127.0.0.1:``port`` (any path under it)."""
    return (f"fstream://127.0.0.1:{port}/",)


def policy_file(directory: Path, secret_file: object, roots: tuple[str, ...] = ("/",),
                destinations: tuple[str, ...] = ()) -> str:
    """A policy file (``fstream agent --policy``) serving ``roots`` for the test submitter with ``secret_file``
    as the ``default`` key, sending to ``destinations`` (``fstream://HOST:PORT/PREFIX``; none: every job is
    refused, as destinations are default deny when a policy file is used)."""
    p = Path(directory) / "policy.toml"
    p.write_text(f'[agent]\nroots = {list(roots)!r}\ndestinations = {list(destinations)!r}\n'
                 f'[agent.keys]\ndefault = "{secret_file}"\n'
                 f'[submitters.{SUBMITTER}]\npublic_key_file = "{public_key_file()}"\n'.replace("'", '"'))
    return str(p)
