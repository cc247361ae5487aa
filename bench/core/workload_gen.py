"""Write a named workload's files into a source directory over time, batch by batch (thesis §4.1).

Sizes and arrival times come from ``fstream_provider.tuning.workloads.make_workload``; content
is seeded (same name, seed and path give the same bytes). A file appears only complete: it is
written under a dot-temp name and renamed, or hard-linked from a pre-built staging copy, so a
watcher's "stopped growing" check never sees a half-written file.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fstream_provider.tuning.workloads import Batch, Workload, default_scale, make_workload

_BLOCK = 4 * 2**20


def content_block(seed: int) -> bytes:
    """The 4 MiB seeded random block every file's content is cut from."""
    return random.Random(f"fstream-bench-content:{seed}").randbytes(_BLOCK)


def write_file(path: Path, size: int, block: bytes, *, key: str) -> None:
    """Write ``size`` seeded bytes to ``path`` atomically (``.NAME.tmp`` then rename).

    The content is ``block`` rotated by an offset derived from ``key``, with ``key`` stamped at
    the start, so files differ from each other and from run to run only if the seed differs.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    off = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") % len(block)
    rotated = block[off:] + block[:off]
    head = (key.encode() + b"\n")[:size]
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(head)
        left = size - len(head)
        view = memoryview(rotated)
        while left > 0:
            n = min(left, len(view))
            f.write(view[:n])
            left -= n
    os.replace(tmp, path)


def write_repeated(path: Path, size: int, block: bytes) -> None:
    """Write ``size`` bytes to ``path``: ``block`` again and again, the last copy cut short (in place)."""
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n


@dataclass
class Staged:
    """A workload materialised once in a staging directory, to be released into sources by hard link.

    :param workload: the workload.
    :param staging: directory holding every file under its workload-relative path.
    """

    workload: Workload
    staging: Path
    released: list[tuple[float, int, int]] = field(default_factory=list)

    def paths(self, batch: Batch) -> list[Path]:
        return [self.staging / f.path for f in batch.files]


def materialize(workload: Workload, staging: Path, *, seed: int = 0) -> Staged:
    """Write every file of ``workload`` under ``staging`` (skipping files already there at the right size)."""
    block = content_block(seed)
    for f in workload.files:
        p = Path(staging) / f.path
        if p.is_file() and p.stat().st_size == f.size:
            continue
        write_file(p, f.size, block, key=f"{seed}:{f.path}")
    return Staged(workload, Path(staging))


def release(staged: Staged, src_dir: Path, *, stop: threading.Event | None = None,
            clock: Callable[[], float] = time.monotonic, t0: float | None = None,
            on_batch: Callable[[int, Batch, float], None] | None = None) -> float:
    """Hard-link each batch from staging into ``src_dir`` at its arrival time; return the start time.

    Files appear atomically under their final names (link beside ``src_dir``, then rename). Waits use ``stop.wait``
    so a caller can abort; falls back to copying when staging and sources are on different filesystems.
    """
    stop = stop or threading.Event()
    start = clock() if t0 is None else t0
    # Link into a sibling directory first, then rename into place: a watcher sees the move
    # (inotify IN_MOVED_TO) exactly as when an instrument writes elsewhere and renames.
    incoming = Path(src_dir).parent / f".incoming-{Path(src_dir).name}"
    incoming.mkdir(parents=True, exist_ok=True)
    for k, batch in enumerate(staged.workload.batches):
        delay = start + batch.t - clock()
        if delay > 0 and stop.wait(delay):
            break
        for j, f in enumerate(batch.files):
            dst = Path(src_dir) / f.path
            dst.parent.mkdir(parents=True, exist_ok=True)
            src = staged.staging / f.path
            try:
                tmp = incoming / f"{k}-{j}"
                os.link(src, tmp)
                os.replace(tmp, dst)
            except OSError:
                tmp = dst.with_name(f".{dst.name}.tmp")
                with open(src, "rb") as fi, open(tmp, "wb") as fo:
                    while chunk := fi.read(_BLOCK):
                        fo.write(chunk)
                os.replace(tmp, dst)
        t = clock() - start
        staged.released.append((t, len(batch.files), batch.bytes))
        if on_batch:
            on_batch(k, batch, t)
    return start


def generate(workload: Workload, src_dir: Path, *, seed: int = 0, stop: threading.Event | None = None,
             clock: Callable[[], float] = time.monotonic,
             on_batch: Callable[[int, Batch, float], None] | None = None) -> None:
    """Write each batch directly into ``src_dir`` at its arrival time (temp name, then rename)."""
    stop = stop or threading.Event()
    block = content_block(seed)
    start = clock()
    for k, batch in enumerate(workload.batches):
        delay = start + batch.t - clock()
        if delay > 0 and stop.wait(delay):
            return
        for f in batch.files:
            write_file(Path(src_dir) / f.path, f.size, block, key=f"{seed}:{f.path}")
        if on_batch:
            on_batch(k, batch, clock() - start)


def build(name: str, *, bandwidth_bps: float = 1e9, rtt_s: float = 0.040, scale: float | None = None,
          seed: int = 0, interval_s: float = 5.0, count_factor: float = 1.0) -> Workload:
    """``make_workload`` with the size scale derived from the path unless given (keeps size/BDP ratios)."""
    if scale is None:
        scale = default_scale(bandwidth_bps, rtt_s)
    return make_workload(name, scale=scale, seed=seed, interval_s=interval_s, count_factor=count_factor)


def describe(w: Workload) -> str:
    """One line per batch: arrival time, files, bytes, size range."""
    lines = [f"{w.name}: {w.description}; scale {w.scale:g}; {len(w.files)} files, {w.total_bytes / 1e9:.2f} GB"]
    for k, b in enumerate(w.batches):
        sizes = [f.size for f in b.files]
        lines.append(f"  batch {k + 1} at t={b.t:g}s: {len(sizes)} files, {b.bytes / 1e6:.0f} MB "
                     f"(min {min(sizes) / 1e6:.2f} MB, avg {sum(sizes) / len(sizes) / 1e6:.2f} MB, "
                     f"max {max(sizes) / 1e6:.1f} MB)")
    return "\n".join(lines)
