"""A file in flight on the sender and how its missing ranges are cut into blocks for a channel's streams."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fstream_provider.watch.sources import SrcFile
from transfer_agent.errors import FStreamError

MIN_STRIPE = 256 << 10  # smallest block a file is cut into when striped over a channel's streams
ALIGN = 64 << 10  # block sizes are multiples of this (a power of two of BLAKE3's 1 KiB chunks)


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
    public_digest: str | None = None  # the unkeyed digest of the same bytes, when asked for (ControlSession.public_algo)
    finished: threading.Event = field(default_factory=threading.Event)
    outcome: str = ""  # committed | skipped | failed
    aborted: bool = False
    resumed: int = 0
    holds: int = 0  # data streams using ``fd`` right now (see ``hold``)
    settled: bool = False
    fd_closed: bool = False
    opened_at: float = field(default_factory=time.monotonic)  # OPEN sent: a file's latency to its commit (metrics)


class Ready:
    """A checksum computed already (by the driver, ``ControlSession._start_hash``): what the commit path asks of a
    ``concurrent.futures.Future`` (``done``, ``cancelled``, ``result``, ``add_done_callback``), without building and
    notifying a condition variable for every small file."""

    __slots__ = ("_value", "_error")

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self._value, self._error = value, error

    def done(self) -> bool:
        return True

    def cancelled(self) -> bool:
        return False

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def add_done_callback(self, fn: Any) -> None:
        fn(self)  # done already: called at once, as a Future does


def cut_blocks(missing: list[tuple[int, int]], p: int, block_size: int) -> list[tuple[int, int]]:
    """Cut a file's missing ranges into (offset, length) blocks for a channel of ``p`` streams.

    Blocks are at most ``block_size`` and at most the file's share per stream (but not under
    ``MIN_STRIPE``), so a file smaller than a block is still striped over every stream. Block sizes are
    multiples of ``ALIGN`` and blocks lie on a grid of their size (a resumed range's first block ends on
    it): each is then one or a few whole nodes of the file's BLAKE3 tree, which the receiver hashes as
    the block arrives (issue 29, ``storage.tree_hash``); an unaligned edge is read back at commit.
    """
    todo = sum(b - a for a, b in missing)
    share = -(-todo // max(1, p))
    bs = min(block_size, max(MIN_STRIPE, -(-share // ALIGN) * ALIGN))
    if bs >= ALIGN:
        bs -= bs % ALIGN
    blocks = []
    for a, end in missing:
        off = a
        while off < end:
            nxt = min(end, (off // bs + 1) * bs)
            blocks.append((off, nxt - off))
            off = nxt
    return blocks


def hold(f: InFlight) -> bool:
    """Take a hold on ``f``'s source descriptor for one block; False once the file is settled (skip the block).

    The control thread settles a file (a refusal, an abort) while a data stream may be inside
    ``sendfile`` on its descriptor: closing it then failed the stream with EBADF, failing the whole
    session, and a reused descriptor number could have sent another file's bytes. The descriptor is
    closed by the last of ``settle`` and ``release``.
    """
    with f.lock:
        if f.settled or f.aborted:
            return False
        f.holds += 1
        return True


def release(f: InFlight) -> None:
    """End a hold taken by ``hold``; closes the descriptor if the file was settled meanwhile."""
    with f.lock:
        f.holds -= 1
        close = f.settled and f.holds == 0 and not f.fd_closed
        if close:
            f.fd_closed = True
    if close:
        _close_quiet(f.fd)


def settle(f: InFlight) -> None:
    """Close the source (at once, or when the last stream holding it lets go) and wake whoever waits on the file."""
    with f.lock:
        f.settled = True
        close = f.holds == 0 and not f.fd_closed
        if close:
            f.fd_closed = True
    if close:
        _close_quiet(f.fd)
    f.opened.set()
    f.finished.set()


def _close_quiet(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def public_checksum(f: InFlight, algo: str | None, public_algo: str | None = None) -> dict[str, str]:
    """``{"checksum", "algo"}`` of a committed file for downstream users, when it is a plain content hash
    (``xxh3_128`` with TLS or no auth). The default ``blake3-keyed`` digest is keyed with the session's
    key: it proves the bytes to the receiver but means nothing to anyone else, so it is not reported;
    the unkeyed ``public_algo`` digest computed beside it is, when the transfer asked for one."""
    fut = f.hash_future
    if not algo or fut is None or not fut.done() or fut.cancelled():
        return {}
    if algo.endswith("-keyed"):
        return {"checksum": f.public_digest, "algo": public_algo} if f.public_digest and public_algo else {}
    digest = fut.result()
    return {"checksum": digest, "algo": algo} if digest else {}
