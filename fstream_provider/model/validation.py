"""Pydantic validation errors as one sentence per problem, naming the field, the value and what is accepted."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pydantic is imported by whoever has an error of its to explain, not by this module
    from pydantic import ValidationError


class SpecError(ValueError):
    """Invalid transfer options; the message names each bad field, its value and what is accepted."""


def explain(exc: ValidationError, what: str, accepted: Iterable[str], *, noun: str = "field") -> str:
    """``what: problem; problem`` for ``exc``; unknown names are listed together with ``accepted``.

    :param exc: the pydantic error.
    :param what: what was being validated (``transfer spec``, ``tuner_options``).
    :param accepted: the names that are accepted, shown when an unknown one was given.
    :param noun: what a name is called there (``field``, ``key``).
    """
    unknown: list[str] = []
    problems: list[str] = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(x) for x in err.get("loc", ()))
        if err["type"] == "extra_forbidden":
            unknown.append(loc)
        elif err["type"] in ("value_error", "assertion_error"):
            # our own validators say what is wrong; they name the field too, or it is put in front
            text = str(err["ctx"]["error"]) if "ctx" in err else err["msg"]
            problems.append(text if not loc or text.startswith(loc) else f"{loc} {text}")
        else:
            msg = err["msg"][:1].lower() + err["msg"][1:]
            problems.append(f"{loc} {err['input']!r}: {msg}" if loc else msg)
    if unknown:
        problems.insert(0, f"unknown {noun}(s) {', '.join(unknown)} (accepted: {', '.join(accepted)})")
    return f"{what}: " + "; ".join(problems)
