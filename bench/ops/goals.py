"""The ops room's rows of the goals table (issues 8, 30): each auth mode's cost, drain, key rotation, metrics'
CPU, `fstream doctor`; ``fstream_bench.goals`` puts every room's rows in issue order."""

from __future__ import annotations

from fstream_bench.core.goals_table import Goal
from fstream_bench.core.readers import WAN
from fstream_bench.ops.drain import drain_goal  # issue 30: the reader sits beside the summary it reads
from fstream_bench.ops.readers import doctor_goal, metrics_overhead, rotation_goal, trust_modes

GOALS: list[Goal] = [
    Goal("8", "cost of each auth mode, in one run (loopback CPU per GB; WAN not window-bound)",
         "bench/results/trust-*.json", WAN + "fstream bench trust --wan", measure=trust_modes,
         was=("loopback (before the freed-page hold): `--encrypt` 0.63–0.92×, TLS 0.66–0.82× of `hmac`; "
              "WAN 0.96–1.01× but capped by the TCP window", "measured, unfairly")),
    Goal("30", "drain: SIGTERM during a 1,000-file transfer → exit within the grace (code 0), 0 files lost or "
         "duplicated, a second agent finishes re-sending ≤ one block per file open at the cut (WAN; and a grace "
         "short enough to cut)", "bench/results/drain-*", WAN + "fstream bench drain", measure=drain_goal,
         select=lambda d: not d["loopback"]),
    Goal("30", "rotation: a key rotation during continuous transfers completes with 0 failed files",
         "bench/results/rotation-*.json", "fstream bench rotation", measure=rotation_goal),
    Goal("30", "metrics add ≤ 2 % CPU per GB (both daemons, pinned loopback, a scrape every second)",
         "bench/results/metrics-*.json", "fstream bench metrics", measure=metrics_overhead),
    Goal("30", "`fstream doctor` names the cause on 3 of 3 broken emulated paths (small buffer cap, half-rate "
         "bottleneck, slow destination disk)", "bench/results/doctor-*.json", WAN + "fstream bench doctor",
         measure=doctor_goal, select=lambda d: not d["config"]["loopback"]),
]
