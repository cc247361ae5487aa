"""Least squares through the origin with a t-based interval for a mean prediction: the two numbers the ETA needs.

Identical to statsmodels' ``OLS(y, X).fit().get_prediction(x).conf_int(alpha)`` and ``pvalues`` (the
tests compare them on random data), computed in plain Python: a QR factorization by modified Gram-Schmidt
(the ETA fits one or two columns over a window of tens of intervals) and Student's t for an integer number of
degrees of freedom from its finite series (Abramowitz & Stegun 26.7.3-4), within 1e-14 of scipy's (tests), its quantile by
bisection on that series.

Why not a library, measured: ``import statsmodels.api`` pulls pandas, pyarrow and scipy.stats into the process
(145-175 MiB resident, issue 28); numpy and ``scipy.special``, which this module used until issue 43, cost 0.22-0.34
CPU-s and ~40 MiB to import (timed on this machine, three runs), and every ``fstream send`` that lasts two intervals
paid it at its first ETA: 0.15 CPU-s of the 0.75 that a send of 2000 one-byte files took, and ~75 µs of the
sender's per-file cost as the loopback benchmark measures it (2000 files net of one, which never fits).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

Vector = Sequence[float]


@dataclass(frozen=True)
class Fit:
    """A fitted model: coefficients, their p-values, the residual degrees of freedom and ``(XᵀX)⁻¹ s²``."""

    params: tuple[float, ...]
    pvalues: tuple[float, ...]
    df_resid: int
    cov: tuple[tuple[float, ...], ...]

    def predict(self, x: Vector, alpha: float) -> tuple[float, float, float]:
        """Mean prediction at the row ``x`` and its ``1 - alpha`` confidence interval ``(mean, lo, hi)``."""
        x = [float(v) for v in x]
        mean = _dot(x, self.params)
        var = sum(x[i] * _dot(row, x) for i, row in enumerate(self.cov))
        se = math.sqrt(max(var, 0.0))
        q = t_quantile(self.df_resid, alpha) if self.df_resid > 0 else math.nan
        return mean, mean - q * se, mean + q * se


def fit(y: Vector, X: Sequence[Vector] | Vector) -> Fit:
    """Ordinary least squares of ``y`` on the columns of ``X`` (rows of ``X``; no intercept added). A column
    that is a combination of the ones before it gets a NaN coefficient and p-value (the ETA then ignores the fit)."""
    y = [float(v) for v in y]
    rows = [[float(c) for c in v] if hasattr(v, "__len__") else [float(v)] for v in X]
    n, k = len(rows), len(rows[0]) if rows else 0
    if n != len(y) or k == 0:
        raise ValueError(f"least squares: {n} rows of X for {len(y)} values of y")
    qr = _qr([[row[j] for row in rows] for j in range(k)])
    df = n - k
    if qr is None:  # rank deficient: no unique fit
        nan = (math.nan,) * k
        return Fit(nan, nan, df, (nan,) * k)
    q, r = qr
    rinv = _upper_inverse(r)
    qty = [_dot(col, y) for col in q]
    params = [sum(rinv[i][j] * qty[j] for j in range(i, k)) for i in range(k)]
    resid = [y[i] - _dot(rows[i], params) for i in range(n)]
    s2 = _dot(resid, resid) / df if df > 0 else math.nan
    cov = [[s2 * sum(rinv[i][m] * rinv[j][m] for m in range(max(i, j), k)) for j in range(k)] for i in range(k)]
    pvalues = []
    for j in range(k):
        se = math.sqrt(cov[j][j]) if cov[j][j] >= 0 else math.nan
        pvalues.append(t_two_sided(df, params[j] / se) if df > 0 and se > 0 else math.nan)
    return Fit(tuple(params), tuple(pvalues), df, tuple(tuple(row) for row in cov))


def t_two_sided(df: int, t: float) -> float:
    """P(|T| ≥ |t|) for Student's t with ``df`` (a positive integer) degrees of freedom."""
    return max(0.0, 1.0 - _a(df, math.atan(abs(t) / math.sqrt(df))))


@functools.lru_cache(maxsize=256)
def t_quantile(df: int, alpha: float) -> float:
    """The ``t`` with P(|T| ≥ t) = ``alpha``: the half-width of a ``1 - alpha`` interval in standard errors."""
    if not 0 < alpha < 1 or df < 1:
        raise ValueError(f"t quantile: alpha {alpha!r} must be in (0, 1) and df {df!r} a positive integer")
    lo, hi = 0.0, math.pi / 2  # A(θ) grows from 0 to 1 over θ = atan(t / √df) in [0, π/2)
    while True:
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            return math.sqrt(df) * math.tan(mid)
        if _a(df, mid) < 1.0 - alpha:
            lo = mid
        else:
            hi = mid


def _a(df: int, theta: float) -> float:
    """A(t | df) = P(|T| ≤ t) at θ = atan(t / √df): Abramowitz & Stegun 26.7.3 (odd df) and 26.7.4 (even df)."""
    c2 = math.cos(theta) ** 2
    if df % 2:  # odd: (2/π)(θ + sinθ (cosθ + 2/3 cos³θ + … + (2·4…(df-3))/(1·3…(df-2)) cos^(df-2)θ))
        if df == 1:
            return 2 * theta / math.pi
        term = total = math.cos(theta)
        for j in range(1, (df - 1) // 2):
            term *= c2 * (2 * j) / (2 * j + 1)
            total += term
        return 2 / math.pi * (theta + math.sin(theta) * total)
    term = total = 1.0  # even: sinθ (1 + 1/2 cos²θ + (1·3)/(2·4) cos⁴θ + … + (1·3…(df-3))/(2·4…(df-2)) cos^(df-2)θ)
    for j in range(1, df // 2):
        term *= c2 * (2 * j - 1) / (2 * j)
        total += term
    return math.sin(theta) * total


def _qr(cols: list[list[float]]) -> tuple[list[list[float]], list[list[float]]] | None:
    """Thin QR of the matrix with columns ``cols`` by modified Gram-Schmidt with one re-orthogonalization:
    (Q's columns, R as rows); None when a column is (to rounding) a combination of the ones before it."""
    k = len(cols)
    q: list[list[float]] = []
    r = [[0.0] * k for _ in range(k)]
    for j, col in enumerate(cols):
        v = list(col)
        for _ in range(2):  # twice is enough (Giraud et al.): Q stays orthogonal to rounding
            for i, qi in enumerate(q):
                h = _dot(qi, v)
                r[i][j] += h
                v = [a - h * b for a, b in zip(v, qi)]
        norm = math.sqrt(_dot(v, v))
        if not norm > 1e-12 * math.sqrt(_dot(col, col)):
            return None
        r[j][j] = norm
        q.append([a / norm for a in v])
    return q, r


def _upper_inverse(r: list[list[float]]) -> list[list[float]]:
    """The inverse of the upper-triangular ``r`` (back substitution, column by column)."""
    k = len(r)
    inv = [[0.0] * k for _ in range(k)]
    for j in range(k):
        inv[j][j] = 1.0 / r[j][j]
        for i in range(j - 1, -1, -1):
            inv[i][j] = -sum(r[i][m] * inv[m][j] for m in range(i + 1, j + 1)) / r[i][i]
    return inv


def _dot(a: Vector, b: Vector) -> float:
    return math.fsum(x * y for x, y in zip(a, b))
