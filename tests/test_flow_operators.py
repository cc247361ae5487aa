"""The channel operators on their own: ordering, batching by size and by time, backpressure,
one emission per file, cancellation, errors raised where the user subscribed."""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from agentkit import wait_until
from fstream_provider.flow import Channel, channel
from fstream_provider.flow.core import from_iterable
from fstream_provider.flow.pipe import Pipe


def _counting(n: int | None = None, threads: set[threading.Thread] | None = None) -> tuple[list[int], Channel]:
    """A channel of 0, 1, 2, ... that records how many values its source produced (and in ``threads``,
    the threads that produced them)."""
    produced: list[int] = []

    def gen():
        for i in itertools.count() if n is None else range(n):
            produced.append(i)
            if threads is not None:
                threads.add(threading.current_thread())
            yield i

    return produced, from_iterable(gen(), capacity=4)


def _alive_flow_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("fstream-flow")]


def _waiting_for_room(t: threading.Thread) -> bool:
    """Is ``t`` blocked in ``Pipe.put`` on a full pipe (in the condition wait, not between two slices)?"""
    frame = sys._current_frames().get(t.ident)
    caller = frame.f_back if frame is not None else None
    return (caller is not None and frame.f_code is threading.Condition.wait.__code__
            and caller.f_code is Pipe.put.__code__)


def test_map_filter_keep_order_and_are_lazy():
    calls: list[int] = []
    ch = channel.of(1, 2, 3, 4, 5).map(lambda x: calls.append(x) or x * 10).filter(lambda x: x != 30)
    assert calls == []  # nothing runs until subscribed
    assert ch.collect() == [10, 20, 40, 50]
    assert ch.collect() == [10, 20, 40, 50]  # each subscription runs the recipe again
    assert calls == [1, 2, 3, 4, 5] * 2


def test_buffer_by_size_with_and_without_remainder():
    assert channel.of(*range(7)).buffer(size=3).collect() == [[0, 1, 2], [3, 4, 5], [6]]
    assert channel.of(*range(7)).buffer(size=3, remainder=False).collect() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="size="):
        channel.of(1).buffer()


def test_buffer_by_duration_emits_a_batch_when_time_is_up_before_it_is_full():
    def slow():
        for i in range(3):
            yield i
        time.sleep(1.0)  # a gap longer than the batch window
        yield 3

    t0 = time.monotonic()
    got: list[tuple[float, list[int]]] = []
    for batch in from_iterable(slow()).buffer(size=100, duration=0.3):
        got.append((time.monotonic() - t0, batch))
    assert [b for _, b in got] == [[0, 1, 2], [3]]
    assert got[0][0] < 0.9  # the first batch left after ~0.3 s, not when the source went on or ended


def test_take_stops_the_source_and_until_ends_on_a_predicate_or_a_time():
    produced, ch = _counting()
    assert ch.take(3).collect() == [0, 1, 2]
    assert len(produced) < 20  # an endless source was stopped, bounded by the pipes' capacity
    assert channel.of(1, 2, 3, 4).until(lambda x: x == 3).collect() == [1, 2]

    def forever():
        while True:
            time.sleep(0.05)
            yield 1

    t0 = time.time()
    assert len(from_iterable(forever()).until(t0 + 0.5).collect()) >= 3
    assert time.time() - t0 < 3


def test_backpressure_bounds_what_a_slow_consumer_has_pulled():
    produced, ch = _counting()
    it = iter(ch.map(lambda x: x).filter(lambda x: True))
    assert next(it) == 0
    bound = 3 * 4 + 4  # three pipes of capacity 4, and one item in each stage's hands
    stages = [t for t in threading.enumerate() if t.name.startswith("fstream-flow")]
    assert sorted(t.name for t in stages) == ["fstream-flow-filter", "fstream-flow-map", "fstream-flow-of"]
    # the consumer stalls: every stage fills its pipe and blocks waiting for room (seen in its stack)
    wait_until(lambda: len(produced) > bound or all(_waiting_for_room(t) for t in stages), 5,
               "every stage blocked on a full pipe")
    assert len(produced) <= bound
    assert all(_waiting_for_room(t) for t in stages)  # blocked, so nothing more is pulled while the consumer stalls
    it.close()
    wait_until(lambda: not _alive_flow_threads(), 5, "flow threads ended after close")


def test_breaking_out_cancels_every_stage():
    source: set[threading.Thread] = set()
    produced, ch = _counting(threads=source)
    for x in ch.map(lambda v: v + 1).buffer(size=2):
        if x[0] > 5:
            break
    wait_until(lambda: not _alive_flow_threads(), 5, "flow threads ended after break")
    (runner,) = source  # the one thread that ever advanced the endless source ...
    assert not runner.is_alive()  # ... has ended: nothing runs after the loop
    assert len(produced) < 64  # the source was stopped at the break, within what the pipes hold


def test_an_error_is_raised_where_the_user_subscribed():
    def boom(x):
        if x == 2:
            raise RuntimeError(f"bad item {x}")
        return x

    seen = []
    with pytest.raises(RuntimeError, match="bad item 2"):
        for x in channel.of(1, 2, 3).map(boom):
            seen.append(x)
    assert seen == [1]
    wait_until(lambda: not _alive_flow_threads(), 5, "flow threads ended after an error")


def test_mix_merge_view_and_subscribe():
    assert sorted(channel.of(1, 2).mix(channel.of(3), channel.of(4, 5)).collect()) == [1, 2, 3, 4, 5]
    assert channel.of(1, 2, 3).merge(channel.of("a", "b")).collect() == [(1, "a"), (2, "b")]
    printed: list[str] = []
    assert channel.of(1, 2).view(lambda x: f"item {x}", printer=printed.append).collect() == [1, 2]
    assert printed == ["item 1", "item 2"]

    got, completed = [], threading.Event()
    run = channel.of(1, 2, 3).subscribe(got.append, on_complete=completed.set)
    assert run.wait(5) and completed.is_set() and got == [1, 2, 3]

    errors: list[BaseException] = []
    run = channel.of(1).map(lambda x: 1 / 0).subscribe(got.append, on_error=errors.append)
    assert run.wait(5) and isinstance(errors[0], ZeroDivisionError)
    run = channel.of(1).map(lambda x: 1 / 0).subscribe(got.append)
    with pytest.raises(ZeroDivisionError):
        run.wait(5)


def test_subscribe_cancel_stops_an_idle_endless_channel(tmp_path: Path):
    run = channel.watch_path(str(tmp_path), interval=0.2).subscribe(lambda p: None)
    time.sleep(0.3)
    t0 = time.monotonic()
    run.cancel()
    assert run.done and time.monotonic() - t0 < 2
    wait_until(lambda: not _alive_flow_threads(), 5, "flow threads ended after cancel")


def test_from_path_lists_in_order_with_nextflow_globs(tmp_path: Path):
    for rel in ("b.h5", "a.h5", "c.txt", "sub/d.h5", ".hidden.h5"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    names = lambda ch: [str(p.relative_to(tmp_path)) for p in ch.collect()]  # noqa: E731
    assert names(channel.from_path(str(tmp_path / "*.h5"))) == ["a.h5", "b.h5"]  # * stays in one directory
    assert names(channel.from_path(str(tmp_path / "**/*.h5"))) == ["a.h5", "b.h5", "sub/d.h5"]
    assert names(channel.from_path(str(tmp_path))) == ["a.h5", "b.h5", "c.txt", "sub/d.h5"]
    assert ".hidden.h5" in names(channel.from_path(str(tmp_path / "*.h5"), hidden=True))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        channel.from_path(str(tmp_path / "nope" / "*.h5"))


@pytest.mark.parametrize("use_inotify", [True, False])
def test_watch_path_emits_each_file_once_and_only_when_complete(tmp_path: Path, use_inotify: bool):
    (tmp_path / "old.dat").write_bytes(b"o" * 10)
    os.utime(tmp_path / "old.dat", (time.time() - 60, time.time() - 60))
    got: list[tuple[float, str]] = []
    lock = threading.Lock()
    run = channel.watch_path(str(tmp_path / "*.dat"), interval=0.3, use_inotify=use_inotify).subscribe(
        lambda p: got.append((time.monotonic(), p.name)))
    try:
        with open(tmp_path / "grow.dat", "wb") as f:  # written slowly for 1.5 s, closed at the end
            for _ in range(6):
                f.write(b"g" * 1000)
                f.flush()
                time.sleep(0.25)
            closed_at = time.monotonic()
        (tmp_path / "skip.txt").write_bytes(b"not matched")
        wait_until(lambda: len(got) >= 2, 10, "two files emitted")
        # each file once: two more files, the second written only once the first came out, so the watcher
        # looked again at least twice after emitting old.dat and grow.dat; anything it re-emitted in those
        # looks comes out before the last marker (one pipe, in order)
        for marker in ("zz1.dat", "zz2.dat"):
            (tmp_path / marker).write_bytes(b"m")
            wait_until(lambda: marker in [n for _, n in got], 10, f"{marker} emitted")
    finally:
        run.cancel()
    with lock:
        names = [n for _, n in got]
    assert names == ["old.dat", "grow.dat", "zz1.dat", "zz2.dat"]
    assert got[1][0] >= closed_at  # never while it was still growing
