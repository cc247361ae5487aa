"""HARP's cubic and error classes in numpy (``harp_cubic``) give what scikit-learn gave, on real and synthetic groups."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.cluster import DBSCAN
from sklearn.linear_model import LinearRegression
from sklearn.metrics import r2_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import PolynomialFeatures, StandardScaler

from fstream_provider.tuning.harp_cubic import Cubic, r2, split_1d

ROOT = Path(__file__).resolve().parents[1]
#: a real calibration on the emulated WAN (1 Gbit/s, 40 ms): probes of tiny, small and medium files
CALIBRATED = ROOT / "bench/results/harp-20261130-042417/history.csv"


def _groups() -> list[tuple[str, np.ndarray, np.ndarray]]:
    out = []
    frame = pd.read_csv(CALIBRATED)
    for name, rows in frame.groupby("group"):
        out.append((name, rows[["cc", "p", "pp"]].to_numpy(float), rows["throughput_bps"].to_numpy(float) / 1e6))
    rng = np.random.default_rng(5)
    grid = np.array([(cc, p, pp) for cc in (1, 2, 4, 8, 16, 32) for p in (1, 2, 4, 8) for pp in (0, 1, 4, 8)], float)
    y = 900 * (1 - np.exp(-grid[:, 0] * grid[:, 1] / 12)) - 0.3 * grid[:, 0] * grid[:, 1] + rng.normal(0, 5, len(grid))
    out.append(("synthetic full grid", grid, y))
    two = grid[np.isin(grid[:, 2], (0, 4))]  # pp probed at two values: a rank-deficient cubic
    out.append(("synthetic pp in {0, 4}", two, y[np.isin(grid[:, 2], (0, 4))]))
    return out


@pytest.mark.parametrize("name,x,y", _groups(), ids=lambda v: v if isinstance(v, str) else "")
def test_the_cubic_predicts_what_scikit_learns_pipeline_predicts_over_the_whole_grid(name, x, y):
    ours = Cubic(3).fit(x, y)
    theirs = make_pipeline(StandardScaler(), PolynomialFeatures(3), LinearRegression()).fit(x, y)
    lo, hi = x.min(axis=0).astype(int), x.max(axis=0).astype(int)
    grid = np.stack(np.meshgrid(*[np.arange(a, b + 1) for a, b in zip(lo, hi)], indexing="ij"), -1).reshape(-1, 3)
    a, b = ours.predict(grid), theirs.predict(grid)
    assert np.allclose(a, b, rtol=1e-6, atol=1e-6 * max(1.0, float(np.abs(b).max()))), (name, np.abs(a - b).max())
    assert int(np.argmax(a)) == int(np.argmax(b))  # the optimum (Eq. 4) is the same point
    assert r2(y, ours.predict(x)) == pytest.approx(r2_score(y, theirs.predict(x)), abs=1e-9)


def test_the_real_history_has_groups_of_every_kind():
    names = [n for n, _, _ in _groups()]
    assert sum(n.startswith("calibrate:") for n in names) >= 3


def test_split_1d_is_dbscan_with_one_sample_per_core():
    rng = np.random.default_rng(11)
    for _ in range(200):
        v = rng.exponential(0.2, rng.integers(1, 12))
        eps = float(rng.choice([0.01, 0.05, 0.1, 0.3]))
        ours = split_1d(v, eps)
        theirs = DBSCAN(eps=eps, min_samples=1).fit(v.reshape(-1, 1)).labels_
        same = {(int(a), int(b)) for a, b in zip(ours, theirs)}  # the same partition, whatever the numbering
        assert len(same) == len(set(ours)) == len(set(theirs)), (v, eps)
    assert list(split_1d(np.array([0.0, 0.1, 0.35, 0.36]), 0.1)) == [0, 0, 1, 1]  # a gap of exactly eps joins


def test_bad_input_is_refused_naming_it():
    with pytest.raises(ValueError, match="degree must be >= 1"):
        Cubic(0)
    with pytest.raises(ValueError, match=r"x must be \(n, k\)"):
        Cubic().fit(np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="fit first"):
        Cubic().predict(np.zeros((1, 3)))
    with pytest.raises(ValueError, match="eps must be > 0"):
        split_1d(np.zeros(2), 0)
