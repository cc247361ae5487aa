"""Keep freed memory warm for a CPU benchmark on a VM that hands freed pages back to its host.

This VM reports free 2 MiB blocks to its host as soon as they are freed (virtio-balloon free
page reporting, ``/sys/module/page_reporting/parameters``: ``min_free_ms`` 0,
``max_waiting_mib`` 1024), and the host drops them. The next first touch of such a page faults
on the host, which the guest sees as a slow copy: ~7 us per 4 KiB page, ~1.8 CPU-seconds per
GiB, charged to whichever process writes the page (measured: touching 4 GiB took 7.3 s cold and
1.7 s warm). A receiver writing 1 GiB into tmpfs or the page cache therefore cost 1 or 3
CPU-seconds depending on how long ago that memory was freed, for GridFTP and FStream alike: the
2-3x swings between repeats of the loopback benchmark. Real transfer nodes have no such cost.

``held_free_pages()`` raises both knobs for the benchmark's duration (root only; the old values
are restored on exit) and touches the memory the run will reuse once, so every measured run
writes into warm pages. When the knobs are absent or not writable it changes nothing and says so.
"""

from __future__ import annotations

import contextlib
import mmap
from pathlib import Path
from typing import Iterator

KNOBS = Path("/sys/module/page_reporting/parameters")
HOLD = {"min_free_ms": "60000", "max_waiting_mib": "8192"}  # the largest min_free_ms this kernel takes


def _read(name: str) -> str | None:
    try:
        return (KNOBS / name).read_text().strip()
    except OSError:
        return None


def prefault(nbytes: int) -> None:
    """Touch ``nbytes`` of anonymous memory once and free it (with the hold on, it stays warm)."""
    if nbytes <= 0:
        return
    m = mmap.mmap(-1, nbytes)
    try:
        for off in range(0, nbytes, mmap.PAGESIZE):
            m[off] = 1
    finally:
        m.close()


def _hold() -> tuple[dict[str, str], str]:
    """Set the hold; return the values to restore and the line for the report."""
    old = {name: _read(name) for name in HOLD}
    if any(v is None for v in old.values()):
        return {}, "free page reporting: no knobs here; memory first touched in a run costs what the host charges"
    changed: dict[str, str] = {}
    for name, value in HOLD.items():
        try:
            (KNOBS / name).write_text(value)
        except OSError as e:
            _restore(changed)
            return {}, f"free page reporting not held ({KNOBS / name}: {e}); first-touch memory costs what the host charges"
        changed[name] = old[name]  # type: ignore[assignment]
    return changed, (f"free page reporting held for the run ({', '.join(f'{k} {old[k]} -> {v}' for k, v in HOLD.items())}"
                     "; restored after)")


def _restore(changed: dict[str, str]) -> None:
    for name, value in changed.items():
        with contextlib.suppress(OSError):
            (KNOBS / name).write_text(value)


@contextlib.contextmanager
def held_free_pages(warm_bytes: int = 0) -> Iterator[str]:
    """Hold freed pages in the guest for the duration; yields a line for the report saying what it did."""
    changed, line = _hold()
    try:
        prefault(warm_bytes)
        yield f"{line}; {warm_bytes / 2**30:.1f} GiB touched first"
    finally:
        _restore(changed)
