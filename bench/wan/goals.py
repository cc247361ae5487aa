"""The WAN testbed's row of the goals table (issue 3): the emulated path's selfcheck."""

from __future__ import annotations

from fstream_bench.core.goals_table import Goal
from fstream_bench.core.readers import WAN
from fstream_bench.wan.readers import selfcheck

GOALS: list[Goal] = [
    Goal("3", "WAN selfcheck within ±5 % rate, ±2 ms RTT",
         ("bench/results/wan-20261122-011431", "bench/results/selfcheck-*.json"),
         WAN + "fstream bench wan selfcheck --results", measure=selfcheck,
         was=("0.99–1.00 of payload rate, 40.1–40.5 ms", "yes")),
]
