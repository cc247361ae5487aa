"""Smart channel distribution: channels keep p, are reassigned by p, passive ones are reused first."""

from __future__ import annotations

from hypothesis import given, strategies as st

from fstream_provider.tuning.base import ClusterLayout
from fstream_provider.tuning.distribution import ChannelState, plan_channels


def test_switch_from_large_to_small_reuses_matching_p_and_passivates_the_rest():
    chans = [ChannelState(1, 8, "large", True), ChannelState(2, 8, "large", False),
             ChannelState(3, 2, None)]
    plan = plan_channels(chans, [ClusterLayout("small", 3, 2, 10)])
    assert plan.reassign == ((3, "small"),)           # passive p=2 woken up first
    assert [(o.cluster, o.p, o.count) for o in plan.open] == [("small", 2, 2)]
    assert set(plan.passivate) == {1, 2}              # p=8 channels kept for later
    assert plan.close == ()


def test_channel_from_another_cluster_with_matching_p_is_reassigned_not_reopened():
    chans = [ChannelState(1, 4, "large", False), ChannelState(2, 4, "large", False)]
    plan = plan_channels(chans, [ClusterLayout("large", 1, 4, 0), ClusterLayout("small", 1, 4, 5)])
    assert plan.open == ()
    assert len(plan.reassign) == 1 and plan.reassign[0][1] == "small"


def test_passive_channels_beyond_the_cap_are_closed_unwanted_p_first():
    chans = [ChannelState(i, 1 if i < 3 else 4, None) for i in range(6)]
    plan = plan_channels(chans, [ClusterLayout("all", 1, 4, 0)], max_passive=2)
    assert plan.reassign == ((3, "all"),)
    assert set(plan.close) == {0, 1, 2}               # p=1 nobody wants go first
    assert plan.open == ()


channel = st.builds(ChannelState, channel_id=st.integers(0, 10**6), p=st.integers(1, 4),
                    cluster=st.sampled_from([None, "small", "large", "gone"]), busy=st.booleans())
layout = st.builds(ClusterLayout, cluster=st.sampled_from(["small", "large", "all"]),
                   cc=st.integers(0, 8), p=st.integers(1, 4), pp=st.integers(0, 10))


def _unique(chans):
    seen, out = set(), []
    for c in chans:
        if c.channel_id not in seen:
            seen.add(c.channel_id)
            out.append(c)
    return out


@given(st.lists(channel, max_size=20), st.lists(layout, max_size=3, unique_by=lambda l: l.cluster),
       st.integers(0, 5))
def test_plan_properties(chans, layouts, max_passive):
    chans = _unique(chans)
    plan = plan_channels(chans, layouts, max_passive=max_passive)
    by_id = {c.channel_id: c for c in chans}
    want = {l.cluster: l for l in layouts if l.cc > 0}
    # after the plan each cluster has exactly cc channels, all with its p
    after = {cid: c.cluster for cid, c in by_id.items()}
    for cid in plan.passivate:
        after[cid] = None
    for cid, cl in plan.reassign:
        assert by_id[cid].p == want[cl].p          # channels keep their p
        after[cid] = cl
    for name, lay in want.items():
        have = [cid for cid, cl in after.items() if cl == name]
        assert all(by_id[cid].p == lay.p for cid in have)
        opened = sum(o.count for o in plan.open if o.cluster == name)
        assert len(have) + opened == lay.cc
    # no channel is opened while a passive/released one with that p stays unused
    for o in plan.open:
        spare = [cid for cid, cl in after.items() if cl is None and by_id[cid].p == o.p]
        assert spare == []
    # only passive channels are closed and passive count respects the cap
    for cid in plan.close:
        assert after[cid] is None
    passive_left = sum(1 for cid, cl in after.items() if cl is None and cid not in plan.close)
    assert passive_left <= max_passive
    # active channels never exceed what the layouts ask for
    active = sum(1 for cl in after.values() if cl is not None) + plan.opened
    assert active == sum(l.cc for l in want.values())
