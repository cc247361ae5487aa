"""The scheduling room's rows of the goals table (issues 11, 28, 44): SEAL and STEAL on the traces, the burst through
agents with pools, the scheduling cycle's Redis cost; ``fstream_bench.goals`` puts every room's rows in issue order."""

from __future__ import annotations

from fstream_bench.core.goals_table import Goal
from fstream_bench.core.readers import WAN
from fstream_bench.scheduling.readers import (sched_burst, sched_cycle_goal, seal_at_load, seal_vs_baselines,
                                              steal_share_at_load, steal_with_batch)

GOALS: list[Goal] = [
    Goal("11", "SEAL avg slowdown ≥ 30 % and worst ≥ 50 % below the best baseline, every trace (simulator)",
         ("BENCHMARKS.md", "bench/results/scheduling-*.json"), "fstream bench scheduling",
         measure=seal_vs_baselines, select=lambda d: not d["config"]["batch"],
         was=("25 %: +5 % / +51 %; 45 %: +1 % / +19 %; 60 %: −41 % / −33 %; 60 %-HV: −90 % / −78 % "
              "(printed, no result file)", "60 %-HV only")),
    Goal("11", "STEAL interactive slowdown ≥ 65 % below BaseVary with batch, batch ≥ 0.9 of SEAL's spare",
         ("BENCHMARKS.md", "bench/results/scheduling-*.json"), "fstream bench scheduling --batch",
         measure=steal_with_batch, select=lambda d: d["config"]["batch"],
         was=("−97 to −99 %; 0.90–0.99 of SEAL's (seeds 0 and 1; printed, no result file)", "yes")),
    Goal("11", "burst of mixed jobs through 8 agents with pools (WAN): aggregate ≥ 0.9, Jain ≥ 0.9, preempted "
         "jobs resend nothing", "bench/results/sched-wan-*", WAN + "fstream bench sched-wan", measure=sched_burst,
         was=("STEAL 0.83–0.87 (fifo 0.84–0.87); Jain 0.994–1.000; 6 / 6", "2 of 3")),
    Goal("28", "the scheduling cycle's Redis cost independent of finished jobs and ≤ 10 ms at 1,000 live jobs; an "
         "idle agent's Redis operations per second bounded", "bench/results/sched-cycle-*.json",
         "fstream bench sched-cycle", measure=sched_cycle_goal),
    Goal("44", "SEAL at ordinary load: ≥ 20 % lower average bounded slowdown than the best baseline at 25 %, 45 % "
         "and 60 % load, never worse on any trace (simulator, fresh seeds)", "bench/results/seal-load-*.json",
         "fstream bench seal-load", measure=seal_at_load),
    Goal("44", "STEAL's batch share ≥ 0.9 of SEAL's (simulator, fresh seeds)", "bench/results/seal-load-*.json",
         "fstream bench seal-load", measure=steal_share_at_load),
]
