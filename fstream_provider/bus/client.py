"""Redis clients for the bus: timeouts, health checks and retries on every client; standalone, Sentinel, Cluster."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, parse_qsl, unquote, urlencode

import redis
import redis.asyncio
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ClusterDownError, SlotNotCoveredError, TryAgainError

from fstream_provider.bus import server_floor
from fstream_provider.bus.role_change import AsyncRoleChangeRetry, RoleChangeRetry

SOCKET_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 5.0
HEALTH_CHECK_INTERVAL_S = 15
RETRIES = 5
MAX_BLOCK_MS = 5000
WAIT_TIMEOUT_MS = 500  # ``?wait_replicas=N``: how long a job write waits for its replicas by default

# The errors that mean "Redis is unreachable for now" (down, restarting, loading its AOF; a Cluster failing over:
# CLUSTERDOWN while a dead master's slots have no one to serve them, TRYAGAIN, a slot the client's map does not
# cover yet), not "the command was wrong": what the agent waits out with backoff. A MOVED after a failover is
# followed by the Cluster client itself. A master made a replica under a blocked read answers ``-UNBLOCKED``: the
# clients' Retry (``role_change``) makes that a ConnectionError and reads again on a fresh connection.
REDIS_UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, ClusterDownError,
                     TryAgainError, SlotNotCoveredError)


def redis_unreachable(exc: BaseException) -> bool:
    """The retry predicate for Redis outages: True for ``REDIS_UNREACHABLE`` errors."""
    return isinstance(exc, REDIS_UNREACHABLE)


def _options(socket_timeout: float, connect_timeout: float, retries: int) -> dict[str, Any]:
    return {
        "decode_responses": True,
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "socket_keepalive": True,
        "health_check_interval": HEALTH_CHECK_INTERVAL_S,
        "retry_on_timeout": True,
        "retry": RoleChangeRetry(ExponentialWithJitterBackoff(cap=2.0, base=0.05), retries),
    }


def _hosts(netloc: str, url: str) -> tuple[list[tuple[str, int]], str | None, str | None]:
    """Parse ``[user:pw@]h1:p1,h2:p2`` into hosts and credentials."""
    user = password = None
    if "@" in netloc:
        cred, netloc = netloc.rsplit("@", 1)
        if ":" in cred:
            user, password = cred.split(":", 1)
        else:
            password = cred
        user = unquote(user) if user else None
        password = unquote(password) if password else None
    hosts = []
    for item in netloc.split(","):
        host, sep, port = item.rpartition(":")
        if not sep:
            host, port = item, ""
        host = host.strip("[]")
        if not host:
            raise ValueError(f"Redis URL {url!r}: empty host in {netloc!r}")
        try:
            hosts.append((host, int(port) if port else 0))
        except ValueError:
            raise ValueError(f"Redis URL {url!r}: bad port {port!r}") from None
    return hosts, user, password


def _split_multi(url: str) -> tuple[str, list[tuple[str, int]], str | None, str | None, str, dict[str, list[str]]]:
    scheme, rest = url.split("://", 1)
    netloc, _, tail = rest.partition("/")
    path, _, query = tail.partition("?")
    hosts, user, password = _hosts(netloc, url)
    return scheme, hosts, user, password, unquote(path), parse_qs(query)


def _auth(user: str | None, password: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if user:
        out["username"] = user
    if password:
        out["password"] = password
    return out


def connect(url: str, *, socket_timeout: float = SOCKET_TIMEOUT_S, connect_timeout: float = CONNECT_TIMEOUT_S,
            retries: int = RETRIES) -> redis.Redis:
    """A blocking client for ``url`` (``decode_responses=True``, timeouts, health checks, retries with backoff).

    URL forms: ``redis://[:pw@]host:port/db``, ``rediss://...`` (TLS), ``unix:///path.sock?db=N``,
    ``redis+sentinel://[:pw@]h1:p1,h2:p2/MASTER?db=N`` and ``redis+cluster://[:pw@]h1:p1,h2:p2``
    (``rediss+sentinel`` / ``rediss+cluster`` for TLS). Blocking reads (``XREAD BLOCK``) must
    block for less than ``socket_timeout``; FStream's callers block at most ``MAX_BLOCK_MS``.

    ``?wait_replicas=N[&wait_timeout_ms=T]`` in any form: the job writes that must survive a failover (submit,
    claim, events, finish; ``JobStore``) wait until ``N`` replicas have them (``WAIT N T``, ``run_replicated``).
    """
    from redis.cluster import ClusterNode, RedisCluster
    from redis.sentinel import Sentinel

    url, wait = _wait_option(url)
    opts = _options(socket_timeout, connect_timeout, retries)
    opts["redis_connect_func"] = server_floor.check_connection  # the floor, on every connection (issue 39)
    client = _client(url, opts, redis.Redis, Sentinel, RedisCluster, ClusterNode)
    client.fstream_wait = wait
    return client


def connect_async(url: str, *, socket_timeout: float = SOCKET_TIMEOUT_S, connect_timeout: float = CONNECT_TIMEOUT_S,
                  retries: int = RETRIES) -> redis.asyncio.Redis:
    """A ``redis.asyncio`` client with the same options (for Airflow triggers). Close it with ``await c.aclose()``."""
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.sentinel import Sentinel

    url, _wait = _wait_option(url)  # the async side (triggers) writes no job state that WAIT protects
    opts = _options(socket_timeout, connect_timeout, retries)
    opts["retry"] = AsyncRoleChangeRetry(ExponentialWithJitterBackoff(cap=2.0, base=0.05), retries)
    opts["redis_connect_func"] = server_floor.check_connection_async
    return _client(url, opts, redis.asyncio.Redis, Sentinel, RedisCluster, ClusterNode)


def _wait_option(url: str) -> tuple[str, tuple[int, int]]:
    """Take FStream's ``wait_replicas`` / ``wait_timeout_ms`` out of ``url``'s query: (url, (replicas, ms))."""
    base, sep, query = url.partition("?")
    if not sep or "wait_" not in query:
        return url, (0, 0)
    pairs = parse_qsl(query, keep_blank_values=True)
    ours = {k: v for k, v in pairs if k in ("wait_replicas", "wait_timeout_ms")}
    rest = [(k, v) for k, v in pairs if k not in ours]
    try:
        replicas, timeout_ms = int(ours.get("wait_replicas", 0)), int(ours.get("wait_timeout_ms", WAIT_TIMEOUT_MS))
    except ValueError:
        raise ValueError(f"Redis URL {describe(url)!r}: wait_replicas and wait_timeout_ms must be integers") from None
    if replicas < 0 or timeout_ms < 1:
        raise ValueError(f"Redis URL {describe(url)!r}: wait_replicas must be >= 0 and wait_timeout_ms >= 1")
    return base + ("?" + urlencode(rest, safe="/:") if rest else ""), (replicas, timeout_ms)


class WriteInDoubt(redis.ConnectionError):
    """A job write ran but fewer replicas than ``?wait_replicas`` acknowledged it in time: a failover now could lose
    it (the replica promoted did not have it; a master the sentinel demotes drops what it took meanwhile). A
    ``ConnectionError``, so the writers' outage retries send it again: those writes are fenced or numbered, so a
    second run adds nothing when the first stood (``JobStore._replicated``)."""


def run_replicated(client: Any, script: Any, keys: list[str], args: list[Any]) -> tuple[Any, int | None]:
    """Run a registered Lua ``script``, then ``WAIT`` on the connection that ran it, if the client asks for it.

    Returns ``(result, replicas that acknowledged)``; ``None`` replicas when the client does not wait
    (``?wait_replicas`` not given). Replication is asynchronous: a write the master acknowledged can be missing on
    the replica promoted when the master dies. With ``wait_replicas`` the script's writes count as done only once
    the replicas have them: if the connection fails during the ``WAIT`` (the master died in that window) the
    error is raised, so the caller retries the whole write against the new master (FStream's job writes are
    fenced or idempotent: at least once). A ``WAIT`` that times out with fewer replicas (none connected, one
    lagging) is returned as such: the write stands, with today's risk.
    """
    replicas, timeout_ms = getattr(client, "fstream_wait", (0, 0))
    if not replicas:
        return script(keys=keys, args=args), None
    from redis.cluster import RedisCluster

    pipe = client.pipeline(transaction=False)  # one connection per node, its commands in order
    # EVAL with the text (a Cluster pipeline refuses EVALSHA; a promoted replica may not have the script cached)
    pipe.execute_command("EVAL", script.script, len(keys), *keys, *args)
    target = {"target_nodes": client.get_node_from_key(keys[0])} if isinstance(client, RedisCluster) else {}
    pipe.execute_command("WAIT", replicas, timeout_ms, **target)
    out, acked = pipe.execute(raise_on_error=False)
    if isinstance(out, Exception):
        raise out
    if isinstance(acked, Exception):
        raise acked  # the write is in doubt: the caller's retry makes sure of it
    return out, int(acked)


def _client(url: str, opts: dict[str, Any], redis_cls: Any, sentinel_cls: Any, cluster_cls: Any,
            node_cls: Any) -> Any:
    """Build a standalone, Sentinel or Cluster client from the blocking or the asyncio family of classes."""
    if not url:
        raise ValueError("Redis URL: empty (give --redis, FSTREAM_REDIS_URL, or use the embedded default)")
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "unix":
        opts.pop("socket_keepalive")  # not a TCP socket
    if scheme in ("redis", "rediss", "unix"):
        return redis_cls.from_url(url, **opts)
    if scheme in ("redis+sentinel", "rediss+sentinel"):
        _, hosts, user, password, master, query = _split_multi(url)
        if not master:
            raise ValueError(f"Redis URL {url!r}: missing master name (redis+sentinel://h1:p1,h2:p2/MASTER)")
        hosts = [(h, p or 26379) for h, p in hosts]
        db = int(query.get("db", ["0"])[0])
        if scheme.startswith("rediss"):
            opts["ssl"] = True
        sentinel_kwargs = {k: opts[k] for k in ("socket_timeout", "socket_connect_timeout", "socket_keepalive")}
        sentinel_kwargs.update(_auth(None, query.get("sentinel_password", [None])[0]))
        sentinel = sentinel_cls(hosts, sentinel_kwargs=sentinel_kwargs, **opts)
        return sentinel.master_for(master, db=db, **_auth(user, password))
    if scheme in ("redis+cluster", "rediss+cluster"):
        _, hosts, user, password, _, _ = _split_multi(url)
        opts.pop("health_check_interval")  # cluster nodes are health-checked by the cluster client
        opts.pop("retry_on_timeout")  # the cluster client retries timeouts by default (the option is deprecated)
        if scheme.startswith("rediss"):
            opts["ssl"] = True
        nodes = [node_cls(h, p or 6379) for h, p in hosts]
        connect_func = opts.pop("redis_connect_func")
        if connect_func is server_floor.check_connection:  # RedisCluster calls it after its own on_connect
            opts["redis_connect_func"] = server_floor.check_cluster_connection
        client = cluster_cls(startup_nodes=nodes, **opts, **_auth(user, password))
        if connect_func is server_floor.check_connection_async:
            # redis.asyncio's cluster takes no such argument: its nodes' connections are made from these kwargs
            # (the startup nodes kept a copy of their own); no connection exists yet, they open lazily
            client.nodes_manager.connection_kwargs["redis_connect_func"] = connect_func
            for node in client.nodes_manager.startup_nodes.values():
                node.connection_kwargs["redis_connect_func"] = connect_func
        return client
    raise ValueError(
        f"Redis URL {url!r}: unsupported scheme {scheme or 'none'!r} "
        "(use redis://, rediss://, unix://, redis+sentinel:// or redis+cluster://)"
    )


def describe(url: str) -> str:
    """The URL with any password masked (in its user info or its query), for logs and error messages."""
    from fstream_provider.model.redis_url import masked

    return masked(url)
