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
import signal
import sys
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


def _hold(changed: dict[str, str]) -> str:
    """Set the hold, recording each old value in ``changed`` before its knob is written (a signal between
    the two leaves nothing unrestored); return the line for the report."""
    old = {name: _read(name) for name in HOLD}
    if any(v is None for v in old.values()):
        return "free page reporting: no knobs here; memory first touched in a run costs what the host charges"
    if old == HOLD:  # another run holds them, or one was killed before it could restore them
        return ("free page reporting already held when this run started (another run, or one that could not "
                f"restore {KNOBS}); left as found")
    for name, value in HOLD.items():
        changed[name] = old[name]  # type: ignore[assignment]
        try:
            (KNOBS / name).write_text(value)
        except OSError as e:
            _restore(changed)
            changed.clear()
            return f"free page reporting not held ({KNOBS / name}: {e}); first-touch memory costs what the host charges"
    return (f"free page reporting held for the run ({', '.join(f'{k} {old[k]} -> {v}' for k, v in HOLD.items())}"
            "; restored after)")


def _restore(changed: dict[str, str]) -> None:
    """Write the old values back, with SIGINT/SIGTERM/SIGHUP held off meanwhile (a second Ctrl-C or a
    `timeout` would otherwise skip the rest); a value that cannot be written back is said on stderr."""
    if not changed:
        return
    held = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    try:
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (AttributeError, ValueError):
        blocked = None
    try:
        for name, value in changed.items():
            try:
                (KNOBS / name).write_text(value)
            except OSError as e:
                print(f"vm_memory: could not restore {KNOBS / name} to {value}: {e}", file=sys.stderr)
    finally:
        if blocked is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


@contextlib.contextmanager
def held_free_pages(warm_bytes: int = 0) -> Iterator[str]:
    """Hold freed pages in the guest for the duration; yields a line for the report saying what it did."""
    changed: dict[str, str] = {}
    try:
        line = _hold(changed)
        prefault(warm_bytes)
        yield f"{line}; {warm_bytes / 2**30:.1f} GiB touched first"
    finally:
        _restore(changed)
