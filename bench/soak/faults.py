"""The soak's fault injector: a random fault every 20–60 s (kill either agent, black-hole the path, touch a file)."""

from __future__ import annotations

import os
import random
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from fstream_bench.soak.agents import Agents
from fstream_bench.soak.check import scan
from fstream_bench.soak.producer import Producer


class FaultInjector:
    """Injects faults until ``off`` is set; each fault is a record in ``faults`` (its recovery measured elsewhere).

    A record holds ``kind``, ``t_s`` (seconds into the run), ``seconds`` (black-hole) or ``file`` (touched), and,
    for the monitor, ``_end`` (when the fault ended), ``_visible`` (visible files then) and ``recovery_s`` (None).

    :param agents: the processes to kill and restart.
    :param producer: whose completed files a ``source_touch`` picks from.
    :param path: the emulated WAN path (black-holes), or None on loopback (no black-holes).
    :param rnd: the seeded randomness for intervals, kinds and black-hole lengths.
    :param scale: black-hole length multiplier (short runs get shorter black-holes).
    :param now: seconds since the soak started.
    :param errors: where a failed injection is reported (the soak goes on).
    """

    def __init__(self, agents: Agents, *, src: Path, dst: Path, producer: Producer, path: Any, rnd: random.Random,
                 scale: float, now: Callable[[], float], errors: list[str]) -> None:
        self.agents, self.src, self.dst, self.producer, self.path = agents, src, dst, producer, path
        self.rnd, self.scale, self.now, self.errors = rnd, scale, now, errors
        self.faults: list[dict] = []
        self.off = threading.Event()

    def kinds(self) -> list[str]:
        k = ["sender_kill", "receiver_kill", "source_touch"]
        return k + (["blackhole"] if self.path is not None else [])

    def inject(self, kind: str) -> dict:
        rnd, agents = self.rnd, self.agents
        t = self.now()
        rec: dict = {"kind": kind, "t_s": round(t, 2)}
        end = t
        with agents.lock:
            if kind == "sender_kill":
                agents.kill(agents.tx)
                agents.reap_sender("SIGKILL (fault)")
                agents.start_sender()
            elif kind == "receiver_kill":
                agents.kill(agents.rx)
                agents.start_receiver()
            elif kind == "blackhole":
                secs = rnd.uniform(5, 30) * self.scale
                self.path.blackhole(secs)
                rec["seconds"] = round(secs, 1)
                end = t + secs
            elif kind == "source_touch":
                done = self.producer.complete()
                if done:
                    victim = rnd.choice(done)
                    os.utime(victim)
                    rec["file"] = victim.relative_to(self.src).as_posix()
            end = max(end, self.now())
        visible, _part, _ = scan(self.dst)
        rec.update(_end=end, _visible=visible, recovery_s=None)
        self.faults.append(rec)
        print(f"soak {t:7.1f}s: {kind} {rec.get('seconds', rec.get('file', ''))}", file=sys.stderr, flush=True)
        return rec

    def run(self, duration: float) -> None:
        """Kinds round-robin in a seeded shuffled order, one every ``lo``–``hi`` s (shorter for short runs)."""
        rnd = self.rnd
        lo, hi = min(20.0, duration / 12), min(60.0, duration / 6)
        order: list[str] = []
        while not self.off.wait(rnd.uniform(lo, hi)):
            if not order:
                order = self.kinds()
                rnd.shuffle(order)
            kind = order.pop()
            try:
                rec = self.inject(kind)
            except Exception as exc:  # noqa: BLE001 - a failed injection is reported, the soak goes on
                self.errors.append(f"injecting {kind} at {self.now():.1f} s: {exc!r}")
                print(f"soak: injecting {kind}: {exc!r}", file=sys.stderr, flush=True)
                continue
            if rec["kind"] == "blackhole" and self.off.wait(rec["seconds"]):
                return
