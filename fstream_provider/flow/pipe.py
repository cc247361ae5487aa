"""The plumbing under channels: one subscription, bounded pipes between stages, a thread per stage.

A channel is a recipe; subscribing to it (iterating, ``subscribe``, ``collect``) opens a
:class:`Subscription`, which starts one daemon thread per stage that needs one and joins the stages
with :class:`Pipe`s, bounded queues: a stage whose consumer is slow blocks in ``put`` (backpressure
reaches the file watcher and memory stays bounded). A consumer that stops early closes its pipe:
the producer's next ``put`` returns False and it ends, and so on upstream. An error in any stage
travels downstream as a :class:`Failure` and is raised where the user subscribed.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Callable, Iterator

log = logging.getLogger("fstream.flow")

DEFAULT_CAPACITY = 256  # items a pipe holds before its producer blocks
_SLICE = 0.1  # how often a blocked put/get looks at the stop flags


class _End:
    def __repr__(self) -> str:
        return "END"


END = _End()  # the stream ended normally
EMPTY = object()  # ``Pipe.get`` timed out


class Failure:
    """An error raised in a stage, on its way to the subscriber."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Cancelled(Exception):
    """The subscription was cancelled while a stage waited."""


class Subscription:
    """One run of a channel: the stop flag every stage watches, and the stages' threads."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._closers: list[Callable[[], None]] = []

    def spawn(self, name: str, fn: Callable[[], None], out: "Pipe") -> None:
        """Run ``fn`` in a daemon thread; an exception it raises goes downstream through ``out``."""

        def run() -> None:
            try:
                fn()
            except Cancelled:
                pass
            except BaseException as exc:  # noqa: BLE001 - every error reaches the subscriber
                log.debug("flow stage %s failed: %s", name, exc)
                out.put(Failure(exc), force=True)

        t = threading.Thread(target=run, name=f"fstream-flow-{name}", daemon=True)
        self._threads.append(t)
        t.start()

    def on_close(self, fn: Callable[[], None]) -> None:
        self._closers.append(fn)

    def close(self, timeout: float = 30.0) -> None:
        """Stop every stage and wait for their threads (a transfer stage cancels its transfer first)."""
        self.stop.set()
        for fn in self._closers:
            try:
                fn()
            except Exception:  # noqa: BLE001 - closing must reach every stage
                log.exception("closing a flow stage failed")
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)


class Pipe:
    """A bounded queue from one stage to the next.

    A deque with one condition that is only touched when someone waits: a producer that finds
    room appends and wakes a consumer only if one is waiting, a consumer that finds an item pops
    it and wakes a producer only if one is waiting. Per item that is no lock at all while both
    sides keep up (what a flow over many small files does 100,000 times), against two lock
    round trips and a wake-up with ``queue.Queue``. Waits are sliced so the stop flags are seen.
    """

    def __init__(self, sub: Subscription, capacity: int = DEFAULT_CAPACITY) -> None:
        self.sub = sub
        self.capacity = max(1, capacity)
        self._dq: collections.deque[Any] = collections.deque()
        self._cv = threading.Condition()
        self._getters = 0  # threads waiting in get (read without the lock: see put/get)
        self._putters = 0
        self.closed = threading.Event()  # the consumer wants nothing more

    def _stopped(self) -> bool:
        return self.closed.is_set() or self.sub.stop.is_set()

    def push(self, item: Any) -> None:
        """Append without waiting for room (the caller bounds what it pushes) and wake a waiting consumer."""
        self._dq.append(item)
        if self._getters:  # read after the append: a consumer about to wait either sees the item or is woken
            with self._cv:
                self._cv.notify_all()

    def put(self, item: Any, *, force: bool = False) -> bool:
        """Hand ``item`` to the consumer, waiting for room (``force``: never wait, for an error);
        False once the consumer closed or the run stopped."""
        while not self._stopped():
            if force or len(self._dq) < self.capacity:
                self.push(item)
                return True
            with self._cv:
                self._putters += 1
                if len(self._dq) >= self.capacity:
                    self._cv.wait(_SLICE)
                self._putters -= 1
        return False

    def get(self, timeout: float | None = None) -> Any:
        """The next item, ``EMPTY`` after ``timeout`` seconds; raises ``Cancelled`` once the run stopped."""
        waited = 0.0
        while True:
            try:
                item = self._dq.popleft()
            except IndexError:
                pass
            else:
                if self._putters:
                    with self._cv:
                        self._cv.notify_all()
                return item
            if self.sub.stop.is_set():
                raise Cancelled()
            if timeout is not None and waited >= timeout:
                return EMPTY
            step = _SLICE if timeout is None else min(_SLICE, timeout - waited)
            with self._cv:
                self._getters += 1
                if not self._dq:
                    self._cv.wait(step)
                self._getters -= 1
            waited += step

    def ready(self, limit: int = 1024) -> list[Any]:
        """Up to ``limit`` items already waiting, without blocking; stops before an END or a failure
        (those stay for the next ``get``)."""
        out: list[Any] = []
        while len(out) < limit and self._dq:
            head = self._dq[0]
            if head is END or isinstance(head, Failure):
                break
            out.append(self._dq.popleft())
        if out and self._putters:
            with self._cv:
                self._cv.notify_all()
        return out

    def close(self) -> None:
        self.closed.set()


def items(inp: Pipe) -> Iterator[Any]:
    """The items of a pipe until it ends; an upstream error is raised here."""
    while True:
        item = inp.get()
        if item is END:
            return
        if isinstance(item, Failure):
            raise item.exc
        yield item
