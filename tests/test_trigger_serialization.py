"""Every trigger survives the triggerer's round trip: serialize -> Trigger row (encrypted kwargs) -> rebuild.

In the style of the Amazon provider's ``triggers/test_serialization.py``: the triggerer never sees the
object the operator built, only the row ``Trigger.from_object`` wrote (classpath + Fernet-encrypted,
serde-encoded kwargs). It imports the classpath, decrypts and decodes the kwargs exactly as
``TriggerRunner`` does and calls the class with them; the rebuilt trigger must serialize to the same
thing. Besides hand-written cases, one case per trigger sets *every* constructor argument to a value
other than its default, derived from the signature, so a keyword added later is covered without
editing this file.
"""

from __future__ import annotations

import inspect
import os
import tempfile

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))
pytest.importorskip("airflow")
from cryptography.fernet import Fernet  # noqa: E402

os.environ.setdefault("AIRFLOW__CORE__FERNET_KEY", Fernet.generate_key().decode())

from airflow.models.trigger import Trigger  # noqa: E402
from airflow.serialization.decoders import smart_decode_trigger_kwargs  # noqa: E402
from airflow.triggers.base import BaseTrigger  # noqa: E402

from fstream_provider.triggers.new_files import FStreamNewFilesTrigger  # noqa: E402
from fstream_provider.triggers.transfer import FStreamTransferTrigger  # noqa: E402

TRIGGER_CLASSES = (FStreamTransferTrigger, FStreamNewFilesTrigger)


def _other_than_default(name: str, param: inspect.Parameter):
    """A value of the parameter's annotated type that differs from its default."""
    ann, default = str(param.annotation), param.default
    if "bool" in ann:
        return not default
    if "int" in ann and "float" not in ann:
        return (default or 0) + 7
    if "float" in ann:
        return (default or 0.0) + 1.5
    if "str" in ann:
        return f"{default or ''}-{name}-7"
    if "dict" in ann or "Mapping" in ann:
        return {"k": [1, "two"], "n": None}
    if "list" in ann or "Sequence" in ann or "tuple" in ann:
        return ["a", "b"]
    raise AssertionError(f"test_trigger_serialization: teach _other_than_default the type {ann!r} of {name!r}")


def _every_kwarg_changed(cls: type[BaseTrigger]) -> BaseTrigger:
    kwargs = {}
    for name, param in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
            continue
        if param.default is param.empty:
            kwargs[name] = f"{name}-required-value"
        else:
            kwargs[name] = _other_than_default(name, param)
    return cls(**kwargs)


CASES = [
    pytest.param(FStreamTransferTrigger(job_id="0123456789abcdef"), id="transfer-defaults"),
    pytest.param(FStreamTransferTrigger(job_id="fedcba9876543210", fstream_conn_id="fstream_lab",
                                        last_event_id="1717171717171-3", target_throughput_bps=8e8, block_ms=250),
                 id="transfer-resumed"),
    pytest.param(FStreamNewFilesTrigger(path="/data/instrument"), id="new-files-defaults"),
    pytest.param(FStreamNewFilesTrigger(path="sftp://lcls@dtn.example:2222/xtc", pattern="**/*.h5",
                                        recursive=True, scope="lcls-xpp", min_files=3, max_files=500,
                                        poll_interval=2.0, min_age=30.0, fstream_conn_id="fstream_lab",
                                        ssh_key_file="/etc/fstream/id_ed25519", known_hosts="/etc/fstream/known_hosts"),
                 id="new-files-sftp"),
    *[pytest.param(_every_kwarg_changed(cls), id=f"{cls.__name__}-every-kwarg-changed") for cls in TRIGGER_CLASSES],
]


def _rebuild_like_the_triggerer(row: Trigger) -> BaseTrigger:
    """What ``TriggerRunner`` does with a row: import the classpath, decrypt and decode kwargs, construct."""
    from airflow._shared.module_loading import import_string

    kwargs = {k: smart_decode_trigger_kwargs(v) for k, v in Trigger._decrypt_kwargs(row.encrypted_kwargs).items()}
    return import_string(row.classpath)(**kwargs)


@pytest.mark.parametrize("trigger", CASES)
def test_serialize_store_rebuild_gives_the_same_trigger(trigger):
    classpath, kwargs = trigger.serialize()
    cls = type(trigger)
    assert classpath == f"{cls.__module__}.{cls.__qualname__}"
    row = Trigger.from_object(trigger)
    from airflow.models.crypto import get_fernet

    if get_fernet().is_encrypted:
        assert not row.encrypted_kwargs.startswith("{"), "kwargs stored in clear although a Fernet key is set"
    rebuilt = _rebuild_like_the_triggerer(row)
    assert type(rebuilt) is cls
    assert rebuilt.serialize() == (classpath, kwargs)


@pytest.mark.parametrize("cls", TRIGGER_CLASSES, ids=lambda c: c.__name__)
def test_serialize_mirrors_the_constructor(cls):
    """Every constructor argument is serialized (a missing one would be lost at the triggerer)."""
    trigger = _every_kwarg_changed(cls)
    params = {n for n, p in inspect.signature(cls.__init__).parameters.items()
              if n != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    _, kwargs = trigger.serialize()
    assert set(kwargs) == params
    for name in params:
        assert kwargs[name] == getattr(trigger, name), name
