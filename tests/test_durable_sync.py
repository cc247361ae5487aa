"""Group commit's fdatasync: every file of the group is synced exactly once, at most ``ways`` at a time,
with one pool task per slice rather than per file (issue 13)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from transfer_agent.storage import durable


def test_every_file_synced_once_in_a_few_tasks(tmp_path, monkeypatch):
    fds = [os.open(tmp_path / f"f{i}", os.O_CREAT | os.O_RDWR) for i in range(37)]
    synced: list[int] = []
    lock = threading.Lock()
    real = os.fdatasync

    def spy(fd: int) -> None:
        real(fd)  # the real call, on a real file
        with lock:
            synced.append(fd)

    monkeypatch.setattr(os, "fdatasync", spy)
    submitted = []

    class CountingPool(ThreadPoolExecutor):
        def submit(self, fn, *a, **k):
            submitted.append(fn)
            return super().submit(fn, *a, **k)

    with CountingPool(max_workers=8) as pool:
        durable.sync_files(fds, pool)
    for fd in fds:
        os.close(fd)
    assert sorted(synced) == sorted(fds)
    assert len(submitted) == 8
