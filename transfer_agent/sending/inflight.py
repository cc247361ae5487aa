"""A file in flight on the sender and how its missing ranges are cut into blocks for a channel's streams."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

from fstream_provider.watch.sources import SrcFile
from transfer_agent.errors import FStreamError

MIN_STRIPE = 256 << 10  # smallest block a file is cut into when striped over a channel's streams


@dataclass(eq=False)
class InFlight:
    """One file between OPEN and COMMITTED."""

    sf: SrcFile
    file_id: int
    fd: int
    st_size: int
    st_mtime_ns: int
    opened: threading.Event = field(default_factory=threading.Event)
    reply: dict[str, Any] | None = None
    error: FStreamError | None = None
    blocks_left: int = 0
    bytes_sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    hash_future: Any = None
    finished: threading.Event = field(default_factory=threading.Event)
    outcome: str = ""  # committed | skipped | failed
    aborted: bool = False
    resumed: int = 0


def cut_blocks(missing: list[tuple[int, int]], p: int, block_size: int) -> list[tuple[int, int]]:
    """Cut a file's missing ranges into (offset, length) blocks for a channel of ``p`` streams.

    Blocks are at most ``block_size`` and at most the file's share per stream (but not under
    ``MIN_STRIPE``), so a file smaller than a block is still striped over every stream.
    """
    todo = sum(b - a for a, b in missing)
    bs = min(block_size, max(MIN_STRIPE, -(-todo // max(1, p))))
    return [(off, min(bs, end - off)) for a, end in missing for off in range(a, end, bs)]


def settle(f: InFlight) -> None:
    """Close the source and wake whoever waits on the file; its outcome is decided."""
    try:
        os.close(f.fd)
    except OSError:
        pass
    f.opened.set()
    f.finished.set()


