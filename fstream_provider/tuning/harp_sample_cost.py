"""Whether HARP's sample transfer can pay for itself, and how large it may be (issue 44; a departure from HARP §III-A).

HARP (Arslan & Kosar, SC'16, Algorithm 1 lines 4-8) samples every chunk with ``2 x bandwidth-seconds`` of its files
at the heuristic's settings while the rest of the transfer waits; the sample's measured rate then weights the
history's groups (§III-B4: the group whose model errs least at the sample's settings weighs most). The paper's
datasets were 10-98 GB, where the sample is a few percent. On a transfer of a few bandwidth-seconds the sample is
most of it, and the rest waits; a new user's held-out 0.64 GB transfer ran at 0.80x ``static`` for that reason.

A sample is worth taking only when knowing which group today resembles can change the settings enough to win back
what the sample costs. Per chunk, from its fitted groups (``harp_model.FittedChunk``), before or while its sample
runs:

* **No model fits**, or **one group**: the sample has nothing to weight (with one group every weighting gives the
  same settings). No sample.
* **The groups agree on this path**: the paper's validation (§IV-A: train on 70 % of the groups, project onto
  each test group's own model) errs by at most ``AGREE`` (10 %). The history predicts the path; no sample.
* **Cost against gain.** ``s0`` is the equal-weight prediction (what runs without a sample). If today resembles
  group ``g``, running ``s0`` instead of ``g``'s own relaxed optimum costs ``regret_g = 1 - f_g(s0) / f_g(opt_g)``
  of the time; the expected gain of sampling is the mean regret over the groups times the rest of the chunk's
  time at ``s0``. Each sampled byte costs ``8 / T_h - 8 / T_0`` seconds, the models' rates at the heuristic's
  settings and at ``s0`` (the sample runs at the heuristic's settings while the rest waits). What a sample tells
  (which group today resembles) does not grow with its size, only the accuracy of its rate does, so the sample
  is the paper's ``2 x bandwidth-seconds`` cut to a tenth of the chunk (``MAX_SHARE``) and to the largest size
  whose cost is at most half its expected gain (``PAY_SHARE``); below ``min_bytes`` (too short to measure a
  rate) there is no sample.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

AGREE = 0.10  # the groups' validation error at or below which the history alone predicts the path
PAY_SHARE = 0.5  # a sample may cost at most this share of what it is expected to gain
MAX_SHARE = 0.1  # and be at most this share of its chunk


@dataclass(frozen=True)
class SamplePlan:
    """How many bytes of a chunk to sample (0: none) and why.

    :param bytes: sample size in bytes; 0 means no sample (the chunk starts from the equal-weight prediction).
    :param reason: one line for the tuner's reason.
    :param gain_s: expected seconds saved on the rest of the chunk by sampling (None when not computed).
    :param cost_s: the sample's expected cost at ``bytes`` (None when not computed).
    """

    bytes: float
    reason: str
    gain_s: float | None = None
    cost_s: float | None = None


def group_validation(groups: Sequence[Any], *, test_share: float = 0.3, seed: int = 0) -> dict:
    """§IV-A over fitted groups: the training groups' mean maximiser projected onto each test group's own model.

    Returns ``accuracy`` (None with fewer than two groups), ``per_group``, ``n_train``, ``n_test``, ``settings``.
    """
    if not 0 < test_share < 1:
        raise ValueError(f"validation: test_share {test_share!r} must be between 0 and 1")
    groups = list(groups)
    if len(groups) < 2:
        return {"accuracy": None, "n_train": len(groups), "n_test": 0, "per_group": [], "settings": None}
    order = np.random.default_rng(seed).permutation(len(groups))
    n_test = max(1, int(round(test_share * len(groups))))
    test = [groups[i] for i in order[:n_test]]
    train = [groups[i] for i in order[n_test:]]
    # the optimum of the training data: the groups' maximisers (Eq. 4) averaged (Eq. 5, equal weights), not
    # relaxed: relaxation trades up to a fifth of the estimate for fewer streams by design
    cc, p, pp = (int(round(float(np.mean([g.best[k] for g in train])))) for k in range(3))
    accs = []
    for g in test:
        projected = float(g.predict(cc, p, pp)[0])
        accs.append(max(0.0, 1.0 - abs(g.t_max_bps - projected) / projected) if projected > 0 else 0.0)
    return {"accuracy": float(np.mean(accs)), "per_group": accs, "n_train": len(train), "n_test": len(test),
            "settings": (cc, p, pp)}


def _mean_at(groups: Sequence[Any], s: tuple[int, int, int]) -> float:
    return float(np.mean([float(g.predict(*s)[0]) for g in groups]))


def equal_weight_settings(groups: Sequence[Any]) -> tuple[int, int, int]:
    """Eq. 5 with equal weights: what the chunk runs without a sample (``HarpOptimizer.predict(fitted, None)``)."""
    return tuple(max(lo, int(round(float(np.mean([g.relaxed[k] for g in groups]))))) for k, lo in
                 enumerate((1, 1, 0)))  # type: ignore[return-value]


def plan_sample(groups: Sequence[Any], *, sample_settings: tuple[int, int, int], paper_bytes: float,
                chunk_bytes: float, min_bytes: float, bandwidth_bps: float, no_model: str = "") -> SamplePlan:
    """The sample for one chunk (see the module docstring).

    :param groups: the chunk's fitted groups (``GroupModel``: ``predict``, ``relaxed``, ``best``, ``t_max_bps``).
    :param sample_settings: the heuristic's (cc, p, pp) the sample would run at.
    :param paper_bytes: the paper's sample size (``2 x bandwidth-seconds``, at least two files).
    :param chunk_bytes: the whole chunk's bytes (sample included).
    :param min_bytes: the shortest sample whose rate means anything; a shorter one is no sample.
    :param bandwidth_bps: the path's bandwidth (the models' rates are capped at it).
    :param no_model: why no group fits (shown when ``groups`` is empty).
    """
    if not groups:
        return SamplePlan(0.0, f"no sample: no model fits ({no_model or 'no group'}), so a sample has nothing to "
                               "weight")
    if len(groups) == 1:
        return SamplePlan(0.0, "no sample: one group in the history, so every weighting gives its settings")
    val = group_validation(groups)
    if val["accuracy"] is not None and 1.0 - val["accuracy"] <= AGREE:
        return SamplePlan(0.0, f"no sample: the history predicts this path (validation error "
                               f"{1.0 - val['accuracy']:.0%} <= {AGREE:.0%} over {len(groups)} groups)")
    s0 = equal_weight_settings(groups)
    regrets = []
    for g in groups:
        best = float(g.predict(*g.relaxed)[0])
        regrets.append(max(0.0, 1.0 - float(g.predict(*s0)[0]) / best) if best > 0 else 0.0)
    gain_share = float(np.mean(regrets))
    t0 = min(max(_mean_at(groups, s0), 1.0), bandwidth_bps)
    th = min(max(_mean_at(groups, tuple(sample_settings)), 1.0), bandwidth_bps)
    per_byte = max(0.0, 8.0 / th - 8.0 / t0)  # seconds each sampled byte costs over running it at s0
    per_byte_gain = 8.0 / t0 * gain_share  # seconds the sample saves per byte of the rest of the chunk
    head = (f"groups disagree (mean regret of the equal-weight settings {gain_share:.0%}; the heuristic's "
            f"{th / 1e6:.0f} vs {t0 / 1e6:.0f} Mbit/s modelled)")
    if per_byte_gain <= 0:
        return SamplePlan(0.0, f"no sample: {head}: nothing to gain", 0.0, 0.0)
    size = min(paper_bytes, MAX_SHARE * chunk_bytes)  # what it learns does not grow with its size; accuracy does
    if per_byte > 0:
        size = min(size, chunk_bytes * PAY_SHARE * per_byte_gain / (per_byte + PAY_SHARE * per_byte_gain))
    gain = (chunk_bytes - size) * per_byte_gain
    cost = size * per_byte
    if size < min_bytes:
        return SamplePlan(0.0, f"no sample: {head}: a sample that pays for itself would be {size / 1e6:.1f} MB, "
                               f"below the {min_bytes / 1e6:.1f} MB a rate needs", gain, cost)
    cut = "" if size >= paper_bytes else f", cut from {paper_bytes / 1e6:.0f} MB"
    return SamplePlan(size, f"sample {size / 1e6:.0f} MB{cut}: {head}: expected gain {gain:.1f} s, cost "
                            f"{cost:.1f} s", gain, cost)
