"""Smart channel distribution (thesis §3.3, Fig. 3.2): channels keep their p, get reassigned by p, go passive.

Rules, in order, for each cluster layout (cluster, cc, p):
1. channels already on the cluster with the right p stay (busy ones first), up to cc;
2. the rest of the deficit takes free channels with the same p: passive ones first, then
   channels released by other clusters (idle before busy);
3. only then new channels are opened with that p.
Released channels that nobody took become passive; passive channels beyond ``max_passive``
(or beyond ``max_channels`` in total) are closed, those whose p no layout wants first.
A channel's p never changes: a cluster that needs another p gets other channels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from fstream_provider.tuning.base import ClusterLayout


@dataclass(frozen=True)
class ChannelState:
    """One open channel as the sender sees it.

    :param channel_id: the sender's id for the channel.
    :param p: its number of TCP streams (fixed for its life).
    :param cluster: the cluster it serves, or None when passive.
    :param busy: True while a file is in flight on it.
    """

    channel_id: int
    p: int
    cluster: str | None
    busy: bool = False


@dataclass(frozen=True)
class OpenRequest:
    """Channels to open.

    :param cluster: cluster they serve.
    :param p: streams per channel.
    :param count: how many.
    """

    cluster: str
    p: int
    count: int


@dataclass(frozen=True)
class ChannelPlan:
    """What to do with the channels.

    :param reassign: (channel_id, cluster) for channels that change cluster (including passive ones woken up).
    :param open: channels to open.
    :param passivate: channel ids to make passive (a busy one finishes its file first).
    :param close: channel ids to close (always passive ones, after this plan's passivations).
    """

    reassign: tuple[tuple[int, str], ...] = ()
    open: tuple[OpenRequest, ...] = ()
    passivate: tuple[int, ...] = ()
    close: tuple[int, ...] = ()

    @property
    def opened(self) -> int:
        return sum(o.count for o in self.open)

    def is_empty(self) -> bool:
        return not (self.reassign or self.open or self.passivate or self.close)


def plan_channels(channels: Sequence[ChannelState], layouts: Sequence[ClusterLayout], *,
                  max_passive: int = 8, max_channels: int | None = None) -> ChannelPlan:
    """Plan the move from ``channels`` to ``layouts`` (see module docstring for the rules).

    :param channels: the open channels (active and passive).
    :param layouts: the wanted layout per cluster; a cluster absent here gets no channels.
    :param max_passive: passive channels kept open for reuse.
    :param max_channels: optional cap on open channels (active + passive) after the plan.
    """
    if max_passive < 0:
        raise ValueError(f"plan_channels: max_passive must be >= 0, got {max_passive}")
    wanted = {l.cluster: l for l in layouts if l.cc > 0}
    kept: dict[str, list[ChannelState]] = {c: [] for c in wanted}
    released: list[ChannelState] = []
    passive: list[ChannelState] = []
    for ch in sorted(channels, key=lambda c: (not c.busy, c.channel_id)):
        lay = wanted.get(ch.cluster) if ch.cluster is not None else None
        if ch.cluster is None:
            passive.append(ch)
        elif lay is not None and ch.p == lay.p and len(kept[ch.cluster]) < lay.cc:
            kept[ch.cluster].append(ch)
        else:
            released.append(ch)
    # free channels in reuse order: passive first, then released idle, then released busy
    free = passive + sorted(released, key=lambda c: (c.busy, c.channel_id))
    reassign: list[tuple[int, str]] = []
    opens: list[OpenRequest] = []
    taken: set[int] = set()
    for name in sorted(wanted):
        lay = wanted[name]
        need = lay.cc - len(kept[name])
        for ch in free:
            if need <= 0:
                break
            if ch.channel_id not in taken and ch.p == lay.p:
                taken.add(ch.channel_id)
                reassign.append((ch.channel_id, name))
                need -= 1
        if need > 0:
            opens.append(OpenRequest(name, lay.p, need))
    passivate = tuple(ch.channel_id for ch in released if ch.channel_id not in taken)
    idle_pool = [ch for ch in free if ch.channel_id not in taken]
    wanted_p = {l.p for l in wanted.values()}
    # close order: p nobody wants first, then idle before busy, newest first
    idle_pool.sort(key=lambda c: (c.p in wanted_p, c.busy, -c.channel_id))
    active = sum(l.cc for l in wanted.values())
    limit = len(idle_pool) - max_passive
    if max_channels is not None:
        limit = max(limit, active + len(idle_pool) - max_channels)
    close = tuple(ch.channel_id for ch in idle_pool[:max(0, limit)])
    return ChannelPlan(tuple(reassign), tuple(opens), passivate, close)
