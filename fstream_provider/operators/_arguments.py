"""The transfer operator's arguments: sources from any payload, rendered values converted, known values checked early.

Airflow renders ``template_fields`` just before ``execute``, so a templated ``p="{{ params.p }}"`` arrives as
the string ``"3"``: these helpers convert it and name the argument when it is wrong. At DAG parse the same
checks run on every value that is already known (not a template), so a typo fails the parse, not the run.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from airflow.sdk.exceptions import AirflowException

from fstream_provider.model.units import iso_to_unix, parse_duration, parse_rate


def normalize_sources(sources: Any) -> list[str]:
    """Paths from a string, a list, or a sensor/trigger payload (``{"files": [...]}``), flattened."""
    if sources is None:
        return []
    if isinstance(sources, str):
        return [sources] if sources.strip() else []
    if isinstance(sources, dict):
        return normalize_sources(sources.get("files"))
    out: list[str] = []
    for s in sources:
        out.extend(normalize_sources(s))
    return out


def to_unix_time(until: Any) -> float | None:
    """``until`` as UNIX seconds: a datetime, an ISO-8601 string, or a number."""
    if until in (None, ""):
        return None
    if isinstance(until, (int, float)):
        return float(until)
    if isinstance(until, dt.datetime):
        return (until if until.tzinfo else until.replace(tzinfo=dt.timezone.utc)).timestamp()
    try:
        return float(until)
    except (TypeError, ValueError):
        pass
    try:
        return iso_to_unix(until)
    except ValueError:
        raise ValueError(f"until {until!r}: expected a datetime, an ISO-8601 string or UNIX seconds") from None


def deadline_time(deadline: Any, context: Any = None) -> float | None:
    """``deadline`` as UNIX seconds: a datetime, ISO-8601 string or UNIX seconds is absolute; a duration
    (``timedelta``, ``"2h"``, ``"90m"``) counts from the DAG run's start (now when there is no run)."""
    if deadline in (None, ""):
        return None
    span = None
    if isinstance(deadline, dt.timedelta):
        span = deadline.total_seconds()
    elif isinstance(deadline, str):
        try:
            span = parse_duration(deadline)
        except ValueError:
            span = None
    if span is None:
        try:
            return to_unix_time(deadline)
        except ValueError:
            raise ValueError(f"deadline {deadline!r}: expected a datetime, an ISO-8601 string, UNIX seconds, or a "
                             "duration from the run's start (timedelta or a string such as 2h)") from None
    run = context.get("dag_run") if context is not None else None
    start = getattr(run, "start_date", None) or getattr(run, "logical_date", None)
    base = start.timestamp() if isinstance(start, dt.datetime) else time.time()
    return base + span


def rendered_int(task_id: str, name: str, value: Any) -> int | None:
    """An integer option after rendering (templates give strings): None stays None, anything else must be an int."""
    if value in (None, "", "None"):
        return None
    if isinstance(value, bool):
        raise AirflowException(f"{task_id}: {name}={value!r} must be an integer")
    try:
        return int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise AirflowException(f"{task_id}: {name}={value!r} must be an integer (after rendering)") from None


def rendered_bool(task_id: str, name: str, value: Any) -> bool:
    """A boolean option after rendering: True/False, or the strings true/false/1/0/yes/no."""
    if isinstance(value, bool) or value is None:
        return bool(value)
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", ""):
        return False
    raise AirflowException(f"{task_id}: {name}={value!r} must be true or false (after rendering)")


def rendered_tuner_options(task_id: str, options: Any) -> Any:
    """``tuner_options`` after rendering: Jinja gives text, so a flag such as ``encrypt`` rendered as ``"true"``
    becomes True (the options model is strict and would refuse the string)."""
    if not isinstance(options, dict):
        return options
    from fstream_provider.model.options import TunerOptions

    flags = {k for k, f in TunerOptions.model_fields.items() if f.annotation in (bool, bool | None)}
    return {k: rendered_bool(task_id, f"tuner_options[{k!r}]", v) if k in flags and isinstance(v, str) else v
            for k, v in options.items()}


def is_template(value: Any) -> bool:
    """True when ``value`` is only known once Airflow renders it (Jinja text or an XCom reference)."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    return value is not None and not isinstance(value, (int, float))


# argument -> how its value is checked (the conversions ``execute`` applies once Airflow rendered it)
_INTS = ("cc", "p", "pp", "max_cc")
_BOOLS = ("watch", "verify")
_DURATIONS = ("interval", "idle_exit", "agent_timeout", "redis_outage_timeout", "rtt")
_RATES = ("target_throughput", "bandwidth")


def check_known_arguments(task_id: str, values: dict[str, Any]) -> None:
    """Check each argument whose value is known at DAG parse (not a template); a ``ValueError`` names it.

    :param values: argument name to value, as given to the operator.
    """
    for name, value in values.items():
        if value in (None, "", "None") or is_template(value):  # a datetime ``until`` is skipped too: always valid
            continue
        try:
            if name in _INTS:
                rendered_int(task_id, name, value)
            elif name in _BOOLS:
                rendered_bool(task_id, name, value)
            elif name in _DURATIONS and not isinstance(value, (int, float)):
                parse_duration(value)
            elif name in _RATES and not isinstance(value, (int, float)):
                parse_rate(value)
            elif name == "until":
                to_unix_time(value)
        except (AirflowException, ValueError) as exc:
            message = str(exc) if str(exc).startswith(task_id) else f"{task_id}: {name}={value!r}: {exc}"
            raise ValueError(message) from None
