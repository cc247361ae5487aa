"""The soak's monitor: restarts agents that exit on their own, samples their RSS/fds, measures fault recovery."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Callable

from fstream_bench.soak.agents import Agents
from fstream_bench.soak.check import scan


class Monitor:
    """Every 0.25 s until ``stop`` is set: supervision, progress scan, recovery times; /proc sampling every 1 s.

    A fault's recovery time runs from its end until the destination moves again: a new visible file, or part
    files growing by more than 64 KiB over their smallest size since the fault ended.

    :param agents: the processes to supervise and sample.
    :param dst: the destination root to scan for progress.
    :param faults: the injector's fault records; this sets their ``recovery_s``.
    :param now: seconds since the soak started.
    :param errors: where a failed round is reported (supervision goes on).
    """

    def __init__(self, agents: Agents, *, dst: Path, faults: list[dict], now: Callable[[], float],
                 errors: list[str]) -> None:
        self.agents, self.dst, self.faults, self.now, self.errors = agents, dst, faults, now, errors
        self.stop = threading.Event()

    def run(self) -> None:
        last_sample = 0.0
        while not self.stop.is_set():
            try:
                last_sample = self.once(last_sample)
            except Exception as exc:  # noqa: BLE001 - supervision must outlive one bad round; reported
                if len(self.errors) < 50:
                    self.errors.append(f"monitor at {self.now():.1f} s: {exc!r}")
                print(f"soak: monitor: {exc!r}", file=sys.stderr, flush=True)
            self.stop.wait(0.25)

    def once(self, last_sample: float) -> float:
        with self.agents.lock:
            self.agents.restart_exited()
        visible, part, _ = scan(self.dst)
        t = self.now()
        for f in self.faults:
            if f.get("recovery_s") is not None or t < f["_end"]:
                continue
            f["_min_part"] = min(f.get("_min_part", part), part)
            if visible > f["_visible"] or part > f["_min_part"] + 64 * 1024:
                f["recovery_s"] = round(t - f["_end"], 2)
        if time.monotonic() - last_sample >= 1.0:
            last_sample = time.monotonic()
            self.agents.sample()
        return last_sample
