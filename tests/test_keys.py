"""The key schema: the namespace slot and the own slots (issue 28), distinct and injective keys, every key
documented."""

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


def _tag(key: str) -> str:
    """The Redis Cluster hash tag: between the first '{' and the first '}' after it."""
    return key[key.index("{") + 1:key.index("}")]


def test_the_control_plane_shares_the_namespace_slot_and_the_bulky_data_has_tags_of_its_own():
    k = Keys()
    values = all_keys(k)
    control = {n: v for n, v in values.items() if n not in ("history", "profiling", "pool", "seen")}
    assert all(v.startswith("{fstream}:") for v in control.values())
    assert {_tag(v) for v in control.values()} == {"fstream"}
    assert {_tag(k.seen("s")), _tag(k.pending("s")), _tag(k.looks("s"))} == {"fstream:watch:s"}  # one Lua call
    assert (_tag(k.history()), _tag(k.pool("a", "b")), _tag(k.profiling("small", "h5")), _tag(k.calibration("p"))) \
        == ("fstream:history", "fstream:pool:a:b", "fstream:profiling:small:h5", "fstream:calibration:p")
    assert _tag(k.migration_temp(k.history())) == _tag(k.history())
    assert len(set(values.values())) == len(values)
    assert k.jobs_group() == "agents"


def _glob(pattern: str, key: str) -> bool:
    """Redis's glob for the patterns Keys makes: ``*`` any run, ``\\x`` a literal x."""
    import re

    rx = "".join(".*" if c == "*" else re.escape(c) for c in re.sub(r"\\(.)", r"\1", pattern))
    return re.fullmatch(rx, key) is not None


def test_own_slot_patterns_match_their_keys_and_no_other_namespaces():
    k = Keys("a")
    own = k.own_slot_patterns()
    mine = {"seen": k.seen("s"), "pending": k.pending("s"), "looks": k.looks("s"), "history": k.history(),
            "history-migrating": k.migration_temp(k.history()), "calibration": k.calibration("p"),
            "profiling": k.profiling("small", "h5"), "pool": k.pool("x", "y")}
    assert set(own) == set(mine) and all(_glob(own[f], key) for f, key in mine.items())
    for other in (Keys("ab"), Keys("a:pool"), Keys("a:watch:x"), Keys("a:history"), Keys("a*")):
        theirs = list(all_keys(other).values()) + [other.looks("s"), other.calibration("p")]
        assert not any(_glob(p, key) for p in own.values() for key in theirs), other
    assert Keys("a:b").history() == "{a%3Ab:history}" and Keys("x*").own_slot_patterns()["pool"] == "{x%2A:pool:*}"


def test_the_keys_before_issue_28_map_to_their_own_slots():
    k = Keys()
    for new in (k.seen("dir with space"), k.pending("s"), k.looks("s"), k.history(), k.calibration("p"),
                k.profiling("small", "h5"), k.pool("a:1", "b")):
        family = next(f for f in ("seen", "pending", "looks", "history", "calibration", "profiling", "pool")
                      if f in new)
        rest = new[len("{fstream:"):].replace("}", "").split(":")
        old = "{fstream}:" + ":".join([family] + [p for p in rest if p not in (family, "watch")])
        assert k.renamed(old) == (family, new), old
        assert _glob(k.legacy_patterns()[family], old)
    for not_old in ("{fstream}:jobs", "{fstream}:job:1", "{fstream}:seen:a:b", "{fstream}:history:x",
                    "{other}:pool:a:b", "{fstream}:pool:a"):
        assert k.renamed(not_old) is None, not_old


def test_namespaces_do_not_overlap():
    a, b = all_keys(Keys("a")), all_keys(Keys("b"))
    assert not set(a.values()) & set(b.values())


def test_components_are_escaped_injectively():
    k = Keys()
    # a ':' inside a component cannot forge another key
    assert k.pool("a:b", "c") != k.pool("a", "b:c")
    assert k.job("x:events") != k.job_events("x")
    assert k.seen("50%") != k.seen("50%25")
    assert k.seen("dir with space/ü") == "{fstream:watch:dir%20with%20space/%C3%BC}:seen"
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
