"""The authorization policy file (issue 32): which sources an agent serves, where to, with which keys, for whom.

One TOML file, by default ``/etc/fstream/policy.toml`` (``fstream agent --policy FILE``)::

    [agent]
    roots = ["/data/lcls", "/data/sra"]              # the only source trees this agent reads (default deny)
    # roots = ["/data/lcls", { path = "/data/sra", span_mounts = true }]   # a root may read across mounts
    allow_hardlinks = false                          # files with several hard links are refused (default)
    destinations = ["fstream://dtn2:7600/lcls"]      # receivers and path prefixes it may send to (default deny)
    max_job_age = "7d"                               # a signed job older than this is refused
    clock_skew = "5m"                                # accepted difference between clocks

    [agent.keys]                                     # the agent's keyring: jobs name a key by its id
    default = "/etc/fstream/keys/default"            # a shared-secret file (mode 0600) ...
    lcls = { secret_file = "/etc/fstream/keys/lcls" }
    tls = { tls_cert = "/etc/fstream/tls/c.pem", tls_key = "/etc/fstream/tls/c.key", tls_ca = "/etc/fstream/tls/ca.pem" }

    [submitters.lcls-daq]                            # who may submit: id, public key(s), what it may ask for
    public_key_file = "/etc/fstream/submitters/lcls-daq.key.pub"   # or a list (rotation); or public_key = "..."
    roots = ["/data/lcls/daq"]                       # within the agent's roots (default: the agent's roots)
    destinations = ["fstream://dtn2:7600/lcls/daq"]  # default: the agent's destinations
    keys = ["lcls"]                                  # key ids it may use (default: ["default"])

A job is allowed when a configured submitter signed it (Ed25519: the agent holds only public keys), and its
sources lie within both the agent's and the submitter's roots, its destination matches both lists (when given;
when neither lists any, every job is refused: destinations are default deny) and its key is one the submitter
may use and the agent holds. Issue 32's HMAC ``key_file`` is refused, naming the entry and the way to replace it.
This module validates the file; the agent enforces it (``transfer_agent.daemon.authorize``). Errors name the
file, the key, the value and the reason.
"""

from __future__ import annotations

import os
import tomllib
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from fstream_provider.authz.ed25519 import parse_public
from fstream_provider.model.keyfile import KeyFileError
from fstream_provider.authz.signing import check_submitter_id
from fstream_provider.model.spec import KEY_ID, Destination
from fstream_provider.model.units import parse_duration

DEFAULT_POLICY = "/etc/fstream/policy.toml"
HMAC_REFUSED = ("HMAC submitter keys are no longer accepted (every agent holding one could sign as "
                "submitter {name!r}): run `fstream keys new submitter {name} --out DIR` where it submits, give it "
                "DIR/{name}.key, and list DIR/{name}.key.pub here as public_key_file (docs/keys.md)")


def as_list(value: str | list[str]) -> list[str]:
    """A field that takes one value or a list (public keys: several during a rotation)."""
    return [value] if isinstance(value, str) else list(value)


class PolicyError(ValueError):
    """A policy file that cannot be used; the message names the file, the key, the value and the reason."""


class KeyEntry(BaseModel):
    """One key of the agent's keyring: a shared secret, TLS files, or both."""

    model_config = ConfigDict(extra="forbid")
    secret_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None


class RootEntry(BaseModel):
    """A source root given as a table: ``{ path = "/data", span_mounts = true }`` (a plain string: no span)."""

    model_config = ConfigDict(extra="forbid")
    path: str
    span_mounts: bool = False  # files on other mounts below it (bind mounts too) are read; default: refused


Root = str | RootEntry


def root_path(root: Root) -> str:
    return root if isinstance(root, str) else root.path


class SubmitterEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key_file: str | None = None  # issue 32's HMAC key: refused by _check, naming what to do instead
    public_key: str | list[str] = []
    public_key_file: str | list[str] = []
    roots: list[Root] = []
    destinations: list[str] = []
    keys: list[str] = ["default"]
    allow_hardlinks: bool | None = None  # default: as [agent] says


class AgentSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    roots: list[Root] = []
    allow_hardlinks: bool = False  # send files with several hard links (another name may lie outside the roots)
    destinations: list[str] = []
    max_job_age: str | float = "7d"
    clock_skew: str | float = "5m"
    keys: dict[str, str | KeyEntry] = {}
    signing_key: str = ""  # the agent's Ed25519 key for job outcomes (default <state dir>/agent.key; authz.outcome)


class PolicyFile(BaseModel):
    """The parsed file: ``agent`` and ``submitters`` (``[receive]`` belongs to the receiver's keyring file)."""

    model_config = ConfigDict(extra="forbid")
    agent: AgentSection = AgentSection()
    submitters: dict[str, SubmitterEntry] = {}

    def keyring(self) -> dict[str, KeyEntry]:
        return {k: KeyEntry(secret_file=v) if isinstance(v, str) else v for k, v in self.agent.keys.items()}


def _check(policy: PolicyFile) -> list[tuple[str, Any, str]]:
    """Problems the models cannot see: (key, value, reason)."""
    problems: list[tuple[str, Any, str]] = []
    a = policy.agent
    for i, root in enumerate(map(root_path, a.roots)):
        if not os.path.isabs(root):
            problems.append((f"agent.roots[{i}]", root, "a source root must be an absolute path"))
    for where, dests in [("agent", a.destinations)] + [(f"submitters.{n}", s.destinations)
                                                        for n, s in policy.submitters.items()]:
        for i, d in enumerate(dests):
            try:
                Destination.parse(d)
            except ValueError as exc:
                problems.append((f"{where}.destinations[{i}]", d, str(exc)))
    for name in ("max_job_age", "clock_skew"):
        try:
            parse_duration(getattr(a, name))
        except ValueError as exc:
            problems.append((f"agent.{name}", getattr(a, name), str(exc)))
    for key_id, entry in policy.keyring().items():
        if not KEY_ID.fullmatch(key_id):
            problems.append((f"agent.keys.{key_id}", key_id, "a key id is 1-64 letters, digits, '.', '_' or '-'"))
        if not (entry.secret_file or entry.tls_cert):
            problems.append((f"agent.keys.{key_id}", entry.model_dump(exclude_none=True),
                             "give a secret_file, or tls_cert, tls_key and tls_ca"))
        if entry.tls_cert and not (entry.tls_key and entry.tls_ca):
            problems.append((f"agent.keys.{key_id}", entry.model_dump(exclude_none=True),
                             "tls_cert needs tls_key and tls_ca"))
    for name, sub in policy.submitters.items():
        try:
            check_submitter_id(name)
        except ValueError as exc:
            problems.append((f"submitters.{name}", name, str(exc)))
        for i, root in enumerate(map(root_path, sub.roots)):
            if not os.path.isabs(root):
                problems.append((f"submitters.{name}.roots[{i}]", root, "a root must be an absolute path"))
        if sub.key_file is not None:
            problems.append((f"submitters.{name}.key_file", sub.key_file, HMAC_REFUSED.format(name=name)))
        elif not (as_list(sub.public_key) or as_list(sub.public_key_file)):
            problems.append((f"submitters.{name}", name, "give its public_key_file (or public_key): run "
                             f"`fstream keys new submitter {name} --out DIR` where it submits (docs/keys.md)"))
        for i, line in enumerate(as_list(sub.public_key)):
            try:
                parse_public(line)
            except KeyFileError as exc:
                problems.append((f"submitters.{name}.public_key[{i}]", line[:80], str(exc)))
        for k in sub.keys:  # "default" may come from `fstream agent --secret-file`; a job needing it is refused without
            if k not in a.keys and k != "default":
                problems.append((f"submitters.{name}.keys", k, "not a key of [agent.keys]"))
    return problems


def load_policy(path: str | os.PathLike[str]) -> PolicyFile:
    """Read and validate a policy file; ``PolicyError`` naming the file, the key, the value and the reason."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise PolicyError(f"policy file {path}: does not exist") from None
    except OSError as exc:
        raise PolicyError(f"policy file {path}: cannot read ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"policy file {path}: not valid TOML ({exc})") from None
    try:
        policy = PolicyFile.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors(include_url=False):
            loc = ".".join(str(x) for x in err.get("loc", ()))
            what = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            lines.append(f"{loc} = {err.get('input')!r}: {what}")
        raise PolicyError(f"policy file {path}: " + "; ".join(lines)) from None
    problems = _check(policy)
    if problems:
        raise PolicyError(f"policy file {path}: " + "; ".join(f"{k} = {v!r}: {r}" for k, v, r in problems))
    return policy
