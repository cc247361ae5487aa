"""What every goal reader shares: the met cell and the re-run prefix of a WAN row.

A reader turns one result document into ``(measured, met)`` (``fstream_bench.core.goals_table.Goal.measure``);
each room's ``readers`` module holds the readers of its own benchmarks' results, and summarises runs with
``fstream_bench.core.runstats.med_range``.
"""

from __future__ import annotations

#: a goal row's re-run command that needs the emulated WAN (network namespaces: root)
WAN = "(as root) "


def yes(ok: bool) -> str:
    """The met cell of a goal that is met or not."""
    return "yes" if ok else "no"
