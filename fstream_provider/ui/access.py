"""Who sees which transfers in the live views (issues 27 and 41): the auth manager decides.

The overview's routes are guarded by ``requires_access_view(AccessView.PLUGINS)``. Within it:

- **Which bus.** The ``fstream_default`` connection's, for everyone with the view. ``?conn_id=`` picks another
  only if the auth manager lets the user read that connection (``is_authorized_connection``, method GET, the
  check Airflow's own connection endpoints make): otherwise 403, before the id is even looked up (``bus_for``).
- **Which jobs.** A user who may read the bus's connection holds what it takes to read the whole bus anyway:
  they see every job on it (``whole_bus``), those no Airflow task submitted (``fstream submit``, a flow) and
  those of DAGs since deleted included. Anyone else sees the jobs of the DAGs the auth manager lets them read
  (``get_authorized_dag_ids``: the same call the core API filters its lists with, teams included) and nothing
  else: a job with no DAG, or whose DAG the database no longer knows, is denied by default. With the simple
  auth manager that is ADMIN and OP see everything; with FAB, the roles that may read connections.

What would name a hidden job elsewhere on the page is masked: an agent's current job, a pool grant's client, a
board entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException

HIDDEN = "(hidden)"


@dataclass(frozen=True)
class Scope:
    """What one user may see of one bus: every job (``whole_bus``), else the jobs of ``dag_ids``."""

    dag_ids: frozenset[str]
    whole_bus: bool = False


def readable_dag_ids(user: Any) -> set[str]:
    """The DAG ids ``user`` may read (blocking: the auth manager queries the database)."""
    from airflow.api_fastapi.app import get_auth_manager

    return set(get_auth_manager().get_authorized_dag_ids(user=user, method="GET"))


def may_read_connection(user: Any, conn_id: str) -> bool:
    """The auth manager lets ``user`` read Airflow connection ``conn_id`` (GET, as ``/api/v2/connections/{id}``)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import ConnectionDetails

    return bool(get_auth_manager().is_authorized_connection(method="GET", details=ConnectionDetails(conn_id=conn_id),
                                                            user=user))


def scope(user: Any, conn_id: str) -> Scope:
    """What ``user`` may see on the bus of ``conn_id`` (blocking)."""
    if may_read_connection(user, conn_id):
        return Scope(frozenset(), whole_bus=True)
    return Scope(frozenset(readable_dag_ids(user)))


def bus_for(user: Any, conn_id: str | None) -> Any:
    """The bus ``user`` asked for (``bus_conn.resolve``): the default one, or ``conn_id`` if they may read that
    connection; ``HTTPException`` 403 otherwise (before looking it up: no hint whether it exists). Blocking."""
    from fstream_provider.ui import bus_conn

    if conn_id and conn_id != bus_conn.DEFAULT_CONN_ID and not may_read_connection(user, conn_id):
        raise HTTPException(status_code=403, detail=f"you may not read Airflow connection {conn_id!r}, so not "
                                                    "its FStream bus either; the page shows "
                                                    f"{bus_conn.DEFAULT_CONN_ID!r} without ?conn_id=")
    return bus_conn.resolve(conn_id)


def may_see(row: dict, readable: Scope | set[str]) -> bool:
    """A job row is visible to a user who sees the whole bus, else when its Airflow task's DAG is readable."""
    if isinstance(readable, Scope):
        if readable.whole_bus:
            return True
        readable = set(readable.dag_ids)
    ref = row.get("airflow")
    if not isinstance(ref, dict) or not ref.get("dag_id"):
        return False  # no Airflow task: the bus's readers only
    return ref["dag_id"] in readable


def visible_overview(ov: dict, readable: Scope | set[str]) -> dict:
    """``ov`` (``bus.live.overview``) as a user with ``readable`` (a ``Scope``, or the DAG ids they may read)
    sees it (a new dict; ``ov`` is shared). A user who sees the whole bus sees it as it is."""
    if isinstance(readable, Scope) and readable.whole_bus:
        return {**ov, "hidden": {"jobs": 0, "board": 0}}
    jobs, hidden = [], set()
    for row in ov.get("jobs") or []:
        if may_see(row, readable):
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
        if any(c not in shown for c in grants):  # a grant's client is a job: not listed, deny (as agents, board)
            masked: dict[str, Any] = {}
            for c, g in grants.items():
                name = HIDDEN if c not in shown else c
                if name in masked:  # several hidden clients: their streams add up under one name
                    g = {**g, "streams": (masked[name].get("streams") or 0) + (g.get("streams") or 0)}
                masked[name] = g
            p = {**p, "grants": masked}
        pools.append(p)
    board_in = ov.get("board") or {}
    board = {j: t for j, t in board_in.items() if j in shown}
    return {**ov, "jobs": jobs, "agents": agents, "pools": pools, "board": board,
            "hidden": {"jobs": len(hidden), "board": len(board_in) - len(board)}}
