"""``fstream redis migrate-keys``: move the keys that got slots of their own (issue 28) to their new names.

Before issue 28 every FStream key shared the namespace slot (``{fstream}:seen:<scope>``, ``{fstream}:history``,
``{fstream}:pool:<src>:<dst>``, ...). The seen sets, pending batches and looks of each new-files scope, the
transfer history, the calibration progress, the profiling lists and the stream pools now have hash tags of
their own (``Keys.renamed`` maps old to new), so after an upgrade the old keys would be orphaned: the sensors
would report every file again, HARP would start without history.

``migrate`` finds the old keys (``SCAN``; a Cluster client scans every master), copies each into its new key
with commands of its data type and deletes it. Each command names one key (a new key and its scratch key share
a slot), so the same code runs on a standalone server and on a Cluster, and with the ``agent`` ACL user
(``DUMP``/``RESTORE`` are ``@dangerous``). A new key that already exists (upgraded agents or triggers wrote it
first) is merged into, never overwritten: set members are added, hash fields kept where the new key has them,
list items appended after the new ones (they are older), a looks string kept; the history stream is rebuilt
in id order in ``Keys.migration_temp`` and renamed into place by one Lua call that first copies what was added
to the new stream meanwhile. A time to live of the old key is kept.

Run it once the writers of the old names (FStream before this release) are stopped: a write to an old key
after it was copied is lost with the key. Running it again is harmless (it finds nothing, or what is left).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from fstream_provider.bus.keys import Keys

PAGE = 1000

# KEYS[1] the scratch stream (rebuilt), KEYS[2] the new history stream. ARGV[1]: the id of the new stream copied
# last ('0-0': none). Copies the rest of the new stream (written meanwhile) and renames the scratch into place.
_SWAP = """
local rest = redis.call('XRANGE', KEYS[2], '(' .. ARGV[1], '+')
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local lms, lseq = -1, -1
if #last > 0 then
  local a, b = string.match(last[1][1], '^(%d+)-(%d+)$')
  lms, lseq = tonumber(a), tonumber(b)
end
for _, entry in ipairs(rest) do
  -- the entry's ms, ties renumbered after the scratch's last id (what 'XADD <ms>-*' does from Redis 7.0 only)
  local ms = math.max(tonumber(string.match(entry[1], '^(%d+)-')), lms)
  local seq = 0
  if ms == lms then seq = lseq + 1 end
  redis.call('XADD', KEYS[1], string.format('%.0f-%.0f', ms, seq), unpack(entry[2]))
  lms, lseq = ms, seq
end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('RENAME', KEYS[1], KEYS[2]) end
return #rest
"""


@dataclasses.dataclass
class MigrationReport:
    """What ``migrate`` moved: keys per family, of which merged into an existing new key, and the entries copied.

    :param moved: family -> old keys copied to their new name and deleted.
    :param merged: family -> of those, how many new keys already existed (merged into).
    :param items: family -> members, fields, items or stream entries copied.
    :param dry_run: nothing was written (the counts say what would move).
    """

    moved: Counter = dataclasses.field(default_factory=Counter)
    merged: Counter = dataclasses.field(default_factory=Counter)
    items: Counter = dataclasses.field(default_factory=Counter)
    dry_run: bool = False

    def lines(self) -> list[str]:
        verb = "would move" if self.dry_run else "moved"
        out = [f"{family}: {verb} {n} key(s), {self.items[family]} entr{'y' if self.items[family] == 1 else 'ies'}"
               + (f"; {self.merged[family]} merged into a key the new version had written" if self.merged[family]
                  else "") for family, n in sorted(self.moved.items())]
        total = sum(self.moved.values())
        out.append(f"{total} old key(s) {'to migrate' if self.dry_run else 'migrated'}" if total
                   else "nothing to migrate: no key of the old layout found")
        return out


def old_keys(client: Any, keys: Keys) -> list[tuple[str, str, str]]:
    """``(family, old key, new key)`` of every key of the layout before issue 28 in ``keys``' namespace."""
    found = []
    for pattern in keys.legacy_patterns().values():
        for old in client.scan_iter(match=pattern, count=PAGE):
            renamed = keys.renamed(old)
            if renamed is not None:
                found.append((renamed[0], old, renamed[1]))
    return sorted(set(found))


def migrate(client: Any, keys: Keys | None = None, *, dry_run: bool = False) -> MigrationReport:
    """Copy every old-layout key of the namespace to its new name and delete it (see the module docstring)."""
    keys = keys or Keys()
    report = MigrationReport(dry_run=dry_run)
    swap = None if dry_run else client.register_script(_SWAP)
    for family, old, new in old_keys(client, keys):
        kind = client.type(old)
        if kind == "none":
            continue  # gone since the scan (expired looks)
        existed = bool(client.exists(new))
        if dry_run:
            n = _size(client, old, kind)
        else:
            pttl = client.pttl(old)
            n = _copy(client, keys, swap, old, new, kind)
            if pttl and pttl > 0 and client.pttl(new) == -1:
                client.pexpire(new, pttl)
            client.delete(old)
        report.moved[family] += 1
        report.merged[family] += int(existed)
        report.items[family] += n
    return report


def _size(client: Any, key: str, kind: str) -> int:
    return {"set": client.scard, "hash": client.hlen, "list": client.llen, "stream": client.xlen,
            "string": lambda k: 1}[kind](key)


def _copy(client: Any, keys: Keys, swap: Any, old: str, new: str, kind: str) -> int:
    """Copy ``old`` into ``new`` with commands of its type (merging); returns the entries copied."""
    n = 0
    if kind == "set":
        for members in _pages(client.sscan_iter(old, count=PAGE)):
            client.sadd(new, *members)
            n += len(members)
    elif kind == "hash":
        for fields in _pages(client.hscan_iter(old, count=PAGE)):
            pipe = client.pipeline(transaction=False)  # one key: one node
            for name, value in fields:
                pipe.hsetnx(new, name, value)
            pipe.execute()
            n += len(fields)
    elif kind == "list":
        start = 0
        while items := client.lrange(old, start, start + PAGE - 1):
            client.rpush(new, *items)
            start, n = start + len(items), n + len(items)
    elif kind == "string":
        value = client.get(old)
        n = int(value is not None and bool(client.set(new, value, nx=True)))
    elif kind == "stream":
        n = _copy_stream(client, keys, swap, old, new)
    else:
        raise ValueError(f"{old}: unexpected Redis type {kind!r} (FStream writes no such key)")
    return n


def _copy_stream(client: Any, keys: Keys, swap: Any, old: str, new: str) -> int:
    """Rebuild ``new`` as the merge (by id) of ``old`` and ``new`` in the scratch key, then swap it in."""
    temp = keys.migration_temp(new)
    client.delete(temp)  # a run that stopped half-way left it
    olds, news = _entries(client, old), _entries(client, new)
    a, b = next(olds, None), next(news, None)
    last_new, n, prev = "0-0", 0, (-1, -1)
    pipe = client.pipeline(transaction=False)  # one key: one node
    while a is not None or b is not None:
        if b is None or (a is not None and _id(a[0]) <= _id(b[0])):
            entry, a = a, next(olds, None)
            n += 1
        else:
            entry, b = b, next(news, None)
            last_new = entry[0]
        # same ms, order kept, ties renumbered: what ``XADD <ms>-*`` does, which only Redis >= 7.0 takes
        ms = _id(entry[0])[0]
        prev = (ms, prev[1] + 1) if ms == prev[0] else (ms, 0)
        pipe.xadd(temp, entry[1], id=f"{prev[0]}-{prev[1]}")
        if len(pipe) >= PAGE:
            pipe.execute()
    pipe.execute()
    swap(keys=[temp, new], args=[last_new])
    return n


def _entries(client: Any, key: str):
    after = "-"
    while page := client.xrange(key, min=after, count=PAGE):
        yield from page
        after = "(" + page[-1][0]


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _pages(it: Any):
    page: list = []
    for item in it:
        page.append(item)
        if len(page) >= PAGE:
            yield page
            page = []
    if page:
        yield page
