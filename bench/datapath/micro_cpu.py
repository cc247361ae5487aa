"""``fstream bench micro``'s in-process entries: each measures one BENCHMARKS.md §12 figure in this process.

AES-GMAC against keyed BLAKE3 in memory, the checksum pass per GiB (today and as before b333e7f),
BLAKE3's threads on a small file, a control frame's cost, first-touch of fresh memory cold and warm,
and pydantic's import (in fresh interpreters). Each runs pinned to CPU 0 and counts CPU with
``time.process_time`` (every thread of this process); the registry and the run are ``micro``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from fstream_bench.core import runstats

from fstream_bench.core import vm_memory

GIB = 1 << 30
MIB = 1 << 20
KIB = 1 << 10


@dataclass
class Ctx:
    """What an entry gets: the parsed options, its repeat count, a scratch directory on tmpfs, a logger."""

    args: argparse.Namespace
    repeat: int
    work: Path
    log: Callable[[str], None] = print


@contextlib.contextmanager
def pinned(cpu: int = 0) -> Iterator[bool]:
    """Run the calling thread (and threads it starts) on ``cpu``; yields whether that worked."""
    try:
        old = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {cpu})
    except (AttributeError, OSError, ValueError):
        yield False
        return
    try:
        yield True
    finally:
        os.sched_setaffinity(0, old)


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(CPU-s of this process, wall s) that ``fn()`` took."""
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - w0


def tmpfs_dir(prefix: str) -> Path:
    """A fresh directory on ``/dev/shm`` (RAM: the data path, not the disk) if there is one."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=shm))


def write_file(path: Path, size: int) -> Path:
    """``size`` bytes of one repeated 1 MiB random block."""
    from fstream_bench.core.workload_gen import write_repeated

    write_repeated(path, size, os.urandom(min(size, MIB)) if size else b"")
    return path


def run_gmac(ctx: Ctx) -> dict:
    """AES-GMAC (AES-GCM with no plaintext, the data as associated data) and keyed BLAKE3 on one thread
    over the same buffer, ``--mac-bytes`` per repeat in ``--chunk`` pieces (default 1 MiB: the checksum's
    buffer size, in cache, as the agent hashes)."""
    import blake3
    import cryptography
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    total, chunk = ctx.args.mac_bytes, min(ctx.args.chunk, ctx.args.mac_bytes)
    n = max(1, total // chunk)
    buf = os.urandom(chunk)
    gcm = AESGCM(AESGCM.generate_key(bit_length=128))
    key = os.urandom(32)

    def gmac() -> None:
        for i in range(n):
            gcm.encrypt(i.to_bytes(12, "big"), b"", buf)  # the 16-byte tag over buf

    def b3() -> None:
        h = blake3.blake3(key=key, max_threads=1)
        for _ in range(n):
            h.update(buf)
        h.digest()

    raw: dict[str, list[tuple[float, float]]] = {"gmac": [], "blake3": []}
    with pinned(0) as pin:
        gmac(), b3()  # warm-up: key schedules, code paths, the buffer in cache
        for _ in range(ctx.repeat):
            raw["gmac"].append(timed(gmac))
            raw["blake3"].append(timed(b3))
    nbytes = n * chunk
    return {"params": {"bytes_per_repeat": nbytes, "chunk": chunk, "pinned_cpu0": pin, "aes_key_bits": 128,
                       "cryptography": cryptography.__version__, "blake3": blake3.__version__},
            "series": {
                "AES-GMAC (AESGCM, empty plaintext, data as AAD)": runstats.series(
                    [nbytes / c / 1e9 for c, _ in raw["gmac"]], "GB/s per CPU-s"),
                "keyed BLAKE3, one thread": runstats.series([nbytes / c / 1e9 for c, _ in raw["blake3"]],
                                                            "GB/s per CPU-s"),
                "AES-GMAC, CPU-s per GiB": runstats.series([c / (nbytes / GIB) for c, _ in raw["gmac"]], "CPU-s/GiB"),
                "keyed BLAKE3, CPU-s per GiB": runstats.series([c / (nbytes / GIB) for c, _ in raw["blake3"]],
                                                               "CPU-s/GiB")},
            "raw": {k: [{"cpu_s": c, "wall_s": w} for c, w in v] for k, v in raw.items()}}


def _old_hash_fd(fd: int, size: int, key: bytes) -> str:
    """The checksum pass as it was before b333e7f: a fresh 8 MiB ``bytes`` per ``pread``, BLAKE3 on AUTO threads."""
    import blake3

    h = blake3.blake3(key=key, max_threads=blake3.blake3.AUTO)
    off = 0
    while off < size:
        chunk = os.pread(fd, min(8 * MIB, size - off), off)
        if not chunk:
            raise EOFError(f"file shorter than expected ({off} of {size} bytes)")
        h.update(chunk)
        off += len(chunk)
    return h.hexdigest()


def run_checksum(ctx: Ctx) -> dict:
    """The agent's checksum pass (``storage.checksum.hash_fd``) over a page-cached ``--checksum-bytes`` file on
    tmpfs, one process pinned to CPU 0, in CPU-s per GiB: keyed BLAKE3 today, keyed BLAKE3 as before b333e7f,
    and xxh3_128; the three interleaved in every repeat."""
    from transfer_agent.storage.checksum import hash_fd

    size = ctx.args.checksum_bytes
    path = write_file(ctx.work / "checksum.dat", size)
    key = bytes(32)
    arms = {"blake3-keyed, hash_fd (today: one reused 1 MiB buffer)": lambda fd: hash_fd(fd, size, "blake3-keyed", key),
            "blake3-keyed, before b333e7f (fresh 8 MiB bytes per read, AUTO threads)":
                lambda fd: _old_hash_fd(fd, size, key),
            "xxh3_128, hash_fd (today)": lambda fd: hash_fd(fd, size, "xxh3_128", None)}
    raw: dict[str, list[float]] = {k: [] for k in arms}
    fd = os.open(path, os.O_RDONLY)
    try:
        with pinned(0) as pin:
            for fn in arms.values():  # warm-up: page cache, buffers, BLAKE3's thread pool
                fn(fd)
            for _ in range(ctx.repeat):
                for label, fn in arms.items():
                    raw[label].append(timed(lambda: fn(fd))[0] / (size / GIB))
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return {"params": {"bytes": size, "pinned_cpu0": pin,
                       "file": "tmpfs" if str(path).startswith("/dev/shm") else "temp dir"},
            "series": {k: runstats.series(v, "CPU-s/GiB") for k, v in raw.items()},
            "ratios": {"before / today (keyed BLAKE3)": runstats.series(runstats.pair_ratios(
                raw[next(iter(arms))], raw[list(arms)[1]]), "ratio")}}


def run_hash_small(ctx: Ctx) -> dict:
    """``hash_fd`` of one ``--small-bytes`` file (keyed BLAKE3), ``--small-count`` times per repeat, pinned to
    CPU 0, in µs of CPU per file: on one thread (today, ``THREADED_MIN``) against BLAKE3's AUTO threads
    (before b333e7f, forced here through ``checksum._threads_pay``)."""
    from transfer_agent.storage import checksum

    size, count = ctx.args.small_bytes, ctx.args.small_count
    path = write_file(ctx.work / "small.dat", size)
    key = bytes(32)
    real = checksum._threads_pay

    def arm(threads: bool) -> float:
        checksum._threads_pay = (lambda _size: True) if threads else real
        try:
            cpu, _ = timed(lambda: [checksum.hash_fd(fd, size, "blake3-keyed", key) for _ in range(count)])
        finally:
            checksum._threads_pay = real
        return cpu / count * 1e6

    one, auto = [], []
    fd = os.open(path, os.O_RDONLY)
    try:
        with pinned(0) as pin:
            arm(False), arm(True)  # warm-up
            for _ in range(ctx.repeat):
                one.append(arm(False))
                auto.append(arm(True))
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return {"params": {"bytes": size, "hashes_per_repeat": count, "pinned_cpu0": pin},
            "series": {"AUTO threads (before b333e7f)": runstats.series(auto, "µs CPU/file"),
                       "one thread (today)": runstats.series(one, "µs CPU/file")},
            "ratios": {"today / before": runstats.series(runstats.pair_ratios(auto, one), "ratio")}}


def run_frame(ctx: Ctx) -> dict:
    """MAC'd control frames (an OPEN body) through a ``ControlLink`` pair on a socketpair, sent and received
    in one thread pinned to CPU 0 (both sides' cost), in batches of 32 as pipelining sends them: µs of CPU
    per frame, read through ``FrameBuffer`` (today's control connection) and with ``recv_raw`` (two
    ``recv`` calls per frame: a data connection's read, and the control read before issue 13)."""
    from transfer_agent.wire.protocol import Frame
    from transfer_agent.wire.secure import ControlLink, derive_keys

    n = ctx.args.frames
    body = {"path": "run-0001/sample-000123.dat", "size": 262144, "mtime_ns": 1764000000123456789,
            "algo": "blake3-keyed"}
    keys = derive_keys(os.urandom(32), b"c" * 16, b"s" * 16, b"fstream bench micro", encrypt=False)

    def arm(buffered: bool) -> float:
        a, b = socket.socketpair()
        with a, b:
            tx, rx = ControlLink(a, keys, client=True), ControlLink(b, keys, client=False)
            if buffered:
                rx.read_ahead()

            def loop() -> None:
                done = 0
                while done < n:
                    k = min(32, n - done)
                    for i in range(k):
                        tx.send(Frame.OPEN, body, done + i)
                    for _ in range(k):
                        rx.recv()
                    done += k
            cpu, _ = timed(loop)
        return cpu / n * 1e6

    buf, raw = [], []
    with pinned(0) as pin:
        arm(True), arm(False)
        for _ in range(ctx.repeat):
            buf.append(arm(True))
            raw.append(arm(False))
    return {"params": {"frames_per_repeat": n, "body": body, "mode": "MAC (shared secret), not sealed",
                       "pinned_cpu0": pin},
            "series": {"FrameBuffer (control connection today), send + receive": runstats.series(buf, "µs CPU/frame"),
                       "recv_raw (two recv per frame), send + receive": runstats.series(raw, "µs CPU/frame")}}


def _reported_kib() -> int | None:
    try:
        return int((vm_memory.KNOBS / "reported_kib").read_text())
    except (OSError, ValueError):
        return None


def run_touch(ctx: Ctx) -> dict:
    """First touch of ``--touch-bytes`` of fresh anonymous memory (``vm_memory.prefault``: one write per page,
    then freed), wall and CPU-s. Cold: free page reporting as found (not held), ``--settle`` s after the
    previous touch freed its memory, so the host has taken the pages back; every cold repeat first. Warm:
    with freed pages held in the guest (``vm_memory.held_free_pages``, root only) and the memory touched
    once before, as the loopback benchmark runs."""
    nbytes = ctx.args.touch_bytes
    knobs = {k: vm_memory._read(k) for k in vm_memory.HOLD}
    notes = [f"knobs at start: {knobs}"]
    cold: list[tuple[float, float]] = []
    warm: list[tuple[float, float]] = []
    reported: list[int | None] = []
    with pinned(0) as pin:
        if all(v is None for v in knobs.values()):
            notes.append("no free page reporting knobs here: cold and warm touch memory the same way")
        if knobs == vm_memory.HOLD:
            notes.append("free pages were already held when this run started (another run?): no cold touch measured")
        else:
            for _ in range(ctx.repeat):
                time.sleep(ctx.args.settle)
                reported.append(_reported_kib())
                cold.append(timed(lambda: vm_memory.prefault(nbytes)))
                ctx.log(f"micro touch: cold {cold[-1][1]:.2f} s wall, {cold[-1][0]:.2f} CPU-s")
        with vm_memory.held_free_pages(warm_bytes=nbytes) as line:
            notes.append(line)
            for _ in range(ctx.repeat):
                warm.append(timed(lambda: vm_memory.prefault(nbytes)))
                ctx.log(f"micro touch: warm {warm[-1][1]:.2f} s wall, {warm[-1][0]:.2f} CPU-s")
    gib = nbytes / GIB
    series = {"cold (not held): wall s": runstats.series([w for _, w in cold], "s"),
              "cold: CPU-s": runstats.series([c for c, _ in cold], "CPU-s"),
              "warm (held, touched before): wall s": runstats.series([w for _, w in warm], "s"),
              "warm: CPU-s": runstats.series([c for c, _ in warm], "CPU-s"),
              "cold: wall s per GiB": runstats.series([w / gib for _, w in cold], "s/GiB"),
              "warm: wall s per GiB": runstats.series([w / gib for _, w in warm], "s/GiB")}
    out = {"params": {"bytes": nbytes, "settle_s": ctx.args.settle, "pinned_cpu0": pin,
                      "reported_kib_before_each_cold_touch": reported},
           "series": series, "notes": notes}
    if cold and warm:
        med = runstats.summarize
        out["ratios"] = {"cold / warm, wall (medians)": runstats.series(
            [med([w for _, w in cold])["median"] / med([w for _, w in warm])["median"]], "ratio")}
    return out


def run_pydantic(ctx: Ctx) -> dict:
    """CPU-s of a fresh interpreter that imports pydantic (``from pydantic import BaseModel``, plugins off as
    ``send`` sets them) against one that imports nothing, pinned to CPU 0, interleaved; the difference is
    the import's cost."""
    import pydantic

    from fstream_bench.core.cpu_meter import reap

    env = {**os.environ, "PYDANTIC_DISABLE_PLUGINS": "__all__"}
    prefix = ["taskset", "-c", "0"] if shutil.which("taskset") else []

    def cpu(code: str) -> float:
        p = subprocess.Popen([*prefix, sys.executable, "-c", code], env=env)
        cpu_s = reap(p)
        if p.returncode:
            raise RuntimeError(f"python -c {code!r} failed ({p.returncode})")
        return cpu_s

    bare, imp = [], []
    cpu("from pydantic import BaseModel")  # warm-up: the files in the page cache
    for _ in range(ctx.repeat):
        bare.append(cpu("pass"))
        imp.append(cpu("from pydantic import BaseModel"))
    return {"params": {"pydantic": pydantic.VERSION, "pinned_cpu0": bool(prefix)},
            "series": {"bare interpreter": runstats.series(bare, "CPU-s"),
                       "interpreter + from pydantic import BaseModel": runstats.series(imp, "CPU-s"),
                       "pydantic's import (difference per pair)": runstats.series(
                           [(b - a) * 1e3 for a, b in zip(bare, imp)], "ms CPU")}}
