"""Claimed batches not yet known to be delivered: what makes the new-files trigger at-least-once.

A new-files trigger claims files (``SADD`` on the scope's seen-set, so no other watcher reports them)
and hands the batch to Airflow as an event. If the claim were all, a triggerer that died between the
claim and Airflow storing the event would lose the batch for good (at-most-once). So the claim also
records the batch under ``pending(scope)`` — in the same Lua call, so a crash cannot separate the two
— as ``{claimed_at, delivered_at, files}`` under a random ``batch_id``. A pending batch leaves the hash
only when it is acknowledged (:meth:`PendingBatches.ack`); who acknowledges is the Airflow face's
business (:mod:`fstream_provider.triggers.new_files`): Airflow's persistence confirmation in the
triggerer's ack mode, or the deferred sensor's ``execute_complete``.

A pending batch whose last delivery is older than ``redeliver_after`` is *taken* again
(:meth:`PendingBatches.take_redeliverable`, one Lua call that also stamps ``delivered_at``, so two
watchers never take it at once) and delivered again with the same ``batch_id``. ``release`` makes a
batch redeliverable at once (Airflow reported that its event was not stored).

Identity: ``path`` (a file is reported once, whatever happens to it later) or ``path+size+mtime`` (a
rewritten file is a new version and is reported again).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterable
from typing import Any

from fstream_provider.watch.stability import FileStat

IDENTITIES = ("path", "path+size+mtime")
_ALIASES = {"version": "path+size+mtime"}

_CLAIM = """
local won = {}
for i = 3, #ARGV, 2 do
  if redis.call('SADD', KEYS[1], ARGV[i]) == 1 then table.insert(won, ARGV[i + 1]) end
end
if #won > 0 then
  local now = tonumber(ARGV[2])
  redis.call('HSET', KEYS[2], ARGV[1], cjson.encode({claimed_at = now, delivered_at = now, files = won}))
end
return won
"""

# ARGV: now, redeliver_after, excluded batch ids...; takes the oldest batch due, stamps delivered_at
_TAKE = """
local now, after = tonumber(ARGV[1]), tonumber(ARGV[2])
local skip = {}
for i = 3, #ARGV do skip[ARGV[i]] = true end
local raw = redis.call('HGETALL', KEYS[1])
local best, best_doc, best_at = nil, nil, nil
for i = 1, #raw, 2 do
  if not skip[raw[i]] then
    local ok, doc = pcall(cjson.decode, raw[i + 1])
    if ok and type(doc) == 'table' then
      local at = tonumber(doc.delivered_at or doc.claimed_at) or 0
      if now - at >= after and (best_at == nil or at < best_at) then best, best_doc, best_at = raw[i], doc, at end
    end
  end
end
if best == nil then return nil end
best_doc.delivered_at = now
local text = cjson.encode(best_doc)
redis.call('HSET', KEYS[1], best, text)
return {best, text}
"""

_RELEASE = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
local doc = cjson.decode(raw)
doc.delivered_at = 0
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(doc))
return 1
"""


async def _call(awaitable: Any) -> Any:
    """Await a ``redis.asyncio`` call and re-raise a cancellation it swallowed.

    redis-py's async client can lose a ``CancelledError`` that lands mid-command (redis/redis-py#2028,
    #2551; reproduced with redis 8.1 here): the command returns and the task goes on, so a cancelled
    trigger kept polling and the triggerer's cancel or shutdown waited on it forever. The task still
    counts the request (``Task.cancelling()``), so honour it here.
    """
    result = await awaitable
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError("cancelled during a Redis call")
    return result


def normalize_identity(identity: str) -> str:
    """``identity`` as one of :data:`IDENTITIES` (``version`` is accepted for ``path+size+mtime``)."""
    name = _ALIASES.get(identity, identity)
    if name not in IDENTITIES:
        raise ValueError(f"identity {identity!r}: expected one of {', '.join(repr(i) for i in IDENTITIES)}")
    return name


def member(f: FileStat, identity: str) -> str:
    """The seen-set member for ``f``: its path, or ``path|size|mtime`` (identity ``path+size+mtime``)."""
    if normalize_identity(identity) == "path":
        return f.path
    return f"{f.path}|{f.size}|{f.mtime_ns or f.mtime}"


def _doc(f: FileStat) -> str:
    return json.dumps({"path": f.path, "size": f.size, "mtime": f.mtime, "mtime_ns": f.mtime_ns, "rel": f.rel})


def _stat(text: str) -> FileStat:
    d = json.loads(text)
    return FileStat(d["path"], int(d["size"]), float(d["mtime"]), mtime_ns=int(d.get("mtime_ns", 0)),
                    rel=d.get("rel", ""))


class PendingBatches:
    """Claim-with-pending, redelivery and acknowledgement for one scope, on a ``redis.asyncio`` client.

    It is the async seen/claim store a :class:`~fstream_provider.watch.watcher.Watcher` polls with.

    :param client: the async Redis client.
    :param seen_key: the scope's seen-set.
    :param pending_key: the scope's pending hash (batch id -> ``{claimed_at, delivered_at, files}``).
    :param identity: ``path`` or ``path+size+mtime``.
    """

    def __init__(self, client: Any, seen_key: str, pending_key: str, identity: str = "path") -> None:
        self.client, self.seen_key, self.pending_key = client, seen_key, pending_key
        self.identity = normalize_identity(identity)
        self.last_batch_id: str | None = None

    async def aunseen(self, files: list[FileStat]) -> list[FileStat]:
        if not files:
            return []
        flags = await _call(self.client.smismember(self.seen_key, [member(f, self.identity) for f in files]))
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
            doc = _doc(f)
            by_doc[doc] = f
            argv += [member(f, self.identity), doc]
        won_docs = await _call(self.client.eval(_CLAIM, 2, self.seen_key, self.pending_key, *argv))
        won = [by_doc[d] for d in won_docs]
        if won:
            self.last_batch_id = batch_id
        return won

    async def take_redeliverable(self, redeliver_after: float,
                                 exclude: Iterable[str] = ()) -> tuple[str, list[FileStat]] | None:
        """The oldest pending batch last delivered ``redeliver_after`` seconds ago or more (not in
        ``exclude``), stamped as delivered now; ``None`` if there is none."""
        got = await _call(self.client.eval(_TAKE, 1, self.pending_key, time.time(), float(redeliver_after),
                                          *exclude))
        if not got:
            return None
        batch_id, text = got
        return batch_id, [_stat(d) for d in json.loads(text)["files"]]

    async def pending(self) -> list[tuple[str, float, list[FileStat]]]:
        """Pending batches, oldest first: (batch_id, claimed_at, files)."""
        raw = await _call(self.client.hgetall(self.pending_key))
        out = []
        for bid, text in raw.items():
            doc = json.loads(text)
            out.append((bid, float(doc["claimed_at"]), [_stat(d) for d in doc["files"]]))
        return sorted(out, key=lambda b: b[1])

    async def ack(self, batch_id: str) -> None:
        """Delivered: the batch leaves the pending hash and is never delivered again."""
        await _call(self.client.hdel(self.pending_key, batch_id))

    async def release(self, batch_id: str) -> None:
        """Not delivered (Airflow did not store its event): redeliverable at once."""
        await _call(self.client.eval(_RELEASE, 1, self.pending_key, batch_id))
