"""The GIL meter (``storage.gil_meter``, issue 42): per-thread counters, no lock per ``add``, exact sums on read."""

from __future__ import annotations

import threading

from transfer_agent.storage import gil_meter

THREADS, ADDS = 16, 5000


def _adder(start: threading.Barrier, base: int) -> None:
    start.wait()
    for i in range(ADDS):
        gil_meter.add(base + i)


def test_many_threads_adding_at_once_sum_exactly() -> None:
    """Every add of every thread is in the total, none lost or counted twice, also while the threads race."""
    before = gil_meter.free_seconds()
    start = threading.Barrier(THREADS)
    threads = [threading.Thread(target=_adder, args=(start, 1000 * t)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = sum(1000 * t * ADDS + ADDS * (ADDS - 1) // 2 for t in range(THREADS))
    assert round((gil_meter.free_seconds() - before) * 1e9) == expected


def test_threads_that_ended_are_folded_into_the_total_and_leave_the_registry() -> None:
    """A daemon starts threads per session: their counters must not pile up, and what they counted stays."""
    before = gil_meter.free_ns()
    for _ in range(3):
        batch = [threading.Thread(target=gil_meter.add, args=(7,)) for _ in range(40)]
        for t in batch:
            t.start()
        for t in batch:
            t.join()
    assert gil_meter.free_ns() - before == 3 * 40 * 7
    last = threading.Thread(target=gil_meter.add, args=(5,))  # its first add folds every ended thread's counter
    last.start()
    last.join()
    assert gil_meter.free_ns() - before == 3 * 40 * 7 + 5
    ended = [c for c in gil_meter._counters if not c.thread.is_alive() and c.thread is not last]
    assert ended == [] and len(gil_meter._counters) <= threading.active_count() + 1
