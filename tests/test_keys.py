"""The key schema: one hash tag, distinct and injective keys, every key documented."""

from __future__ import annotations

import inspect
import os

import pytest

from fstream_provider.bus import keys as keys_module
from fstream_provider.bus.keys import Keys

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "redis-keys.md")


def all_keys(k: Keys) -> dict[str, str]:
    return {
        "jobs_stream": k.jobs_stream(), "dead_letter": k.dead_letter(), "job": k.job("j1"),
        "job_events": k.job_events("j1"), "job_index": k.job_index(), "idempotency": k.idempotency("i"),
        "cancel_channel": k.cancel_channel("j1"), "agent": k.agent("a"), "agents": k.agents(),
        "history": k.history(), "profiling": k.profiling("small", "h5"), "pool": k.pool("src", "dst"),
        "seen": k.seen("scope"),
    }


def test_every_key_shares_one_cluster_hash_tag_and_is_distinct():
    k = Keys()
    values = all_keys(k)
    assert all(v.startswith("{fstream}:") for v in values.values())
    assert len(set(values.values())) == len(values)
    assert k.jobs_group() == "agents"


def test_namespaces_do_not_overlap():
    a, b = all_keys(Keys("a")), all_keys(Keys("b"))
    assert not set(a.values()) & set(b.values())


def test_components_are_escaped_injectively():
    k = Keys()
    # a ':' inside a component cannot forge another key
    assert k.pool("a:b", "c") != k.pool("a", "b:c")
    assert k.job("x:events") != k.job_events("x")
    assert k.seen("50%") != k.seen("50%25")
    assert k.seen("dir with space/ü") == "{fstream}:seen:dir%20with%20space/%C3%BC"
    with pytest.raises(ValueError, match="empty"):
        k.job("")


def test_bad_namespace_refused():
    for bad in ("", "a{b", "c}"):
        with pytest.raises(ValueError, match="namespace"):
            Keys(bad)


def test_every_key_method_is_documented_in_module_and_docs():
    methods = [n for n, f in inspect.getmembers(Keys, inspect.isfunction) if not n.startswith("_")]
    with open(DOC) as f:
        doc = f.read()
    for name in methods:
        assert f"{name}(" in keys_module.__doc__, f"{name} missing from the keys module docstring"
        assert f"{name}(" in doc, f"{name} missing from docs/redis-keys.md"
