"""The channel pool: the tuner's layout applied to channels (reuse by p, park as passive, open new), the file queue, pacing.

The sender's connection layer is four modules below this one: ``inflight`` (a file in flight and
its blocks), ``connector`` (authenticated connections), ``control`` (the control session) and
``channel`` (one channel's streams).

A channel is ``p`` TCP streams that share one block queue: a file's missing ranges are cut into
blocks and each stream takes the next block, so one file is striped over the channel's
streams and, with small files, several files are in flight on one channel at once (a channel of one
stream is sent on by its driver, ``channel``). A channel's
driver keeps up to ``pp`` files opened ahead of the one whose blocks it is queueing, so the
channel never waits a round trip between files. Channels are kept by their ``p``: a tuner
change reassigns channels whose ``p`` fits, parks the rest as passive, and opens new ones only
when no passive channel fits (smart channel distribution, thesis ch. 3).

Security (issue 8; modes and what they protect against: ``transfer_agent.wire.secure``): every
connection authenticates the receiver by our own configuration (``auth.client_handshake``); the
control connection's frames go through its ``ControlLink`` (MAC'd or sealed with a shared
secret), its digest key keys the file digest (``blake3-keyed``), and with ``encrypt`` each data
stream seals its blocks (pread + seal + sendall, like the TLS path; never sendfile).
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from typing import Callable

from fstream_provider.tuning.base import ClusterLayout
from fstream_provider.tuning.distribution import ChannelState, plan_channels
from fstream_provider.tuning.pacing import TokenBucket
from fstream_provider.watch.sources import SrcFile
from transfer_agent.errors import FStreamError
from transfer_agent.sending.channel import Channel
from transfer_agent.sending.connector import Connector
from transfer_agent.sending.control import ControlSession
from transfer_agent.sending.inflight import InFlight
from transfer_agent.wire.protocol import Frame


#: channels opened at once: each opens its streams one after another, so this many handshakes are in progress at
#: most, well under a receiver's limit of unauthenticated connections from one address (16 by default)
OPEN_AT_ONCE = 8


class ChannelPool:
    """All channels of one session, the per-cluster file queues and the byte counters.

    :param control: the session's control connection.
    :param connector: opens data connections.
    :param block_size: bytes per data block.
    :param max_passive: passive channels kept for reuse; beyond this the idle ones are closed.
    """

    def __init__(self, control: ControlSession, connector: Connector, block_size: int, max_passive: int = 8) -> None:
        self.control, self.connector, self.block_size, self.max_passive = control, connector, block_size, max_passive
        self.channels: dict[int, Channel] = {}
        self.queues: dict[str, collections.deque[SrcFile]] = collections.defaultdict(collections.deque)
        self.cond = threading.Condition()
        self.stopping = threading.Event()
        self._next_cid = 1
        self._bytes = 0
        self._cluster_bytes: dict[str, int] = collections.defaultdict(int)
        self._count_lock = threading.Lock()
        self._pending: dict[str, list[int]] = {}  # cluster -> [files, bytes] queued
        self.on_unopenable: Callable[[SrcFile, FStreamError], None] | None = None
        self.bucket: TokenBucket | None = None
        self._moved_seen: dict[int, int] = {}

    # -- files ---------------------------------------------------------------------------------
    def add_files(self, files: list[SrcFile]) -> None:
        with self.cond:
            for sf in files:
                self.queues[sf.cluster].append(sf)
                tally = self._pending.setdefault(sf.cluster, [0, 0])
                tally[0] += 1
                tally[1] += sf.size
            self.cond.notify_all()

    def drain(self) -> list[SrcFile]:
        """Take every queued file out (the session is ending)."""
        with self.cond:
            out = [sf for q in self.queues.values() for sf in q]
            self.queues.clear()
            self._pending.clear()
        return out

    def requeue_unstarted(self, f: InFlight) -> None:
        """A file opened ahead but never sent (channel closing): abort it quietly and queue it again."""
        if not f.finished.is_set():
            try:
                self.control.writer.send(Frame.ABORT, {"reason": "channel closed"}, f.file_id)
            except FStreamError:
                pass
            self.control._finish(f, "retry", None)  # noqa: SLF001 - same module family

    def unopenable(self, sf: SrcFile, exc: FStreamError) -> None:
        """A queued source could not be opened (vanished, unreadable): report it, keep the session."""
        if self.on_unopenable is not None:
            self.on_unopenable(sf, exc)

    def next_files(self, cluster: str, n: int) -> list[SrcFile]:
        """Up to ``n`` queued files of ``cluster``, taken under one lock (a driver's refill)."""
        with self.cond:
            q = self.queues.get(cluster)
            if not q:
                return []
            out = [q.popleft() for _ in range(min(n, len(q)))]
            tally = self._pending[cluster]
            tally[0] -= len(out)
            tally[1] -= sum(sf.size for sf in out)
            return out

    def pending(self) -> dict[str, tuple[int, int]]:
        """Per cluster, (files, bytes) queued and not yet opened (kept as files come and go, not recounted)."""
        with self.cond:
            return {c: (n, b) for c, (n, b) in self._pending.items()}

    def wait_for_work(self, timeout: float) -> None:
        with self.cond:
            self.cond.wait(timeout)

    def count(self, f: InFlight, n: int) -> None:
        with self._count_lock:
            self._bytes += n
            self._cluster_bytes[f.sf.cluster] += n

    def counters(self) -> tuple[int, dict[str, int]]:
        with self._count_lock:
            return self._bytes, dict(self._cluster_bytes)

    def set_rates(self, rates: dict[str, float | None]) -> None:
        """Cap the session's total rate at the sum of the clusters' caps (bits/s; no cap when none is given).

        One bucket for the whole session, not one per cluster: when a cluster runs out of files
        mid-interval, the others may use its share at once, so the total stays at the target.
        """
        caps = [r for r in rates.values() if r]
        total = sum(caps) if caps else None
        with self._count_lock:
            if self.bucket is None:
                if total:
                    self.bucket = TokenBucket(total, now=time.monotonic())
            else:
                self.bucket.set_rate(total, time.monotonic())

    def pace(self, nbytes: int) -> float:
        """Seconds to wait before sending ``nbytes`` (0 when unpaced)."""
        if self.bucket is None:
            return 0.0
        with self._count_lock:
            return self.bucket.reserve(nbytes, time.monotonic())

    # -- layout --------------------------------------------------------------------------------
    def apply(self, layouts: dict[str, tuple[int, int, int]], halt: Callable[[], bool] = lambda: False
              ) -> dict[str, int]:
        """Make the channels match ``{cluster: (cc, p, pp)}`` (smart distribution); return what was done.

        ``halt()`` true (the transfer is cancelled or draining) stops opening channels: on a WAN each costs p
        handshakes of a few round trips, and a cancel must not wait for ten of them (issue 30); the channels already
        opening (``OPEN_AT_ONCE`` at most) finish theirs."""
        with self.cond:
            states = [ChannelState(c.id, c.p, c.cluster, c.busy) for c in self.channels.values() if not c.closing]
            plan = plan_channels(states, [ClusterLayout(k, cc, p, pp) for k, (cc, p, pp) in layouts.items()],
                                 max_passive=self.max_passive)
            for cid, cluster in plan.reassign:
                self.channels[cid].cluster = cluster
            for cid in plan.passivate:
                self.channels[cid].cluster = None
            closed = [self.channels.pop(cid) for cid in plan.close if cid in self.channels]
            for ch in closed:
                ch.cluster = None
                ch.stop()
            for ch in self.channels.values():
                if ch.cluster is not None and ch.cluster in layouts:
                    ch.pp = layouts[ch.cluster][2]
            self.cond.notify_all()
        fresh = []
        for req in plan.open:
            for _ in range(req.count):
                ch = Channel(self._next_cid, req.p, self)
                self._next_cid += 1
                ch.cluster = req.cluster
                ch.pp = layouts[req.cluster][2]
                fresh.append(ch)
        self._open(fresh, halt)
        for ch in closed:
            threading.Thread(target=ch.join, daemon=True).start()
        return {"opened": plan.opened, "reassigned": len(plan.reassign), "passivated": len(plan.passivate),
                "closed": len(closed)}

    def _open(self, fresh: list[Channel], halt: Callable[[], bool]) -> None:
        """Open ``fresh`` channels, ``OPEN_AT_ONCE`` handshakes at a time, each joining the pool as soon as its
        streams are up; the first failure is raised once the others have finished (those that opened stay).

        One after another they cost a connect and an authentication (a few round trips) per stream: 28 channels of
        one stream and 4 of five, 48 handshakes on a 40 ms path, took 5.8 s, the whole of a 0.5 GB transfer, while
        the sender's loop waited (issue 44). At once they cost the slowest of them, a few hundred ms. After a failure
        no further channel starts (a receiver gone answers every one with a connect timeout)."""
        failed = threading.Event()

        def one(ch: Channel) -> None:
            if halt() or failed.is_set():
                return
            try:
                ch.start()  # refused ("unknown session"): the session's failure is the receiver's reason (control)
            except BaseException:
                failed.set()
                raise
            with self.cond:
                self.channels[ch.id] = ch
                self.cond.notify_all()

        if len(fresh) <= 1:
            for ch in fresh:
                one(ch)
            return
        with concurrent.futures.ThreadPoolExecutor(min(OPEN_AT_ONCE, len(fresh)),
                                                   thread_name_prefix="fstream-open") as ex:
            futures = [ex.submit(one, ch) for ch in fresh]
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            raise errors[0]

    def active_layout(self) -> dict[str, tuple[int, int, int]]:
        """What is in force now: per cluster (channels, p, pp)."""
        out: dict[str, tuple[int, int, int]] = {}
        with self.cond:
            for ch in self.channels.values():
                if ch.cluster is None or ch.closing:
                    continue
                cc, p, pp = out.get(ch.cluster, (0, 0, 0))
                out[ch.cluster] = (cc + 1, max(p, ch.p), max(pp, ch.pp))
        return out

    def working_channels(self) -> dict[str, int]:
        """Per cluster, channels that moved data since the last call or are busy now (not merely assigned)."""
        out: dict[str, int] = {}
        with self.cond:
            for ch in self.channels.values():
                moved, ch_last = ch.moved, self._moved_seen.get(ch.id, 0)
                self._moved_seen[ch.id] = moved
                # a channel reassigned mid-file still works for the file's cluster until that file is done
                name = (ch.carrying if ch.busy else None) or ch.cluster
                if name is not None and (ch.busy or moved > ch_last):
                    out[name] = out.get(name, 0) + 1
        return out

    def passive_count(self) -> int:
        with self.cond:
            return sum(1 for c in self.channels.values() if c.cluster is None and not c.closing)

    def shutdown(self, graceful: bool) -> None:
        self.stopping.set()
        with self.cond:
            self.cond.notify_all()
        chans = list(self.channels.values())
        for ch in chans:
            ch.stop() if graceful else ch.kill()
        for ch in chans:
            ch.join(timeout=10 if graceful else 3)
