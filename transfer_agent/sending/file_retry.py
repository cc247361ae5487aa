"""When a file is tried again within a transfer (issue 8, defect 6): its budget and its backoff.

A checksum mismatch (or a retry without a reason) counts against ``MAX_FILE_TRIES``; a retryable
refusal (the receiver says "busy" while a stale attempt is fenced) is retried within ``RETRY_BUDGET_S``.
Either way with exponential backoff and jitter (``FILE_RETRY``, the one retry policy of
``fstream_provider.model.retry``), never a storm of retries within milliseconds.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Iterable, Iterator

from fstream_provider.model.retry import RetryPolicy
from fstream_provider.watch.sources import SrcFile
from transfer_agent.errors import ChecksumError, FStreamError

MAX_FILE_TRIES = 3  # tries of a file after checksum mismatches (and other counted failures)
RETRY_BUDGET_S = 60.0  # a file refused as retryable (e.g. "busy") is retried with backoff within this time
FILE_RETRY = RetryPolicy(base_s=0.15, cap_s=12.0)  # 75-150 ms, doubling up to 6-12 s


def retry_delay(sf: SrcFile, err: FStreamError | None, now: float | None = None) -> float | None:
    """Seconds to wait before retrying ``sf``; None when its retries are used up."""
    now = time.monotonic() if now is None else now
    sf.retries += 1
    if err is None:  # opened ahead and put back unsent (a channel closed): it did not fail, no wait
        return 0.0
    if isinstance(err, ChecksumError):
        sf.tries += 1
        if sf.tries >= MAX_FILE_TRIES:
            return None
    else:
        if not sf.retry_since:
            sf.retry_since = now
        if now - sf.retry_since >= RETRY_BUDGET_S:
            return None
    delay = FILE_RETRY.delay(sf.retries - 1)
    if sf.retry_since:
        delay = min(delay, max(0.0, sf.retry_since + RETRY_BUDGET_S - now))
    return delay


def left_over(*groups: Iterable[SrcFile]) -> list[SrcFile]:
    """The files a failed session leaves to the next one (in flight, waiting out a retry, queued), each once, in
    order of first appearance: keyed by source and destination, so O(n) (issue 43: a list membership test under
    the dataclass's field-by-field equality was O(n²), minutes of CPU for 50,000 files)."""
    once: dict[tuple[str, str], SrcFile] = {}
    for group in groups:
        for sf in group:
            once.setdefault((sf.src, sf.rel), sf)
    return list(once.values())


class RetryQueue:
    """The files of a session waiting out a retry's backoff, the soonest due first (issue 43: the session's loop
    split a list of them on every pass, and it passes once per finished file: O(n) per file while n wait)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, SrcFile]] = []
        self._order = itertools.count()

    def append(self, sf: SrcFile) -> None:
        heapq.heappush(self._heap, (sf.retry_at, next(self._order), sf))

    def due(self, now: float) -> list[SrcFile]:
        """Take out the files whose backoff ended by ``now``, soonest first."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            out.append(heapq.heappop(self._heap)[2])
        return out

    def clear(self) -> None:
        self._heap.clear()

    def __iter__(self) -> Iterator[SrcFile]:
        return (sf for _at, _n, sf in sorted(self._heap))

    def __len__(self) -> int:
        return len(self._heap)
