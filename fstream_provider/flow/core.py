"""``Channel``: a lazy, Nextflow-style stream of items, and its operators.

Composing (``.map``, ``.filter``, ``.buffer``, ``.transfer``, …) only builds a recipe; nothing runs
until the channel is subscribed: iterated (``for x in ch``), ``.subscribe(fn)``, or ``.collect()``.
Each subscription runs its own copy of the recipe (:mod:`fstream_provider.flow.pipe`): stages joined
by bounded pipes, so a slow consumer slows the file watcher instead of growing memory, and
breaking out of the loop cancels every stage. Errors raised by any stage are raised where the
user subscribed.

Operators follow Nextflow's (https://www.nextflow.io/docs/latest/reference/operator.html) where
Python allows: ``map``, ``filter``, ``buffer`` (here also by time), ``take``, ``until``, ``view``,
``mix``, ``merge``, ``collect``, ``subscribe``; ``transfer`` ships files through FStream
(:mod:`fstream_provider.flow.transfer`).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any, Callable, Iterable, Iterator

from fstream_provider.flow.pipe import END, EMPTY, Cancelled, Failure, Pipe, Subscription, items
from fstream_provider.flow.transfer import transfer_opener

Opener = Callable[[Subscription], Pipe]


class Channel:
    """A stream of items built lazily from a source and operators.

    :param opener: starts this channel's stages in a subscription and returns the pipe its items
        come out of (sources and operators build it; users call the factories in
        :mod:`fstream_provider.flow.channel`).
    :param name: shown in thread names and errors.
    :param capacity: items the output pipe holds before the stage producing them blocks.
    :param source: where a file channel's paths come from (``channel.from_path``/``watch_path`` set it;
        operators pass it on), so ``transfer`` can keep each file's path relative to the glob's base.
    """

    def __init__(self, opener: Opener, name: str = "channel", capacity: int = 256, source: Any = None) -> None:
        self._opener = opener
        self.name = name
        self.capacity = capacity
        self.source = source

    def open(self, sub: Subscription) -> Pipe:
        return self._opener(sub)

    # -- building stages ------------------------------------------------------------------------
    def _stage(self, name: str, body: Callable[[Pipe, Pipe], None], capacity: int | None = None) -> "Channel":
        """A new channel whose one thread runs ``body(inp, out)`` and then ends ``out``."""

        def opener(sub: Subscription) -> Pipe:
            inp = self.open(sub)
            out = Pipe(sub, capacity or self.capacity)

            def run() -> None:
                try:
                    body(inp, out)
                finally:
                    inp.close()  # nothing more is read: upstream may stop
                out.put(END)  # only after a normal end: an error goes downstream instead (Subscription.spawn)

            sub.spawn(name, run, out)
            return out

        return Channel(opener, name, capacity or self.capacity, self.source)

    # -- operators -----------------------------------------------------------------------------
    def map(self, fn: Callable[[Any], Any]) -> "Channel":
        """Each item transformed by ``fn``."""

        def body(inp: Pipe, out: Pipe) -> None:
            for x in items(inp):
                if not out.put(fn(x)):
                    return

        return self._stage("map", body)

    def filter(self, pred: Callable[[Any], bool]) -> "Channel":
        """The items for which ``pred`` is true."""

        def body(inp: Pipe, out: Pipe) -> None:
            for x in items(inp):
                if pred(x) and not out.put(x):
                    return

        return self._stage("filter", body)

    def view(self, fn: Callable[[Any], Any] | None = None, *, printer: Callable[[Any], None] = print) -> "Channel":
        """Print each item (or ``fn(item)``) as it passes, like Nextflow's ``view``; items pass unchanged."""

        def body(inp: Pipe, out: Pipe) -> None:
            for x in items(inp):
                printer(fn(x) if fn else x)
                if not out.put(x):
                    return

        return self._stage("view", body)

    def take(self, n: int) -> "Channel":
        """The first ``n`` items, then the channel ends (upstream is stopped)."""
        if n < 0:
            raise ValueError(f"take({n}): n must be >= 0")

        def body(inp: Pipe, out: Pipe) -> None:
            if n == 0:
                return
            for i, x in enumerate(items(inp), 1):
                if not out.put(x) or i >= n:
                    return

        return self._stage("take", body)

    def until(self, cond: Callable[[Any], bool] | dt.datetime | float) -> "Channel":
        """Items until ``cond`` holds, then the channel ends (upstream is stopped).

        :param cond: a predicate on each item (the item that satisfies it is not emitted, as in
            Nextflow), or a stop time: a ``datetime`` or UNIX seconds, checked even while no item comes.
        """
        if callable(cond):
            pred, deadline = cond, None
        else:
            pred = None
            deadline = cond.timestamp() if isinstance(cond, dt.datetime) else float(cond)

        def body(inp: Pipe, out: Pipe) -> None:
            while True:
                wait = None if deadline is None else deadline - time.time()
                if wait is not None and wait <= 0:
                    return
                x = inp.get(timeout=wait)
                if x is EMPTY:
                    continue
                if x is END:
                    return
                if isinstance(x, Failure):
                    raise x.exc
                if (pred is not None and pred(x)) or not out.put(x):
                    return

        return self._stage("until", body)

    def buffer(self, size: int | None = None, duration: float | None = None, *, remainder: bool = True) -> "Channel":
        """Lists of items, emitted when ``size`` items are waiting or ``duration`` seconds passed
        since the first of them arrived, whichever comes first.

        :param remainder: emit the last, short batch when the channel ends (Nextflow's ``remainder: true``).
        """
        if size is None and duration is None:
            raise ValueError("buffer(): give size=, duration= or both")
        if size is not None and size < 1:
            raise ValueError(f"buffer(size={size}): must be >= 1")
        if duration is not None and duration <= 0:
            raise ValueError(f"buffer(duration={duration}): must be a positive number of seconds")

        def body(inp: Pipe, out: Pipe) -> None:
            batch: list[Any] = []
            first = 0.0
            while True:
                wait = None if not batch or duration is None else first + duration - time.monotonic()
                x = inp.get(timeout=max(0.0, wait)) if wait is not None else inp.get()
                if x is END:
                    if batch and remainder:
                        out.put(batch)
                    return
                if isinstance(x, Failure):
                    raise x.exc
                if x is not EMPTY:
                    if not batch:
                        first = time.monotonic()
                    batch.append(x)
                full = size is not None and len(batch) >= size
                late = duration is not None and batch and time.monotonic() - first >= duration
                if full or late:
                    if not out.put(batch):
                        return
                    batch = []

        return self._stage("buffer", body)

    def mix(self, *others: "Channel") -> "Channel":
        """The items of this channel and ``others`` as they come; ends when all of them ended."""
        mixed = _mix([self, *others], self.capacity)
        sources = {id(c.source): c.source for c in (self, *others)}
        mixed.source = next(iter(sources.values())) if len(sources) == 1 else None
        return mixed

    def merge(self, *others: "Channel") -> "Channel":
        """Tuples of the channels' n-th items (Nextflow's ``merge``); ends with the shortest."""
        chans = [self, *others]

        def opener(sub: Subscription) -> Pipe:
            ins = [c.open(sub) for c in chans]
            out = Pipe(sub, self.capacity)

            def run() -> None:
                try:
                    its = [items(p) for p in ins]
                    while True:
                        row = []
                        for it in its:
                            x = next(it, END)
                            if x is END:
                                out.put(END)
                                return
                            row.append(x)
                        if not out.put(tuple(row)):
                            return
                finally:
                    for p in ins:
                        p.close()

            sub.spawn("merge", run, out)
            return out

        return Channel(opener, "merge", self.capacity)

    def transfer(self, to: str, **options: Any) -> "Channel":
        """Ship each file (a path, or a batch of paths from ``buffer``) and emit one
        :class:`~fstream_provider.flow.records.Landed` record per landed file; the options are
        :func:`fstream_provider.flow.transfer.transfer_opener`'s."""
        capacity = options.pop("capacity", None) or self.capacity
        return Channel(transfer_opener(self, to, capacity=capacity, **options), "transfer", capacity)

    # -- subscribing ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        return self.run(Subscription())

    def run(self, sub: Subscription) -> Iterator[Any]:
        """Iterate this channel in ``sub`` (``sub.stop`` ends it quietly); closing the iterator
        (a ``break``) stops every stage and waits for them."""
        out = self.open(sub)
        try:
            for x in items(out):
                yield x
        except Cancelled:
            return
        finally:
            out.close()
            sub.close()

    def collect(self) -> list[Any]:
        """Every item, once the channel ended (Nextflow's ``collect``; blocks)."""
        return list(self)

    def subscribe(self, on_next: Callable[[Any], None], *, on_complete: Callable[[], None] | None = None,
                  on_error: Callable[[BaseException], None] | None = None) -> "Running":
        """Run the channel in the background, calling ``on_next`` with each item.

        Returns a :class:`Running` handle: ``wait()`` blocks until the end and raises the channel's
        error (unless ``on_error`` took it), ``cancel()`` stops it.
        """
        return Running(self, on_next, on_complete, on_error)


class Running:
    """A background subscription (:meth:`Channel.subscribe`)."""

    def __init__(self, ch: Channel, on_next: Callable[[Any], None], on_complete: Callable[[], None] | None,
                 on_error: Callable[[BaseException], None] | None) -> None:
        self.error: BaseException | None = None
        self._sub = Subscription()
        self._done = threading.Event()
        self._handled = on_error is not None
        self._cancelled = False

        def run() -> None:
            it = ch.run(self._sub)
            try:
                for x in it:
                    on_next(x)
                if on_complete and not self._cancelled:
                    on_complete()
            except BaseException as exc:  # noqa: BLE001 - handed to on_error or re-raised by wait()
                self.error = exc
                if on_error:
                    on_error(exc)
            finally:
                it.close()
                self._done.set()

        self._thread = threading.Thread(target=run, name=f"fstream-flow-subscribe-{ch.name}", daemon=True)
        self._thread.start()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the end; True if it ended. Raises the channel's error unless ``on_error`` took it."""
        ended = self._done.wait(timeout)
        if ended and self.error is not None and not self._handled:
            raise self.error
        return ended

    def cancel(self, timeout: float | None = 30.0) -> None:
        """Stop every stage (a transfer leaves its unfinished files resumable) and wait for them."""
        self._cancelled = True
        self._sub.stop.set()
        self._done.wait(timeout)
        self._thread.join(timeout)


def _mix(chans: list[Channel], capacity: int) -> Channel:
    def opener(sub: Subscription) -> Pipe:
        out = Pipe(sub, capacity)
        ins = [c.open(sub) for c in chans]
        left = [len(ins)]
        lock = threading.Lock()

        def pump(inp: Pipe) -> Callable[[], None]:
            def run() -> None:
                try:
                    for x in items(inp):
                        if not out.put(x):
                            return
                finally:
                    inp.close()
                with lock:  # a failed pump never gets here: its error ends the channel instead
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    out.put(END)

            return run

        for i, inp in enumerate(ins):
            sub.spawn(f"mix{i}", pump(inp), out)
        return out

    return Channel(opener, "mix", capacity)


def from_iterable(values: Iterable[Any], name: str = "of", capacity: int = 256) -> Channel:
    """A channel of the values of an iterable (consumed once per subscription, in its own thread)."""

    def opener(sub: Subscription) -> Pipe:
        out = Pipe(sub, capacity)

        def run() -> None:
            for v in values:
                if not out.put(v):
                    return
            out.put(END)

        sub.spawn(name, run, out)
        return out

    return Channel(opener, name, capacity)
