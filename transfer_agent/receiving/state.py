"""What a receiver knows of one sender: its ``Session`` (links, open files, given-up ids) and each ``RecvFile``."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from transfer_agent.errors import FStreamError
from transfer_agent.receiving.keyring import ReceiverKey
from transfer_agent.receiving.quota import Charge
from transfer_agent.storage.checksum import KEYED, PrefixHasher
from transfer_agent.storage.ranges import RangeSet
from transfer_agent.storage.tree_hash import TreeDigest
from transfer_agent.wire.protocol import ControlWriter, Frame
from transfer_agent.wire.secure import ControlLink, SessionKeys

SETTLED_MAX = 4096  # file ids a session remembers as aborted/skipped/failed, so their late blocks are dropped


@dataclass(eq=False)
class RecvFile:
    """One file being received in a session."""

    file_id: int
    relpath: str
    dir_fd: int
    base: str
    tmp: str
    size: int
    mtime_ns: int
    algo: str
    fd: int
    ranges: RangeSet
    session: "Session"
    lock: threading.Lock = field(default_factory=threading.Lock)
    expected_hash: str | None = None
    commit_requested: bool = False
    part_key: tuple[tuple[int, int], str] = ((0, 0), "")
    queued: bool = False
    done: bool = False
    failed: bool = False
    dirty: bool = False
    unkicked: int = 0  # bytes written since its writeback was last started (``storage.writeback``, issue 43)
    users: int = 0
    closing: bool = False
    meta_written: bool = False
    inflight: list[tuple[int, int]] = field(default_factory=list)
    hasher: PrefixHasher | None = None
    tree: TreeDigest | None = None  # its digest from blocks as they arrive (issue 29; then ``hasher`` is None)
    quota: Charge | None = None  # what its OPEN charged to its key's quota (None: the key has none)
    resumed: int = 0  # bytes its part held when it was opened
    opened: float = field(default_factory=time.monotonic)  # when its OPEN was taken (the per-file latency's start)

    def acquire(self) -> int:
        """Borrow the fd for one I/O; -1 once the file is closing. Pair with ``unuse``."""
        with self.lock:
            if self.fd < 0 or self.closing:
                return -1
            self.users += 1
            return self.fd

    def unuse(self) -> None:
        with self.lock:
            self.users -= 1
            if self.closing and self.users == 0:
                self._close_now()

    def close(self) -> bool:
        """Close once nobody uses the fd any more (never under a concurrent pwrite). True the first time."""
        with self.lock:
            if self.closing:
                return False
            self.closing = True
            if self.users == 0:
                self._close_now()
            return True

    def _close_now(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            os.close(self.dir_fd)
            self.fd = self.dir_fd = -1

    def meta(self) -> dict[str, Any]:
        return {"path": self.relpath, "size": self.size, "mtime_ns": self.mtime_ns, "algo": self.algo,
                "job": self.session.job, "attempt": self.session.attempt, "ranges": self.ranges.ranges()}


class Session:
    """One sender's session: a control connection, its data connections, its open files.

    ``key`` is the receiver's key the control connection authenticated with (issue 32): where the session may
    write, its quota; its data connections must use the same key. Default: the whole root, no quota.
    """

    def __init__(self, sid: str, job: str, attempt: int, control: ControlLink | ControlWriter, peer: str,
                 keys: SessionKeys | None = None, key: ReceiverKey | None = None) -> None:
        self.id, self.job, self.attempt, self.control, self.peer = sid, job, attempt, control, peer
        self.keys = keys  # the control connection's keys (None: TLS only)
        self.key = key if key is not None else ReceiverKey("default", None)
        self.files: dict[int, RecvFile] = {}
        self.deferred: set[int] = set()  # opened, final already present: waiting for SKIP or a replacing OPEN
        # ids of files this session opened and then aborted, skipped or failed (the newest SETTLED_MAX): blocks
        # of them already on their way when the sender gave up are read and dropped, not a protocol error
        self.settled: OrderedDict[int, None] = OrderedDict()
        self.dirs: dict[str, tuple[int, tuple[int, int]]] = {}  # parent dirs walked (O_NOFOLLOW) this session
        self.free_estimate = 0
        self.data_socks: set[socket.socket] = set()
        self.data_threads: set[threading.Thread] = set()
        self.lock = threading.Lock()
        # OPENs are taken one at a time (the control loop, or the receiver's thread admitting parked ones: issue 43)
        self.opening = threading.Lock()
        self.closed = False
        self.sock: socket.socket | None = None  # the control connection (fencing checks and shuts it)

    @property
    def job_key(self) -> tuple[str, str]:
        """(key id, job): jobs are named per key, so one key's sender cannot fence another key's job."""
        return self.key.key_id, self.job

    def settle(self, fid: int) -> None:
        """Remember that file ``fid`` was opened and is given up (aborted, skipped, failed) in this session."""
        with self.lock:
            self.settled[fid] = None
            self.settled.move_to_end(fid)
            while len(self.settled) > SETTLED_MAX:
                self.settled.popitem(last=False)

    def is_settled(self, fid: int) -> bool:
        with self.lock:
            return fid in self.settled

    def reply(self, ftype: Frame, body: dict[str, Any], file_id: int = 0) -> None:
        try:
            self.control.send(ftype, body, file_id)
        except FStreamError:
            pass  # the sender is gone; its files stay resumable

    def digest_key(self, algo: str) -> bytes | None:
        """The key of ``algo`` in this session: the control connection's digest key for keyed algorithms."""
        if algo in KEYED and self.keys is not None:
            return self.keys.digest
        return None
