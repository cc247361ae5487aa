"""A submitter's new-files scope takes over what the same scope remembered before issue 40.

Since issue 40 a connection with a submitter keeps its scopes under its id (``<submitter>:<scope>``,
``FStreamSettings.scope_key``): keys no other submitter's Redis user may write. A sensor or trigger upgraded onto
that layout would find its scope empty and report every file already there as new again. Before its first claim
it copies the scope's old ``seen`` set and ``pending`` batches into its own (``SSCAN``/``SADD`` and ``HSCAN``/
``HSET`` in chunks: the two scopes hash to different Cluster slots, so no server-side copy can join them), once,
only while its own scope holds nothing. The old keys stay (``fstream gc`` or ``fstream seen reset`` removes them).

A submitter's own ACL user may not read the old keys (they are agents' only): then nothing is copied and the
watcher says how to do it, ``fstream seen adopt --scope S --submitter ID`` as an agent or operator user.
"""

from __future__ import annotations

from typing import Any

import redis

from fstream_provider.bus.keys import Keys

CHUNK = 1000
NOPERM = redis.exceptions.NoPermissionError


def _pairs(keys: Keys, scope: str, owned: str) -> list[tuple[str, str, str]]:
    return [("seen", keys.seen(scope), keys.seen(owned)), ("pending", keys.pending(scope), keys.pending(owned))]


def adopt(client: Any, keys: Keys, scope: str, owned: str) -> dict[str, int] | None:
    """Copy ``scope``'s seen set and pending batches into ``owned`` if ``owned`` has neither yet; the counts copied
    (``{}`` when there was nothing to do), or None when this Redis user may not read the old scope."""
    if owned == scope:
        return {}
    try:
        if client.exists(keys.seen(owned), keys.pending(owned)):
            return {}
        done: dict[str, int] = {}
        for family, old, new in _pairs(keys, scope, owned):
            n, batch = 0, []
            items = client.sscan_iter(old, count=CHUNK) if family == "seen" else client.hscan_iter(old, count=CHUNK)
            for item in items:
                batch.append(item)
                if len(batch) >= CHUNK:
                    n += _write(client, family, new, batch)
                    batch = []
            n += _write(client, family, new, batch)
            if n:
                done[family] = n
        return done
    except NOPERM:
        return None


def _write(client: Any, family: str, key: str, batch: list) -> int:
    if not batch:
        return 0
    if family == "seen":
        client.sadd(key, *batch)
    else:
        client.hset(key, mapping=dict(batch))
    return len(batch)


async def aadopt(client: Any, keys: Keys, scope: str, owned: str) -> dict[str, int] | None:
    """``adopt`` on a ``redis.asyncio`` client (the new-files trigger)."""
    if owned == scope:
        return {}
    try:
        if await client.exists(keys.seen(owned), keys.pending(owned)):
            return {}
        done: dict[str, int] = {}
        for family, old, new in _pairs(keys, scope, owned):
            n, batch = 0, []
            items = client.sscan_iter(old, count=CHUNK) if family == "seen" else client.hscan_iter(old, count=CHUNK)
            async for item in items:
                batch.append(item)
                if len(batch) >= CHUNK:
                    n += await _awrite(client, family, new, batch)
                    batch = []
            n += await _awrite(client, family, new, batch)
            if n:
                done[family] = n
        return done
    except NOPERM:
        return None


async def _awrite(client: Any, family: str, key: str, batch: list) -> int:
    if not batch:
        return 0
    if family == "seen":
        await client.sadd(key, *batch)
    else:
        await client.hset(key, mapping=dict(batch))
    return len(batch)


def hint(scope: str, owner: str) -> str:
    """What to run when the watcher's own user may not read the old scope."""
    return (f"new-files scope {scope!r}: its state before issue 40 (if any) is not readable by this Redis user; to "
            f"carry it over run `fstream seen adopt --scope {scope} --submitter {owner}` as an agent or operator")
