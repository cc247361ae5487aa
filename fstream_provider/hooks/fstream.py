"""``FStreamHook``: the ``fstream`` connection (the Redis bus the agents share) and job access for tasks.

Create the connection the usual Airflow way, for example::

    export AIRFLOW_CONN_FSTREAM_DEFAULT='fstream://dag-lcls:PASSWORD@redis.example.org:6379/0?submitter=lcls-daq&submitter_key_file=%2Fetc%2Ffstream%2Fsubmitters%2Flcls-daq.key'

host, port and schema are the Redis server and database number; login/password are the Redis ACL user
and password. Extras: ``submitter`` with ``submitter_secret`` (the key itself; Airflow masks it) or
``submitter_key_file`` (a 0600 file on the worker): the identity the agents know and the key every job is
signed with (issue 32; agents refuse unsigned jobs); ``key`` (the id of the agents' keyring key the jobs
use, default ``default``), ``namespace`` (key prefix, default ``fstream``), ``agent_group`` (shown by
``test_connection``), ``ssl`` (``true`` for ``rediss://``) and ``url`` (a full Redis URL, e.g.
``redis+sentinel://h1:26379,h2:26379/mymaster``, overriding host/port). Jobs never name key files on the
agents' hosts: a connection with ``secret_file`` or ``tls_*`` extras is refused at submit, naming them. A connection id that does not exist fails at once with ``AirflowNotFoundException``
naming it: inside Airflow there is no fallback to ``$FSTREAM_REDIS_URL`` or an embedded Redis (a job
submitted to a private Redis no agent watches would wait for ever). The ``fstream`` CLI and the demo
keep that fallback; they do not use this hook.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

if TYPE_CHECKING:
    from fstream_provider.model.spec import TransferSpec

DEFAULT_CONN_ID = "fstream_default"
DEFAULT_NAMESPACE = "fstream"


def _truthy(v: Any) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def _text(v: Any) -> str | None:
    """A connection field's text without surrounding blanks, or None where it is unset: missing, ``null``, ``""``
    or only whitespace. Airflow 3.3's form saves every declared extra field, an empty one as ``""`` (its
    pre-fill) or ``null`` (cleared), and a field can hold the blanks a user typed (docs/airflow/connection.md)."""
    if v is None:
        return None
    return str(v).strip() or None


@dataclass(frozen=True)
class FStreamSettings:
    """What an ``fstream`` connection resolves to.

    :param redis_url: the Redis bus.
    :param namespace: key namespace on that Redis.
    :param secret_file: no longer forwarded: a connection naming it is refused at submit (jobs name keys by id).
    :param agent_group: the agent group name (informational).
    :param tls_cert: likewise refused at submit (agents hold their TLS files in their keyring).
    :param tls_key: its key.
    :param tls_ca: CA bundle that signed the receivers' certificates.
    :param submitter: the submitter id jobs are signed as.
    :param submitter_secret: its Ed25519 private key, inline (the connection's masked extra; PEM or its body).
    :param submitter_key_file: its Ed25519 private key, as a 0600 file on the worker (``fstream keys new``).
    :param key: the keyring key id jobs use (None: the agents' ``default``).
    :param source: where the settings came from, for log lines.
    :param trusted_agents: the agents whose signed outcomes count (``authz.outcome``): a path (a file of
        ``fstream-ed25519`` lines, or a directory of ``.pub`` files) or the lines inline; None: the local agent's.
    """

    redis_url: str
    namespace: str = DEFAULT_NAMESPACE
    secret_file: str | None = None
    agent_group: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    submitter: str | None = None
    submitter_secret: str | None = field(default=None, repr=False)
    submitter_key_file: str | None = None
    key: str | None = None
    source: str = ""
    trusted_agents: str | None = None

    def trust(self) -> Any:
        """The agents whose outcomes count (``authz.outcome.TrustedAgents``); ``KeyFormatError`` naming the extra."""
        from fstream_provider.authz.ed25519 import KeyFormatError
        from fstream_provider.authz.outcome import TrustedAgents

        try:
            return TrustedAgents.resolve(self.trusted_agents)
        except KeyFormatError as exc:
            raise KeyFormatError(f"{self.source or 'the FStream connection'}: extra 'trusted_agents': {exc}") from None

    def scope_key(self, scope: str) -> str:
        """A new-files scope as its Redis keys name it: ``<submitter>:<scope>`` (issue 40: state no other
        submitter's Redis user may write), or ``scope`` itself without a submitter identity."""
        from fstream_provider.bus.keys import Keys

        return Keys.owned(self.submitter, scope) if self.submitter else scope

    def signer(self) -> Any:
        """The ``authz.signing.Signer`` jobs are signed with; ``ValueError`` naming what is missing."""
        from fstream_provider.authz.signing import Signer

        if not self.submitter or not (self.submitter_secret or self.submitter_key_file):
            raise ValueError(f"{self.source or 'the FStream connection'}: no submitter identity: set the 'submitter' "
                             "extra and its key ('submitter_secret', or 'submitter_key_file'); agents refuse "
                             "unsigned jobs")
        if self.submitter_secret:
            return Signer.from_pem(self.submitter, self.submitter_secret)  # Ed25519 PKCS#8 PEM (or its body)
        return Signer.from_file(self.submitter, self.submitter_key_file)


def settings_from_connection(conn: Any) -> FStreamSettings:
    """Map an Airflow ``Connection`` of type ``fstream`` to :class:`FStreamSettings`.

    Every extra reads ``""``, ``null`` and whitespace as unset (``_text``), so a connection saved by Airflow's form
    with its optional fields empty gets the defaults; so do the host and database.
    """
    extra = conn.extra_dejson or {}
    url = _text(extra.get("url")) or _text(extra.get("redis_url"))
    if not url:
        host = _text(conn.host)
        if not host:
            raise ValueError(f"connection {conn.conn_id!r}: no Redis host (set host/port or the 'url' extra)")
        scheme = "rediss" if _truthy(extra.get("ssl", "false")) else "redis"
        auth = ""
        if conn.login or conn.password:
            auth = f"{quote(conn.login or '', safe='')}:{quote(conn.password or '', safe='')}@"
        db = _text(conn.schema) or "0"
        if not db.isdigit():
            raise ValueError(f"connection {conn.conn_id!r}: schema {db!r} must be a Redis database number")
        url = f"{scheme}://{auth}{host}:{conn.port or 6379}/{db}"
    return FStreamSettings(
        redis_url=url,
        namespace=_text(extra.get("namespace")) or DEFAULT_NAMESPACE,
        secret_file=_text(extra.get("secret_file")),
        agent_group=_text(extra.get("agent_group")),
        tls_cert=_text(extra.get("tls_cert")),
        tls_key=_text(extra.get("tls_key")),
        tls_ca=_text(extra.get("tls_ca")),
        submitter=_text(extra.get("submitter")),
        submitter_secret=_text(extra.get("submitter_secret")),
        submitter_key_file=_text(extra.get("submitter_key_file")),
        key=_text(extra.get("key")),
        source=f"connection {conn.conn_id!r}",
        trusted_agents=_text(extra.get("trusted_agents")),
    )


def missing_connection(conn_id: str) -> AirflowNotFoundException:
    """The error for a connection id that is not defined: names it and says how to define one."""
    return AirflowNotFoundException(
        f"The FStream connection {conn_id!r} is not defined. Define it (Admin → Connections, type "
        f"'FStream', or AIRFLOW_CONN_{conn_id.upper()}='fstream://REDIS_HOST:6379/0?submitter=ID&submitter_key_file=...') or "
        "pass the right fstream_conn_id; tasks never fall back to a private Redis no agent watches.")


class FStreamHook(BaseHook):
    """Submit, follow and cancel FStream jobs on the Redis bus named by an ``fstream`` connection.

    :param fstream_conn_id: the connection id (default ``fstream_default``; one that does not exist is
        an ``AirflowNotFoundException`` at first use).
    """

    conn_name_attr = "fstream_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = "fstream"
    hook_name = "FStream"

    def __init__(self, *, fstream_conn_id: str = DEFAULT_CONN_ID) -> None:
        super().__init__()
        self.fstream_conn_id = fstream_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Relabel the generic connection form for a Redis bus (the provider info's ``ui-field-behaviour``).

        Airflow 3.2+ reads the form from ``get_provider_info`` and calls this only where the FAB provider is
        installed; both come from ``fstream_provider.provider_info`` so they cannot drift apart.
        """
        from fstream_provider.provider_info import UI_FIELD_BEHAVIOUR

        return {
            "hidden_fields": list(UI_FIELD_BEHAVIOUR["hidden-fields"]),
            "relabeling": dict(UI_FIELD_BEHAVIOUR["relabeling"]),
            "placeholders": dict(UI_FIELD_BEHAVIOUR["placeholders"]),
        }

    @cached_property
    def settings(self) -> FStreamSettings:
        try:
            conn = self.get_connection(self.fstream_conn_id)
        except AirflowNotFoundException:
            raise missing_connection(self.fstream_conn_id) from None
        return settings_from_connection(conn)

    @cached_property
    def client(self) -> Any:
        from fstream_provider.bus.client import connect

        return connect(self.settings.redis_url)

    @cached_property
    def keys(self) -> Any:
        from fstream_provider.bus.keys import Keys

        return Keys(self.settings.namespace)

    @cached_property
    def store(self) -> Any:
        from fstream_provider.bus.jobs import JobStore

        try:
            signer = self.settings.signer()
        except ValueError:  # reading jobs needs no identity; submit says what is missing
            signer = None
        store = make_store(JobStore, self.client, self.keys, signer)
        store.trust = self.settings.trust()  # issue 40: a success no trusted agent signed is not done
        return store

    def get_conn(self) -> Any:
        """The blocking ``redis.Redis`` client."""
        return self.client

    def submit(self, spec: "TransferSpec", *, idempotency_key: str) -> tuple[str, bool]:
        """Queue ``spec``; the same key returns the existing job instead of a second one."""
        from fstream_provider.model.spec_fields import KEY_FILE_FIELDS

        s = self.settings
        named = [f for f in KEY_FILE_FIELDS if getattr(s, f)]
        if named:
            raise ValueError(f"{s.source}: extra(s) {', '.join(named)} name key files on the agents' hosts, which "
                             "jobs may not do (issue 32): remove them and set 'key' to the id of the agents' keyring "
                             "key instead")
        named = [f for f in KEY_FILE_FIELDS if getattr(spec, f)]
        if named:
            raise ValueError(f"transfer spec: {', '.join(named)} name key files on the agent's host; jobs refer to "
                             "keys by id (key=...)")
        if spec.key is None and s.key:
            spec = spec.replace(key=s.key)
        if self.store.signer is None:
            s.signer()  # raises, naming the missing extras
        return self.store.submit(spec, idempotency_key=idempotency_key)

    def jobs_under_keys(self, idempotency_keys: list[str]) -> list[str | None]:
        """The job id each idempotency key points at (None where unknown or expired), in one ``MGET``."""
        if not idempotency_keys:
            return []
        scoped = [self.store.scoped_idempotency(k) or k for k in idempotency_keys]
        return list(self.client.mget([self.keys.idempotency(k) for k in scoped]))

    def get_job(self, job_id: str) -> Any:
        return self.store.get(job_id)

    def events(self, job_id: str, *, after: str = "0-0", block_ms: int | None = None,
               count: int = 100) -> list[tuple[str, dict[str, Any]]]:
        return self.store.events(job_id, after=after, block_ms=block_ms, count=count)

    def all_events(self, job_id: str, *, after: str = "0-0") -> list[tuple[str, dict[str, Any]]]:
        """Every event of a job from ``after`` on (pages through the stream)."""
        return self.store.all_events(job_id, after=after)

    def cancel(self, job_id: str, reason: str) -> Any:
        return self.store.cancel(job_id, reason)

    def test_connection(self) -> tuple[bool, str]:
        """PING the Redis bus and count live agents."""
        from fstream_provider.bus.client import describe

        try:
            s = self.settings
            self.client.ping()
            agents = self.client.smembers(self.keys.agents())
            alive = sum(1 for a in agents if self.client.exists(self.keys.agent(a)))
            group = f", agent group {s.agent_group!r}" if s.agent_group else ""
            return True, (f"Redis {describe(s.redis_url)} answered PING (namespace {s.namespace!r}{group}); "
                          f"{alive} live agent(s)")
        except Exception as exc:  # test_connection reports, it does not raise
            return False, f"FStream connection {self.fstream_conn_id!r}: {type(exc).__name__}: {exc}"

    def close(self) -> None:
        if "client" in self.__dict__:
            self.client.close()
            del self.__dict__["client"]


def make_store(store_cls: Any, client: Any, keys: Any, signer: Any = None) -> Any:
    """Build a ``JobStore`` on ``client`` in the namespace of ``keys`` that signs as ``signer``."""
    return store_cls(client, keys=keys, signer=signer)
