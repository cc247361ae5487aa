"""Where the agent's next job comes from: its own pending entries, dead agents' jobs (reclaim), new jobs.

An idle agent's Redis operations are bounded (issue 28): the blocking read of new jobs paces the loop; its own
pending list is read only when one of its reads may have left something there (at start, after an iteration
that had entries: read on past what it returned until it returns nothing) and every ``reclaim_interval``;
dead agents' jobs are looked for every ``reclaim_interval`` (an entry is reclaimable only after
``claim_idle_ms`` anyway), and at once again after a reclaim found one.
"""

from __future__ import annotations

import time

import redis

RECLAIM_EVERY_S = 5.0  # the longest wait between scans for dead agents' jobs (a quarter of claim_idle_ms if less)


class IntakeMixin:
    """Reading, reclaiming and housekeeping the jobs stream for ``transfer_agent.daemon.worker.Agent``.

    Uses the agent's ``name``, ``keys``, ``claim_idle_ms``, ``orphan_idle_ms``, ``reclaim_interval``,
    ``counters``, ``log``, ``_client``, ``_store``, ``_autoclaim_cursor`` and ``_intake_due``.
    """

    def _intake(self, block_ms: int, count: int) -> list[tuple[str, dict | None]]:
        """The next entries: our own pending ones when due, else dead agents' when due, else new ones (blocking)."""
        stream, group = self.keys.jobs_stream(), self.keys.jobs_group()
        self._store.ensure_group()
        due, now, every = self._intake_due, time.monotonic(), self.reclaim_interval
        entries: list[tuple[str, dict | None]] = []
        if due["own_dirty"] or now >= due["own"]:
            # leftovers in our own pending list (a previous incarnation with this name, a failed ack), read on
            # from the last one returned: an entry that stays pending (left alone) is not read again at once
            entries = self._read(stream, group, due["own_from"], block=None, count=count)
            if entries:
                due["own_from"] = entries[-1][0]
            else:
                due["own_from"], due["own"], due["own_dirty"] = "0", now + every, False
        if not entries and now >= due["reclaim"]:
            entries = self._reclaim()  # jobs of dead agents
            due["reclaim"] = now if entries else now + every  # one found: there may be more, look again next time
        if not entries:
            entries = self._read(stream, group, ">", block=block_ms, count=count)  # new jobs
        if entries:
            due["own_dirty"] = True  # handling them may leave one pending for us (a failed ack, left alone)
        return entries

    def _read(self, stream: str, group: str, start: str, block: int | None,
              count: int = 1) -> list[tuple[str, dict | None]]:
        try:
            resp = self._client.xreadgroup(group, self.name, {stream: start}, count=count, block=block)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._store._group_ready = False
            self._store.ensure_group()
            return []
        out = []
        for _stream, entries in resp or []:
            out.extend(entries)
        return out

    def _reclaim(self) -> list[tuple[str, dict | None]]:
        stream, group = self.keys.jobs_stream(), self.keys.jobs_group()
        try:
            pending = self._client.xpending_range(stream, group, min="-", max="+", count=50,
                                                  idle=self.claim_idle_ms)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self.log.warning("the jobs stream or its consumer group vanished (Redis flushed?); recreating it")
            self._store._group_ready = False
            self._store.ensure_group()
            return []
        for p in pending:
            owner = p["consumer"]
            if owner == self.name or self._client.exists(self.keys.agent(owner)):
                continue
            # XCLAIM re-checks the idle time atomically: a live owner that just touched it keeps it
            got = self._client.xclaim(stream, group, self.name, self.claim_idle_ms, [p["message_id"]])
            if got:
                self.counters["reclaimed"] += 1
                self.log.info("reclaimed entry %s of agent %s (heartbeat gone, idle %d ms)",
                              p["message_id"], owner, p["time_since_delivered"])
                return got[:1]
        resp = self._client.xautoclaim(stream, group, self.name, self.orphan_idle_ms,
                                       start_id=self._autoclaim_cursor, count=1)
        self._autoclaim_cursor = resp[0] if resp and resp[0] else "0-0"
        got = [e for e in (resp[1] if resp else []) if e and e[0]]
        if got:
            self.counters["reclaimed"] += 1
            self.log.info("reclaimed orphan entry %s (idle > %d ms)", got[0][0], self.orphan_idle_ms)
        return got

    def _housekeeping(self) -> None:
        removed = self._store.trim_acked()
        if removed:
            self.log.info("trimmed %d acknowledged job entries", removed)
        stream, group = self.keys.jobs_stream(), self.keys.jobs_group()
        for c in self._client.xinfo_consumers(stream, group):
            if (c["name"] != self.name and not c["pending"] and c["idle"] > 3600_000
                    and not self._client.exists(self.keys.agent(c["name"]))):
                self._client.xgroup_delconsumer(stream, group, c["name"])
