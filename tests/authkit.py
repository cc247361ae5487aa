"""Authorization for tests that are not about it (issue 32): one test submitter, an agent policy that serves
it, and the connection extras that make Airflow sign as it. Tests of authorization itself build their own."""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path
from urllib.parse import quote

from fstream_provider.model.signing import Signer

SUBMITTER = "tests"


def key_file() -> str:
    """The test submitter's key: one 0600 file per user, shared by the test processes (Airflow subprocesses too)."""
    d = Path(tempfile.gettempdir()) / f"fstream-tests-{os.getuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    p = d / "submitter.key"
    if not p.exists():
        # written whole under a private name, then linked in: two processes making it at once (pytest-xdist
        # workers) both end up with the one that won, and none ever reads it half written
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".submitter.key.")  # mode 0600
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
            try:
                os.link(tmp, p)
            except FileExistsError:
                pass  # another process linked its key first: use that one
        finally:
            os.unlink(tmp)
    return str(p)


def signer() -> Signer:
    return Signer.from_file(SUBMITTER, key_file())


def policy(secret_file: object = None, roots: tuple[str, ...] = ("/",)):
    """An agent policy serving ``roots`` (default: everything) for the test submitter, with ``secret_file`` as
    its ``default`` key."""
    from transfer_agent.daemon.authorize import AgentPolicy

    return AgentPolicy.local(list(roots), secret_file, submitter=SUBMITTER, key_file=key_file())


def conn_query() -> str:
    """The ``fstream`` connection's query string (extras) that signs jobs as the test submitter."""
    return f"submitter={SUBMITTER}&submitter_key_file={quote(key_file(), safe='')}"


def policy_file(directory: Path, secret_file: object, roots: tuple[str, ...] = ("/",)) -> str:
    """A policy file (``fstream agent --policy``) serving ``roots`` for the test submitter with ``secret_file``
    as the ``default`` key."""
    p = Path(directory) / "policy.toml"
    p.write_text(f'[agent]\nroots = {list(roots)!r}\n[agent.keys]\ndefault = "{secret_file}"\n'
                 f'[submitters.{SUBMITTER}]\nkey_file = "{key_file()}"\n'.replace("'", '"'))
    return str(p)
