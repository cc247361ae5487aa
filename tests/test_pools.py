"""ADAPT stream pools (issue #11): the Greedy policy as Fig. 2 writes it, atomic grants in Redis, leases that lapse."""

from __future__ import annotations

import threading
import time

import pytest

from fstream_provider.bus.keys import Keys
from fstream_provider.bus.pools import StreamPools
from fstream_provider.tuning.policy import GreedyPolicy, adapt

SRC, DST = "dtn-a", "dtn-b:9000"


def test_greedy_policy_follows_fig2():
    p = GreedyPolicy(s_pmax=10, s_cmax=8, s_i=4, s_u=2)
    assert p.provision(0, 0) == (4, "initial grant s_i=4")
    assert p.provision(4, 4) == (6, "update +s_u=2")
    assert p.provision(6, 6) == (8, "the 2 stream(s) left (pool 6/10)")  # s_v = s_u: not more than s_u, the rest
    assert p.provision(8, 8)[0] == 8 and "no streams available" in p.provision(8, 8)[1]
    assert p.provision(0, 8)[0] == 2  # only two left in the pool: the rest, not s_i
    assert p.provision(0, 10)[0] == 0
    with pytest.raises(ValueError, match="s_pmax >= 1"):
        GreedyPolicy(s_pmax=0)


def test_adapt_moves_concurrency_within_the_grant():
    assert adapt(4, 2, 8, 500e6, 700e6, 50e6)[0] == 6
    assert adapt(4, 2, 5, 500e6, 700e6, 50e6)[0] == 5  # capped by the grant
    assert adapt(4, 2, 8, 700e6, 500e6, 50e6)[0] == 2
    assert adapt(4, 2, 8, 500e6, 520e6, 50e6)[0] == 4


def test_two_clients_share_a_pool_and_a_third_waits(redis_client):
    pools = StreamPools(redis_client, Keys("t-pools"), ttl_s=30)
    pol = GreedyPolicy(s_pmax=10, s_cmax=6, s_i=4, s_u=4)
    a = pools.provision(SRC, DST, "agent-a", pol)
    b = pools.provision(SRC, DST, "agent-b", pol)
    assert (a.streams, b.streams) == (4, 4) and b.allocated == 8
    a2 = pools.provision(SRC, DST, "agent-a", pol)  # update: only 2 left
    assert a2.streams == 6 and a2.allocated == 10 and "left" in a2.reason
    c = pools.provision(SRC, DST, "agent-c", pol)
    assert c.streams == 0 and "no streams" in c.reason
    assert pools.give_back(SRC, DST, "agent-a", keep=2) == 4
    assert pools.provision(SRC, DST, "agent-c", pol).streams == 4
    st = pools.status(SRC, DST)
    assert {k: v["streams"] for k, v in st["grants"].items()} == {"agent-a": 2, "agent-b": 4, "agent-c": 4}
    assert st["s_pmax"] == "10" and st["allocated"] == 10
    assert pools.pairs() == [(SRC, DST)]


def _race(n: int, ask) -> dict[str, int]:
    """``n`` clients c0..c{n-1} calling ``ask(name)`` at the same moment; what each got."""
    got: dict[str, int] = {}
    start = threading.Barrier(n)

    def run(name: str) -> None:
        start.wait()
        got[name] = ask(name)

    threads = [threading.Thread(target=run, args=(f"c{i}",)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return got


def test_racing_clients_never_overcommit_the_pool(redis_client):
    """Twenty clients asking at once through the Lua script: the pool's s_pmax is never exceeded."""
    pools = StreamPools(redis_client, Keys("t-race"), ttl_s=30)
    pol = GreedyPolicy(s_pmax=17, s_cmax=8, s_i=3, s_u=3)
    got = _race(20, lambda name: [pools.provision(SRC, DST, name, pol).streams for _ in range(3)][-1])
    assert sum(got.values()) == 17 == pools.status(SRC, DST)["allocated"]
    assert max(got.values()) <= 8


class _Halves:
    """A custom policy: each request takes half of what is left, at least one stream."""

    name = "halves"

    def provision(self, current: int, allocated: int) -> tuple[int, str]:
        left = 12 - allocated
        return (current + max(1, left // 2), "half of what is left") if left > 0 else (current, "pool full")


def test_a_custom_python_policy_runs_atomically_too(redis_client):
    pools = StreamPools(redis_client, Keys("t-custom"), ttl_s=30)
    got = _race(8, lambda name: pools.provision(SRC, DST, name, _Halves()).streams)
    assert sum(got.values()) == 12 == pools.status(SRC, DST)["allocated"]
    assert sorted(got.values(), reverse=True) == [6, 3, 1, 1, 1, 0, 0, 0]  # each saw what the others left


def test_a_dead_clients_lease_lapses_and_its_streams_return(redis_client):
    pools = StreamPools(redis_client, Keys("t-lease"), ttl_s=0.3)
    pol = GreedyPolicy(s_pmax=8, s_cmax=8, s_i=8, s_u=0)
    assert pools.provision(SRC, DST, "dead", pol).streams == 8
    assert pools.provision(SRC, DST, "alive", pol).streams == 0
    deadline = time.monotonic() + 5
    grant = pools.provision(SRC, DST, "alive", pol)
    while grant.streams == 0 and time.monotonic() < deadline:  # the dead agent never renews
        grant = pools.provision(SRC, DST, "alive", pol)
    assert grant.streams == 8 and grant.lapsed == 1
    assert pools.renew(SRC, DST, "dead") == 0  # a late renewal finds nothing: it must ask again
    assert pools.renew(SRC, DST, "alive") == 8


def test_fstream_pools_sets_a_policy_and_shows_grants_live(redis_url, redis_client):
    import subprocess
    import sys

    base = [sys.executable, "-m", "transfer_agent.cli", "pools", "--redis", redis_url, "--namespace", "t-cli"]
    out = subprocess.run(base + ["set", "--source", SRC, "--destination", DST, "--s-pmax", "12", "--s-i", "5"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pools = StreamPools(redis_client, Keys("t-cli"))
    assert pools.provision(SRC, DST, "agent-a").streams == 5  # the stored parameters win over the defaults
    shown = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert f"{SRC} -> {DST}: greedy s_pmax=12" in shown.stdout and "agent-a: 5 stream(s), lease" in shown.stdout
    bad = subprocess.run(base + ["set", "--source", SRC, "--destination", DST, "--s-pmax", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "s_pmax >= 1" in bad.stdout


def test_fit_streams_cuts_channels_in_proportion_then_p():
    from fstream_provider.tuning.base import ClusterLayout as L
    from fstream_provider.tuning.granted import fit_streams

    same, note = fit_streams((L("small", 4, 2, 4), L("large", 2, 4, 1)), 16)
    assert note == "" and same == (L("small", 4, 2, 4), L("large", 2, 4, 1))
    cut, note = fit_streams((L("small", 4, 2, 4), L("large", 2, 4, 1)), 8)
    assert sum(c.cc * c.p for c in cut) <= 8 and all(c.cc >= 1 for c in cut) and "pool grant 8" in note
    tight, _ = fit_streams((L("small", 4, 2, 4), L("large", 2, 4, 1)), 2)
    assert tight == (L("small", 1, 1, 4), L("large", 1, 1, 1))  # one stream per cluster is the floor


def test_interactive_clients_take_streams_from_batch_ones_only_what_they_want(redis_client):
    """STEAL in the pool: a full pool held by batch clients gives an interactive client what Greedy would
    give it, taken from the batch clients (each keeps one), never more than its tuner wants; class-less
    and batch requests stay plain Greedy."""
    pools = StreamPools(redis_client, Keys("t-pools-class"), ttl_s=30)
    pol = GreedyPolicy(s_pmax=16, s_cmax=16, s_i=4, s_u=4)
    for _ in range(4):
        pools.provision(SRC, DST, "batch-a", pol, klass="batch", want=16)
    assert pools.provision(SRC, DST, "batch-a", pol, klass="batch").streams == 16  # the whole pool
    assert pools.provision(SRC, DST, "plain", pol, want=8).streams == 0  # no class: Greedy, nothing left
    g = pools.provision(SRC, DST, "inter", pol, klass="interactive", want=8)
    assert g.streams == 4 and "4 taken from batch clients" in g.reason and g.allocated == 16
    assert pools.provision(SRC, DST, "batch-a", pol, klass="batch").streams == 12  # it sees the cut at its next ask
    assert pools.provision(SRC, DST, "inter", pol, klass="interactive", want=6).streams == 6  # +2: all it wants
    assert pools.provision(SRC, DST, "inter", pol, klass="interactive", want=6).streams == 6  # wants no more
    assert pools.provision(SRC, DST, "inter", pol, klass="interactive", want=40).streams == 10
    st = pools.status(SRC, DST)
    assert st["grants"]["batch-a"] == {"streams": 6, "expires_in_s": pytest.approx(30, abs=1), "class": "batch"}
    for _ in range(4):
        pools.provision(SRC, DST, "inter", pol, klass="interactive", want=40)
    assert pools.status(SRC, DST)["grants"]["batch-a"]["streams"] == 1  # a batch transfer always keeps one
    assert pools.give_back(SRC, DST, "batch-a") == 1
    assert "class:batch-a" not in redis_client.hgetall(Keys("t-pools-class").pool(SRC, DST))


def test_an_interactive_first_request_takes_its_initial_grant_from_batch(redis_client):
    """The first request comes before the tuner has asked for anything: it may take s_i from batch clients."""
    pools = StreamPools(redis_client, Keys("t-pools-first"), ttl_s=30)
    pol = GreedyPolicy(s_pmax=8, s_cmax=8, s_i=4, s_u=4)
    pools.provision(SRC, DST, "batch-a", pol, klass="batch")
    assert pools.provision(SRC, DST, "batch-a", pol, klass="batch").streams == 8
    g = pools.provision(SRC, DST, "inter", pol, klass="interactive")  # want not known yet
    assert g.streams == 4 and "4 taken from batch clients" in g.reason
