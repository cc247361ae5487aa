"""Who sees which transfers in the overview (issue 27): the auth manager decides, per DAG.

The overview's routes are guarded by ``requires_access_view(AccessView.PLUGINS)``; within it a user sees a
job submitted by an Airflow task only if the auth manager lets them read that task's DAG
(``get_authorized_dag_ids``: the same call the core API filters its lists with, teams included). A job
with no Airflow task (``fstream submit``, a flow) is shown to everyone with the view. A DAG the database
does not know (deleted) is nobody's to read: its jobs are hidden, deny by default. What would name a
hidden job elsewhere on the page is masked: an agent's current job, a pool grant's client, a board entry.
"""

from __future__ import annotations

from typing import Any

HIDDEN = "(hidden)"


def readable_dag_ids(user: Any) -> set[str]:
    """The DAG ids ``user`` may read (blocking: the auth manager queries the database)."""
    from airflow.api_fastapi.app import get_auth_manager

    return set(get_auth_manager().get_authorized_dag_ids(user=user, method="GET"))


def may_see(row: dict, dag_ids: set[str]) -> bool:
    """A job row is visible when it has no Airflow task, or its DAG is readable."""
    ref = row.get("airflow")
    if not isinstance(ref, dict) or not ref.get("dag_id"):
        return True
    return ref["dag_id"] in dag_ids


def visible_overview(ov: dict, dag_ids: set[str]) -> dict:
    """``ov`` (``bus.live.overview``) as a user who may read ``dag_ids`` sees it (a new dict; ``ov`` is shared)."""
    jobs, hidden = [], set()
    for row in ov.get("jobs") or []:
        if may_see(row, dag_ids):
            jobs.append(row)
        else:
            hidden.add(row.get("job_id"))
    shown = {row.get("job_id") for row in jobs}
    agents = []
    for a in ov.get("agents") or []:
        if a.get("job_id") and a["job_id"] not in shown:  # not listed: its DAG is unknown here, deny
            a = {**a, "job_id": HIDDEN}
        agents.append(a)
    pools = []
    for p in ov.get("pools") or []:
        grants = p.get("grants") or {}
        if any(c in hidden for c in grants):
            masked: dict[str, Any] = {}
            for c, g in grants.items():
                name = HIDDEN if c in hidden else c
                if name in masked:  # several hidden clients: their streams add up under one name
                    g = {**g, "streams": (masked[name].get("streams") or 0) + (g.get("streams") or 0)}
                masked[name] = g
            p = {**p, "grants": masked}
        pools.append(p)
    board_in = ov.get("board") or {}
    board = {j: t for j, t in board_in.items() if j in shown}
    return {**ov, "jobs": jobs, "agents": agents, "pools": pools, "board": board,
            "hidden": {"jobs": len(hidden), "board": len(board_in) - len(board)}}
