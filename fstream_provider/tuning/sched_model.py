"""Throughput of concurrent transfers between shared endpoints (SEAL §4.2), for the scheduler and the simulator.

An endpoint (a DTN with its storage and its link) moves more in aggregate as concurrency grows, up to a
limit, and less when driven far past it ("indiscriminate concurrency saturates endpoints and slows
everyone", SEAL §1, §3). ``EndpointCurve`` is that curve::

    aggregate(N) = capacity * min(1, N * unit / capacity)           N <= knee
                 = capacity / (1 + overload * (N - knee) / knee)    N >  knee,   knee = 2 * capacity / unit

where ``N`` is the concurrency (parallel file streams) the endpoint carries and ``unit`` what one unit of
concurrency moves on an idle path. A task with concurrency ``cc`` gets ``cc / N`` of the aggregate at its
source and at its destination and the smaller of the two: ``LoadModel.throughput`` is the paper's
``throughput(src, dst, cc, src_cc, dst_cc, size)`` (Listing 2, line 39) with ``src_cc``/``dst_cc`` the
concurrency others already put on each end.

*Correction by recent transfers* (§4.2: history "combined with a correction term that accounts for
current external load"): ``LoadModel.observe(src, dst, predicted, observed)`` keeps, per endpoint pair, an
exponentially weighted ratio of observed to predicted throughput over recent transfers (half-life
``half_life`` observations) and ``throughput`` multiplies by it. The capacities are what history says each
endpoint reached at most (the scheduler's "known maximum"); the simulator runs the same curve as ground
truth with external load the scheduler does not see.

*Given capacities* (SEAL §4.3 (a): "the maximum possible throughput, as revealed by previous empirical
measurements"): ``endpoint_curves`` builds the curves from a mapping of endpoint name to its capacity in
bits/s, or to a table with ``capacity`` and optionally ``unit`` (one stream's idle rate, bits/s) and
``overload``, as read from an ``--endpoints`` file; a bad entry is a ``ValueError`` naming the file, the
endpoint and the reason. It reads no file: the caller parses JSON or TOML and passes the mapping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EndpointCurve:
    """Aggregate throughput of one endpoint against the concurrency it carries.

    :param capacity_bps: the most it moves (history's maximum).
    :param unit_bps: what one unit of concurrency moves on an idle path.
    :param overload: how steeply the aggregate falls past the knee (0: it does not).
    """

    capacity_bps: float
    unit_bps: float = 1e9
    overload: float = 0.1

    def __post_init__(self) -> None:
        if not (self.capacity_bps > 0 and self.unit_bps > 0 and self.overload >= 0):
            raise ValueError(f"endpoint curve: capacity and unit must be > 0 and overload >= 0, got {self}")

    @property
    def knee(self) -> float:
        return 2.0 * self.capacity_bps / self.unit_bps

    def aggregate(self, n: float) -> float:
        if n <= 0:
            return 0.0
        if n <= self.knee:
            return min(self.capacity_bps, n * self.unit_bps)
        return self.capacity_bps / (1.0 + self.overload * (n - self.knee) / self.knee)


@dataclass
class LoadModel:
    """Per-endpoint curves plus a per-pair correction from recent transfers.

    :param endpoints: endpoint name -> its curve.
    :param half_life: recent observations after which an old one weighs half.
    :param startup_s: fixed cost of starting (or restarting) a transfer: connection and authentication.
    """

    endpoints: dict[str, EndpointCurve]
    half_life: float = 5.0
    startup_s: float = 1.0
    _ratio: dict[tuple[str, str], float] = field(default_factory=dict)

    def curve(self, name: str) -> EndpointCurve:
        try:
            return self.endpoints[name]
        except KeyError:
            raise ValueError(f"endpoint {name!r} has no capacity in the model "
                             f"(known: {', '.join(sorted(self.endpoints))})") from None

    def throughput(self, src: str, dst: str, cc: int, src_cc: float = 0.0, dst_cc: float = 0.0, *,
                   corrected: bool = True) -> float:
        """Estimated bits/s of one task with ``cc`` while others carry ``src_cc`` and ``dst_cc``."""
        if cc <= 0:
            return 0.0
        shares = []
        for name, others in ((src, src_cc), (dst, dst_cc)):
            n = cc + max(0.0, others)
            shares.append(self.curve(name).aggregate(n) * cc / n)
        thr = min(shares)
        return thr * (self._ratio.get((src, dst), 1.0) if corrected else 1.0)

    def aggregate(self, src: str, dst: str, cc: int, src_cc: float = 0.0, dst_cc: float = 0.0) -> float:
        """What the busier-limited of the two ends moves in all with this task at ``cc`` (corrected)."""
        return min(self.curve(src).aggregate(cc + max(0.0, src_cc)),
                   self.curve(dst).aggregate(cc + max(0.0, dst_cc))) * self._ratio.get((src, dst), 1.0)

    def observe(self, src: str, dst: str, predicted_bps: float, observed_bps: float) -> None:
        """Fold one recent transfer's observed/predicted ratio into the pair's correction."""
        if predicted_bps <= 0 or observed_bps < 0:
            return
        alpha = 1.0 - 0.5 ** (1.0 / self.half_life)
        old = self._ratio.get((src, dst), 1.0)
        self._ratio[(src, dst)] = min(2.0, max(0.05, (1 - alpha) * old + alpha * observed_bps / predicted_bps))

    def correction(self, src: str, dst: str) -> float:
        return self._ratio.get((src, dst), 1.0)

    def corrections(self) -> dict[tuple[str, str], float]:
        """Every pair's correction (to keep them between models, as the agents' board does)."""
        return dict(self._ratio)

    def set_correction(self, src: str, dst: str, ratio: float) -> None:
        self._ratio[(src, dst)] = float(ratio)

    def ideal_time(self, src: str, dst: str, size: float, max_cc: int, beta: float = 1.1) -> float:
        """TT_ideal: the transfer alone, at the concurrency FindThrCC picks without load (Listing 2), uncorrected."""
        _cc, thr = find_thr_cc(lambda c: self.throughput(src, dst, c, corrected=False), max_cc, beta)
        return self.startup_s + size * 8 / thr


def find_thr_cc(throughput, max_cc: int, beta: float, aggregate=None) -> tuple[int, float]:
    """FindThrCC (SEAL Listing 2, lines 32-42): raise cc from 1 while the prediction grows by more than
    ``beta``; return the last cc whose prediction was kept and that prediction.

    (As printed, the loop returns the cc one past the one whose throughput it returns; we return the
    pair that belongs together.)

    With ``aggregate`` (cc -> the endpoints' predicted aggregate with this task at cc), one more cc must
    also add ``beta - 1`` of the task's rate to the *aggregate*: on a busy endpoint a task's share grows
    with its cc whether or not the endpoint moves more, so the plain test hands ever more concurrency to
    whoever asks, taken from the others (the scheduler's ``aggregate-gain`` switch)."""
    if max_cc < 1 or beta < 1:
        raise ValueError(f"FindThrCC: need max_cc >= 1 and beta >= 1, got {max_cc}, {beta}")
    best_cc, best = 1, throughput(1)
    agg = aggregate(1) if aggregate is not None else 0.0
    cc = 1
    while cc < max_cc:
        nxt = throughput(cc + 1)
        if not nxt > best * beta:
            break
        if aggregate is not None:
            nxt_agg = aggregate(cc + 1)
            if not nxt_agg - agg > (beta - 1) * best:
                break
            agg = nxt_agg
        cc += 1
        best_cc, best = cc, nxt
    return best_cc, best


#: the keys of an endpoint's table in an endpoints file, and what each sets on ``EndpointCurve``
CURVE_KEYS = {"capacity": "capacity_bps", "unit": "unit_bps", "overload": "overload"}


def endpoint_curves(mapping: Any, *, where: str = "endpoints", unit_bps: float = 1e9,
                    overload: float = 0.1) -> dict[str, EndpointCurve]:
    """Endpoint name -> ``EndpointCurve`` from ``{name: capacity}`` or ``{name: {capacity, unit, overload}}``.

    Rates are numbers of bits/s (``10e9``; TOML also ``10_000_000_000``); a string such as ``"10Gbit"``
    is refused, saying what is expected.

    :param mapping: what the endpoints file holds (a JSON object or a TOML document).
    :param where: names the source in errors, e.g. ``endpoints file sites.toml``.
    :param unit_bps: one stream's rate where an entry does not give ``unit``.
    :param overload: the curve's overload where an entry does not give it.
    """
    if not isinstance(mapping, dict):
        raise ValueError(f"{where}: expected a mapping of endpoint name to capacity, got {type(mapping).__name__}")
    if not mapping:
        raise ValueError(f"{where}: names no endpoint (expected e.g. {{\"dtn-a\": 10e9}})")
    out = {}
    for name, entry in mapping.items():
        what = f"{where}: endpoint {name!r}"
        if not isinstance(entry, dict):
            entry = {"capacity": entry}
        unknown = sorted(set(entry) - set(CURVE_KEYS))
        if unknown:
            raise ValueError(f"{what}: unknown key(s) {', '.join(map(repr, unknown))} "
                             f"(expected {', '.join(CURVE_KEYS)})")
        if "capacity" not in entry:
            raise ValueError(f"{what}: no capacity (the most it moves in all, in bits/s, e.g. 10e9)")
        values = {"unit_bps": unit_bps, "overload": overload}
        for key, attr in CURVE_KEYS.items():
            if key not in entry:
                continue
            raw = entry[key]
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                want = "a number" if key == "overload" else "bits/s as a number (e.g. 10e9 for 10 Gbit/s)"
                raise ValueError(f"{what}: {key}: expected {want}, got {raw!r}")
            value = float(raw)
            if not math.isfinite(value) or (value < 0 if key == "overload" else value <= 0):
                raise ValueError(f"{what}: {key} must be {'>= 0' if key == 'overload' else '> 0'}, got {raw!r}")
            values[attr] = value
        out[str(name)] = EndpointCurve(**values)
    return out
