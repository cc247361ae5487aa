"""How many new files a ``--watch`` stream takes from its sources at a time (issue 43).

A stream started on a backlog (a million files already present, as after an outage) used to list, track and queue
every one of them at once: 1.5 GB of sender memory at 1,000,000 files of 1 KiB (BENCHMARKS §19.3; 57 % of it the
list each scan built). Now the stream takes new files only while fewer than ``QUEUE_MAX`` are outstanding (queued in
the pool, open, or waiting out a retry), at most the room left; the listing stops where the window is full and goes
on from there at the next look (``TreeLister.scan(limit=)``), which comes at once (``BACKLOG_POLL_S``) while the
listing has more. What a stream holds is then a window of files, whatever the backlog: the files it shipped stay in
the packed seen store (``watch.packed_seen``), a few bytes each.

A channel's feed (``flow.transfer.FlowFeed``) is not windowed: the channel holds its files already.
"""

from __future__ import annotations

import time
from typing import Any

from fstream_provider.watch.source_watcher import SourceWatcher
from fstream_provider.watch.sources import SrcFile

QUEUE_MAX = 10_000  # files outstanding before a stream takes no more (the tuner keeps ~1,200 in flight at most)
REFILL = QUEUE_MAX // 4  # room needed before the next look: a look lists a quarter of the window or more
BACKLOG_POLL_S = 0.05  # the next look, while the listing has more (else the spec's interval)


def take(watcher: Any, outstanding: int, spec: Any, first: bool = False) -> tuple[list[SrcFile], float]:
    """New files from ``watcher`` (a ``SourceWatcher`` or a feed) for a stream with ``outstanding`` files, and the
    seconds until the next look. After the spec's ``until`` only the ``first`` look (what is there at the start)
    takes files."""
    if not first and spec.until is not None and time.time() >= spec.until:
        return [], spec.interval_s
    if not isinstance(watcher, SourceWatcher):
        return watcher.poll(), spec.interval_s
    room = QUEUE_MAX - outstanding
    new = watcher.poll(limit=room) if room >= REFILL else []
    return new, (BACKLOG_POLL_S if watcher.backlog else spec.interval_s)
