"""Which agents are alive on the bus, and the rule that fails a job nobody can take ("no agent" grace period).

An agent announces itself in the ``agents`` set and keeps a heartbeat key with a TTL
(``transfer_agent.daemon.heartbeat``); it is alive while that key exists. A job that stays
``queued`` while no agent is alive for longer than a grace period will never move: the Airflow
operator fails it then, with the command that starts an agent, instead of deferring for ever.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fstream_provider.bus.keys import Keys


def live_agents(client: Any, keys: Keys) -> list[str]:
    """Names of the agents whose heartbeat key still exists (blocking client)."""
    return sorted(a for a in client.smembers(keys.agents()) if client.exists(keys.agent(a)))


async def alive_agents(client: Any, keys: Keys) -> list[str]:
    """``live_agents`` on a ``redis.asyncio`` client."""
    names = await client.smembers(keys.agents())
    return sorted([a for a in names if await client.exists(keys.agent(a))])


def start_agent_hint(redis_url: str, namespace: str) -> str:
    """The command that starts an agent on this bus (for log lines and errors): the URL without its password (a
    password in an argument is refused, issue 40), and ``--redis-password-file FILE`` where it had one."""
    from fstream_provider.model.redis_url import secret_in, without_password

    auth = " --redis-password-file FILE" if secret_in(redis_url) else ""
    ns = f" --namespace {namespace}" if namespace != "fstream" else ""
    return f"start one on a source host: `fstream agent --redis {without_password(redis_url)}{auth}{ns} " \
           "--secret-file SECRET`"


class NoAgentError(RuntimeError):
    """A job stayed queued with no live agent for longer than the grace period."""


class NoAgentWatch:
    """Tracks how long a job has been queued with no live agent; ``check`` raises once that passes ``timeout``.

    :param timeout: grace period in seconds (None: never fail).
    :param hint: appended to the error (how to start an agent).
    :param clock: monotonic clock (tests pass their own).
    """

    def __init__(self, timeout: float | None, hint: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self.hint = hint
        self.clock = clock
        self.since: float | None = None

    def check(self, job_id: str, state: str | None, alive: int) -> None:
        if self.timeout is None:
            return
        if state != "queued" or alive > 0:
            self.since = None
            return
        now = self.clock()
        if self.since is None:
            self.since = now
        if now - self.since >= self.timeout:
            raise NoAgentError(f"FStream job {job_id} stayed queued for {now - self.since:.0f} s with no live "
                               f"agent on the bus (agent_timeout {self.timeout:g} s); {self.hint}")
