"""``TunerOptions``: the transfer options with no operator parameter of their own, checked by key and value."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from fstream_provider.model.spec import BLOCK_SIZE_MAX, BLOCK_SIZE_MIN, TCP_BUFFER_MAX, TCP_BUFFER_MIN
from fstream_provider.model.units import parse_duration, parse_size
from fstream_provider.model.validation import SpecError, explain


def _duration(v: Any) -> float:
    try:
        s = parse_duration(v)
    except (TypeError, ValueError):
        raise ValueError(f"{v!r}: expected a duration such as 500ms, 10s or 2m") from None
    if s <= 0:
        raise ValueError(f"{v!r}: expected a positive duration such as 500ms, 10s or 2m")
    return s


def _size_between(low: int, high: int, accepted: str) -> Any:
    """A validator: a size (``4MiB`` or bytes) within [low, high]; the error says ``accepted``."""
    def check(v: Any) -> int:
        try:
            n = parse_size(v) if isinstance(v, (str, int)) and not isinstance(v, bool) else None
        except ValueError:
            n = None
        if n is None or not low <= n <= high:
            raise ValueError(f"{v!r}: expected a size {accepted} (or bytes)")
        return n
    return check


_block_size = _size_between(BLOCK_SIZE_MIN, BLOCK_SIZE_MAX, "between 4KiB and 64MiB such as 1MiB or 4MiB")
_tcp_buffer = _size_between(TCP_BUFFER_MIN, TCP_BUFFER_MAX, "between 4KiB and 1GiB such as 1MiB or 32MiB")


Duration = Annotated[float, BeforeValidator(_duration)]
TcpBuffer = Annotated[int, BeforeValidator(_tcp_buffer)]
BlockSize = Annotated[int, BeforeValidator(_block_size)]


class TunerOptions(BaseModel):
    """Options an operator passes as ``tuner_options``; every key is optional, unknown keys are refused.

    :param profile_interval: the profiling interval (``10s``; default: the tuner's own); ``fixed`` and ``globus``
        refuse it (``registry.check_options``).
    :param variant: ``fstream``: ``thesis``, ``default`` or either with switches (``thesis+jump``); ``harp``:
        ``paper``, ``default`` or either with switches (``paper+observed-grid``).
    :param utilisation: ``fstream``: the share of the bandwidth online profiling aims for (0.05-1).
    :param band: ``fstream``: accepted distance from that target (0.01-0.5).
    :param sample_interval: how often an interval record is taken (``1s``).
    :param block_size: bytes per data block on a stream (``4MiB`` or a number of bytes).
    :param tcp_buffer: the TCP buffer cap per stream the tuners assume (``32MiB``; default: the sending
        host's kernel maximum).
    :param encrypt: seal data and control frames (needs the shared secret).
    :param pool: share the path's stream pool with other agents (ADAPT): never open more streams than the
        pool grants (``fstream pools``).
    :param tls_cert: client certificate (mutual TLS).
    :param tls_key: client key.
    :param tls_ca: CA bundle that signed the receiver's certificate.
    :param label: free text shown in logs (default: the Airflow task).
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    profile_interval: Duration | None = None
    sample_interval: Duration | None = None
    block_size: BlockSize | None = None
    tcp_buffer: TcpBuffer | None = None
    encrypt: bool | None = None
    pool: bool | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    label: str | None = None
    variant: str | None = None
    utilisation: float | None = None
    band: float | None = None

    @classmethod
    def check(cls, options: Mapping[str, Any] | None, *, own_parameters: Iterable[str] = ()) -> "TunerOptions":
        """Validate ``options``; a ``SpecError`` names each bad key, its value and what is accepted.

        :param options: the ``tuner_options`` mapping (None: no options).
        :param own_parameters: keys that must be given as their own parameter, not in ``tuner_options``.
        """
        if options is None:
            return cls()
        if not isinstance(options, Mapping):
            raise SpecError(f"tuner_options {options!r}: expected a mapping of option name to value")
        own = sorted(set(options) & set(own_parameters))
        if own:
            verb = "has its own parameter" if len(own) == 1 else "have their own parameters"
            raise SpecError(f"tuner_options: {', '.join(own)} {verb}; pass {', '.join(f'{k}=' for k in own)} "
                            f"instead (tuner_options accepts: {', '.join(cls.model_fields)})")
        try:
            return cls.model_validate(dict(options))
        except ValidationError as exc:
            raise SpecError(explain(exc, "tuner_options", cls.model_fields, noun="key")) from None

    def as_options(self) -> dict[str, Any]:
        """The given options, for ``TransferSpec.from_options``."""
        return self.model_dump(exclude_none=True)

