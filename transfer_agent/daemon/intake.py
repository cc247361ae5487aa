"""Where the agent's next job comes from: its own pending entries, dead agents' jobs (reclaim), new jobs."""

from __future__ import annotations

import redis


class IntakeMixin:
    """Reading, reclaiming and housekeeping the jobs stream for ``transfer_agent.daemon.worker.Agent``.

    Uses the agent's ``name``, ``keys``, ``claim_idle_ms``, ``orphan_idle_ms``, ``counters``, ``log``,
    ``_client``, ``_store`` and ``_autoclaim_cursor``.
    """

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
