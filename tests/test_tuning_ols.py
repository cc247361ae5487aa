"""The ETA's least squares gives statsmodels' numbers (issue 28 replaced the import to save ~130 MiB per sender)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import statsmodels.api as sm

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


def test_eta_imports_neither_statsmodels_nor_pandas() -> None:
    code = ("import sys; from fstream_provider.tuning.eta import EtaEstimator; e = EtaEstimator()\n"
            "for i in range(12): e.add(i, 1.0, 1e8 + i * 1e6, files=3 + i % 4)\n"
            "est = e.estimate(5e9, 40); assert est is not None and est.lo <= est.s <= est.hi, est\n"
            "print(sorted(m for m in ('statsmodels', 'pandas', 'pyarrow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
