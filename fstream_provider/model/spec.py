"""The transfer specification: what a job asks for, shared by the CLI, the agent and Airflow.

A ``TransferSpec`` is a pydantic model that refuses unknown fields; it round-trips through
JSON (it is stored on the Redis job) and validates its input with errors that name the
field, the value and what is accepted. Its fields and rules are declared in plain Python in
``spec_fields`` (``fstream send`` checks them there without importing pydantic: ``spec_plain``).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator, model_validator

from fstream_provider.model.keyfile import KEY_ID  # noqa: F401  (re-exported: policy reads it here)
from fstream_provider.model.spec_fields import (  # noqa: F401  (re-exported: the constants' old home)
    BEFORE_RULES, BLOCK_SIZE_MAX, BLOCK_SIZE_MIN, CONNECT_TIMEOUT_S, DEADLINE_RISK, DURATION_OPTIONS, FIELD_RULES,
    OPTIONAL_FIELDS, PRIORITY_CLASSES, RATE_OPTIONS, RETIRED_FIELDS, TCP_BUFFER_MAX, TCP_BUFFER_MIN, Destination,
    SpecFields, check_together, fields_from_options, stored_form)
from fstream_provider.model.validation import SpecError, explain
from fstream_provider.tuning.registry import DEFAULT_TUNER, TUNERS


class TransferSpec(SpecFields, BaseModel):
    """Everything a transfer needs; all rates in bits/s, durations in seconds, sizes in bytes.

    The fields, their types, defaults and meaning are ``spec_fields.SpecFields``'; what each accepts is
    ``spec_fields.FIELD_RULES`` and ``check_together``, which the validators below call.
    """

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise SpecError(explain(exc, "transfer spec", type(self).model_fields)) from None

    @field_validator(*BEFORE_RULES, mode="before")
    @classmethod
    def _before(cls, v: Any, info: ValidationInfo) -> Any:
        return BEFORE_RULES[info.field_name or ""](v)

    @field_validator("*")
    @classmethod
    def _rules(cls, v: Any, info: ValidationInfo) -> Any:
        rule = FIELD_RULES.get(info.field_name or "")
        return v if rule is None else rule(v, info.field_name)

    @model_validator(mode="after")
    def _together(self) -> "TransferSpec":
        check_together(self)
        return self

    def to_dict(self) -> dict[str, Any]:
        """The fields; a job without a deadline leaves the deadline's fields out, so agents older than issue 27
        (which refuse unknown fields) still take it; likewise ``OPTIONAL_FIELDS`` at their defaults (issue 30)."""
        return stored_form(self.model_dump())

    def replace(self, **changes: Any) -> "TransferSpec":
        """A validated copy with ``changes`` applied."""
        return type(self)(**{**self.to_dict(), **changes})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TransferSpec":
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> "TransferSpec":
        """Read a spec stored on Redis (fields of older versions that nothing reads are dropped).

        Older versions also stored a profiling interval for tuners that ignore it (now refused when given):
        it is dropped here, which changes nothing for those tuners, so such a queued job still runs.
        """
        data = json.loads(text)
        for name in RETIRED_FIELDS:
            data.pop(name, None)
        info = TUNERS.get(data.get("tuner", DEFAULT_TUNER)) if isinstance(data, dict) else None
        if info is not None and not info.takes_interval:
            data.pop("profile_interval_s", None)
        return cls.from_dict(data)

    @classmethod
    def from_options(cls, sources: list[str], destination: str, **opts: Any) -> "TransferSpec":
        """Build from user-facing options: rates, durations and sizes may be strings (``1Gbit``, ``40ms``, ``4MiB``).

        Each option is a spec field or one of ``RATE_OPTIONS`` / ``DURATION_OPTIONS``; None means "not given".
        """
        return cls.from_dict(fields_from_options(sources, destination, opts))
