"""The soak room's row of the goals table (issue 8): 30 minutes under random faults on the emulated WAN."""

from __future__ import annotations

from fstream_bench.core.goals_table import Goal
from fstream_bench.core.readers import WAN

GOALS: list[Goal] = [
    Goal("8", "30-minute soak under random faults: 0 corrupted or partial visible files, 0 jobs lost (WAN)",
         "bench/results/soak-*.json", WAN + "fstream bench soak --minutes 30",
         pending="30 minutes of exclusive WAN time, not in issue 26's session",
         was=("45 faults, 1,513/1,513 files verified, 0 / 0 / 0", "yes")),
]
