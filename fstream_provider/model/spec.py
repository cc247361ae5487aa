"""The transfer specification: what a job asks for, shared by the CLI, the agent and Airflow.

A ``TransferSpec`` round-trips through JSON (it is stored on the Redis job) and validates
its input with errors that name the field and the reason.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any
from urllib.parse import unquote, urlparse

from fstream_provider.model.units import parse_duration, parse_rate

TUNERS = ("fixed", "static", "dynamic", "fstream", "harp", "globus", "adaptivecc")
PRIORITY_CLASSES = ("interactive", "batch")


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


@dataclass
class TransferSpec:
    """Everything a transfer needs; all rates in bits/s, durations in seconds.

    :param sources: files, directories or globs on the source host.
    :param destination: ``fstream://HOST:PORT/DEST/PATH``.
    :param tuner: one of ``TUNERS``.
    :param cc: channels (fixed tuner, or starting point).
    :param p: TCP streams per channel.
    :param pp: files queued ahead per channel.
    :param max_cc: upper bound on channels for every tuner.
    :param bandwidth_bps: known path bandwidth (else measured/assumed).
    :param rtt_s: known round-trip time (else measured at connect).
    :param target_throughput_bps: QoS target; enables the QoS controller.
    :param profile_interval_s: how often the tuner is consulted.
    :param sample_interval_s: how often an interval record is taken.
    :param watch: keep scanning the sources and ship new files.
    :param interval_s: scan interval in watch mode.
    :param idle_exit_s: in watch mode, stop after this long with nothing new.
    :param until: in watch mode, stop at this UNIX time (seconds), if set.
    :param verify: end-to-end checksum per file.
    :param secret_file: shared secret for HMAC authentication.
    :param tls_cert: client certificate (mutual TLS).
    :param tls_key: client key.
    :param tls_ca: CA bundle that signed the receiver's certificate.
    :param encrypt: seal data blocks and control bodies with ChaCha20-Poly1305 (shared-secret mode).
    :param priority_class: ``interactive`` or ``batch`` (for the multi-transfer scheduler).
    :param block_size: bytes per data block on a stream.
    :param label: free text shown in logs.
    """

    sources: list[str]
    destination: str
    tuner: str = "fstream"
    cc: int | None = None
    p: int | None = None
    pp: int | None = None
    max_cc: int = 32
    bandwidth_bps: float | None = None
    rtt_s: float | None = None
    target_throughput_bps: float | None = None
    profile_interval_s: float = 10.0
    sample_interval_s: float = 1.0
    watch: bool = False
    interval_s: float = 2.0
    idle_exit_s: float | None = None
    until: float | None = None
    verify: bool = True
    secret_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    encrypt: bool = False
    priority_class: str = "batch"
    block_size: int = 4 * 2**20
    label: str = ""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if isinstance(self.sources, str):
            self.sources = [self.sources]
        if not self.sources:
            raise ValueError("sources: at least one source path is required")
        for s in self.sources:
            if not isinstance(s, str) or not s or "\x00" in s:
                raise ValueError(f"sources: {s!r} is not a valid path")
        Destination.parse(self.destination)
        if self.tuner not in TUNERS:
            raise ValueError(f"tuner {self.tuner!r}: must be one of {', '.join(TUNERS)}")
        for name in ("cc", "p", "pp", "max_cc"):
            v = getattr(self, name)
            if v is None:
                continue
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"{name} {v!r}: must be an integer")
            low = 0 if name == "pp" else 1
            if v < low or v > 1024:
                raise ValueError(f"{name} {v}: must be between {low} and 1024")
        for name in ("bandwidth_bps", "rtt_s", "target_throughput_bps", "idle_exit_s"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or v <= 0):
                raise ValueError(f"{name} {v!r}: must be a positive number")
        for name in ("profile_interval_s", "sample_interval_s", "interval_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v <= 0:
                raise ValueError(f"{name} {v!r}: must be a positive number of seconds")
        if self.priority_class not in PRIORITY_CLASSES:
            raise ValueError(f"priority_class {self.priority_class!r}: must be interactive or batch")
        if not isinstance(self.encrypt, bool):
            raise ValueError(f"encrypt {self.encrypt!r}: must be true or false")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key must be given together")
        if self.block_size < 4096 or self.block_size > 64 * 2**20:
            raise ValueError(f"block_size {self.block_size}: must be between 4 KiB and 64 MiB")

    @property
    def dest(self) -> Destination:
        return Destination.parse(self.destination)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TransferSpec":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"transfer spec: unknown field(s) {', '.join(unknown)}")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> "TransferSpec":
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_options(cls, sources: list[str], destination: str, **opts: Any) -> "TransferSpec":
        """Build from user-facing options: rates and durations may be strings (``1Gbit``, ``40ms``)."""
        conv: dict[str, Any] = {}
        rate_keys = {"bandwidth": "bandwidth_bps", "target_throughput": "target_throughput_bps"}
        dur_keys = {"rtt": "rtt_s", "profile_interval": "profile_interval_s", "interval": "interval_s",
                    "idle_exit": "idle_exit_s", "sample_interval": "sample_interval_s"}
        for k, v in opts.items():
            if v is None:
                continue
            if k in rate_keys:
                conv[rate_keys[k]] = parse_rate(v)
            elif k in dur_keys:
                conv[dur_keys[k]] = parse_duration(v)
            else:
                conv[k] = v
        return cls.from_dict({"sources": list(sources), "destination": destination, **conv})
