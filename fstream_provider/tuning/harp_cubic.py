"""HARP's regression model (Arslan & Kosar, SC'16, §III-B2, Eq. 2) and its error classes (§III-B4), in numpy.

The model is scikit-learn's ``make_pipeline(StandardScaler(), PolynomialFeatures(3), LinearRegression())``, the one
``harp_model`` used, written out: inputs standardised (mean 0, standard deviation 1; a constant input keeps scale
1), every monomial of degree <= 3, least squares on centred columns with the same minimum-norm solver and cut-off
(LAPACK ``gelsd``, singular values below 1e-6 of the largest dropped) and the intercept restored, so a rank-deficient
group (a parameter probed at two values only) is extrapolated the same way. ``split_1d`` is DBSCAN with
``min_samples=1`` on one dimension: a point's class is every point reachable through neighbours within ``eps``,
which on a line is a split wherever two sorted neighbours are more than ``eps`` apart.

Why not scikit-learn itself: importing it takes 1.6 s of CPU on this machine (``python -X importtime``), and the
sender imports it while the transfer runs; on the emulated WAN (2 cores, the sender busy) HARP's prediction arrived
4.3-5.8 s after the first byte of 5.6-11 s transfers (issue 44, ``bench/results/harp-20261130-042417``).
``tests/test_harp_cubic.py`` checks both against scikit-learn on real and synthetic histories.
"""

from __future__ import annotations

from itertools import combinations_with_replacement

import numpy as np

RCOND = 1e-6  # scikit-learn's LinearRegression(tol=1e-6): the cut-off of its lstsq


class Cubic:
    """``y = f(x)``: least squares over every monomial of degree <= ``degree`` of the standardised columns of x."""

    def __init__(self, degree: int = 3) -> None:
        if degree < 1:
            raise ValueError(f"Cubic: degree must be >= 1, got {degree}")
        self.degree = degree
        self._terms: list[tuple[int, ...]] = []
        self._mean = self._scale = self._x_mean = self._coef = None
        self._intercept = 0.0

    def _design(self, x: np.ndarray) -> np.ndarray:
        z = (x - self._mean) / self._scale
        return np.column_stack([np.prod(z[:, list(t)], axis=1) for t in self._terms])

    def fit(self, x: np.ndarray, y: np.ndarray) -> "Cubic":
        x, y = np.asarray(x, float), np.asarray(y, float)
        if x.ndim != 2 or len(x) != len(y) or len(y) == 0:
            raise ValueError(f"Cubic.fit: x must be (n, k) and y (n,), got {x.shape} and {y.shape}")
        self._mean = x.mean(axis=0)
        scale = x.std(axis=0)
        self._scale = np.where(scale > 0, scale, 1.0)
        k = x.shape[1]
        self._terms = [t for d in range(1, self.degree + 1) for t in combinations_with_replacement(range(k), d)]
        a = self._design(x)
        self._x_mean = a.mean(axis=0)
        y_mean = float(y.mean())
        self._coef = np.linalg.lstsq(a - self._x_mean, y - y_mean, rcond=RCOND)[0]
        self._intercept = y_mean - float(self._x_mean @ self._coef)
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        if self._coef is None:
            raise ValueError("Cubic.predict: fit first")
        return self._design(np.asarray(x, float)) @ self._coef + self._intercept


def r2(y: np.ndarray, pred: np.ndarray) -> float:
    """Coefficient of determination, as ``sklearn.metrics.r2_score`` (a constant y: 1 if matched, else 0)."""
    y, pred = np.asarray(y, float), np.asarray(pred, float)
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    if ss_tot == 0:
        return 1.0 if ss_res == 0 else 0.0
    return 1.0 - ss_res / ss_tot


def split_1d(values: np.ndarray, eps: float) -> np.ndarray:
    """DBSCAN(eps, min_samples=1) labels of 1-D ``values``: classes numbered from 0 in ascending order of value."""
    v = np.asarray(values, float).ravel()
    if eps <= 0:
        raise ValueError(f"split_1d: eps must be > 0, got {eps}")
    order = np.argsort(v, kind="stable")
    gaps = np.diff(v[order]) > eps
    labels = np.empty(len(v), dtype=int)
    labels[order] = np.concatenate([[0], np.cumsum(gaps)]) if len(v) else []
    return labels
