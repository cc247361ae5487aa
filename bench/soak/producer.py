"""The soak's producer: seeded files written into the source over time, each renamed into place when complete."""

from __future__ import annotations

import math
import os
import random
import threading
import time
from pathlib import Path

MiB = 1 << 20


class Producer(threading.Thread):
    """Writes seeded files into ``src`` at about ``rate_Bps`` until stopped (temp name, then rename)."""

    def __init__(self, src: Path, rate_Bps: float, seed: int, lo: int = 64 << 10, hi: int = 64 * MiB) -> None:
        super().__init__(name="soak-producer", daemon=True)
        self.src, self.rate, self.rnd = src, rate_Bps, random.Random(seed)
        self.lo, self.hi = lo, hi
        self.block = random.Random(seed ^ 0x5EED).randbytes(8 * MiB)
        self.stop = threading.Event()
        self.done: list[Path] = []
        self.bytes = 0
        self.lock = threading.Lock()

    def _size(self) -> int:
        return int(math.exp(self.rnd.uniform(math.log(self.lo), math.log(self.hi))))

    def _write(self, path: Path, idx: int, size: int) -> None:
        tmp = path.parent / f".{path.name}.tmp"
        with open(tmp, "wb") as f:
            off = 0
            while off < size:
                n = min(MiB, size - off)
                start = (idx * 7919 + off // MiB * 104729) % (len(self.block) - MiB)
                chunk = (idx.to_bytes(8, "little") + (off // MiB).to_bytes(8, "little")
                         + self.block[start + 16:start + n])
                f.write(chunk[:n])
                off += n
        os.rename(tmp, path)

    def run(self) -> None:
        t0, idx = time.monotonic(), 0
        while not self.stop.is_set():
            size = self._size()
            d = self.src / f"d{idx // 200:03d}"
            d.mkdir(parents=True, exist_ok=True)
            p = d / f"f{idx:06d}.bin"
            self._write(p, idx, size)
            with self.lock:
                self.done.append(p)
                self.bytes += size
            idx += 1
            ahead = t0 + self.bytes / self.rate - time.monotonic()
            if ahead > 0:
                self.stop.wait(ahead)

    def complete(self) -> list[Path]:
        with self.lock:
            return list(self.done)
