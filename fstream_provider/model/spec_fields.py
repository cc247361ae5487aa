"""The transfer spec's fields and rules in plain Python: declared once, used twice (issue 29).

``SpecFields`` declares every field of the transfer spec (its type and default) and ``FIELD_RULES`` /
``check_together`` say what each accepts. The pydantic model ``spec.TransferSpec`` inherits the fields and
calls the rules from its validators; ``spec_plain.PlainSpec`` checks the same fields with the same rules
without importing pydantic, for ``fstream send``'s start-up (pydantic's import was a third of a one-file
send's CPU). Nothing here imports pydantic.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import unquote, urlparse

from fstream_provider.model.keyfile import KEY_ID
from fstream_provider.model.units import parse_duration, parse_rate, parse_size, parse_until
from fstream_provider.model.validation import SpecError
from fstream_provider.tuning.registry import DEFAULT_TUNER, check_options, tuner_info, tuner_variant

if TYPE_CHECKING:
    from fstream_provider.tuning.variants import FStreamVariant, HarpVariant

BLOCK_SIZE_MIN = 4096
BLOCK_SIZE_MAX = 64 * 2**20
TCP_BUFFER_MIN, TCP_BUFFER_MAX = 4096, 2**30
# Fields older versions wrote into the JSON on Redis and nothing reads any more: dropped when
# a stored spec is read, refused when given. (``priority_class`` was one until the SEAL/STEAL
# scheduler read it again: issue #11.)
RETIRED_FIELDS: tuple[str, ...] = ()
PRIORITY_CLASSES = ("interactive", "batch")
DEADLINE_RISK = ("warn", "fail")  # what an infeasible deadline does: a WARNING (and a job event), or stop
# User-facing option names (``from_options``) that are converted into a spec field.
RATE_OPTIONS = {"bandwidth": "bandwidth_bps", "target_throughput": "target_throughput_bps"}
DURATION_OPTIONS = {"rtt": "rtt_s", "profile_interval": "profile_interval_s", "interval": "interval_s",
                    "idle_exit": "idle_exit_s", "sample_interval": "sample_interval_s",
                    "connect_timeout": "connect_timeout_s", "retry_for": "retry_for_s"}
CONNECT_TIMEOUT_S = 10.0  # one connection attempt: TCP connect, TLS and the handshake (issue 30, defect 1)
# The fields that name key files on the sending host (the spec's, and the same names in a policy's key entry and
# an Airflow connection's extras). A job submitted through the bus names none: it names a key by id (issue 32).
KEY_FILE_FIELDS = ("secret_file", "tls_cert", "tls_key", "tls_ca")
# Fields left out of the JSON while at their default, so agents older than the field still take the job.
OPTIONAL_FIELDS = {"connect_timeout_s": CONNECT_TIMEOUT_S, "max_attempts": None, "retry_for_s": None}


@dataclass(frozen=True)
class Destination:
    """A parsed ``fstream://HOST:PORT/DEST/PATH`` URL."""

    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, url: str) -> "Destination":
        u = urlparse(url)
        if u.scheme != "fstream":
            raise ValueError(f"destination {url!r}: scheme must be fstream:// (got {u.scheme or 'none'!r})")
        if not u.hostname:
            raise ValueError(f"destination {url!r}: missing host")
        try:
            port = u.port
        except ValueError as exc:
            raise ValueError(f"destination {url!r}: bad port ({exc})") from None
        if not port:
            raise ValueError(f"destination {url!r}: missing port (fstream://HOST:PORT/PATH)")
        path = unquote(u.path or "/").lstrip("/")
        return cls(host=u.hostname, port=port, path=path)

    def url(self) -> str:
        return f"fstream://{self.host}:{self.port}/{self.path}"


class SpecFields:
    """Everything a transfer needs; all rates in bits/s, durations in seconds, sizes in bytes.

    The fields of ``spec.TransferSpec`` (which inherits them) and of ``spec_plain.PlainSpec``.

    :param sources: files, directories or globs on the source host.
    :param destination: ``fstream://HOST:PORT/DEST/PATH``.
    :param tuner: a built tuner (``fstream_provider.tuning.registry.TUNER_NAMES``).
    :param cc: channels: the layout of ``fixed``, the starting point of an adaptive tuner,
        refused by the others (``registry.check_options``).
    :param p: TCP streams per channel (likewise).
    :param pp: files queued ahead per channel (likewise).
    :param max_cc: upper bound on channels for every tuner.
    :param bandwidth_bps: known path bandwidth (else measured/assumed).
    :param rtt_s: known round-trip time (else measured at connect).
    :param target_throughput_bps: QoS target (tuners that hold one: ``fstream``).
    :param variant: ``fstream``: the thesis' algorithms as written (``thesis``) or ours (``default``), with
        switches added or removed (``thesis+jump``); ``harp``: the paper as written (``paper``) or ours
        (``default``, ``paper+observed-grid``); ``fstream_provider.tuning.variants``.
    :param utilisation: ``fstream`` only: the share of the bandwidth online profiling aims for (Alg. 2's p;
        default 0.9, thesis 0.8).
    :param band: ``fstream`` only: accepted distance from that target (default and thesis 0.15).
    :param profile_interval_s: the profiling interval: how often the tuner decides (``fstream``) and is
        consulted at least (None: the tuner's own; fstream ``max(2 s, 50 RTT)``, its thesis variant and
        the other tuners 10 s); refused by tuners it would not change (``fixed``, ``globus``: ``registry.check_options``).
    :param sample_interval_s: how often an interval record is taken.
    :param watch: keep scanning the sources and ship new files.
    :param interval_s: scan interval in watch mode.
    :param idle_exit_s: in watch mode, stop after this long with nothing new.
    :param until: in watch mode, stop at this UNIX time (seconds), if set.
    :param verify: end-to-end checksum per file.
    :param public_checksum: also report an unkeyed ``xxh3_128`` digest of each landed file, from the same
        read pass as the (keyed) verifying one, for manifests and flow records that others check
        (``fstream send --manifest``, ``channel.transfer()``); TLS-only transfers report theirs anyway.
    :param key: the id of the key (shared secret or TLS set) to authenticate to the receiver with: the
        keyring of the agent that runs the job, and the key the receiver knows by that id (None: ``default``).
        Jobs refer to keys only by id; a job naming a ``secret_file`` or TLS file is refused by agents.
    :param secret_file: shared secret for HMAC authentication (``fstream send``; an agent uses its keyring).
    :param tls_cert: client certificate (mutual TLS).
    :param tls_key: client key.
    :param tls_ca: CA bundle that signed the receiver's certificate.
    :param encrypt: seal data blocks and control bodies with ChaCha20-Poly1305 (shared-secret mode).
    :param block_size: bytes per data block on a stream.
    :param tcp_buffer: the TCP buffer cap per stream the tuners assume, in bytes (default: the kernel's
        ``net.ipv4.tcp_wmem`` maximum on the sending host); give it when the path's real cap is elsewhere.
    :param label: free text shown in logs.
    :param priority_class: ``interactive`` or ``batch``: how the agents' STEAL scheduler treats the job
        (batch runs on the bandwidth interactive jobs leave and never preempts; ``docs/scheduling.md``).
    :param deadline: UNIX seconds by which everything known should have landed: the tuner's QoS target is
        steered to it (``tuning.deadline``; ``from_options`` also takes an ISO-8601 time or a duration from now).
    :param on_deadline_risk: ``warn`` (a WARNING and a ``deadline`` event when even the path's best rate cannot
        meet it) or ``fail`` (the transfer stops then, as failed).
    :param connect_timeout_s: the time one connection attempt may take (TCP connect, TLS, handshake).
    :param max_attempts: session tries in one outage (receiver unreachable, connection lost, stall) before the
        transfer gives up as retryable (exit 75); None: 5 for a plain send, no limit for a watch stream.
    :param retry_for_s: how long one outage may be retried before giving up (None: no time limit). A watch
        stream given neither retries for as long as it runs (``transfer_agent.sending.session_retry``).
    """

    sources: list[str]
    destination: str
    tuner: str = DEFAULT_TUNER
    cc: int | None = None
    p: int | None = None
    pp: int | None = None
    max_cc: int = 32
    bandwidth_bps: float | None = None
    rtt_s: float | None = None
    target_throughput_bps: float | None = None
    variant: str | None = None
    utilisation: float | None = None
    band: float | None = None
    profile_interval_s: float | None = None
    sample_interval_s: float = 1.0
    watch: bool = False
    interval_s: float = 2.0
    idle_exit_s: float | None = None
    until: float | None = None
    verify: bool = True
    public_checksum: bool = False
    key: str | None = None
    secret_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    encrypt: bool = False
    pool: bool = False  # hold a grant from the (source, destination) stream pool in Redis (ADAPT, issue #11)
    block_size: int = 4 * 2**20
    tcp_buffer: int | None = None
    label: str = ""
    priority_class: str = "interactive"
    deadline: float | None = None  # UNIX seconds: a QoS target steered to land everything by then (issue 27)
    on_deadline_risk: str = "warn"
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    max_attempts: int | None = None
    retry_for_s: float | None = None

    def tuner_variant(self) -> FStreamVariant | HarpVariant | None:
        """The variant the tuner runs (``fstream``: with p, band and the profiling interval if given; ``harp``);
        None for tuners without variants. Raises ``ValueError`` for a variant, p or band the tuner cannot take."""
        return tuner_variant(self.tuner, self.variant, utilisation=self.utilisation, band=self.band,
                             interval_s=self.profile_interval_s)

    @property
    def dest(self) -> Destination:
        return Destination.parse(self.destination)

    def to_dict(self) -> dict[str, Any]:
        """The fields as stored (``stored_form``)."""
        raise NotImplementedError

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


# -- the rules: each takes the value (already of the field's type) and the field's name ------------------
def normalise_sources(v: Any) -> Any:
    """``sources`` before its type is checked: one path becomes a list; empty lists and bad paths are refused."""
    v = [v] if isinstance(v, str) else v
    if isinstance(v, (list, tuple)) and not v:
        raise ValueError("sources: at least one source path is required")
    for s in v if isinstance(v, (list, tuple)) else ():
        if not isinstance(s, str) or not s or "\x00" in s:
            raise ValueError(f"sources: {s!r} is not a valid path")
    return list(v) if isinstance(v, tuple) else v


def _destination(v: str, name: str) -> str:
    Destination.parse(v)
    return v


def _key(v: str | None, name: str) -> str | None:
    if v is not None and not KEY_ID.fullmatch(v):
        raise ValueError(f"key {v!r}: a key id is 1-64 letters, digits, '.', '_' or '-'")
    return v


def _tuner(v: str, name: str) -> str:
    tuner_info(v)
    return v


def _layout(v: int | None, name: str) -> int | None:
    low = 0 if name == "pp" else 1
    if v is not None and not low <= v <= 1024:
        raise ValueError(f"{name} {v}: must be between {low} and 1024")
    return v


def _positive(v: float | None, name: str) -> float | None:
    if v is not None and v <= 0:
        unit = " of seconds" if name.endswith("_s") else ""
        raise ValueError(f"{name} {v!r}: must be a positive number{unit}")
    return v


def _max_attempts(v: int | None, name: str) -> int | None:
    if v is not None and not 1 <= v <= 1_000_000:
        raise ValueError(f"max_attempts {v}: must be between 1 and 1000000 (tries in all, the first included)")
    return v


def _one_of(accepted: tuple[str, ...]) -> Callable[[str, str], str]:
    def check(v: str, name: str) -> str:
        if v not in accepted:
            raise ValueError(f"{name} {v!r}: must be one of {', '.join(accepted)}")
        return v
    return check


def _block_size(v: int, name: str) -> int:
    if not BLOCK_SIZE_MIN <= v <= BLOCK_SIZE_MAX:
        raise ValueError(f"block_size {v}: must be between 4 KiB and 64 MiB")
    return v


def _tcp_buffer(v: int | None, name: str) -> int | None:
    if v is not None and not TCP_BUFFER_MIN <= v <= TCP_BUFFER_MAX:
        raise ValueError(f"tcp_buffer {v}: must be between 4 KiB and 1 GiB")
    return v


# What a given value of a field becomes before its type is checked.
BEFORE_RULES: dict[str, Callable[[Any], Any]] = {"sources": normalise_sources}
# What each field accepts beyond its type (run after the type is checked; given values only, as pydantic does).
FIELD_RULES: dict[str, Callable[[Any, str], Any]] = {
    "destination": _destination, "key": _key, "tuner": _tuner,
    **dict.fromkeys(("cc", "p", "pp", "max_cc"), _layout),
    **dict.fromkeys(("bandwidth_bps", "rtt_s", "target_throughput_bps", "idle_exit_s", "profile_interval_s",
                     "sample_interval_s", "interval_s", "connect_timeout_s", "retry_for_s"), _positive),
    "max_attempts": _max_attempts, "on_deadline_risk": _one_of(DEADLINE_RISK),
    "priority_class": _one_of(PRIORITY_CLASSES), "block_size": _block_size, "tcp_buffer": _tcp_buffer,
}


def check_together(spec: SpecFields) -> None:
    """The rules between fields, once every field passed its own (``ValueError`` names what is wrong)."""
    if bool(spec.tls_cert) != bool(spec.tls_key):
        raise ValueError("tls_cert and tls_key must be given together")
    if spec.cc is not None and spec.cc > spec.max_cc:
        raise ValueError(f"cc {spec.cc}: more than max_cc {spec.max_cc}")
    check_options(spec.tuner, cc=spec.cc, p=spec.p, pp=spec.pp, target_throughput_bps=spec.target_throughput_bps,
                  profile_interval=spec.profile_interval_s is not None)
    if spec.deadline is not None:
        if spec.target_throughput_bps is not None:
            raise ValueError("deadline and target_throughput: give one (a deadline sets the target itself)")
        if not tuner_info(spec.tuner).holds_target:
            raise ValueError(f"deadline: tuner {spec.tuner!r} cannot hold a target; a deadline steers one "
                             "(use tuner fstream)")
    spec.tuner_variant()


def stored_form(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (every field) as a spec is stored: a job without a deadline leaves the deadline's fields out, so
    agents older than issue 27 (which refuse unknown fields) still take it; likewise ``OPTIONAL_FIELDS`` at their
    defaults (issue 30)."""
    if data["deadline"] is None and data["on_deadline_risk"] == "warn":
        del data["deadline"], data["on_deadline_risk"]
    for name, default in OPTIONAL_FIELDS.items():
        if data[name] == default:
            del data[name]
    return data


def fields_from_options(sources: list[str], destination: str, opts: dict[str, Any]) -> dict[str, Any]:
    """The spec's fields from user-facing options: rates, durations and sizes may be strings (``1Gbit``, ``40ms``,
    ``4MiB``). Each option is a spec field or one of ``RATE_OPTIONS`` / ``DURATION_OPTIONS``; None means "not
    given". A value that does not parse is a ``SpecError`` naming the option."""
    conv: dict[str, Any] = {}
    for k, v in opts.items():
        if v is None:
            continue
        try:
            if k in RATE_OPTIONS:
                conv[RATE_OPTIONS[k]] = parse_rate(v)
            elif k in DURATION_OPTIONS:
                conv[DURATION_OPTIONS[k]] = parse_duration(v)
            elif k == "deadline" and not isinstance(v, (int, float)):
                conv[k] = parse_until(str(v), what="deadline")
            elif k in ("block_size", "tcp_buffer") and isinstance(v, str):
                conv[k] = parse_size(v)
            else:
                conv[k] = v
        except ValueError as exc:
            raise SpecError(f"transfer spec: {k}: {exc}") from None
    return {"sources": list(sources), "destination": destination, **conv}
