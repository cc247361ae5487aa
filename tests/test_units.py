"""Rates, durations and sizes parse the way users type them, and bad input names itself."""

from __future__ import annotations

import pytest

from fstream_provider.model.units import format_rate, parse_duration, parse_rate, parse_size


@pytest.mark.parametrize("text,bps", [
    ("800Mbps", 800e6), ("1Gbit", 1e9), ("1gbit/s", 1e9), ("100MB/s", 800e6), ("100MBps", 800e6),
    ("1GiB/s", 8 * 2**30), ("500kb/s", 500e3), ("1000", 1000.0), ("2.5Gbps", 2.5e9),
])
def test_parse_rate(text: str, bps: float) -> None:
    assert parse_rate(text) == pytest.approx(bps)


@pytest.mark.parametrize("text,s", [("40ms", 0.04), ("20s", 20.0), ("2m", 120.0), ("1.5", 1.5), ("250us", 250e-6)])
def test_parse_duration(text: str, s: float) -> None:
    assert parse_duration(text) == pytest.approx(s)


@pytest.mark.parametrize("text", ["fast", "10 furlongs", "", "-5Mbps", "1Xbps"])
def test_bad_rate_names_input(text: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_rate(text)
    assert repr(text) in str(e.value)


def test_bad_duration_names_input() -> None:
    with pytest.raises(ValueError, match="'soon'"):
        parse_duration("soon")


def test_sizes_are_binary() -> None:
    assert parse_size("64KiB") == 65536
    assert parse_size("4M") == 4 * 2**20
    assert parse_size(1000) == 1000


def test_format_rate() -> None:
    assert format_rate(1.5e9) == "1.50 Gbit/s"


def test_parse_until_counts_a_duration_from_the_start_it_is_given() -> None:
    """Issue 42: one parser of "when" for the command line, the spec and the operator's deadline (which counts a
    duration from the DAG run's start): ``parse_until`` takes that start, and a ``timedelta`` as a duration."""
    import datetime as dt
    import time

    from fstream_provider.model.units import parse_until
    from fstream_provider.operators._arguments import deadline_time

    assert parse_until("2h", start=1000.0) == 8200.0
    assert parse_until(dt.timedelta(minutes=30), start=1000.0) == 2800.0
    assert parse_until(dt.timedelta(minutes=-1), start=1000.0) == 940.0  # already past: a time, said late later
    assert parse_until("2026-11-26T18:00", start=1000.0) == 1795716000.0  # a time is a time, whatever the start
    before = time.time()
    assert before + 60 <= parse_until("1m") <= time.time() + 60  # no start: from now
    with pytest.raises(ValueError, match="deadline 'soon': expected an ISO-8601 time .* a duration from the start"):
        parse_until("soon", start=1000.0, what="deadline")
    run = {"dag_run": type("Run", (), {"start_date": dt.datetime.fromtimestamp(1000.0, dt.timezone.utc)})()}
    for given in ("2h", "90m", dt.timedelta(minutes=30), "2026-11-26T18:00"):
        assert deadline_time(given, run) == parse_until(given, start=1000.0), given
