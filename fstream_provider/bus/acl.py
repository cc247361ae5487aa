"""Redis ACL users for FStream's three roles (issue 32, least privilege); ``docs/redis-keys.md`` has the table.

Every rule is scoped to one namespace ``N`` (keys ``{N}:*`` in the namespace slot and the families with slots of
their own, ``{N:watch:*}:seen``, ``{N:history}``, ``{N:pool:*}``, ...: ``Keys.own_slot_patterns``); no role gets a
``@dangerous`` command (FLUSHALL, FLUSHDB, KEYS, CONFIG, ACL, DEBUG, SHUTDOWN, INFO, MONITOR, ...).

``submitter`` (Airflow's hook, operators, sensors and triggers; ``fstream submit/status/cancel``): one user per
    submitter id ``S`` (issue 40: tenants that cannot touch each other; ``Keys.owner_patterns``)
    may: submit its own jobs (the SUBMIT script: a job id ``S:<hex>`` with its hash and events, ``XADD {N}:jobs``,
    its own index ``{N}:jobs:index:S``, its own idempotency keys ``{N}:idem:S%3A*``), create the ``agents`` consumer
    group if missing (``XGROUP CREATE``), read and follow its own jobs, cancel them (the CANCEL script,
    ``PUBLISH {N}:job:S%3A*:cancel``), read the agents' heartbeats, and keep its own new-files scopes' state
    (``{N:watch:S%3A*}:seen``, ``:pending``, ``:looks``).
    may not: read or write another submitter's jobs, idempotency keys, index or scopes; read the dead letters or
    the facility's index (they name every tenant's jobs); take jobs (``XREADGROUP``/``XACK``/``XCLAIM``/
    ``XAUTOCLAIM``/``XPENDING``), touch the audit stream ``{N}:audit``, the replay guard ``{N}:nonce:*``, pools,
    the scheduler's hashes, the history, calibration or profiling keys, delete keys, or run any admin command.
    It may add an entry naming any job to the jobs stream (``XADD`` has no per-entry rule): agents take an entry
    only if it is the one its job was submitted under (``job_scripts.CLAIM``), so a forged entry is ignored.
``agent`` (``fstream agent`` and the operator tools: reconcile, pools, schedule, history, calibrate)
    may: read and write every ``{N}:*`` key and every own-slot key of ``N`` with the data-type, stream (consumer
    groups, claims), transaction and scripting commands, publish and subscribe on ``{N}:*`` channels, ``TIME``.
    may not: any ``@dangerous``/``@admin`` command, Redis Functions, ``SCRIPT FLUSH/KILL/DEBUG``,
    ``MOVE``/``SWAPDB``, or any key or channel outside ``N``.
``viewer`` (live views: ``fstream status``, ``pools``, ``schedule`` with ``--watch``)
    may: every ``@read`` command on ``{N}:*`` and own-slot keys (``%R~``), ``TIME``, subscribe to ``{N}:*`` channels
    (``PSUBSCRIBE`` only to the pattern ``{N}:*`` itself: Redis compares patterns literally).
    may not: write anything, run scripts, publish.

Redis 6.2 (the floor, ``bus.server_floor``) has no read-only or write-only key patterns (``%R~``/``%RW~``) and
no selectors (``clearselectors``), both from 7.0: for a server older than 7.0 (``server_version``) the rules give
plain ``~`` patterns instead. The commands still bound each role (the viewer has only ``@read`` commands, so it
writes nothing), but the submitter's read-only keys (the agents' heartbeats, the dead letters) become writable by
the submitter's write commands. Use Redis >= 7.0 or Valkey where that separation matters.

Lua scripts: Redis 7 checks the keys an ``EVAL``/``EVALSHA`` declares as read *and* written, and
every command a script calls against the caller's rules, so a role with scripts can do inside a
script exactly what it could do outside one. All roles can still see key *names* of other
namespaces through ``SCAN`` (viewer) and can run a long Lua loop (submitter, agent): ACLs limit
what is read and written, not the server's CPU.
"""

from __future__ import annotations

import hashlib
import re

from fstream_provider.bus.keys import Keys
from fstream_provider.authz.signing import check_submitter_id

ROLES = ("submitter", "agent", "viewer")

# what every role needs to connect and stay connected (standalone, Sentinel master, Cluster): @connection
# is AUTH/HELLO/PING/ECHO/SELECT/COMMAND/READONLY and the harmless CLIENT subcommands; -@dangerous takes
# CLIENT KILL/LIST/PAUSE back out. CLUSTER SLOTS/SHARDS are what redis-py's cluster client reads at start.
_CONNECT = ("+@connection", "+cluster|slots", "+cluster|shards")

# the submitter's commands, one by one: what JobStore's client side, the SUBMIT and CANCEL scripts, the
# hook's agent check, `fstream status` and the new-files watcher call (redis-py loads a missing script
# with SCRIPT LOAD; a pipeline with scripts first asks SCRIPT EXISTS)
_SUBMITTER_COMMANDS = (
    "evalsha", "eval", "script|load", "script|exists",
    "get", "mget", "set", "exists", "expire",
    "hget", "hmget", "hgetall", "hset", "hdel",
    "xadd", "xread", "xrange", "xrevrange", "xlen", "xgroup|create",
    "zadd", "zrange", "zrevrange", "zremrangebyscore", "zcard",
    "sadd", "smembers", "sismember", "smismember",
    "publish",
)

# the submitter's keys outside its own (``Keys.owner_patterns`` gives those), after the ``{N}:`` prefix. Every key a
# script declares must be RW (Redis cannot know how the script uses it), hence RW on the jobs stream.
_SUBMITTER_KEYS = (
    ("%RW", "jobs"),         # the jobs stream: XADD (SUBMIT), XGROUP CREATE; XREADGROUP is not granted
    ("%R", "agents"),        # the hook's connection test and `fstream status`: which agents are alive
    ("%R", "agent:*"),
)
# ... and its own: jobs (hash, events, followed), idempotency keys, index, new-files scopes (each in its own slot)
_SUBMITTER_OWN = ("job", "idem", "index", "seen", "pending", "looks")

# the agent: every data type's reads and writes, streams (consumer groups, claims), MULTI/EXEC/WATCH,
# pub/sub and scripts, on its namespace only; then everything an agent never needs is taken out again
_AGENT_CATEGORIES = ("+@read", "+@write", "+@transaction", "+@pubsub", "+@scripting")
_AGENT_DENIED = ("-@dangerous", "-@admin", "-function", "-fcall", "-fcall_ro", "-script|flush", "-script|kill",
                 "-script|debug", "-move", "-swapdb")

_VIEWER_COMMANDS = ("subscribe", "unsubscribe", "psubscribe", "punsubscribe", "ssubscribe", "sunsubscribe")

_GLOB = re.compile(r"([*?\[\]\\])")
_TOKEN_BAD = re.compile(r"[\s\x00-\x1f\x7f]")


def _prefix(namespace: str) -> str:
    """``{N}:`` with glob characters of ``N`` escaped, so ``N`` itself cannot widen a pattern."""
    Keys(namespace)  # the key schema's own check (non-empty, no braces)
    if _TOKEN_BAD.search(namespace):
        raise ValueError(f"namespace {namespace!r}: must not contain whitespace or control characters")
    return "{" + _GLOB.sub(r"\\\1", namespace) + "}:"


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"Redis ACL role {role!r}: unknown (accepted: {', '.join(ROLES)})")


def _before_7(server_version: str) -> bool:
    parts = re.match(r"(\d+)", server_version or "")
    if not parts:
        raise ValueError(f"server version {server_version!r}: expected a version such as 6.2 or 7.0")
    return int(parts.group(1)) < 7


# commands a Redis 6.2 does not know (an ACL rule naming one is an error there): nothing to grant or deny
_SINCE_7 = {"cluster|shards", "function", "fcall", "fcall_ro", "ssubscribe", "sunsubscribe"}


def _legacy(rules: list[str]) -> list[str]:
    """The rules for a Redis 6.2: no selectors, key permissions as plain ``~`` patterns (each kept once), no
    rule about a command 6.2 does not have."""
    out: list[str] = []
    for rule in rules:
        if rule == "clearselectors" or (rule[:1] in "+-" and rule[1:] in _SINCE_7):
            continue
        if rule.startswith("-script|"):  # 6.2 cannot take a subcommand away: no SCRIPT but what redis-py uses
            rule = "-script"
            for keep in ("-script", "+script|load", "+script|exists"):
                if keep not in out:
                    out.append(keep)
            continue
        if rule.startswith(("%R~", "%W~", "%RW~")):
            rule = rule[rule.index("~"):]
        if rule not in out:
            out.append(rule)
    return out


def acl_rules(role: str, namespace: str = "fstream", server_version: str = "7.0",
              submitter: str | None = None) -> list[str]:
    """The ACL rule tokens of ``role`` in ``namespace``, without user name or password.

    ``submitter``: the submitter id a ``submitter`` user is for (required for that role, refused for the others):
    the user reads and writes that submitter's jobs, keys and scopes only.

    ``server_version``: the Redis the rules are for; below 7.0 they are written without what 7.0 added (see the
    module's docstring). Valkey's versions (7.2 on) take the full rules.

    Usable after ``ACL SETUSER <name>`` (the tokens reset the user's keys, channels, selectors and
    commands, so applying them again to an existing user replaces its rights and keeps its password)
    or in an ACL file line (``acl_setuser_line``). ``ValueError`` for an unknown role or a bad namespace.
    """
    _check_role(role)
    p = _prefix(namespace)
    own = Keys(namespace).own_slot_patterns()  # literal but for '*': the namespace is escaped in them
    if (role == "submitter") != (submitter is not None):
        raise ValueError(f"Redis ACL role {role!r}: " + ("give the submitter id the user is for (--submitter)"
                                                         if role == "submitter" else "takes no submitter id"))
    rules = ["on", "resetkeys", "resetchannels", "clearselectors", "-@all"]
    if role == "submitter":
        mine = Keys(namespace).owner_patterns(check_submitter_id(submitter or ""))
        rules += [f"{perm}~{p}{pattern}" for perm, pattern in _SUBMITTER_KEYS]
        rules += [f"%RW~{mine[family]}" for family in _SUBMITTER_OWN]
        rules.append(f"&{mine['cancel']}")
        rules += [*_CONNECT, "-@dangerous"]
        rules += ["+" + c for c in _SUBMITTER_COMMANDS]
    elif role == "agent":
        rules += [f"~{p}*", *(f"~{pattern}" for pattern in own.values()), f"&{p}*", *_CONNECT, *_AGENT_CATEGORIES,
                  *_AGENT_DENIED, "+time"]
    else:
        rules += [f"%R~{p}*", *(f"%R~{pattern}" for pattern in own.values()), f"&{p}*", *_CONNECT, "+@read",
                  "-@dangerous", "+time"]
        rules += ["+" + c for c in _VIEWER_COMMANDS]
    return _legacy(rules) if _before_7(server_version) else rules


def password_hash(password: str) -> str:
    """The SHA-256 hex digest Redis stores for a password (``#<hash>`` in an ACL rule)."""
    return hashlib.sha256(password.encode()).hexdigest()


def acl_setuser_line(role: str, user: str, password: str | None = None, namespace: str = "fstream",
                     password_hash: str | None = None, server_version: str = "7.0",
                     submitter: str | None = None) -> str:
    """One ACL file line, ``user NAME on >pw|#hash ~... +...``, for ``role`` in ``namespace``.

    ``password_hash`` (64 hex digits, ``password_hash()``) wins over ``password``; prefer it, so the ACL
    file holds no clear-text secret. With neither, the user exists but cannot authenticate until a
    password is added (never ``nopass``).
    """
    _check_role(role)
    if not user or _TOKEN_BAD.search(user):
        raise ValueError(f"Redis ACL user name {user!r}: must be non-empty, without whitespace or control characters")
    rules = acl_rules(role, namespace, server_version, submitter)
    if password_hash is not None:
        if not re.fullmatch(r"[0-9a-fA-F]{64}", password_hash):
            raise ValueError("password hash: expected 64 hex digits (SHA-256)")
        secret = ["#" + password_hash.lower()]
    elif password is not None:
        if not password or _TOKEN_BAD.search(password):
            raise ValueError("password: must be non-empty, without whitespace or control characters "
                             "(or give its SHA-256 as password_hash)")
        secret = [">" + password]
    else:
        secret = []
    return " ".join(["user", user, rules[0], *secret, *rules[1:]])
