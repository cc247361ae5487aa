"""Agent-signed job outcomes (issue 40): what an agent signs when it ends a job, and how clients check it.

A job's terminal state is written by the agent that ran it, but a job hash on Redis can be written by others too
(the submitter's own Redis user, anyone with a writable path to the hash). So an agent signs the outcome with its
own Ed25519 key (``authz.ed25519``) and stores the signature beside it, in the job hash's ``outcome_sig`` field,
in the same Lua script that writes the state (``bus.job_scripts.FINISH``/``REJECT``). A client (``fstream
submit``/``status``, the trigger, the operator, flows) counts a ``succeeded`` state, and any landed-files record,
only when a key it trusts signed exactly what is stored:

    ["fstream-outcome-v1", namespace, job id, attempt, state, error, result JSON, submitter signature envelope]

every string exactly as the hash stores it (compact JSON array, UTF-8). The namespace and job id stop a signature
copied from another job or bus; the attempt one copied from an earlier try; the submitter's envelope (which signs
the spec) ties the outcome to the request the agent checked.

Anything else is "not done": a success no trusted agent signed becomes the client-side state ``unverified`` (not
terminal: a follower keeps waiting, up to its own timeout). An unsigned ``failed`` or ``cancelled`` state is
honored as a failure (the fail-closed direction: a submitter cancelling its own queued job, or the claim script
dead-lettering a job, writes no agent signature), but its result is dropped: no landed files without a signature.

Trust: ``TrustedAgents``, a set of agent public keys (``fstream-ed25519 ...`` lines, one per key) read from a file,
a directory of ``.pub`` files or inline lines: ``--trusted-agents``, ``$FSTREAM_TRUSTED_AGENTS``, the connection
extra ``trusted_agents``; by default the local agent's ``<state dir>/agent.key.pub`` (single-user mode).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fstream_provider.authz.ed25519 import KEY_ID_HEX, PUBLIC_PREFIX, KeyFormatError, PrivateKey, PublicKey
from fstream_provider.authz.ed25519 import load_public, parse_public
from fstream_provider.model.statedir import state_dir

log = logging.getLogger(__name__)

VERSION = "fstream-outcome-v1"
FIELD = "outcome_sig"  # the job hash field the signature is stored in
ENV_TRUSTED_AGENTS = "FSTREAM_TRUSTED_AGENTS"
AGENT_KEY_NAME = "agent.key"
UNVERIFIED = "unverified"  # the client-side state of a success no trusted agent signed (never stored)
# the job hash fields a verifier reads (JobState keeps them as stored)
SIGNED_FIELDS = ("job_id", "attempt", "state", "error", "result", "auth", FIELD)


def default_agent_key() -> Path:
    """The local agent's signing key when none is configured: ``<state dir>/agent.key``."""
    return state_dir() / AGENT_KEY_NAME


def canonical(namespace: str, job_id: str, attempt: int, state: str, error: str, result_json: str,
              auth_json: str) -> bytes:
    """The bytes an agent signs for a job's outcome (the fields as the job hash stores them)."""
    return json.dumps([VERSION, namespace, job_id, int(attempt), state, error, result_json, auth_json],
                      separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class OutcomeSigner:
    """An agent's signing key. :param key: its Ed25519 private key. :param agent: the agent's name (informational:
    the key id, not the name, decides trust)."""

    key: PrivateKey
    agent: str

    def sign(self, namespace: str, job_id: str, attempt: int, state: str, error: str, result_json: str,
             auth_json: str) -> str:
        """The ``outcome_sig`` field's value: ``{"agent", "key_id", "sig"}`` as JSON."""
        sig = self.key.sign(canonical(namespace, job_id, attempt, state, error, result_json, auth_json))
        return json.dumps({"agent": self.agent, "key_id": self.key.key_id, "sig": sig}, separators=(",", ":"))


@dataclass(frozen=True)
class Verdict:
    """What a check of a stored outcome found. :param ok: a trusted key signed it. :param agent: the agent the
    signature names. :param reason: why not (empty when ok)."""

    ok: bool
    agent: str | None = None
    reason: str = ""


@dataclass
class TrustedAgents:
    """The agent keys a client trusts. :param keys: key id -> public key. :param source: where they came from (for
    messages). :param pending: the local agent's public key file the default trust did not find when it was
    resolved: adopted once it exists (a client started before the local agent's first start, which writes it)."""

    keys: dict[str, PublicKey]
    source: str = ""
    pending: str = ""

    @classmethod
    def of(cls, keys: list[PublicKey], source: str = "") -> "TrustedAgents":
        return cls({k.key_id: k for k in keys}, source)

    @classmethod
    def parse(cls, text: str, source: str = "inline trusted_agents") -> "TrustedAgents":
        """``fstream-ed25519 <base64> [name]`` lines (blank lines and ``#`` comments skipped)."""
        lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        return cls.of([parse_public(ln, f"{source}, line {i + 1}") for i, ln in enumerate(lines)], source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "TrustedAgents":
        """A file of key lines, or a directory whose ``*.pub`` files each hold one; ``KeyFormatError`` if missing."""
        p = Path(os.path.expanduser(str(path)))
        if p.is_dir():
            return cls.of([load_public(f, "trusted agent key") for f in sorted(p.glob("*.pub"))], str(p))
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise KeyFormatError(f"trusted agents {p}: does not exist (a file of '{PUBLIC_PREFIX} ...' lines, or a "
                                 "directory of .pub files)") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise KeyFormatError(f"trusted agents {p}: cannot read ({exc})") from None
        return cls.parse(text, str(p))

    @classmethod
    def from_value(cls, value: str) -> "TrustedAgents":
        """A setting's value: key lines inline (it holds ``fstream-ed25519``), else a path."""
        return cls.parse(value) if PUBLIC_PREFIX in value else cls.load(value.strip())

    @classmethod
    def resolve(cls, value: str | None = None) -> "TrustedAgents":
        """``value`` (an option or extra), else ``$FSTREAM_TRUSTED_AGENTS``, else the local agent's public key (an
        empty trust if it does not exist: then no success counts, and the messages say how to fix it)."""
        value = (value or "").strip() or os.environ.get(ENV_TRUSTED_AGENTS, "").strip()
        if value:
            return cls.from_value(value)
        pub = default_agent_key().with_name(AGENT_KEY_NAME + ".pub")
        if not pub.exists():
            return cls({}, f"{pub} (does not exist: no local agent has started with this state dir)", str(pub))
        return cls.of([load_public(pub, "local agent key")], str(pub))

    def verify(self, namespace: str, stored: dict[str, str]) -> Verdict:
        """Check a job hash's outcome signature (``stored``: the hash's ``SIGNED_FIELDS`` as stored)."""
        if not self.keys and self.pending:
            self._adopt_pending()
        raw = stored.get(FIELD) or ""
        if not raw:
            return Verdict(False, None, "no agent signed this outcome (the job hash has no outcome_sig)")
        try:
            env = json.loads(raw)
            agent, key_id, sig = str(env.get("agent", "")), str(env["key_id"]), str(env["sig"])
            attempt = int(stored.get("attempt") or 0)
        except (ValueError, TypeError, KeyError, AttributeError):
            return Verdict(False, None, "its outcome_sig is not a signature envelope")
        key = self.keys.get(key_id) if KEY_ID_HEX.fullmatch(key_id) else None
        if key is None:
            return Verdict(False, agent, f"signed by key {key_id[:16]!r} (agent {agent!r}), which is not among the "
                                         f"trusted agents ({self.describe()})")
        message = canonical(namespace, stored.get("job_id", ""), attempt, stored.get("state", ""),
                            stored.get("error", ""), stored.get("result", ""), stored.get("auth", ""))
        if not key.verify(message, sig):
            return Verdict(False, agent, f"agent {agent!r}'s signature does not match the stored outcome (altered "
                                         "after the agent wrote it, or copied from another job)")
        return Verdict(True, key.name or agent)

    def _adopt_pending(self) -> None:
        """The default trust's local key, if the local agent has written it since (only that file, the one the
        trust would have read at the start: nothing a peer says widens it). A file not yet whole is tried again at
        the next check."""
        pub = Path(self.pending)
        if not pub.exists():
            return
        try:
            key = load_public(pub, "local agent key")
        except KeyFormatError:
            return
        self.keys[key.key_id] = key
        self.source, self.pending = str(pub), ""

    def describe(self) -> str:
        if not self.keys:
            return f"none: {self.source}" if self.source else "none"
        return f"{len(self.keys)} key(s) from {self.source}" if self.source else f"{len(self.keys)} key(s)"


def trusted_view(state: Any, namespace: str, trust: TrustedAgents | None) -> Any:
    """A ``JobState`` as a client may believe it: unchanged if a trusted agent signed it (or nothing is claimed);
    a success nobody trusted signed becomes ``unverified`` (not terminal, no result); an unsigned failure stays a
    failure without its result. ``trust`` None: no check (the agents' own reads)."""
    if state is None or trust is None or not getattr(state, "terminal", False):
        return state
    verdict = trust.verify(namespace, state.stored or {})
    if verdict.ok:
        return dataclasses.replace(state, outcome_agent=verdict.agent)
    reason = f"job {state.job_id} shows {state.state!r}, but {verdict.reason}"
    if state.state == "succeeded":
        return dataclasses.replace(state, state=UNVERIFIED, result=None, unverified=reason)
    return dataclasses.replace(state, result=None, unverified=reason)


def load_signer(path: str | os.PathLike[str] | None, agent: str) -> OutcomeSigner:
    """The agent's signing key: ``path`` (``--signing-key``/``[agent] signing_key``; must exist), else
    ``<state dir>/agent.key``, made with its ``.pub`` on first start."""
    from fstream_provider.authz.ed25519 import ensure_pair, load_private

    if path:
        return OutcomeSigner(load_private(os.path.expanduser(str(path)), "agent signing key", name=agent), agent)
    return OutcomeSigner(ensure_pair(default_agent_key(), name=agent), agent)
