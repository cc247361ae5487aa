"""The transfer operator's arguments: sources from any payload, rendered values converted, known values checked early.

Airflow renders ``template_fields`` just before ``execute``, so a templated ``p="{{ params.p }}"`` arrives as
the string ``"3"``: these helpers convert it and name the argument when it is wrong. At DAG parse the same
checks run on every value that is already known (not a template), so a typo fails the parse, not the run.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk.exceptions import AirflowException

from fstream_provider.model.units import iso_to_unix, parse_duration, parse_rate, parse_until


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
    (``timedelta``, ``"2h"``, ``"90m"``) counts from the DAG run's start (now when there is no run): text and
    durations are ``model.units.parse_until``'s, with the run's start as the time they count from."""
    if deadline in (None, ""):
        return None
    if isinstance(deadline, (str, dt.timedelta)):
        try:
            return parse_until(deadline, start=_run_start(context), what="deadline")
        except ValueError:
            pass
    try:
        return to_unix_time(deadline)
    except ValueError:
        raise ValueError(f"deadline {deadline!r}: expected a datetime, an ISO-8601 string, UNIX seconds, or a "
                         "duration from the run's start (timedelta or a string such as 2h)") from None


def _run_start(context: Any) -> float | None:
    """The DAG run's start (its logical date if it has none) as UNIX seconds; None without a run."""
    run = context.get("dag_run") if context is not None else None
    start = getattr(run, "start_date", None) or getattr(run, "logical_date", None)
    return start.timestamp() if isinstance(start, dt.datetime) else None


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


def check_at_parse(op: Any, own_parameters: tuple[str, ...]) -> None:
    """Refuse at DAG parse what is known then about ``op`` (a ``FStreamTransferOperator``): an unknown tuner,
    options it ignores, bad ``tuner_options``, a value of the wrong kind (``p="x"``, ``agent_timeout="5 minutes"``).

    Pure and cheap (no I/O). Values Airflow renders later (Jinja, XCom; also inside ``tuner_options``) are
    checked by ``build_spec`` at execute, before anything is submitted.
    """
    from fstream_provider.model.options import TunerOptions
    from fstream_provider.tuning.registry import check_options

    check_known_arguments(op.task_id, {n: getattr(op, n) for n in (
        "cc", "p", "pp", "max_cc", "watch", "verify", "interval", "idle_exit", "agent_timeout",
        "redis_outage_timeout", "rtt",
        "target_throughput", "bandwidth", "until")})
    try:
        opts = op.tuner_options
        if isinstance(opts, dict):  # a templated value is checked once rendered; its key is checked now
            known = TunerOptions.model_fields
            TunerOptions.check({k: v for k, v in opts.items() if not (is_template(v) and k in known)},
                               own_parameters=own_parameters)
        elif not is_template(opts):
            TunerOptions.check(opts, own_parameters=own_parameters)
        if not is_template(op.priority_class):
            from fstream_provider.model.spec import PRIORITY_CLASSES
            if op.priority_class not in PRIORITY_CLASSES:
                raise ValueError(f"priority_class {op.priority_class!r}: must be one of "
                                 f"{', '.join(PRIORITY_CLASSES)}")
        if not is_template(op.deadline):
            deadline_time(op.deadline)  # its form; a duration counts from the run's start at execute
        if not is_template(op.on_deadline_risk):
            from fstream_provider.model.spec import DEADLINE_RISK
            if op.on_deadline_risk not in DEADLINE_RISK:
                raise ValueError(f"on_deadline_risk {op.on_deadline_risk!r}: must be one of "
                                 f"{', '.join(DEADLINE_RISK)}")
        if any(is_template(v) for v in (op.tuner, op.target_throughput, op.cc, op.p, op.pp)):
            return
        target = parse_rate(op.target_throughput) if op.target_throughput not in (None, "") else None
        cc, p, pp = (rendered_int(op.task_id, n, getattr(op, n)) for n in ("cc", "p", "pp"))
        given = {k for k, v in opts.items() if v is not None} if isinstance(opts, dict) else set()
        check_options(op.tuner, cc=cc, p=p, pp=pp, target_throughput_bps=target, variant="variant" in given,
                      profiling=bool(given & {"utilisation", "band"}), profile_interval="profile_interval" in given)
        if op.deadline not in (None, "") and not check_options(op.tuner).holds_target:
            raise ValueError(f"deadline: tuner {op.tuner!r} cannot hold a target; a deadline steers one "
                             "(use tuner fstream)")
    except ValueError as exc:
        raise ValueError(f"{op.task_id}: invalid transfer options: {exc}") from None
