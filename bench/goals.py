"""The rows of BENCHMARKS.md's "Goals at a glance": each room declares its own (``fstream_bench.<room>.goals``),
beside the benchmarks and the readers they name; this module puts them in issue order.

``fstream bench report --goals`` renders them (``fstream_bench.core.goals_table``); ``--check`` fails
when the committed table says something its results or today's code do not. A goal's number is
read from the newest result that matches ``source`` and carries provenance; results from before
provenance existed are quoted as ``was`` and never shown as met. Summaries are the median and the
range of every run in the result (``med_range``), ratios taken within a run.
"""

from __future__ import annotations

import re

from fstream_bench.airflow import goals as airflow
from fstream_bench.core.goals_table import Goal
from fstream_bench.datapath import goals as datapath
from fstream_bench.ops import goals as ops
from fstream_bench.scale import goals as scale
from fstream_bench.scheduling import goals as scheduling
from fstream_bench.soak import goals as soak
from fstream_bench.tuning import goals as tuning
from fstream_bench.wan import goals as wan

#: the rooms in the order their rows of one issue follow each other
ROOMS = (datapath, scale, wan, tuning, soak, ops, scheduling, airflow)


def _issue(goal: Goal) -> int:
    """The issue number a row's ``issue`` cell starts with (``"2 (a)"`` -> 2)."""
    return int(re.match(r"\d+", goal.issue).group())


GOALS: list[Goal] = sorted((g for room in ROOMS for g in room.GOALS), key=_issue)
