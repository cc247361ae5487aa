"""The loopback benchmark's hold on freed memory always gives the knobs back (on a temp copy of them)."""

from __future__ import annotations

import pytest

from fstream_bench.core import vm_memory


@pytest.fixture
def knobs(tmp_path, monkeypatch):
    (tmp_path / "min_free_ms").write_text("0\n")
    (tmp_path / "max_waiting_mib").write_text("1024\n")
    monkeypatch.setattr(vm_memory, "KNOBS", tmp_path)
    return tmp_path


def _values(d):
    return {n: (d / n).read_text().strip() for n in vm_memory.HOLD}


def test_held_during_and_restored_after_an_error(knobs):
    with pytest.raises(RuntimeError):
        with vm_memory.held_free_pages() as line:
            assert "held for the run" in line and _values(knobs) == vm_memory.HOLD
            raise RuntimeError("the run failed")
    assert _values(knobs) == {"min_free_ms": "0", "max_waiting_mib": "1024"}


def test_already_held_is_left_as_found(knobs):
    for name, value in vm_memory.HOLD.items():
        (knobs / name).write_text(value)
    with vm_memory.held_free_pages() as line:
        assert "already held" in line
    assert _values(knobs) == vm_memory.HOLD


def test_no_knobs_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(vm_memory, "KNOBS", tmp_path / "absent")
    with vm_memory.held_free_pages() as line:
        assert "no knobs" in line
