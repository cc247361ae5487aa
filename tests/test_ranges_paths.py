"""Byte ranges (checked against a brute-force model) and destination path safety."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings, strategies as st

from transfer_agent.errors import RefusedError
from transfer_agent.storage.parts import part_stem
from transfer_agent.storage.paths import open_parent, safe_relpath, stem_of, temp_name
from transfer_agent.storage.ranges import RangeSet, read_meta, write_meta

SIZE = 200


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, SIZE), st.integers(0, 40)), max_size=30))
def test_rangeset_matches_model(ops: list[tuple[int, int]]) -> None:
    r, model = RangeSet(), set()
    for start, n in ops:
        end = min(SIZE, start + n)
        r.add(start, end)
        model.update(range(start, end))
    assert r.total() == len(model)
    missing = {i for a, b in r.missing(SIZE) for i in range(a, b)}
    assert missing == set(range(SIZE)) - model
    assert r.covers(SIZE) == (len(model) == SIZE)
    assert r.prefix() == next((i for i in range(SIZE + 1) if i not in model), SIZE)
    for start, n in ops[:5]:
        end = min(SIZE, start + n)
        assert r.overlaps(start, end) == any(i in model for i in range(start, end))
    spans = r.ranges()
    assert all(spans[i][1] < spans[i + 1][0] for i in range(len(spans) - 1))  # merged, sorted, disjoint


def test_rangeset_rejects_bad_range() -> None:
    with pytest.raises(ValueError):
        RangeSet().add(5, 3)


def test_meta_round_trip(tmp_path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        write_meta(fd, "x.meta", {"ranges": [[0, 5]], "size": 9})
        assert read_meta(fd, "x.meta") == {"ranges": [[0, 5]], "size": 9}
        assert read_meta(fd, "missing.meta") is None
    finally:
        os.close(fd)


@pytest.mark.parametrize("name", ["a", "dir/sub/file.h5", "ünïcödé/ファイル.dat"])
def test_safe_paths_pass(name: str) -> None:
    assert safe_relpath(name) == name


@pytest.mark.parametrize("name,why", [
    ("../etc/passwd", "escapes"), ("a/../../b", "escapes"), ("/abs/path", "absolute"), ("", "empty"),
    ("a//b", "escapes or is empty"), ("./a", "escapes"), ("a\x00b", "NUL"), ("a\nb", "control"),
    ("\uff0e\uff0e/secret", "escapes"),  # full-width dots normalise to ".."
    ("a\\..\\b", "backslash"), ("x" * 300, "longer than"),
])
def test_unsafe_paths_refused(name: str, why: str) -> None:
    with pytest.raises(RefusedError, match=why):
        safe_relpath(name)


def test_open_parent_refuses_symlink_component(tmp_path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(outside)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(RefusedError, match="symlink"):
            open_parent(fd, "link/file")
        dfd, base = open_parent(fd, "new/dir/file")
        os.close(dfd)
        assert base == "file" and (root / "new" / "dir").is_dir()
    finally:
        os.close(fd)


def test_temp_names_share_prefix_and_fit() -> None:
    long = "n" * 250
    for base in ("file.h5", long):
        t = temp_name(base, "job" * 30, 3)
        assert part_stem(t) == stem_of(base) and t.endswith(".3.part") and len(t.encode()) <= 255
    assert part_stem("a.part") is None and part_stem(".x.job.notanumber.part") is None
