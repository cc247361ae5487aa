"""The ETA's least squares gives statsmodels' numbers (issue 28 replaced the import to save ~130 MiB per sender;
issue 43 numpy and scipy.special, 0.22-0.34 CPU-s per send)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import statsmodels.api as sm
from scipy.special import stdtr, stdtrit

from fstream_provider.tuning import ols


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k", [1, 2])
def test_fit_and_interval_equal_statsmodels(seed: int, k: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 40))
    X = rng.uniform(1e6, 5e8, size=(n, k))
    if k == 2:
        X[:, 1] = rng.integers(1, 200, size=n)
    y = X @ rng.uniform(1e-9, 1e-8, size=k) + rng.normal(0, 0.05, size=n)
    ours = ols.fit(y, X)
    ref = sm.OLS(y, X).fit()
    np.testing.assert_allclose(ours.params, ref.params, rtol=1e-9)
    np.testing.assert_allclose(ours.pvalues, ref.pvalues, rtol=1e-6, atol=1e-12)
    x = X.mean(axis=0) * 3
    mean, lo, hi = ours.predict(x, alpha=0.1)
    pred = ref.get_prediction(x.reshape(1, -1))
    np.testing.assert_allclose([mean, lo, hi], [pred.predicted_mean[0], *pred.conf_int(alpha=0.1)[0]], rtol=1e-8)


@pytest.mark.parametrize("df", [*range(1, 41), 57, 100, 333, 1000])
def test_student_t_equals_scipy(df: int) -> None:
    for t in (0.01, 0.3, 1.0, 1.7, 2.5, 4.0, 10.0):
        assert ols.t_two_sided(df, t) == pytest.approx(2 * stdtr(df, -t), rel=1e-9, abs=1e-14), t
        assert ols.t_two_sided(df, -t) == ols.t_two_sided(df, t)
    for alpha in (0.5, 0.1, 0.05, 0.01, 0.001):
        assert ols.t_quantile(df, alpha) == pytest.approx(stdtrit(df, 1 - alpha / 2), rel=1e-10), alpha


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="alpha 1.5"):
        ols.t_quantile(3, 1.5)
    with pytest.raises(ValueError, match="3 rows of X for 2 values"):
        ols.fit([1.0, 2.0], [1.0, 2.0, 3.0])


def test_a_dependent_column_gives_no_fit() -> None:
    """Two proportional columns (every interval moved the same bytes per file): NaN, which the ETA reads as no
    per-file cost, where numpy's pseudo-inverse gave a split of the slope between them."""
    res = ols.fit([1.0, 2.1, 2.9, 4.2], [(1e6, 2), (2e6, 4), (3e6, 6), (4e6, 8)])
    assert all(np.isnan(res.params)) and all(np.isnan(res.pvalues))
    one = ols.fit([1.0, 2.1, 2.9], [1e6, 2e6, 3e6])  # one column given as a flat list
    assert one.params[0] == pytest.approx(sm.OLS([1.0, 2.1, 2.9], [1e6, 2e6, 3e6]).fit().params[0], rel=1e-12)


def test_eta_imports_no_numpy_scipy_statsmodels_or_pandas() -> None:
    code = ("import sys; from fstream_provider.tuning.eta import EtaEstimator; e = EtaEstimator()\n"
            "for i in range(12): e.add(i, 1.0, 1e8 + i * 1e6, files=3 + i % 4)\n"
            "est = e.estimate(5e9, 40); assert est is not None and est.lo <= est.s <= est.hi, est\n"
            "print(sorted(m for m in ('statsmodels', 'pandas', 'pyarrow', 'numpy', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
