"""The audit trail and the replay guard of authorization (issue 32): what was asked, by whom, and what came of it.

Agents append two kinds of entry to the append-only stream ``Keys.audit()``: a ``decision`` when a job is
claimed (submitter, sources, destination, key, ``accepted`` or ``refused`` with the reason) and an
``outcome`` when an accepted job ends (succeeded, failed, cancelled, with files and bytes). The same
lines go to the agent's log. ``fstream audit`` lists and filters the stream. With the Redis ACLs of
``fstream_provider.bus.acl`` only agents may write it.

The replay guard records the first use of each submitter nonce (``Keys.nonce``) in one Lua script (``FIRST_USE``:
atomic on every supported server; ``SET NX GET`` would be one command, but Redis takes ``NX`` with ``GET`` only
from 7.0 and the floor is 6.2, ``bus.server_floor``): the value names the job id and stream entry that used it, so the same job delivered again (a
retry, a reclaim, a preempted job resumed) passes and a copy of it under a new entry is a replay;
``fstream reconcile --repair`` moves the binding when it re-enqueues a job under a new entry.

When an agent records a job's terminal outcome it marks the binding ended (``mark_ended``): the nonce keys are
written by agents alone, so whoever changes the job's hash afterwards (its state back to ``queued``, issue 40
"replay through repair") cannot make an agent run it again: the next delivery reads as a replay, and ``fstream
reconcile --repair`` leaves such a job alone (``ended``).
"""

from __future__ import annotations

import json
import time
from typing import Any

from fstream_provider.bus.keys import AUDIT_MAXLEN, Keys

FIELDS = ("kind", "job_id", "submitter", "decision", "reason", "sources", "destination", "key", "agent",
          "outcome", "files", "bytes")


class AuditLog:
    """Append to and read the audit stream.

    :param client: a ``redis.Redis`` with ``decode_responses=True``.
    :param keys: the key schema.
    """

    def __init__(self, client: Any, keys: Keys | None = None) -> None:
        self.client, self.keys = client, keys or Keys()

    def record(self, kind: str, **fields: Any) -> str:
        """Append one entry; lists and dicts are stored as JSON, None as ""."""
        entry = {"kind": kind, "ts": f"{time.time():.3f}"}
        for name, value in fields.items():
            if value is None:
                value = ""
            elif isinstance(value, (list, tuple, dict)):
                value = json.dumps(value, default=str)
            entry[name] = str(value)
        return self.client.xadd(self.keys.audit(), entry, maxlen=AUDIT_MAXLEN, approximate=True)

    def entries(self, *, count: int = 100, submitter: str | None = None, decision: str | None = None,
                job_id: str | None = None, since: float | None = None, page: int = 1000) -> list[dict[str, Any]]:
        """The newest ``count`` entries matching every filter given, newest first (each with ``id``)."""
        out: list[dict[str, Any]] = []
        hi = "+"
        while len(out) < count:
            batch = self.client.xrevrange(self.keys.audit(), max=hi, min="-", count=page)
            if not batch:
                break
            for entry_id, fields in batch:
                if since is not None and float(fields.get("ts") or 0) < since:
                    return out
                if submitter and fields.get("submitter") != submitter:
                    continue
                if decision and decision not in (fields.get("decision"), fields.get("outcome")):
                    continue
                if job_id and fields.get("job_id") != job_id:
                    continue
                out.append({"id": entry_id, **fields})
                if len(out) >= count:
                    break
            ms, seq = batch[-1][0].split("-")
            hi = f"{ms}-{int(seq) - 1}" if int(seq) else f"{int(ms) - 1}-18446744073709551615"
            if len(batch) < page:
                break
        return out


# KEYS[1] the nonce, ARGV[1] the binding, ARGV[2] the expiry in seconds. Sets the binding if the nonce is new;
# renews the expiry if it is already this binding; returns the binding found before (false when there was none).
FIRST_USE = """
local previous = redis.call('GET', KEYS[1])
if not previous then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
elseif previous == ARGV[1] then
  redis.call('EXPIRE', KEYS[1], ARGV[2])
end
return previous
"""


def _script(client: Any, source: str) -> Any:
    """``source`` registered on ``client`` once (``EVALSHA``, loaded again by redis-py if the server lost it): an
    ``EVAL`` sends the whole script with every job's decision."""
    cache = client.__dict__.setdefault("_fstream_scripts", {})
    if source not in cache:
        cache[source] = client.register_script(source)
    return cache[source]


def first_use(client: Any, keys: Keys, submitter: str, nonce: str, binding: str, ttl_s: float) -> tuple[str, str]:
    """Record that ``binding`` (``"<job id> <entry id>"``) uses this nonce, atomically (``FIRST_USE``).

    Returns ``("first", "")`` on the first use, ``("again", "")`` when the same job is delivered again (its
    expiry is renewed in the same script: a long stream keeps its record), or ``("replay", <the earlier
    binding>)``."""
    key, ttl = keys.nonce(submitter, nonce), max(1, int(ttl_s))
    previous = _script(client, FIRST_USE)(keys=[key], args=[binding, ttl])
    if previous is None:
        return "first", ""
    if previous == binding:
        return "again", ""
    return "replay", str(previous)


# KEYS[1] the nonce; ARGV[1] the binding, ARGV[2] the outcome. Only the binding's own job is marked; the expiry stays.
MARK_ENDED = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1] .. ' ended:' .. ARGV[2], 'KEEPTTL')
  return 1
end
return 0
"""
ENDED = " ended:"


def job_nonce(auth_json: str | None) -> tuple[str, str] | None:
    """``(submitter, nonce)`` of a job's stored signature envelope (any version), or None."""
    try:
        d = json.loads(auth_json or "")
        submitter, nonce = d["submitter"], d["nonce"]
    except (ValueError, TypeError, KeyError):
        return None
    return (submitter, nonce) if isinstance(submitter, str) and isinstance(nonce, str) and submitter and nonce else None


def mark_ended(client: Any, keys: Keys, auth_json: str | None, binding: str, outcome: str) -> bool:
    """Record that the job bound to its nonce (``"<job id> <entry id>"``) ended with ``outcome``; False when the
    job has no envelope or the nonce is bound to something else."""
    found = job_nonce(auth_json)
    if found is None:
        return False
    return bool(_script(client, MARK_ENDED)(keys=[keys.nonce(*found)], args=[binding, outcome]))


def ended(client: Any, keys: Keys, auth_json: str | None) -> str | None:
    """The outcome an agent recorded for the job whose envelope this is (``mark_ended``), else None."""
    found = job_nonce(auth_json)
    value = client.get(keys.nonce(*found)) if found else None
    return value.rpartition(ENDED)[2] if value and ENDED in value else None
