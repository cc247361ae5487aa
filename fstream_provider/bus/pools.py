"""Stream pools in Redis (ADAPT's policy service, ``fstream_provider.tuning.policy``): grants as leases, atomic.

One hash per (source, destination) pair (``Keys.pool``): the policy's parameters (``s_pmax``, ``s_cmax``,
``s_i``, ``s_u``, ``policy``) and, per client, ``grant:<client>`` (streams held) and ``lease:<client>``
(when the grant lapses, ms on the Redis clock). Every request first drops lapsed leases, so a dead
agent's streams return to the pool after its TTL without anyone cleaning up.

Atomicity: the Greedy policy runs as one Lua script (``PROVISION``), so two agents racing for the last
streams can never both get them. Any other ``PoolPolicy`` (a Python class) runs in an optimistic
transaction (WATCH / MULTI) that retries when another client changed the pool meanwhile. The parameters
of a pool are set by its first request (or ``configure``) and then read from Redis, so every agent of a
path uses the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from fstream_provider.bus.keys import Keys
from fstream_provider.tuning.policy import GreedyPolicy, PoolPolicy

# KEYS[1] pool hash. ARGV: client, ttl_ms, s_pmax, s_cmax, s_i, s_u, class ('' | interactive | batch), want
# (streams the client's tuner asks for; 0: not known yet, as Greedy). STEAL in the pool: an interactive client that wants more
# than it holds and finds the pool short takes the streams it would get from batch clients (each keeps one).
PROVISION = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local defaults = {s_pmax = ARGV[3], s_cmax = ARGV[4], s_i = ARGV[5], s_u = ARGV[6], policy = 'greedy'}
for f, v in pairs(defaults) do redis.call('HSETNX', KEYS[1], f, v) end
local cfg = redis.call('HMGET', KEYS[1], 's_pmax', 's_cmax', 's_i', 's_u')
local pmax, cmax, si, su = tonumber(cfg[1]), tonumber(cfg[2]), tonumber(cfg[3]), tonumber(cfg[4])
local all = redis.call('HGETALL', KEYS[1])
local lapsed = 0
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 6) == 'lease:' and tonumber(all[i + 1]) < now then
    local c = string.sub(all[i], 7)
    redis.call('HDEL', KEYS[1], 'lease:' .. c, 'grant:' .. c, 'class:' .. c)
    lapsed = lapsed + 1
  end
end
all = redis.call('HGETALL', KEYS[1])
local sa = 0
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 6) == 'grant:' then sa = sa + tonumber(all[i + 1]) end
end
local cur = tonumber(redis.call('HGET', KEYS[1], 'grant:' .. ARGV[1]) or '0')
local old = cur
local klass, want = ARGV[7] or '', tonumber(ARGV[8] or '0')
if want <= 0 then want = cmax end  -- not known yet (a first request): what Greedy would give
if klass ~= '' then redis.call('HSET', KEYS[1], 'class:' .. ARGV[1], klass) end
local revoked = 0
if klass == 'interactive' and want > cur and cur < cmax then
  local step = su
  if cur == 0 then step = si end
  local short = (math.min(want, cmax, cur + step) - cur) - math.max(0, math.min(cmax - cur, pmax - sa))
  for i = 1, #all, 2 do
    if short <= 0 then break end
    if string.sub(all[i], 1, 6) == 'class:' and all[i + 1] == 'batch' then
      local c = string.sub(all[i], 7)
      local g = tonumber(redis.call('HGET', KEYS[1], 'grant:' .. c) or '0')
      local take = math.min(short, g - 1)
      if take > 0 then
        redis.call('HSET', KEYS[1], 'grant:' .. c, g - take)
        sa, short, revoked = sa - take, short - take, revoked + take
      end
    end
  end
end
local sv = math.min(cmax - cur, pmax - sa)
local why
if sv <= 0 then
  why = 'none'
elseif cur == 0 and sv > si then
  cur = si; why = 'initial'
elseif cur > 0 and sv > su then
  cur = cur + su; why = 'update'
else
  cur = cur + sv; why = 'rest'
end
if cur > 0 then
  redis.call('HSET', KEYS[1], 'grant:' .. ARGV[1], cur, 'lease:' .. ARGV[1], now + tonumber(ARGV[2]))
end
return {cur, sa - old + cur, lapsed, why, revoked}
"""

# KEYS[1] pool hash. ARGV: client, ttl_ms -> the grant still held (0: it lapsed; ask again)
RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = redis.call('HGET', KEYS[1], 'lease:' .. ARGV[1])
if not lease or tonumber(lease) < now then
  redis.call('HDEL', KEYS[1], 'lease:' .. ARGV[1], 'grant:' .. ARGV[1], 'class:' .. ARGV[1])
  return 0
end
redis.call('HSET', KEYS[1], 'lease:' .. ARGV[1], now + tonumber(ARGV[2]))
return tonumber(redis.call('HGET', KEYS[1], 'grant:' .. ARGV[1]) or '0')
"""

# KEYS[1] pool hash. ARGV: client, streams to keep (0: release all) -> streams returned to the pool
GIVE_BACK = """
local cur = tonumber(redis.call('HGET', KEYS[1], 'grant:' .. ARGV[1]) or '0')
local keep = math.min(cur, math.max(0, tonumber(ARGV[2])))
if keep == 0 then
  redis.call('HDEL', KEYS[1], 'lease:' .. ARGV[1], 'grant:' .. ARGV[1], 'class:' .. ARGV[1])
else
  redis.call('HSET', KEYS[1], 'grant:' .. ARGV[1], keep)
end
return cur - keep
"""


@dataclass(frozen=True)
class Grant:
    """A client's streams on one pair after a request.

    :param streams: streams held (0: none available now; ask again later).
    :param allocated: streams held by every client of the pair together, this one included.
    :param lapsed: other clients' leases dropped by this request (dead or slow agents).
    :param reason: why (for the logs and the task log).
    """

    streams: int
    allocated: int
    lapsed: int
    reason: str


class StreamPools:
    """Request, renew and give back stream grants on (source, destination) pools.

    :param client: a redis-py client (``decode_responses=True``).
    :param keys: the key schema.
    :param ttl_s: how long a grant lives without a renewal.
    """

    def __init__(self, client: Any, keys: Keys, ttl_s: float = 30.0) -> None:
        if ttl_s <= 0:
            raise ValueError(f"pool lease ttl {ttl_s!r}: must be > 0 seconds")
        self.client, self.keys, self.ttl_ms = client, keys, int(ttl_s * 1000)
        self._provision = client.register_script(PROVISION)
        self._renew = client.register_script(RENEW)
        self._give_back = client.register_script(GIVE_BACK)

    def configure(self, src: str, dst: str, policy: GreedyPolicy) -> None:
        """Set a pool's parameters (they apply to every client's next request)."""
        self.client.hset(self.keys.pool(src, dst), mapping={"s_pmax": policy.s_pmax, "s_cmax": policy.s_cmax,
                                                            "s_i": policy.s_i, "s_u": policy.s_u,
                                                            "policy": policy.name})

    def provision(self, src: str, dst: str, client: str, policy: PoolPolicy | None = None, *, klass: str = "",
                  want: int = 0) -> Grant:
        """Fig. 2's PROVISION for ``client``: a first request or an update, under the pool's policy.

        ``klass`` (``interactive``/``batch``; Greedy only) makes the pool follow STEAL: an interactive
        client whose tuner wants more streams (``want``) than it holds, on a pool too full to give them,
        takes what this request would give it from batch clients, each keeping one stream; they see their
        smaller grant at their next request and their tuners close channels to fit.
        """
        policy = policy or GreedyPolicy()
        key = self.keys.pool(src, dst)
        if isinstance(policy, GreedyPolicy):
            cur, allocated, lapsed, why, revoked = self._provision(keys=[key], args=[
                client, self.ttl_ms, policy.s_pmax, policy.s_cmax, policy.s_i, policy.s_u, klass, int(want)])
            text = {"none": "no streams available", "initial": "initial grant s_i", "update": "update +s_u",
                    "rest": "the streams left"}[why]
            took = f", {int(revoked)} taken from batch clients" if int(revoked) else ""
            return Grant(int(cur), int(allocated), int(lapsed),
                         f"{policy.name}: {text} -> {int(cur)} stream(s){took}")
        return self._provision_python(key, client, policy)

    def _provision_python(self, key: str, client: str, policy: PoolPolicy) -> Grant:
        while True:
            with self.client.pipeline() as pipe:
                try:
                    pipe.watch(key)
                    now_ms = self._now_ms(pipe)
                    live, lapsed = _live(pipe.hgetall(key), now_ms)
                    grants = {c: streams for c, (streams, _lease) in live.items()}
                    cur = grants.get(client, 0)
                    new, why = policy.provision(cur, sum(grants.values()))
                    pipe.multi()
                    for c in lapsed:
                        pipe.hdel(key, "lease:" + c, "grant:" + c)
                    pipe.hsetnx(key, "policy", policy.name)
                    if new > 0:
                        pipe.hset(key, mapping={"grant:" + client: new, "lease:" + client: now_ms + self.ttl_ms})
                    else:
                        pipe.hdel(key, "grant:" + client, "lease:" + client)
                    pipe.execute()
                    return Grant(new, sum(grants.values()) - cur + new, len(lapsed), f"{policy.name}: {why}")
                except redis.WatchError:
                    continue  # another client changed the pool: decide again on what is there now

    @staticmethod
    def _now_ms(client: Any) -> int:
        sec, usec = client.time()
        return int(sec) * 1000 + int(usec) // 1000

    def renew(self, src: str, dst: str, client: str) -> int:
        """Extend ``client``'s lease; returns the streams still held (0: the grant lapsed, ask again)."""
        return int(self._renew(keys=[self.keys.pool(src, dst)], args=[client, self.ttl_ms]))

    def give_back(self, src: str, dst: str, client: str, keep: int = 0) -> int:
        """Return streams to the pool, keeping ``keep`` (0: all, the client is done); returns how many."""
        return int(self._give_back(keys=[self.keys.pool(src, dst)], args=[client, keep]))

    def status(self, src: str, dst: str) -> dict[str, Any]:
        """The pool as stored: its parameters and each live grant with the seconds left on its lease."""
        fields = self.client.hgetall(self.keys.pool(src, dst))
        now_ms = self._now_ms(self.client)
        live, _lapsed = _live(fields, now_ms)
        grants = {c: {"streams": n, "expires_in_s": round((lease - now_ms) / 1000, 1),
                      **({"class": fields["class:" + c]} if "class:" + c in fields else {})}
                  for c, (n, lease) in live.items()}
        params = {k: fields[k] for k in ("policy", "s_pmax", "s_cmax", "s_i", "s_u") if k in fields}
        return {"source": src, "destination": dst, **params, "allocated": sum(g["streams"] for g in grants.values()),
                "grants": grants}

    def pairs(self) -> list[tuple[str, str]]:
        """Every (source, destination) with a pool hash."""
        out = []  # each pool has a slot of its own: a Cluster client scans every master
        for key in self.client.scan_iter(match=self.keys.own_slot_patterns()["pool"], count=500):
            pair = self.keys.pool_pair(key)
            if pair is not None:
                out.append(pair)
        return sorted(out)


def _live(fields: dict[str, str], now_ms: int) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """A pool hash's grants whose lease still runs (client -> (streams, lease ms)) and the clients whose lapsed."""
    live: dict[str, tuple[int, int]] = {}
    lapsed: list[str] = []
    for f, v in fields.items():
        if f.startswith("grant:"):
            lease = int(fields.get("lease:" + f[6:], 0))
            if lease >= now_ms:
                live[f[6:]] = (int(v), lease)
            else:
                lapsed.append(f[6:])
    return live, lapsed

