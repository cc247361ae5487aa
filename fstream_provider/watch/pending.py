"""Claimed batches not yet known to be delivered: what makes the event trigger at-least-once, not at-most-once.

A new-files trigger claims files (``SADD`` on the scope's seen-set, so no other trigger reports them)
and hands the batch to Airflow by yielding an event. Airflow 3.3 offers no hook after that event is
persisted (``BaseEventTrigger`` has none; ``cleanup`` also runs on shutdown), so a triggerer that
died between the claim and the write lost the batch for good. Now the claim also records the batch
under ``pending(scope)`` — in one Lua call, so a crash cannot separate the two — and:

* the next ``run()`` of a trigger **in the same triggerer process** acknowledges (deletes) the batches
  that process yielded: Airflow took the event and started the trigger again, the normal cycle;
* a trigger that finds a pending batch **no process of its own yielded**, older than
  ``redeliver_after``, yields it again with the same ``batch_id`` (the process that claimed it died).

The guarantee: every claimed batch is delivered at least once, with a stable ``batch_id``; a batch
is re-delivered only if the process that yielded it died before its next ``run()`` — exactly once per
file version for consumers that ignore a ``batch_id`` they already handled. ``fstream seen reset``
clears a scope (seen, pending, looks).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from fstream_provider.watch.stability import FileStat

IDENTITIES = ("path", "version")  # version = path + size + mtime: a rewritten file is a new version

# Batches this process yielded (module state lives as long as the triggerer's trigger runner does).
YIELDED: set[str] = set()

_CLAIM = """
local won = {}
for i = 3, #ARGV, 2 do
  if redis.call('SADD', KEYS[1], ARGV[i]) == 1 then table.insert(won, ARGV[i + 1]) end
end
if #won > 0 then
  redis.call('HSET', KEYS[2], ARGV[1], cjson.encode({claimed_at = tonumber(ARGV[2]), files = won}))
end
return won
"""


def member(f: FileStat, identity: str) -> str:
    """The seen-set member for ``f``: its path, or path|size|mtime (identity ``version``)."""
    if identity == "path":
        return f.path
    if identity == "version":
        return f"{f.path}|{f.size}|{f.mtime_ns or f.mtime}"
    raise ValueError(f"identity {identity!r}: expected one of {', '.join(IDENTITIES)}")


def _stat(d: dict[str, Any]) -> FileStat:
    return FileStat(d["path"], int(d["size"]), float(d["mtime"]), mtime_ns=int(d.get("mtime_ns", 0)),
                    rel=d.get("rel", ""))


class PendingBatches:
    """Claim-with-pending and acknowledgement for one scope, on a ``redis.asyncio`` client.

    :param client: the async Redis client.
    :param seen_key: the scope's seen-set.
    :param pending_key: the scope's pending hash (batch id -> {claimed_at, files}).
    :param identity: ``path`` or ``version``.
    """

    def __init__(self, client: Any, seen_key: str, pending_key: str, identity: str = "path") -> None:
        member(FileStat("/", 0, 0.0), identity)  # refuse an unknown identity at once
        self.client, self.seen_key, self.pending_key, self.identity = client, seen_key, pending_key, identity
        self.last_batch_id: str | None = None

    async def aunseen(self, files: list[FileStat]) -> list[FileStat]:
        if not files:
            return []
        flags = await self.client.smismember(self.seen_key, [member(f, self.identity) for f in files])
        return [f for f, seen in zip(files, flags) if not int(seen)]

    async def aclaim(self, files: list[FileStat]) -> list[FileStat]:
        """Claim ``files`` and record the ones won as one pending batch (``last_batch_id``), atomically."""
        self.last_batch_id = None
        if not files:
            return []
        batch_id = uuid.uuid4().hex
        argv: list[Any] = [batch_id, time.time()]
        by_doc = {}
        for f in files:
            doc = json.dumps({"path": f.path, "size": f.size, "mtime": f.mtime, "mtime_ns": f.mtime_ns, "rel": f.rel})
            by_doc[doc] = f
            argv += [member(f, self.identity), doc]
        won_docs = await self.client.eval(_CLAIM, 2, self.seen_key, self.pending_key, *argv)
        won = [by_doc[d] for d in won_docs]
        if won:
            self.last_batch_id = batch_id
        return won

    async def pending(self) -> list[tuple[str, float, list[FileStat]]]:
        """Pending batches, oldest first: (batch_id, claimed_at, files)."""
        raw = await self.client.hgetall(self.pending_key)
        out = []
        for bid, text in raw.items():
            doc = json.loads(text)
            out.append((bid, float(doc["claimed_at"]), [_stat(json.loads(d)) for d in doc["files"]]))
        return sorted(out, key=lambda b: b[1])

    async def ack(self, batch_id: str) -> None:
        await self.client.hdel(self.pending_key, batch_id)
        YIELDED.discard(batch_id)
