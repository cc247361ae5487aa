"""``channel.transfer(to=...)``: ship the files of a channel through FStream, emit one record per landed file.

Two ways to run it:

- **in-process** (default): one long-lived ``Transfer`` (the agent's sender) runs for the whole
  subscription; each file the channel emits is handed to it as it arrives (a ``FlowFeed``),
  so the tuner sees the stream the way ``fstream send --watch`` does and no connection is set
  up per batch;
- **through Redis** (``redis=URL``): each item (a file, or a batch from ``buffer``) becomes a job
  on the bus that any ``fstream agent`` on that Redis runs; the stage follows each job's events.

Either way every landed file comes out as a :class:`Landed` record with its destination path,
size and a checksum anyone can check (``xxh3_128`` of the bytes that were verified end to end),
and a file that fails raises :class:`FlowError` naming it where the user subscribed. At most
``max_in_flight`` files are between the stage's input and its output: a slow path slows the
watcher (backpressure). Cancelling the subscription (a ``break``) stops the transfer; files in
flight stay as hidden per-attempt ``.part`` names at the destination, never under their final
name, and the next transfer of the same file resumes them.
"""

from __future__ import annotations

import collections
import os
import threading
from pathlib import Path
from typing import Any

from fstream_provider.flow.jobs import follow_batches
from fstream_provider.flow.pipe import END, Cancelled, Failure, Pipe, Subscription, items
from fstream_provider.flow.records import FlowError, landed_from_event
from fstream_provider.model.spec import TransferSpec
from fstream_provider.model.spec_fields import KEY_FILE_FIELDS
from fstream_provider.watch.sources import SrcFile, join_dest

class FlowFeed:
    """New files for a running ``Transfer`` (its ``feed``): the channel puts, the transfer polls."""

    def __init__(self) -> None:
        self._q: collections.deque[SrcFile] = collections.deque()
        self._lock = threading.Lock()
        self._closed = False
        self.wake: threading.Event | None = None  # set by the Transfer: put() wakes its loop
        self.last_scan_seconds = 0.0
        self.last_scan_listed = 0

    def put(self, files: list[SrcFile]) -> None:
        with self._lock:
            self._q.extend(files)
        if self.wake is not None:
            self.wake.set()

    def close(self) -> None:
        """No more files will come: the transfer ends once the last one landed."""
        with self._lock:
            self._closed = True
        if self.wake is not None:
            self.wake.set()

    def poll(self) -> list[SrcFile]:
        with self._lock:
            out = list(self._q)
            self._q.clear()
        return out

    @property
    def pending_candidates(self) -> bool:
        with self._lock:
            return not self._closed or bool(self._q)


def _files(x: Any) -> list[Path]:
    batch = x if isinstance(x, list) or type(x) is tuple else [x]  # a Landed record is a named tuple, not a batch
    out = []
    for p in batch:
        if not isinstance(p, Path):
            if not isinstance(p, (str, os.PathLike)):
                raise FlowError(f"transfer: {p!r} is not a file path (a channel of paths or of lists of paths is needed)")
            p = Path(p)
        out.append(p)
    return out


class _Slots:
    """At most ``n`` files between the stage's input and its consumer: taken when a file is handed
    on, given back when the consumer takes its record."""

    LOW = 64  # a partial taker is woken once this many (or all it asked for) are free: no wake per file

    def __init__(self, n: int, sub: Subscription) -> None:
        self.n = n
        self._free = n
        self._want = 0  # what the one taker waits for
        self._cond = threading.Condition()
        self._sub = sub

    def take(self, k: int = 1, *, partial: bool = False) -> int:
        """Take ``k`` slots (``partial``: as many as are free, at least ``min(k, LOW)``); returns how many."""
        need = min(k, self.LOW, self.n) if partial else k
        with self._cond:
            while self._free < need:
                if self._sub.stop.is_set():
                    raise Cancelled()
                self._want = need
                self._cond.wait(0.1)
            self._want = 0
            got = min(k, self._free)
            self._free -= got
            return got

    def give(self, k: int = 1) -> None:
        with self._cond:
            self._free += k
            if self._want and self._free >= self._want:  # wake the taker once, when it can go on
                self._cond.notify()


class Outbox(Pipe):
    """The stage's output. The transfer's own threads push events without blocking (the slots bound
    how many wait here); the consumer builds each record in its own thread, and each record taken
    gives its slot back (in handfuls: one wake-up of the feeder, not one per file)."""

    def __init__(self, sub: Subscription, slots: _Slots, dest: Any) -> None:
        super().__init__(sub, slots.n + 8)
        self.slots = slots
        self.dest = dest
        self._owed = 0

    def deliver(self, ev: dict) -> None:
        """A transfer's ``file`` event, from the transfer's own thread: kept as it is."""
        if ev.get("status") in ("committed", "skipped", "failed"):
            self.push(_Event(ev))

    def fail(self, exc: BaseException) -> None:
        self.put(Failure(exc), force=True)

    def get(self, timeout: float | None = None) -> Any:
        item = super().get(timeout)
        if isinstance(item, _Event):
            self._owed += 1
            if self._owed >= 32 or not self._dq:
                self.slots.give(self._owed)
                self._owed = 0
            try:
                return landed_from_event(item.ev, self.dest)
            except FlowError as exc:
                return Failure(exc)
        return item


class _Event:
    __slots__ = ("ev",)

    def __init__(self, ev: dict) -> None:
        self.ev = ev


def transfer_opener(ch: Any, to: str, *, secret_file: str | None = None, tuner: str = "fstream",
                    target_throughput: Any = None, redis: str | None = None, namespace: str | None = None,
                    max_in_flight: int = 1000, capacity: int = 256, **options: Any) -> Any:
    """How ``Channel.transfer`` runs: ship each file of ``ch`` to ``to``, emit a
    :class:`~fstream_provider.flow.records.Landed` record per landed file (returns the stage's opener).

    :param ch: a channel of paths, or of lists of paths (``buffer``).
    :param to: ``fstream://HOST:PORT/DEST/PATH``; a file lands at its path relative to the glob's base
        directory under DEST/PATH (``watch_path('/daq/run7/**')`` → ``DEST/PATH/sub/file``), or by its
        name when the channel does not know where it came from.
    :param secret_file: the shared secret (default: ``$FSTREAM_STATE_DIR/secret``); or pass ``tls_cert``,
        ``tls_key``, ``tls_ca``. Not with ``redis``: agents authenticate with their own keyring (``key=ID``).
    :param tuner: ``fstream`` (default), ``harp``, ``fixed``, ... as ``fstream send --tuner``.
    :param target_throughput: QoS target (``600Mbps``).
    :param redis: run through Redis jobs on this bus (any ``fstream agent`` there runs them) instead
        of in this process; jobs are signed as ``$FSTREAM_SUBMITTER`` (else the local submitter).
    :param namespace: the agents' key namespace on that Redis (``fstream agent --namespace``).
    :param max_in_flight: files handed on but not yet landed before the stage stops reading its input.
    :param options: any other :class:`~fstream_provider.model.spec.TransferSpec` option of
        ``fstream send`` (``cc``, ``p``, ``pp``, ``bandwidth``, ``rtt``, ``verify``, ``encrypt``, ...).
    """
    if max_in_flight < 1:
        raise ValueError(f"transfer(max_in_flight={max_in_flight}): must be >= 1")
    for name in ("watch", "until", "idle_exit", "interval"):
        if name in options:  # the channel decides what comes and when it ends (watch_path, until, take)
            raise ValueError(f"transfer({name}=...): not an option of a channel's transfer; use watch_path, "
                             f".until() or .take() on the channel")
    if redis is not None:
        named = [n for n in KEY_FILE_FIELDS if (secret_file if n == "secret_file" else options.get(n))]
        if named:  # issue 32: an agent opens only the keys of its own keyring
            raise ValueError(f"transfer({', '.join(n + '=...' for n in named)}, redis=...): jobs may not name key "
                             "files on the agent's host; pass key=ID (the agent's keyring; default 'default')")
    elif secret_file is None and not options.get("tls_cert"):
        from fstream_provider.model.statedir import default_secret_file

        secret_file = str(default_secret_file())
    source = getattr(ch, "source", None)
    base = source.base if source is not None else os.getcwd()
    spec = TransferSpec.from_options([base], to, secret_file=secret_file, tuner=tuner,
                                     target_throughput=target_throughput, public_checksum=True, **options)
    dest = spec.dest

    def rel(p: Path) -> str:
        return join_dest(dest.path, source.rel(p) if source is not None else p.name)

    def opener(sub: Subscription) -> Pipe:
        inp = ch.open(sub)
        out = Outbox(sub, _Slots(max_in_flight, sub), dest)
        if redis is None:
            _in_process(spec, sub, inp, out, rel)
        else:
            follow_batches(spec, redis, namespace, sub, inp, out, rel, _files)
        return out

    return opener


def _src(p: Path, rel: str) -> SrcFile:
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise FlowError(f"{p}: vanished before it was sent") from None
    path = str(p)
    return SrcFile(path if path.startswith("/") else os.path.abspath(path), rel, st.st_size, st.st_mtime_ns)


def _in_process(spec: TransferSpec, sub: Subscription, inp: Pipe, out: Outbox, rel: Any) -> None:
    from fstream_provider.extras import agent_only

    try:
        from transfer_agent.sending.sender import Transfer
    except ImportError as exc:  # a provider-only install (issue 39): send through an agent (redis=...) instead
        raise agent_only(exc, "transfer() in this process (no redis= given)") from exc

    feed = FlowFeed()
    cancel = threading.Event()
    sub.on_close(cancel.set)

    def feed_files() -> None:
        try:
            for x in items(inp):
                paths = _files(x) + [p for more in inp.ready(out.slots.n) for p in _files(more)]
                while paths:  # what was waiting goes in as few hand-overs as the slots allow (one tuner look each)
                    got = out.slots.take(len(paths), partial=True)
                    feed.put([_src(p, rel(p)) for p in paths[:got]])
                    paths = paths[got:]
        except Cancelled:
            raise
        except BaseException as exc:  # noqa: BLE001 - the subscriber sees it, naming the item
            out.fail(exc)
            cancel.set()
        finally:
            inp.close()
            feed.close()

    def ship() -> None:
        try:
            result = Transfer(spec, feed=feed, cancel=cancel,
                              on_event=lambda kind, data: out.deliver(data) if kind == "file" else None).run()
            if result.error and not result.cancelled:
                out.fail(FlowError(f"transfer to {spec.destination} failed: {result.error}"))
                return
        except BaseException as exc:  # noqa: BLE001 - e.g. no secret: the subscriber sees it
            out.fail(exc)
            return
        out.put(END)

    sub.spawn("transfer-feed", feed_files, out)
    sub.spawn("transfer", ship, out)
