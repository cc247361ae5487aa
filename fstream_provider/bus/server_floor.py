"""The servers FStream's bus runs on, held by the code (issue 39): Redis >= 6.2 or Valkey >= 7.2.

Why this floor: it is the oldest server still shipped by the systems transfer nodes run (RHEL 9's Redis 6.2,
Valkey 7.2 in Ubuntu's universe; ``../shared/notes/redis-versions.md``), and every command the bus sends exists
there: ``XAUTOCLAIM`` (whose reply grew a third element in 7.0; redis-py reads both), ``XTRIM MINID``,
``SET ... KEEPTTL``/``GET``, ``ZRANGE BYSCORE``, ACL selectors-free rules. What only 7.0 has (``SET NX GET``,
``EXPIRE NX``, ``XADD <ms>-*``, Functions, ...) is done with a Lua script instead (``bus.audit.FIRST_USE``,
``bus.migrate_keys``); the test matrix (``make test-servers``) runs the bus's tests on Redis 6.2, 7.0 and
Valkey 9 so a 7.0-only command cannot come back unseen.

How it is held: every connection a ``bus.client`` client opens (standalone, Sentinel master, Cluster node;
blocking and asyncio) reads the server's ``HELLO`` reply right after it authenticates; redis-py's RESP3
handshake already carries it, so this costs no round trip there. A server below the floor (Redis 5 has no
``HELLO``; Redis 6.0 has no ``HELLO`` without arguments; any other below 6.2) is refused with
``UnsupportedServerError``, which names the server, its version, the floor and what to do. It is a
``RedisError`` but not a connection error, so the agent does not wait it out as an outage: the process stops.
A server whose version cannot be read (an ACL user without ``HELLO``, which FStream's own ACL users have)
is let through with one warning in the log.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import redis

log = logging.getLogger(__name__)

FLOORS = {"redis": (6, 2, 0), "valkey": (7, 2, 0)}
DOCS = "docs/redis-keys.md, 'Supported servers'"
_warned: set[str] = set()


class UnsupportedServerError(redis.exceptions.RedisError):
    """The server at the other end is older than FStream supports."""


def floor_text() -> str:
    return " or ".join(f"{name.capitalize()} >= {'.'.join(map(str, v[:2]))}" for name, v in FLOORS.items())


def _version(text: str) -> tuple[int, ...] | None:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return tuple(int(x or 0) for x in m.groups()) if m else None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def hello_fields(reply: Any) -> dict[str, str]:
    """``HELLO``'s reply (a RESP3 map or a RESP2 flat list, str or bytes) as ``{"server": ..., "version": ...}``."""
    if isinstance(reply, (list, tuple)):
        reply = dict(zip(reply[0::2], reply[1::2]))
    if not isinstance(reply, dict):
        return {}
    return {_text(k): _text(v) for k, v in reply.items() if _text(k) in ("server", "version", "mode", "role")}


def verdict(server: str, version: str) -> str | None:
    """None when ``server`` (``redis``, ``valkey``, ...) at ``version`` is supported, else why not."""
    name = (server or "redis").lower()
    parsed = _version(version)
    floor = FLOORS.get(name, FLOORS["redis"])  # servers that speak Redis's protocol are held to Redis's floor
    if parsed is None:
        return f"its version {version!r} cannot be read"
    if parsed < floor:
        return f"{name.capitalize()} {version} is older than {name.capitalize()} {'.'.join(map(str, floor[:2]))}"
    return None


def refusal(where: str, why: str) -> UnsupportedServerError:
    return UnsupportedServerError(
        f"Redis server {where}: {why}; FStream needs {floor_text()} ({DOCS}). Upgrade the server (RHEL 8/9: "
        "`dnf module enable redis:7`, or install Valkey), point --redis / FSTREAM_REDIS_URL at a supported one, "
        "or leave both unset to use the embedded server")


def where_of(conn: Any) -> str:
    path = getattr(conn, "path", None)
    if path:
        return f"unix:{path}"
    return f"{getattr(conn, 'host', '?')}:{getattr(conn, 'port', '?')}"


def _from_error(where: str, exc: redis.exceptions.ResponseError) -> UnsupportedServerError | None:
    """A refusal when ``HELLO`` failed the way only a server below the floor fails, else None."""
    text = str(exc).lower()
    if "unknown command" in text and "hello" in text:
        return refusal(where, "it has no HELLO command, so it is older than Redis 6.0")
    if "wrong number of arguments" in text and "hello" in text:
        return refusal(where, "it needs arguments to HELLO, so it is Redis 6.0 (older than 6.2)")
    return None


def _judge(where: str, fields: dict[str, str]) -> None:
    if not fields.get("version"):
        if where not in _warned:
            _warned.add(where)
            log.warning("Redis server %s: HELLO did not say its version; cannot check it is %s", where, floor_text())
        return
    why = verdict(fields.get("server", "redis"), fields["version"])
    if why:
        raise refusal(where, why)


def _hello_failed(where: str, exc: redis.exceptions.ResponseError) -> None:
    """Our own ``HELLO`` was refused: raise the floor's refusal if only an old server refuses it so, else warn once
    (an ACL user without ``HELLO``: the version cannot be read) and let the connection through."""
    refused = _from_error(where, exc)
    if refused:
        raise refused from None
    if where not in _warned:
        _warned.add(where)
        log.warning("Redis server %s: cannot read its version (%s); cannot check it is %s", where, exc, floor_text())


def check_connection(conn: Any, *, initialise: bool = True) -> None:
    """``redis_connect_func`` for blocking connections: authenticate (``on_connect``), then hold the floor.

    ``initialise=False`` where the client initialises the connection itself first (redis-py's ``RedisCluster``
    calls a user's connect function after its own ``on_connect``)."""
    where = where_of(conn)
    if initialise:
        try:
            conn.on_connect()
        except redis.exceptions.ResponseError as exc:  # redis-py's own RESP3 HELLO on a server without it
            raise _from_error(where, exc) or exc from None
    reply = getattr(conn, "handshake_metadata", None)
    if not reply:
        try:
            conn.send_command("HELLO")
            reply = conn.read_response()
        except redis.exceptions.ResponseError as exc:
            _hello_failed(where, exc)
            return
    _judge(where, hello_fields(reply))


def check_cluster_connection(conn: Any) -> None:
    """``check_connection`` for a Cluster node's connection, which ``RedisCluster`` has initialised already."""
    check_connection(conn, initialise=False)


async def check_connection_async(conn: Any) -> None:
    """``redis_connect_func`` for ``redis.asyncio`` connections (standalone, Sentinel, Cluster)."""
    where = where_of(conn)
    try:
        await conn.on_connect()
    except redis.exceptions.ResponseError as exc:
        raise _from_error(where, exc) or exc from None
    reply = getattr(conn, "handshake_metadata", None)
    if not reply:
        try:
            await conn.send_command("HELLO")
            reply = await conn.read_response()
        except redis.exceptions.ResponseError as exc:
            _hello_failed(where, exc)
            return
    _judge(where, hello_fields(reply))
