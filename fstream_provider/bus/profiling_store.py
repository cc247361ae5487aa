"""Load and save the FStream profiling history in Redis (lists at ``Keys.profiling(size_class, ftype)``)."""

from __future__ import annotations

import json
import logging

from fstream_provider.bus.keys import PROFILING_KEEP, Keys
from fstream_provider.tuning.profile_history import ProfileHistory, ProfileRecord

log = logging.getLogger(__name__)

_NO_TYPE = "-"  # key component for records without a file type (key parts must be non-empty)


class ProfilingStore:
    """Redis persistence of ``ProfileHistory`` (newest first, trimmed to ``keep`` per key).

    :param client: a ``redis.Redis`` (``decode_responses=True`` or bytes, both work).
    :param keys: the key schema (namespace).
    :param keep: records kept per (size class, file type).
    """

    def __init__(self, client, *, keys: Keys | None = None, keep: int = PROFILING_KEEP) -> None:
        self.client = client
        self.keys = keys or Keys()
        self.keep = keep

    def _key(self, size_cls: str, ftype: str) -> str:
        return self.keys.profiling(size_cls, ftype or _NO_TYPE)

    def load(self) -> ProfileHistory:
        """Read every profiling list of this namespace into a fresh ``ProfileHistory``."""
        pattern = self.keys.own_slot_patterns()["profiling"]  # one slot per list: a Cluster scans every master
        records = []
        for key in self.client.scan_iter(match=pattern, count=500):
            for raw in self.client.lrange(key, 0, self.keep - 1):
                try:
                    records.append(ProfileRecord.from_dict(json.loads(raw)))
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("profiling history %s: skipping bad record (%s)", key, exc)
        return ProfileHistory(records, keep=self.keep)

    def save(self, history: ProfileHistory) -> int:
        """Persist the records added to ``history`` since the last save; return how many."""
        new = history.take_unsaved()
        if not new:
            return 0
        pipe = self.client.pipeline(transaction=False)
        touched = set()
        for r in new:
            key = self._key(r.size_class, r.ftype)
            pipe.lpush(key, json.dumps(r.to_dict(), sort_keys=True))
            touched.add(key)
        for key in touched:
            pipe.ltrim(key, 0, self.keep - 1)
        pipe.execute()
        return len(new)


def load_history(client, *, keys: Keys | None = None) -> ProfileHistory:
    """Shortcut: ``ProfilingStore(client, keys=keys).load()`` (what the sender calls before a transfer)."""
    return ProfilingStore(client, keys=keys).load()


def save_history(client, history: ProfileHistory, *, keys: Keys | None = None) -> int:
    """Shortcut: persist the records ``history`` gained since it was loaded; returns how many."""
    return ProfilingStore(client, keys=keys).save(history)
