"""A transfer spec checked without pydantic, for ``fstream send``'s start-up (issue 29).

Importing pydantic and building ``TransferSpec`` cost a one-file ``send`` a third of its CPU. ``spec_from_options``
checks the same fields (``spec_fields.SpecFields``) with the same rules (``FIELD_RULES``, ``check_together``) in
plain Python, accepting only what ``TransferSpec``'s strict validation accepts with the same values: exact types
(a bool is not an int, a str subclass is not taken here), an int in a float field becomes a float, no unknown or
missing field. Anything else, a rule's refusal included, goes to ``TransferSpec`` itself, whose error (or, for an
input only pydantic takes, whose spec) is the answer: the messages are pydantic's, never a copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from fstream_provider.model.spec_fields import (
    BEFORE_RULES, FIELD_RULES, SpecFields, check_together, fields_from_options, stored_form)

if TYPE_CHECKING:
    from fstream_provider.model.spec import TransferSpec

_MISSING = object()


def _exact(*types: type) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if type(v) not in types:
            raise TypeError(v)
        return float(v) if float in types else v  # strict pydantic: an int in a float field becomes a float
    return check


def _str_list(v: Any) -> list[str]:
    if type(v) is not list or any(type(s) is not str for s in v):
        raise TypeError(v)
    return list(v)  # the model's list is its own too


_TYPES: dict[str, Callable[[Any], Any]] = {
    "str": _exact(str), "int": _exact(int), "float": _exact(float, int), "bool": _exact(bool), "list[str]": _str_list}


def _type_check(annotation: str) -> Callable[[Any], Any] | None:
    """What a value of ``annotation`` (``int | None``, ``list[str]``...) must be; None: not one this module knows."""
    if not isinstance(annotation, str):  # ``from __future__ import annotations`` in spec_fields keeps them text
        return None
    parts = [p.strip() for p in annotation.split("|")]
    optional = "None" in parts
    rest = [p for p in parts if p != "None"]
    check = _TYPES.get(rest[0]) if len(rest) == 1 else None
    if check is None or not optional:
        return check
    return lambda v, check=check: None if v is None else check(v)


# name: (type check or None when unknown, default or _MISSING when required), in the fields' order
FIELDS: dict[str, tuple[Callable[[Any], Any] | None, Any]] = {
    name: (_type_check(annotation), getattr(SpecFields, name, _MISSING))
    for name, annotation in SpecFields.__annotations__.items()}


class PlainSpec(SpecFields):
    """A transfer spec that passed ``TransferSpec``'s checks without pydantic: the same fields, read only.

    ``Transfer`` reads it as it reads a ``TransferSpec``; ``replace`` returns a checked copy, ``to_dict`` and
    ``to_json`` the stored form, and it equals the ``TransferSpec`` of the same fields.
    """

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a checked transfer spec is read only (use replace(): {name}=...)")

    def field_values(self) -> dict[str, Any]:
        """Every field's value (lists copied)."""
        return {name: list(v) if isinstance(v, list) else v for name in FIELDS for v in (getattr(self, name),)}

    def to_dict(self) -> dict[str, Any]:
        """The fields as stored (as ``TransferSpec.to_dict``)."""
        return stored_form(self.field_values())

    def replace(self, **changes: Any) -> PlainSpec | TransferSpec:
        """A checked copy with ``changes`` applied."""
        return spec_from_dict({**self.to_dict(), **changes})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SpecFields):
            return NotImplemented
        return self.field_values() == {name: getattr(other, name) for name in FIELDS}

    __hash__ = None  # type: ignore[assignment]  (like the model: mutable-looking, compared by value)

    def __repr__(self) -> str:
        return f"PlainSpec({', '.join(f'{k}={v!r}' for k, v in self.field_values().items())})"


def _checked(data: dict[str, Any]) -> PlainSpec | None:
    """``data`` as a ``PlainSpec`` if ``TransferSpec(**data)`` would surely accept it with these values; else None."""
    if not isinstance(data, dict) or any(name not in FIELDS for name in data):
        return None
    values: dict[str, Any] = {}
    try:
        for name, (check, default) in FIELDS.items():
            v = data.get(name, _MISSING)
            if v is _MISSING:  # not given: the default, unchecked (as pydantic leaves defaults)
                if default is _MISSING:
                    return None
                values[name] = default
                continue
            if check is None:
                return None
            before = BEFORE_RULES.get(name)
            v = check(v if before is None else before(v))
            rule = FIELD_RULES.get(name)
            values[name] = v if rule is None else rule(v, name)
        spec = PlainSpec(values)
        check_together(spec)
    except Exception:  # noqa: BLE001  (whatever it is, the model says it: its message, or its exception)
        return None
    return spec


def spec_from_dict(data: dict[str, Any]) -> PlainSpec | TransferSpec:
    """A checked spec of ``data``: a ``PlainSpec`` when the plain checks accept it, else ``TransferSpec(**data)``
    (which raises its ``SpecError`` for what they did not accept)."""
    spec = _checked(data)
    if spec is not None:
        return spec
    from fstream_provider.model.spec import TransferSpec

    return TransferSpec.from_dict(data)


def spec_from_options(sources: list[str], destination: str, **opts: Any) -> PlainSpec | TransferSpec:
    """``TransferSpec.from_options`` without pydantic when the plain checks accept the result."""
    return spec_from_dict(fields_from_options(sources, destination, opts))
