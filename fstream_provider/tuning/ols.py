"""Least squares through the origin with a t-based interval for a mean prediction: the two numbers the ETA needs.

Identical to statsmodels' ``OLS(y, X).fit().get_prediction(x).conf_int(alpha)`` and ``pvalues`` (the
tests compare them on random data), computed with numpy and ``scipy.special``'s Student-t functions.
The reason is memory, measured: ``import statsmodels.api`` (or even ``statsmodels.regression``) pulls
pandas, pyarrow and scipy.stats into the process, 145–175 MiB of resident memory, while numpy and
``scipy.special`` cost ~40 MiB. Every ``fstream send`` and agent computes an ETA, so the difference is
paid by every sender on a DTN (issue 28: a stream of a million files in < 300 MB).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Fit:
    """A fitted model: coefficients, their p-values, the residual degrees of freedom and ``(XᵀX)⁻¹ s²``."""

    params: Any
    pvalues: Any
    df_resid: int
    cov: Any

    def predict(self, x: Any, alpha: float) -> tuple[float, float, float]:
        """Mean prediction at the row ``x`` and its ``1 - alpha`` confidence interval ``(mean, lo, hi)``."""
        import numpy as np
        from scipy.special import stdtrit

        x = np.asarray(x, dtype=float).reshape(-1)
        mean = float(x @ self.params)
        se = float(np.sqrt(max(float(x @ self.cov @ x), 0.0)))
        q = float(stdtrit(self.df_resid, 1 - alpha / 2)) if self.df_resid > 0 else float("nan")
        return mean, mean - q * se, mean + q * se


def fit(y: Any, X: Any) -> Fit:
    """Ordinary least squares of ``y`` on the columns of ``X`` (no intercept added)."""
    import numpy as np
    from scipy.special import stdtr

    y = np.asarray(y, dtype=float)
    X = np.asarray(X, dtype=float)
    if X.ndim == 1:
        X = X.reshape(-1, 1)
    n, k = X.shape
    params, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ params
    df = n - k
    s2 = float(resid @ resid) / df if df > 0 else float("nan")
    cov = np.linalg.pinv(X.T @ X) * s2
    with np.errstate(divide="ignore", invalid="ignore"):
        t = params / np.sqrt(np.diag(cov))
    pvalues = 2 * stdtr(df, -np.abs(t)) if df > 0 else np.full(k, np.nan)
    return Fit(params, pvalues, df, cov)
