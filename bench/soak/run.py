"""One soak run, start to end: produce under faults, drain, stop the watcher, final send, invariant check."""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from fstream_bench.soak.agents import Agents
from fstream_bench.soak.check import check, scan
from fstream_bench.soak.faults import FaultInjector
from fstream_bench.soak.monitor import Monitor
from fstream_bench.soak.producer import Producer
from fstream_bench.soak.report import summarize
from fstream_provider.model.units import parse_rate


class Soak:
    """The run's sequence; the agents, monitor and injector do the work. ``close()`` stops all of it.

    :param args: the parsed ``fstream bench soak`` arguments.
    :param work: an empty scratch directory (source, destination, logs, secret, state).
    :param path: the emulated WAN path (already up), or None on loopback.
    """

    def __init__(self, args: argparse.Namespace, work: Path, path: Any = None) -> None:
        self.args, self.work, self.path = args, work, path
        self.src, self.dst = work / "src", work / "dst"
        self.src.mkdir(parents=True)
        self.dst.mkdir(parents=True)
        logs = work / "logs"
        logs.mkdir()
        self.agents = Agents(args, work=work, src=self.src, dst=self.dst, logs=logs, path=path)
        self.t0 = time.monotonic()
        self.producer: Producer | None = None
        self.monitor: Monitor | None = None
        self.injector: FaultInjector | None = None
        self.errors: list[str] = []  # the harness's own trouble (a failed restart or injection)
        self.wire: dict[str, int] = {}  # WAN: the delay line's counters at the end

    def now(self) -> float:
        return time.monotonic() - self.t0

    def run(self) -> dict:
        a, agents = self.args, self.agents
        duration = a.minutes * 60
        producer = self.producer = Producer(self.src, parse_rate(a.rate) / 8, a.seed)
        injector = self.injector = FaultInjector(agents, src=self.src, dst=self.dst, producer=producer,
                                                 path=self.path, rnd=random.Random(a.seed),
                                                 scale=min(1.0, duration / 300), now=self.now, errors=self.errors)
        monitor = self.monitor = Monitor(agents, dst=self.dst, faults=injector.faults, now=self.now,
                                         errors=self.errors)
        agents.start_receiver()
        agents.start_sender()
        mon = threading.Thread(target=monitor.run, name="soak-monitor", daemon=True)
        inj = threading.Thread(target=injector.run, args=(duration,), name="soak-faults", daemon=True)
        producer.start()
        mon.start()
        inj.start()
        t_end = time.monotonic() + duration
        while time.monotonic() < t_end:
            time.sleep(min(1.0, max(0.0, t_end - time.monotonic())))
        injector.off.set()
        inj.join()
        producer.stop.set()
        producer.join()
        produced = producer.complete()
        if self.path is not None:
            self.path.blackhole(0)
        # drain: the watching sender catches up (bounded), then is stopped
        drain_deadline = time.monotonic() + a.drain_timeout
        drained = False
        while time.monotonic() < drain_deadline:
            if scan(self.dst)[0] >= len(produced):
                drained = True
                break
            time.sleep(0.5)
        drain_s = round(a.drain_timeout - max(0.0, drain_deadline - time.monotonic()), 1)
        monitor.stop.set()
        mon.join()
        agents.stop_watching_sender()
        # the final send over the whole source must exit 0
        final_rc, final_res = agents.final_send(a.final_timeout)
        agents.stop_receiver()
        if self.path is not None:
            try:
                self.wire = self.path.stats()
            except Exception as exc:  # noqa: BLE001 - a missing counter must not lose the report
                print(f"soak: delay line stats: {exc}", file=sys.stderr)
        inv = check(self.src, self.dst / "soak")
        return summarize(agents, injector.faults, self.errors, self.wire, produced=produced,
                         produced_bytes=producer.bytes, final_rc=final_rc, final_res=final_res, inv=inv,
                         drained=drained, drain_s=drain_s)

    def close(self) -> None:
        """Stop everything this soak started (on any exit, also an exception or Ctrl-C)."""
        for stop in (self.monitor and self.monitor.stop, self.injector and self.injector.off,
                     self.producer and self.producer.stop):
            if stop is not None:
                stop.set()
        self.agents.close()
