"""Parse and format the rates and durations users type (``800Mbps``, ``1Gbit``, ``100MB/s``, ``40ms``)."""

from __future__ import annotations

import re
from typing import Any

_RATE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z/]*)\s*$")
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_BIN_PREFIX = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}

_DUR_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ns|us|µs|ms|s|sec|m|min|h|d)?\s*$")
_DUR_UNIT = {None: 1.0, "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0,
             "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_rate(text: str | float | int) -> float:
    """Return a rate in bits per second.

    Bits: ``800Mbps``, ``1Gbit``, ``1gbit/s``, ``500kb/s`` (lower-case ``b``).
    Bytes: ``100MB/s``, ``100MBps``, ``1GiB/s`` (upper-case ``B``). A bare number is bits/s.
    """
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(f"rate {text!r}: must not be negative")
        return float(text)
    m = _RATE_RE.match(str(text))
    if not m:
        raise ValueError(f"rate {text!r}: expected a number with a unit such as 800Mbps, 1Gbit or 100MB/s")
    value, unit = float(m.group(1)), m.group(2)
    if unit == "":
        return value
    u = unit.replace("/s", "ps") if unit.endswith("/s") else unit
    # split prefix and base
    mm = re.match(r"^([kKmMgGtT]i?)?(bps|bit|bits|bitps|Bps|B|byte|bytes|b)$", u)
    if not mm:
        raise ValueError(f"rate {text!r}: unknown unit {unit!r} (use bps, bit, B/s with k/M/G/T prefixes)")
    prefix, base = (mm.group(1) or ""), mm.group(2)
    mult = _BIN_PREFIX[prefix.lower()] if prefix.lower().endswith("i") else _PREFIX[prefix.lower()]
    is_bytes = base in ("Bps", "B", "byte", "bytes")
    return value * mult * (8.0 if is_bytes else 1.0)


def parse_duration(text: str | float | int) -> float:
    """Return a duration in seconds: ``40ms``, ``20s``, ``2m``, ``7d``, ``1.5`` (seconds)."""
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(f"duration {text!r}: must not be negative")
        return float(text)
    m = _DUR_RE.match(str(text))
    if not m:
        raise ValueError(f"duration {text!r}: expected a number with a unit such as 40ms, 20s or 2m")
    return float(m.group(1)) * _DUR_UNIT[m.group(2)]


def parse_until(text: Any, start: float | None = None, what: str = "until") -> float:
    """A stop time as UNIX seconds: an ISO-8601 time (``2026-11-25T18:00``, UTC unless it names a
    zone) or a duration (``30m``, ``2h``, a ``timedelta``) from ``start``, the time it counts from (UNIX
    seconds: a DAG run's start for an operator's deadline; now when None)."""
    import datetime as dt
    import time

    if isinstance(text, dt.timedelta):
        span = text.total_seconds()
    else:
        try:
            span = parse_duration(text)
        except ValueError:
            try:
                return iso_to_unix(text)
            except ValueError:
                raise ValueError(f"{what} {text!r}: expected an ISO-8601 time such as 2026-11-25T18:00 "
                                 f"or a duration from {'now' if start is None else 'the start'} such as 30m") from None
    return (start if start is not None else time.time()) + span


def iso_to_unix(text: str) -> float:
    """An ISO-8601 time (UTC unless it names a zone) as UNIX seconds; ``ValueError`` if it is not one."""
    import datetime as dt

    d = dt.datetime.fromisoformat(str(text))
    return (d if d.tzinfo else d.replace(tzinfo=dt.timezone.utc)).timestamp()


def parse_size(text: str | int) -> int:
    """Return a size in bytes: ``64KiB``, ``1MiB``, ``4M``, ``1000``."""
    if isinstance(text, int):
        return text
    m = re.match(r"^\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]?)(i?)([bB]?)\s*$", str(text))
    if not m:
        raise ValueError(f"size {text!r}: expected a number with a unit such as 64KiB or 1MiB")
    value, p = float(m.group(1)), m.group(2).lower()
    if not p:
        return int(value)
    mult = _BIN_PREFIX[p + "i"]  # sizes are binary: 4M == 4MiB
    return int(value * mult)


def format_rate(bps: float) -> str:
    """``1.23 Gbit/s`` style."""
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.2f} {unit}"
    return f"{bps:.0f} bit/s"


def format_bytes(n: float) -> str:
    """``1.5 GiB`` style."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"
