"""A master that becomes a replica under a blocked reader: an outage to wait out, not a wrong command.

When a Redis or Valkey master is made a replica (``REPLICAOF``, the ``FAILOVER`` command, an operator or an
orchestrator moving the role), every client blocked in ``XREAD``/``XREADGROUP``/``BLPOP`` on it is answered at
once with::

    -UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)

redis-py raises that as a plain ``ResponseError``, which callers rightly treat as "the command was wrong": the
Airflow trigger following a job failed its task with ``ResponseError: UNBLOCKED …`` while the transfer went on
and succeeded. That is the signature of the Sentinel failover test's CI flake (an error event, no state, the last
event id the first interval's): on a loaded host the sentinel can fail back while the test's group settles, and
``settle`` makes the other server, the one the trigger reads on, a replica with ``REPLICAOF``.

The client's ``Retry`` here turns that one answer into ``RoleChangedError``, a ``ConnectionError``, before it
decides: the client closes the connection and sends the read again on a fresh one (through a Sentinel URL, to the
master the sentinel names now); past its retries the error is one of ``bus.client.REDIS_UNREACHABLE``, waited out
as any outage. Every other error, ``CLIENT UNBLOCK … ERROR``'s ``-UNBLOCKED`` included, is raised as it was.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio.retry
import redis.retry


class RoleChangedError(redis.ConnectionError):
    """The server stopped being a master while this client was blocked on it (``-UNBLOCKED``)."""


def role_changed(exc: BaseException) -> bool:
    """True for the answer a blocked client gets when its server becomes a replica."""
    text = str(exc)
    return (isinstance(exc, redis.ResponseError) and text.startswith("UNBLOCKED")
            and "instance state changed" in text)


def _outage(exc: redis.ResponseError) -> RoleChangedError:
    return RoleChangedError(f"the server became a replica under a blocked read ({exc})")


class RoleChangeRetry(redis.retry.Retry):
    """redis-py's ``Retry`` (same backoff, same count) that also retries a role change (``RoleChangedError``)."""

    def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
        def attempt() -> Any:
            try:
                return do()
            except redis.ResponseError as exc:
                if role_changed(exc):
                    raise _outage(exc) from exc
                raise

        return super().call_with_retry(attempt, fail, *args, **kwargs)


class AsyncRoleChangeRetry(redis.asyncio.retry.Retry):
    """The asyncio family's ``Retry`` with the same rule."""

    async def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
        async def attempt() -> Any:
            try:
                return await do()
            except redis.ResponseError as exc:
                if role_changed(exc):
                    raise _outage(exc) from exc
                raise

        return await super().call_with_retry(attempt, fail, *args, **kwargs)
