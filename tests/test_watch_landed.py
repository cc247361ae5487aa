"""Issue 28: a ``--watch`` stream remembers a million files in 24 bytes each, and a restart skips what landed.

The seen map (``watch.packed_seen``) is compared against a plain dict across merges; the landed journal
(``watch.landed_journal``) survives torn writes and compacts; a real restarted stream over a real receiver
offers only the files that had not landed (the journal, not the receiver's digest check, skips them).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from agentkit import make_files, send
from fstream_provider.watch import packed_seen
from fstream_provider.watch.landed_journal import LandedJournal, journal_path
from fstream_provider.watch.packed_seen import RECORD, PackedSeen, record, sig_digest
from fstream_provider.watch.seen import MemorySeenStore
from fstream_provider.watch.stability import FileStat
from transfer_agent.receiving.receiver import Receiver

KiB = 1024


def test_packed_seen_agrees_with_a_dict_across_merges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packed_seen, "_MIN_RECENT", 64)  # many merges of recent rows into the base
    rng = random.Random(7)
    model: dict[str, tuple[int, int]] = {}
    seen = PackedSeen()
    paths = [f"/data/run{rng.randrange(50)}/img_{i:06d}.h5" for i in range(3000)]
    for step in range(40):
        batch = rng.sample(paths, 120)
        items = []
        for p in batch:
            sig = (rng.randrange(1, 4), 1_700_000_000_000_000_000 + rng.randrange(3))  # some rewrites repeat
            model[p] = sig
            items.append((packed_seen.path_digest(p), sig_digest(sig)))
        seen.set_many(items)
    assert len(seen) == len(model)
    assert len(seen._base) > 0 and len(seen._base) + len(seen._recent) == len(model)  # merges happened
    for p in paths:
        want = sig_digest(model[p]) if p in model else None
        assert seen.get(p) == want, p
        assert seen.contains_path(p) == (p in model)
    assert not seen.contains_path("/data/never/seen.h5")


def test_memory_store_reports_a_rewritten_file_again() -> None:
    store = MemorySeenStore()
    f = FileStat("/src/a.dat", 10, 1.0, mtime_ns=1_000)
    assert store.claim([f]) == [f]
    assert store.claim([f]) == [] and store.unseen([f]) == [] and "/src/a.dat" in store
    g = FileStat("/src/a.dat", 11, 2.0, mtime_ns=2_000)
    assert store.unseen([g]) == [g] and store.claim([g]) == [g]


def test_journal_records_load_last_wins_and_torn_tail(tmp_path: Path) -> None:
    j = LandedJournal(tmp_path / "s" / "x.landed")
    j.landed("/src/a", 5, 100)
    j.landed("/src/b", 6, 100)
    j.landed("/src/a", 7, 200)  # rewritten and landed again
    j.close()
    with open(j.path, "ab") as fh:
        fh.write(b"\x01" * 10)  # a crash mid-record
    blob = LandedJournal(j.path).load()
    assert len(blob) == 3 * RECORD
    store = MemorySeenStore()
    assert store.add_records(blob) == 3
    assert store.unseen([FileStat("/src/a", 7, 0.0, mtime_ns=200)]) == []
    assert len(store.unseen([FileStat("/src/a", 5, 0.0, mtime_ns=100)])) == 1  # the older version is not it
    j2 = LandedJournal(j.path)
    j2.landed("/src/c", 1, 1)
    j2.close()
    assert os.path.getsize(j.path) == 4 * RECORD  # the torn bytes were cut before appending
    assert j2.compact(distinct=1)
    assert os.path.getsize(j.path) == 3 * RECORD  # one record per distinct path, the last one
    assert record("/src/a", (7, 200)) in LandedJournal(j.path).load()


def test_restarted_stream_offers_only_files_that_had_not_landed(tmp_path: Path, secret: Path,
                                                                 rx: Receiver) -> None:
    src = make_files(tmp_path / "src", {f"d{i // 10}/f{i:03d}.dat": 4 * KiB for i in range(40)})
    first = send(src, rx.port, secret, watch=True, interval="0.1s", idle_exit="0.5s")
    assert first.ok and first.verified_files == 40
    out = tmp_path / "dst" / "out"
    landed = sorted(p.relative_to(out) for p in out.rglob("*.dat"))
    assert len(landed) == 40
    journal = journal_path([str(src)], f"fstream://127.0.0.1:{rx.port}/out")
    assert os.path.getsize(journal) == 40 * RECORD
    # a consumer at the destination took the landed files away; new files arrive at the source
    for p in out.rglob("*.dat"):
        p.unlink()
    make_files(src, {f"d9/new{i}.dat": 3 * KiB for i in range(5)}, seed=3)
    rewritten = src / "d1" / "f013.dat"  # rewritten while the stream was down: offered again, not skipped
    rewritten.write_bytes(os.urandom(5 * KiB))
    again = send(src, rx.port, secret, watch=True, interval="0.1s", idle_exit="0.5s")
    assert again.ok and again.verified_files == 6 and again.skipped_files == 0
    assert sorted(p.name for p in out.rglob("*.dat")) == ["f013.dat", *(f"new{i}.dat" for i in range(5))]
    assert (out / "d1" / "f013.dat").read_bytes() == rewritten.read_bytes()
    # without the journal the same restart offers everything again (the receiver would have to check it)
    journal.unlink()
    for p in out.rglob("*.dat"):
        p.unlink()
    full = send(src, rx.port, secret, watch=True, interval="0.1s", idle_exit="0.5s")
    assert full.ok and full.verified_files == 45
