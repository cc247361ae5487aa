"""The scheduler board's change log and an agent's cached copy of the board: what a cycle reads (issue 28).

``bus.sched_board.SchedBoard`` decides and writes; this module is what it knows of the board between cycles.
Every writer of the board bumps its version in ``Keys.sched_version`` (a sorted set: ``#`` -> the board's
version, ``#t`` -> the version of the tasks' last change, ``t:<job id>`` / ``p:<job id>`` -> the version at
which that task / its progress last changed; pruned to the last ``LOG_WINDOW`` versions) in the same MULTI
as its write (``bump``). ``BoardView.refresh`` then costs one round trip when nothing changed, reads only the
changed fields when something did, and reads the whole board when the log cannot tell, and every ``resync_s``.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from typing import Any

import redis

from fstream_provider.bus.keys import Keys
from fstream_provider.tuning.sched_model import EndpointCurve, LoadModel

SWEEP_PER_CYCLE = 4  # job states a cycle reads, in turn, to find jobs that ended without the board knowing
LOG_WINDOW = 2048  # versions the change log keeps; a view further behind reads the whole board
MAX_CHANGES = 512  # more changed fields than this since a view's last cycle: it reads the whole board

# Run in a writer's MULTI: the board's next version, what changed at it, and the log pruned to the last
# LOG_WINDOW versions (never below ``#t``, which a commit compares).
_BUMP = """
local key, kind = KEYS[1], ARGV[1]
local v = tonumber(redis.call('ZINCRBY', key, 1, '#'))
if kind == 't' then redis.call('ZADD', key, v, '#t') end
for i = 2, #ARGV do redis.call('ZADD', key, v, kind .. ':' .. ARGV[i]) end
local floor = v - %d
local t = tonumber(redis.call('ZSCORE', key, '#t') or v)
if t < floor then floor = t end
redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. floor)
return v
""" % LOG_WINDOW


def bump(pipe: Any, keys: Keys, kind: str, job_ids: list[str]) -> None:
    """In a writer's MULTI: the board's next version, and what changed at it (``t`` tasks, ``p`` progress)."""
    # as a raw command: a Cluster's pipeline has no eval() but routes EVAL by its key (the namespace slot)
    pipe.execute_command("EVAL", _BUMP, 1, keys.sched_version(), kind, *job_ids)


def running_agents(tasks: dict[str, dict]) -> list[str]:
    return sorted({t["agent"] for t in tasks.values() if t["state"] == "running" and t["agent"]})


class BoardView:
    """What one board last read: the tasks (raw JSON as on Redis, and parsed, never changed in place), their
    progress, the versions of the log it is up to, and where its finished-job sweep stands.

    :param client: ``redis.Redis`` with ``decode_responses=True``.
    :param keys: the key schema.
    :param resync_s: the whole board is read again at least this often (+- 20 %), whatever the log says.
    :param clock: monotonic seconds.
    :param rng: randomness (the resync's spread, the sweep's starting point: agents sweep different tasks).
    """

    def __init__(self, client: redis.Redis, keys: Keys, *, resync_s: float, clock: Callable[[], float],
                 rng: random.Random) -> None:
        self.client, self.keys = client, keys
        self.resync_s, self._clock, self._rng = resync_s, clock, rng
        self.version = -1  # the board version read up to (-1: nothing read yet)
        self.tasks_version: float | None = None  # ``#t``: the version of the tasks' last change
        self.raw: dict[str, str] = {}
        self.tasks: dict[str, dict] = {}
        self.progress: dict[str, dict] = {}
        self.cursor = rng.randrange(1 << 16)
        self.resync_at = -math.inf

    def refresh(self, states: dict[str, str | None]) -> tuple[dict[str, str], set[str]]:
        """Bring the view up to date; returns the model's config and the running tasks' agents found dead, and
        adds the job states of this cycle's sweep to ``states``.

        One round trip when nothing changed: the log since the view's version, the config, one EXISTS over the
        running tasks' agents, the next ``SWEEP_PER_CYCLE`` job states."""
        k = self.keys
        if self.version < 0 or self._clock() >= self.resync_at:
            self.reload()
        sweep = self._sweep(SWEEP_PER_CYCLE)
        agents = running_agents(self.tasks)
        pipe = self.client.pipeline(transaction=False)
        pipe.zrangebyscore(k.sched_version(), f"({self.version}", "+inf", start=0, num=MAX_CHANGES + 1,
                           withscores=True)
        pipe.hgetall(k.sched_config())
        if agents:
            pipe.exists(*[k.agent(a) for a in agents])
        for j in sweep:
            pipe.hget(k.job(j), "state")
        out = pipe.execute()
        log, cfg = out[0], out[1]
        states.update(zip(sweep, out[3 if agents else 2:]))
        if not self._apply(log):
            self.reload()
        dead = self.dead(agents, out[2]) if agents else set()
        unseen = sorted(set(running_agents(self.tasks)) - set(agents))  # started since the view was read
        return cfg, dead | (self.dead(unseen) if unseen else set())

    def _apply(self, log: list[tuple[str, float]]) -> bool:
        """Read the fields the log names as changed since the view's version (False: read the whole board)."""
        if not log:
            return True
        scores = dict(log)
        top = scores.get("#")
        if len(log) > MAX_CHANGES or top is None or top - LOG_WINDOW > self.version:
            return False  # too many changes, or changes pruned from the log before this view read them
        self.tasks_version = scores.get("#t", self.tasks_version)
        tids = [m[2:] for m in scores if m.startswith("t:")]
        pids = [m[2:] for m in scores if m[:2] in ("t:", "p:")]
        if pids:
            pipe = self.client.pipeline(transaction=False)
            if tids:
                pipe.hmget(self.keys.sched_tasks(), tids)
            pipe.hmget(self.keys.sched_progress(), pids)
            out = pipe.execute()
            for j, raw in zip(tids, out[0] if tids else []):
                self.set_task(j, raw)
            for j, raw in zip(pids, out[-1]):
                self.set_progress(j, raw)
        self.version = int(top)
        return True

    def reload(self) -> None:
        """Read the whole board, its progress and the log's versions as one snapshot (MULTI)."""
        k = self.keys
        pipe = self.client.pipeline(transaction=True)
        pipe.zmscore(k.sched_version(), ["#", "#t"])
        pipe.hgetall(k.sched_tasks())
        pipe.hgetall(k.sched_progress())
        (top, tasks_version), raw, prog = pipe.execute()
        self.version, self.tasks_version = int(top or 0), tasks_version
        self.tasks = {j: self.tasks[j] if self.raw.get(j) == r else json.loads(r) for j, r in raw.items()}
        self.raw, self.progress = raw, {j: json.loads(r) for j, r in prog.items()}
        self.resync_at = self._clock() + self.resync_s * self._rng.uniform(0.8, 1.2)

    def dead(self, agents: list[str], alive: int | None = None) -> set[str]:
        """Which of ``agents`` have no heartbeat key: one EXISTS for all of them, one each only if some died."""
        names = [self.keys.agent(a) for a in agents]
        if (self.client.exists(*names) if alive is None else alive) == len(names):
            return set()
        pipe = self.client.pipeline(transaction=False)
        for n in names:
            pipe.exists(n)
        return {a for a, e in zip(agents, pipe.execute()) if not e}

    def set_task(self, job_id: str, raw: str | None) -> None:
        if raw is None:
            for d in (self.raw, self.tasks, self.progress):
                d.pop(job_id, None)
        elif self.raw.get(job_id) != raw:
            self.raw[job_id], self.tasks[job_id] = raw, json.loads(raw)

    def set_progress(self, job_id: str, raw: str | None) -> None:
        if raw is None:
            self.progress.pop(job_id, None)
        else:
            self.progress[job_id] = json.loads(raw)

    def _sweep(self, n: int) -> list[str]:
        """The next ``n`` tasks, in turn round the board, whose job state this cycle reads."""
        ids = sorted(self.tasks)
        if not ids:
            return []
        start = self.cursor % len(ids)
        self.cursor = start + n
        return (ids[start:] + ids[:start])[:n]


class IdealMemo(LoadModel):
    """``LoadModel`` whose TT_ideal (uncorrected, alone on the path) is kept between cycles: it depends only on
    the ends' curves, the size and the cap, and computing it for every task was most of a cycle's time. The
    caller clears ``memo`` when the curves or the start-up cost change."""

    def __init__(self, endpoints: dict[str, EndpointCurve], startup_s: float, memo: dict[Any, Any]) -> None:
        super().__init__(endpoints, startup_s=startup_s)
        self.memo = memo

    def ideal_time(self, src: str, dst: str, size: float, max_cc: int, beta: float = 1.1) -> float:
        key = (src, dst, size, max_cc, beta)
        if key not in self.memo:
            self.memo[key] = super().ideal_time(src, dst, size, max_cc, beta)
        return self.memo[key]
