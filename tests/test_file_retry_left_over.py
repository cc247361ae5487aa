"""The files a failed session leaves to the next are rebuilt in O(n) (issue 43: ``Transfer._session``'s error path
tested list membership under dataclass equality, O(n²): over 10 minutes at 100 % CPU for ~49,000 files)."""

from __future__ import annotations

import pytest

from fstream_provider.watch.sources import SrcFile
from transfer_agent.sending.file_retry import left_over


class _TooManyComparisons(AssertionError):
    pass


def _files(n: int, start: int = 0) -> list[SrcFile]:
    return [SrcFile(f"/src/f{i:06d}", f"f{i:06d}", 1024, 0) for i in range(start, start + n)]


def test_fifty_thousand_files_are_rebuilt_with_a_linear_number_of_comparisons(monkeypatch: pytest.MonkeyPatch
                                                                               ) -> None:
    n = 50_000
    every = _files(n)
    in_flight, waiting, queued = every[:1_000], every[1_000:20_000], every[20_000:]
    budget = 4 * n  # the quadratic rebuild needs ~n²/2 = 1.25e9 comparisons: stopped here at once, not hours later
    compared = [0]
    field_by_field = SrcFile.__eq__

    def counted(self: SrcFile, other: object) -> bool:
        compared[0] += 1
        if compared[0] > budget:
            raise _TooManyComparisons(f"more than {budget} SrcFile comparisons for {n} files")
        return field_by_field(self, other)

    monkeypatch.setattr(SrcFile, "__eq__", counted)
    # a file in flight also waits out a retry, and a few queued ones are listed twice: each is kept once
    again = left_over(in_flight, waiting + in_flight[:500], queued + queued[:100])
    assert compared[0] <= budget
    assert len(again) == n
    assert [sf.src for sf in again] == [sf.src for sf in every]  # first appearance first: in flight, waiting, queued
    assert all(a is b for a, b in zip(again, every))  # the same objects: their retry counters and backoff go along


def test_a_file_listed_twice_with_different_retry_counters_goes_to_the_next_session_once() -> None:
    a, b = SrcFile("/src/x", "x", 1, 0), SrcFile("/src/x", "x", 1, 0, retries=2, retry_at=5.0)
    other = SrcFile("/src/x", "elsewhere/x", 1, 0)  # the same source to another destination is another file
    assert left_over([a], [b, other]) == [a, other]


def test_files_waiting_out_a_retry_come_out_soonest_first_and_only_once_due() -> None:
    """``RetryQueue`` (issue 43): the session's loop takes the due files without walking those still waiting."""
    import random

    from transfer_agent.sending.file_retry import RetryQueue

    q = RetryQueue()
    files = _files(50_000)
    rnd = random.Random(43)
    for sf in files:
        sf.retry_at = rnd.uniform(0.0, 100.0)
        q.append(sf)
    assert len(q) == 50_000 and [sf.retry_at for sf in q] == sorted(sf.retry_at for sf in files)
    due = q.due(10.0)
    assert due and all(sf.retry_at <= 10.0 for sf in due)
    assert [sf.retry_at for sf in due] == sorted(sf.retry_at for sf in due)  # soonest first
    assert len(q) == 50_000 - len(due) and all(sf.retry_at > 10.0 for sf in q)
    assert q.due(10.0) == []  # taken once
    same = SrcFile("/src/a", "a", 1, 0, retry_at=5.0), SrcFile("/src/b", "b", 1, 0, retry_at=5.0)
    q.clear()
    for sf in same:
        q.append(sf)  # equal times: in the order they came (never compared field by field)
    assert q.due(5.0) == list(same) and not q
