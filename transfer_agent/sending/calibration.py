"""``fstream calibrate``: sweep (cc, p, pp) per chunk type on one path to seed HARP's history (HARP §III-B, data collection).

The paper ran every dataset with every parameter combination, at least five times on different days
(21K transfers over 12 weeks). We compress that into a budget of minutes on one path:

* **Datasets.** One file size per chunk, relative to the path's BDP (``harp_history.chunk_of``): tiny
  BDP/30, small BDP/3, medium 3 x BDP, large 12 x BDP (floors 64 KiB; large capped at 256 MiB), random bytes
  in a temporary directory that is removed at the end.
* **Probes.** A probe is a real transfer (the ``fixed`` tuner) of about ``probe_seconds`` of data at the
  path's bandwidth (at least ``MIN_FILES``), into ``<dest>/.fstream-calibration/<chunk>/``. Before every probe
  the first 16 bytes of each source file are rewritten with random bytes, so the destination's copy
  differs and is replaced (the agent skips files already verified there): every probe moves its bytes,
  and the receiver holds one dataset per chunk at most. A channel takes up to ``pp + 1`` files, so a probe
  of ``files`` runs at most ``ceil(files / (pp + 1))`` channels and the row records that (``runnable_cc``):
  what actually ran (on the WAN, four large files at pp=4 went to one channel, and cc 1, 2 and 4 at p=4 all
  measured 280 Mbit/s). The row's throughput is the
  probe's steady rate after its warm-up (``steady_rate``; departure from the paper's whole-transfer
  entries, for the reason given there).
* **Time cap.** A probe is cut (stopped: files in flight stay behind as parts, which the next probe of the chunk
  finds stale by their mtime and removes) ``warm-up + 2 x probe_seconds`` after its first byte. Counted from
  its start instead, connecting a channel's eight streams (1.1 s on the 40 ms path) took the whole cap of a
  0.5 s probe, and every p=8 pp=4 probe was cut before its first steady interval. Its rate is the steady part
  before the cut. Without the cap a slow point ran for as long as its files took: on a 40 ms path, 376 tiny
  files at cc=1 pp=0 took 55 s, and a 120 s budget ended after 6 probes, too few for any model (issue 44). The
  cut used to drain (files in flight finished): a large-file probe at cc=1 then ran its four 60 MB files to the
  end, 15 s of a 120 s budget, and the budget ended after 22 probes with no usable group.
* **Blocks.** Probes send ``PROBE_BLOCK`` blocks: a stream counts its bytes as each block leaves, so a steady
  window of about a second measured in 4 MiB blocks moved in steps of 4 MiB per stream (every large-file row of
  that run was a multiple of 42 Mbit/s over 0.8 s or of 56 over 0.6 s: 84, 168, 224, 336 Mbit/s).
* **Order.** The grid is walked in passes; within a pass each chunk's grid is shuffled (seeded) and the
  chunks take turns in blocks of ``GROUP_BLOCK`` points (a cubic needs 20 distinct settings), so a short
  budget ends with whole groups for the first chunks rather than a few points of every chunk, none of them
  usable (issue 44), and a long one still covers every chunk and the whole grid evenly. One pass of one
  chunk is one experiment set (its ``group``), as the paper's groups are one sweep each.
* **Budget and resume.** No probe starts after the budget; done probes are kept in
  ``Keys.calibration(path id)``, so a second run continues where the first stopped (``restart`` forgets).
"""

from __future__ import annotations

import logging
import math
import os
import random
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fstream_provider.bus.keys import Keys
from fstream_provider.bus.transfer_history import TransferHistory
from fstream_provider.model.spec import Destination, TransferSpec
from fstream_provider.tuning.harp_history import CALIBRATION_GRID, CHUNKS, SIZE_OF_CHUNK, HistoryRow, chunk_of

DEFAULT_GRID = CALIBRATION_GRID
MIN_FILE, MAX_LARGE = 64 * 1024, 256 * 2**20
MIN_FILES = 8  # per probe: large files at cc 1..8 with pp=0 and 1..2 with pp=4 are 24 settings (a cubic needs 20)
GROUP_BLOCK = 24  # grid points of one chunk before the next chunk's turn: a cubic needs 20 distinct settings
CAP_PROBES = 2.0  # a probe is cut after its warm-up + this many probe_seconds
START_MAX_S = 30.0  # a probe that moved no byte by then is stopped (and not recorded)
PROBE_BLOCK = 1 << 20  # bytes per block in a probe: a ~1 s window counts its bytes in steps this fine per stream


def parse_grid(text: str | None) -> dict[str, tuple[int, ...]]:
    """``cc=1,2,4:p=1,2:pp=0,4`` (any subset; the rest from ``DEFAULT_GRID``)."""
    grid = dict(DEFAULT_GRID)
    if not text:
        return grid
    for part in text.split(":"):
        name, _, values = part.partition("=")
        name = name.strip()
        if name not in grid or not values:
            raise ValueError(f"--grid {text!r}: expected cc=..:p=..:pp=.. with comma-separated integers, got {part!r}")
        try:
            vals = tuple(sorted({int(v) for v in values.split(",")}))
        except ValueError:
            raise ValueError(f"--grid {text!r}: {name} values must be integers") from None
        low = 0 if name == "pp" else 1
        if not vals or vals[0] < low:
            raise ValueError(f"--grid {text!r}: {name} values must be >= {low}")
        grid[name] = vals
    return grid


def file_size(chunk: str, bdp: float) -> int:
    size = int(SIZE_OF_CHUNK[chunk] * bdp)
    if chunk == "large":
        size = min(size, MAX_LARGE)
    size = max(size, MIN_FILE)
    if chunk_of(size, bdp) != chunk:
        raise ValueError(f"calibration: a {chunk} file does not exist on this path (BDP {bdp:.0f} bytes gives "
                         f"{size} bytes, a {chunk_of(size, bdp)} file); leave {chunk} out with --chunks")
    return size


def warm_up(rtt: float) -> float:
    """Seconds of a probe that slow start and the first OPENs take (left out of its rate)."""
    return max(0.25, 6 * rtt)


def first_byte(intervals: list[dict]) -> float | None:
    """When a transfer's first byte moved (seconds after its start): the start of its first interval with bytes."""
    iv = next((iv for iv in intervals if iv.get("bytes", 0) > 0), None)
    return None if iv is None else iv["t"] - iv.get("dt", 0.0)


def steady_rate(result: Any, rtt: float, until: float | None = None) -> tuple[float, float]:
    """(bits/s, seconds) of a probe after its warm-up: the intervals that began once slow start and the
    first OPENs were behind it (max(0.25 s, 6 RTT) after the first byte); from the first byte to the end if
    too little is left (< 0.3 s).

    A probe is short (about ``probe_seconds`` of data); its whole-transfer rate is dominated by the session
    set-up and TCP slow start on a long path (measured on a 40 ms path: every 0.5 s probe at or below a
    third of the link), while HARP models the rate a dataset reaches. The paper's entries were whole
    transfers of 10-98 GB datasets, where start-up is negligible; the steady part of a short probe stands
    in for that. Both are counted from the first byte, not the start: eight streams of a channel took 1.1 s
    to connect on the 40 ms path, longer than a 0.5 s probe's whole cap. ``until``: only intervals that
    ended by then, seconds after the first byte (a cut probe's last records are its shutdown).
    """
    fb = first_byte(result.intervals)
    if fb is None:
        return 0.0, 0.0
    warm = fb + warm_up(rtt)
    steady = [iv for iv in result.intervals if iv.get("dt", 0) > 0 and iv["t"] - iv["dt"] >= warm - 1e-9
              and (until is None or iv["t"] <= fb + until + 1e-9)]
    secs = sum(iv["dt"] for iv in steady)
    moved = sum(iv["bytes"] for iv in steady)
    if secs >= 0.3 and moved > 0:
        return moved * 8 / secs, secs
    ends = [iv for iv in result.intervals if until is None or iv["t"] <= fb + until + 1e-9]
    secs = (ends[-1]["t"] if ends else 0.0) - fb
    moved = sum(iv.get("bytes", 0) for iv in ends)
    return (moved * 8 / secs if secs > 0 else 0.0), max(secs, 0.0)


@dataclass(frozen=True)
class Probe:
    """One grid point of one chunk in one pass."""

    chunk: str
    cc: int
    p: int
    pp: int
    pass_no: int

    @property
    def field(self) -> str:
        return f"{self.pass_no}|{self.chunk}|{self.cc}|{self.p}|{self.pp}"


def runnable_cc(cc: int, pp: int, files: int) -> int:
    """Channels a probe of ``files`` files runs at (cc, pp): each channel takes up to ``pp + 1`` files."""
    return max(1, min(cc, math.ceil(files / (pp + 1))))


def probe_order(chunks: list[str], grid: dict[str, tuple[int, ...]], passes: int, seed: int = 0,
                files: dict[str, int] | None = None) -> list[Probe]:
    """Passes of the grid; each chunk's points shuffled per pass, chunks taking turns in ``GROUP_BLOCK`` blocks.

    ``files``: files per chunk's probe. A point is probed at the concurrency that can run (``runnable_cc``) and
    once per pass: a large chunk's four files turned a block of 24 points into 17 distinct settings, fewer than a
    cubic needs (issue 44).
    """
    points = [(cc, p, pp) for cc in grid["cc"] for p in grid["p"] for pp in grid["pp"]]
    out: list[Probe] = []
    for k in range(passes):
        per = {}
        for i, c in enumerate(chunks):
            pts = list(points)
            random.Random(seed * 1000 + k * 31 + i).shuffle(pts)
            if files is not None:
                pts = list(dict.fromkeys((runnable_cc(cc, pp, files[c]), p, pp) for cc, p, pp in pts))
            per[c] = pts
        for j in range(0, max(len(v) for v in per.values()), GROUP_BLOCK):
            for c in chunks:
                out.extend(Probe(c, *pt, k) for pt in per[c][j:j + GROUP_BLOCK])
    return out


class _UntilCut(logging.LoggerAdapter):
    """A probe's log: once its cut is made, the files it stopped are not errors (the probe's line says "cut")."""

    def __init__(self, logger: logging.Logger, cut: Any) -> None:
        super().__init__(logger, {})
        self.cut = cut

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        if not self.cut.is_set():
            super().log(level, msg, *args, **kwargs)


class Calibration:
    """One calibration sweep (see the module docstring).

    :param destination: ``fstream://HOST:PORT/PATH`` of a receiver.
    :param secret_file: the shared secret.
    :param redis: a ``redis.Redis`` (history and progress).
    :param keys: the key schema.
    :param bandwidth_bps: the path's bandwidth.
    :param rtt_s: its RTT (None: measured by a first small transfer).
    :param tcp_buffer: the TCP buffer cap the rows record (None: this host's).
    :param budget_s: no probe starts after this many seconds.
    :param probe_seconds: data per probe, in seconds at ``bandwidth_bps``.
    :param chunks: which chunk types.
    :param grid: cc, p and pp values.
    :param passes: passes over the grid (each pass of a chunk is one experiment set).
    :param restart: forget the progress of earlier runs on this path.
    :param out: one line per probe.
    :param workdir: where the generated files go (default: a temporary directory).
    """

    def __init__(self, destination: str, *, secret_file: str | None, redis: Any, keys: Keys | None = None,
                 bandwidth_bps: float, rtt_s: float | None = None, tcp_buffer: int | None = None,
                 budget_s: float = 300.0, probe_seconds: float = 1.0, chunks: list[str] | None = None,
                 grid: dict[str, tuple[int, ...]] | None = None, passes: int = 5, max_cc: int = 32,
                 restart: bool = False, out: Callable[[str], None] = print, workdir: str | None = None,
                 seed: int = 0) -> None:
        self.dest = Destination.parse(destination)
        for name, v in (("bandwidth", bandwidth_bps), ("budget", budget_s), ("probe_seconds", probe_seconds)):
            if not v > 0:
                raise ValueError(f"calibrate: {name} must be > 0, got {v!r}")
        bad = [c for c in chunks or () if c not in CHUNKS]
        if bad or chunks == []:
            raise ValueError(f"calibrate: --chunks {','.join(chunks or [])!r}: expected some of {', '.join(CHUNKS)}")
        self.destination, self.secret_file, self.redis = destination, secret_file, redis
        self.keys = keys or Keys()
        self.bandwidth_bps, self.rtt_s, self.tcp_buffer = bandwidth_bps, rtt_s, tcp_buffer
        self.budget_s, self.probe_seconds, self.passes, self.max_cc = budget_s, probe_seconds, passes, max_cc
        self.chunks = list(chunks or CHUNKS)
        self.grid = grid or dict(DEFAULT_GRID)
        self.grid = {**self.grid, "cc": tuple(v for v in self.grid["cc"] if v <= max_cc) or (1,)}
        self.restart, self.out, self.workdir, self.seed = restart, out, workdir, seed
        self.history = TransferHistory(redis, keys=self.keys)
        self.summary: dict = {}

    def _under(self, name: str) -> str:
        return "/".join(p for p in (self.dest.path.strip("/"), ".fstream-calibration", name) if p)

    @property
    def path_id(self) -> str:
        return f"{self.dest.host}:{self.dest.port}/{self.dest.path.strip('/')}|{self.bandwidth_bps:.0f}"

    def _spec(self, src: Path, dest_path: str, cc: int, p: int, pp: int, rtt: float | None) -> TransferSpec:
        return TransferSpec(sources=[str(src)], destination=f"fstream://{self.dest.host}:{self.dest.port}/{dest_path}",
                            tuner="fixed", cc=cc, p=p, pp=pp, max_cc=max(cc, 1), bandwidth_bps=self.bandwidth_bps,
                            rtt_s=rtt, secret_file=self.secret_file, tcp_buffer=self.tcp_buffer,
                            sample_interval_s=0.1, block_size=PROBE_BLOCK, label="fstream calibrate")

    def _transfer(self, spec: TransferSpec, cap_s: float | None = None) -> tuple[Any, bool]:
        """Run ``spec``; with ``cap_s``, stop it that many seconds after its first byte (or ``START_MAX_S`` after
        its start without one). (result, whether it was cut)."""
        import threading

        from transfer_agent.sending.history_io import HistoryOptions
        from transfer_agent.sending.sender import Transfer

        cut, done = threading.Event(), threading.Event()
        t = Transfer(spec, redis=None, history=HistoryOptions(record=False), stall_timeout=30.0, cancel=cut,
                     log=_UntilCut(logging.getLogger("fstream.calibrate.probe"), cut))
        started = time.monotonic()

        def watch() -> None:  # the cap counts from the first byte: connecting p streams is not the probe's rate
            while not done.wait(0.05):
                fb = first_byte(t.result.intervals)
                if time.monotonic() - started >= (START_MAX_S if fb is None else fb + cap_s):
                    cut.set()
                    return

        if cap_s:
            threading.Thread(target=watch, name="fstream-calibrate-cap", daemon=True).start()
        try:
            r = t.run()
        finally:
            done.set()
        return r, cut.is_set()

    def run(self) -> dict:
        t0 = time.monotonic()
        progress = self.keys.calibration(self.path_id)
        if self.restart:
            self.redis.delete(progress)
        run_id = self.redis.hget(progress, "run") or uuid.uuid4().hex[:8]
        run_id = run_id.decode() if isinstance(run_id, bytes) else run_id
        self.redis.hset(progress, "run", run_id)
        done = {(k.decode() if isinstance(k, bytes) else k) for k in self.redis.hkeys(progress)}
        work = Path(self.workdir or tempfile.mkdtemp(prefix="fstream-calibrate-"))
        try:
            return self._sweep(work, progress, run_id, done, t0)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _sweep(self, work: Path, progress: str, run_id: str, done: set[str], t0: float) -> dict:
        ping = work / "ping"
        ping.mkdir(parents=True, exist_ok=True)
        (ping / "ping.dat").write_bytes(os.urandom(MIN_FILE))
        first, _ = self._transfer(self._spec(ping, self._under("ping"), 1, 1, 0, self.rtt_s))
        if not first.ok:
            raise RuntimeError(f"calibrate: the first transfer to {self.destination} failed: {first.error}")
        rtt = self.rtt_s or max(first.rtt_s or 0.0, 1e-4)
        from transfer_agent.sending.host import tcp_buffer_max

        buffer = self.tcp_buffer or tcp_buffer_max()
        bdp = self.bandwidth_bps * rtt / 8
        sizes = {c: file_size(c, bdp) for c in self.chunks}
        probe_bytes = self.probe_seconds * self.bandwidth_bps / 8
        counts = {c: max(MIN_FILES, math.ceil(probe_bytes / s)) for c, s in sizes.items()}
        for c in self.chunks:
            d = work / c
            d.mkdir()
            block = os.urandom(1 << 20)
            for i in range(counts[c]):
                with open(d / f"cal{i:04d}.dat", "wb") as f:
                    left = sizes[c]
                    while left > 0:
                        n = min(left, len(block))
                        f.write(block[:n])
                        left -= n
        self.out(f"calibrating {self.destination}: RTT {rtt * 1e3:.1f} ms, BDP {bdp / 1e6:.2f} MB; "
                 + ", ".join(f"{c} {counts[c]} x {sizes[c] / 1e6:.3g} MB" for c in self.chunks)
                 + f"; budget {self.budget_s:.0f} s, run {run_id}")
        order = probe_order(self.chunks, self.grid, self.passes, self.seed, files=counts)
        todo = [pr for pr in order if pr.field not in done]
        ran, best, last_s, failed = 0, {}, 0.0, []
        for pr in todo:
            elapsed = time.monotonic() - t0
            if elapsed + last_s > self.budget_s:
                break
            files = counts[pr.chunk]
            d = work / pr.chunk
            for i in range(files):  # new content: the destination's copy differs, so the probe moves every byte
                with open(d / f"cal{i:04d}.dat", "r+b") as f:
                    f.write(os.urandom(16))
            cc = runnable_cc(pr.cc, pr.pp, files)  # so in the order already; a resumed run's may predate it
            ts = time.monotonic()
            cap = warm_up(rtt) + CAP_PROBES * self.probe_seconds
            r, cut = self._transfer(self._spec(d, self._under(pr.chunk), cc, pr.p, pr.pp, rtt), cap_s=cap)
            last_s = time.monotonic() - ts
            bps, secs = steady_rate(r, rtt, until=cap if cut else None)
            if not r.ok and not (cut and secs > 0 and bps > 0):  # a cut probe's steady part is its measurement
                self.out(f"probe {pr.chunk} cc={cc} p={pr.p} pp={pr.pp}: failed ({r.error}); not recorded")
                failed.append({"chunk": pr.chunk, "cc": cc, "p": pr.p, "pp": pr.pp, "cut": cut,
                               "seconds": round(last_s, 2), "error": r.error})
                continue
            row = HistoryRow(source=os.uname().nodename, destination=f"{self.dest.host}:{self.dest.port}",
                             bandwidth_bps=self.bandwidth_bps, rtt_s=rtt, tcp_buffer=buffer, chunk=pr.chunk,
                             avg_file_size=float(sizes[pr.chunk]), file_count=files, cc=cc, p=pr.p, pp=pr.pp,
                             throughput_bps=bps, time=time.time(), duration_s=secs,
                             group=f"calibrate:{run_id}:{pr.chunk}:pass{pr.pass_no}", kind="probe")
            self.history.append([row])
            self.redis.hset(progress, pr.field, f"{bps:.0f}")
            ran += 1
            if bps > best.get(pr.chunk, (0.0,))[0]:
                best[pr.chunk] = (bps, cc, pr.p, pr.pp)
            self.out(f"probe {ran:4d} pass {pr.pass_no} {pr.chunk:<6} cc={cc:<2} p={pr.p:<2} pp={pr.pp:<2} "
                     f"{bps / 1e6:9.1f} Mbit/s  {r.seconds:5.2f} s  bytes {r.bytes}"
                     + (f"  (cut {cap:.2f} s after its first byte)" if cut else ""))
        total_done = len(done - {"run"}) + ran
        self.summary = {"run": run_id, "probes_run": ran, "probes_done": total_done, "probes_total": len(order),
                        "seconds": time.monotonic() - t0, "rtt_s": rtt, "bdp_bytes": bdp, "sizes": sizes,
                        "files": counts, "failed": len(failed), "failures": failed[-20:],
                        "best": {c: {"bps": b[0], "cc": b[1], "p": b[2], "pp": b[3]} for c, b in best.items()}}
        self.out(f"calibration: {ran} probe(s) this run, {total_done} of {len(order)} done, "
                 f"{self.summary['seconds']:.0f} s; best " + (", ".join(
                     f"{c} cc={b[1]} p={b[2]} pp={b[3]} {b[0] / 1e6:.0f} Mbit/s" for c, b in best.items()) or "-"))
        return self.summary
