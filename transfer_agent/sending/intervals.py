"""The sender's interval records: bytes counted when the pacer earned them, and the record ``fstream send --json`` lists.

A paced block waits until the target rate has paid for all of it and then goes at once, so the
bytes the channel pool counts rise in steps of one block. An interval's count is taken by
``PacedCount``: the bytes the pacer has earned (``TokenBucket.earned``), never less than the
bytes sent. Counted on sends alone, the last, partial interval of a paced transfer always ended on
a block's release and held a block earned mostly before it began: 40 files of 4 MiB at 100 Mbit/s
ended with 8 MiB in 0.42 s, "161 Mbit/s" (issue 31).
"""

from __future__ import annotations

import time
from typing import Any


class PacedCount:
    """Bytes moved by a channel pool, counting a paced block's bytes as the rate pays for them.

    Every block the pool sends once it has a bucket is reserved in it first, so the bytes sent
    when the bucket appeared plus what the bucket has earned since is the smooth count; the bytes
    sent are the floor (a bucket that appeared with blocks already in flight, which it never saw,
    only makes the count fall back to them). Call ``watch`` after each ``pool.set_rates``.
    """

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._bucket: Any = None
        self._base = 0

    def watch(self) -> None:
        """Note the pool's bucket when it first appears, with the bytes sent before it."""
        bucket = getattr(self.pool, "bucket", None)
        if bucket is not None and bucket is not self._bucket:
            self._bucket, self._base = bucket, self.pool.counters()[0]

    def count(self, sent: int, floor: int = 0, now: float | None = None) -> int:
        """Bytes to count as moved: ``sent`` (the pool's counter, just read) or, paced, what the pacer earned.

        ``now`` defaults to the clock read after ``sent``. Never below ``floor`` (the last count).
        """
        if self._bucket is None:
            return max(floor, sent)
        return max(floor, sent, self._base + self._bucket.earned(time.monotonic() if now is None else now))


def interval_record(pool: Any, *, t: float, dt: float, nbytes: int, per_cluster: dict[str, int],
                    last_cluster: dict[str, int], outstanding: int, result: Any, files_total: int,
                    target_bps: float | None, reason: str, tuning_event: bool) -> dict[str, Any]:
    """One interval record (``Transfer.result.intervals``, the ``interval`` event).

    ``throughput_bps`` is ``bytes * 8 / dt``; per cluster it is what the cluster's channels sent
    (a cluster's paced bytes are not split out, so these count at the block's release).
    ``reason`` is the tuner's reason given since the last record; ``tuning_event`` says a
    ``tuning`` event already carried it (a log that prints those need not repeat it).
    """
    active = pool.active_layout()
    pend = pool.pending()
    rec = {
        "t": round(t, 3),
        "dt": round(dt, 3),
        "bytes": nbytes,
        "throughput_bps": nbytes * 8 / dt if dt > 0 else 0.0,
        "cc": sum(v[0] for v in active.values()),
        "p": max((v[1] for v in active.values()), default=0),
        "pp": max((v[2] for v in active.values()), default=0),
        "clusters": {c: {"cc": v[0], "p": v[1], "pp": v[2],
                         "throughput_bps": (per_cluster.get(c, 0) - last_cluster.get(c, 0)) * 8 / dt if dt > 0 else 0.0,
                         "pending_files": pend.get(c, (0, 0))[0]}
                     for c, v in active.items()},
        "passive": pool.passive_count(),
        "active_files": max(0, outstanding - sum(v[0] for v in pend.values())),
        "files_done": result.verified_files + result.skipped_files,
        "files_failed": result.failed_files,
        "files_pending": sum(v[0] for v in pend.values()),
        "files_total": files_total,
        "target_bps": target_bps,
        "reason": reason,
    }
    if reason and tuning_event:
        rec["tuning_event"] = True
    return rec
