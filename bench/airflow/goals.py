"""The Airflow room's rows of the goals table (issues 5, 27, 28, 41): trigger latency, the operator's overhead,
the live view, the triggerer at scale, the Airflow soak; ``fstream_bench.goals`` puts every room's rows in issue
order."""

from __future__ import annotations

from fstream_bench.airflow.readers import (
    operator_overhead, plugin_cpu, trigger_latency, triggerer_goal, view_freshness,
)
from fstream_bench.airflow.soak import soak_goal  # issue 41: the reader beside the soak it reads
from fstream_bench.core.goals_table import Goal

GOALS: list[Goal] = [
    Goal("5", "file closed → event p50 ≤ 1 s (local dir)", "bench/results/airflow-latency-*.json",
         "fstream bench airflow latency", measure=trigger_latency,
         was=("p50 0.80 s at 0.5 s poll; 0.31 s at 0.2 s", "yes")),
    Goal("5", "operator path ≤ 5 % over `fstream send`", "bench/results/airflow-overhead-*.json",
         "fstream bench airflow overhead --reps 7", measure=operator_overhead,
         was=("fixed ~0.2–0.4 s per task (operator − in-process 0.43 s): ≤ 5 % only for transfers ≥ ~5 s",
              "no (short transfers)")),
    Goal("27", "view freshness, agent interval → value on the page: p50 ≤ 1 s, p99 ≤ 2 s (browser)",
         "bench/results/live-view-*.json", "fstream bench live-view", measure=view_freshness),
    Goal("27", "the plugin adds ≤ 5 % CPU (of a core) to the api-server with 50 running jobs watched by 5 pages",
         "bench/results/live-view-*.json", "fstream bench live-view", measure=plugin_cpu),
    Goal("28", "200 deferred transfer tasks on one triggerer: Redis connections bounded (≤ 5, our bound) and CPU "
         "measured against one client per trigger", "bench/results/triggerer-*.json",
         "fstream bench triggerer --tasks 200", measure=triggerer_goal),
    Goal("41", "a 30-minute Airflow soak (Redis outages of 30 s, Sentinel failovers, triggerer SIGKILLs, scheduler "
         "and api-server restarts, agent drains, key rotations under a steady stream of DAG runs): 0 tasks whose "
         "state differs from their job's outcome, 0 files lost or duplicated", "bench/results/airflow-soak-*.json",
         "fstream bench airflow-soak --minutes 30", measure=soak_goal),
]
