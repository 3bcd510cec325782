"""Intrinsic dimension of a cloud of per-image vectors: TwoNN (Facco et al. 2017) and the local PCA rank.

TwoNN reads the dimension from the ratio ``mu = r2 / r1`` of every point's second to first nearest-neighbour
distance: on a locally uniform ``d``-dimensional manifold ``mu`` is Pareto, ``P(mu) = d mu^(-d-1)``, so
``-ln(1 - F(mu)) = d ln mu``, a line through the origin (Facco, d'Errico, Rodriguez & Laio 2017, Sci. Rep.
7:12140). Three estimators (``FITS``):

* ``linear`` (the paper's and scikit-dimension's): the ratios sorted, ``F_i = i / N``, the largest
  ``discard_fraction`` of them left out (the paper's 10 %: the tail most hurt by curvature and density changes), the
  slope of the least-squares line through the origin;
* ``mle``: the maximum-likelihood slope of the same censored sample,
  ``(n - 1) / (sum_kept ln mu + (N - n) ln mu_n)`` (scikit-dimension's ``method="mle"``);
* ``tgo_ii`` (the TGO-II/-III authors' code): features standardised, ratios with ``r1 <= 1e-12`` or ``r2 <= r1``
  left out, ``F_i = i / (n + 1)``, a line *with* intercept fitted on the central 10-90 % of the sorted ratios.

Distances are float64 Euclidean and the neighbours exact (brute force): squared distances from the Gram matrix rank
the candidates, and the three nearest are measured again as ``||x_i - x_j||`` so that a duplicate is exactly 0
(the Gram form leaves ~1e-13 where rows are equal). A point whose first-neighbour distance is 0 (a duplicate) has no
ratio: it is left out of the fit and counted. Subsets (the leave-one-group-out jackknife) search their neighbours
among their own points.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["FITS", "TwoNN", "neighbour_distances", "pca_rank", "twonn", "twonn_fit"]

FITS = ("linear", "mle", "tgo_ii")
"""The TwoNN estimators (module docstring)."""


@dataclass(frozen=True)
class TwoNN:
    """One TwoNN estimate.

    Attributes:
        dimension: The intrinsic dimension (NaN where fewer than two ratios are left to fit).
        duplicates: Points left out for a first-neighbour distance of 0.
        ratios: Ratios the fit used.
    """

    dimension: float
    duplicates: int
    ratios: int


def _candidates(x: np.ndarray, m: int) -> np.ndarray:
    """The ``m`` nearest other rows of every row by squared Euclidean distance (Gram form), nearest first."""
    sq = np.einsum("ij,ij->i", x, x)
    d2 = sq[:, None] + sq[None, :] - 2.0 * (x @ x.T)
    np.fill_diagonal(d2, np.inf)
    idx = np.argpartition(d2, m - 1, axis=1)[:, :m] if m < x.shape[0] - 1 else np.argsort(d2, axis=1)[:, :m]
    order = np.argsort(np.take_along_axis(d2, idx, axis=1), axis=1, kind="stable")
    return np.take_along_axis(idx, order, axis=1)


def _standardised(x: np.ndarray) -> np.ndarray:
    """Each feature to mean 0, variance 1 (ddof 0; a constant feature is only centred), as scikit-learn's
    ``StandardScaler``."""
    std = x.std(axis=0)
    return (x - x.mean(axis=0)) / np.where(std > 0, std, 1.0)


def neighbour_distances(
    x: np.ndarray, subsets: Sequence[np.ndarray | None] = (None,), *, standardise: bool = False
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(r1, r2)``: every point's first and second nearest-neighbour distance within each subset.

    Args:
        x: float64 ``[N, D]`` points.
        subsets: Boolean ``[N]`` masks of the points kept (``None``: all), e.g. each leave-one-group-out set.
        standardise: Standardise the features of each subset first (the ``tgo_ii`` estimator).

    Returns:
        One ``(r1, r2)`` pair of float64 arrays per subset, over its points in index order (empty below 3 points).
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    masks = [np.ones(n, dtype=bool) if s is None else np.asarray(s, dtype=bool) for s in subsets]
    shared = None
    if not standardise and n >= 3:
        # one ranking serves every subset: at most ``n - kept`` of a row's candidates are left out, so its first
        # ``n - kept + 3`` candidates hold the 3 nearest kept ones
        m = min(n - 1, max(n - int(k.sum()) for k in masks) + 3)
        shared = _candidates(x, m)
    out = []
    for keep in masks:
        rows = np.flatnonzero(keep)
        if rows.size < 3:
            out.append((np.empty(0), np.empty(0)))
            continue
        points = _standardised(x[rows]) if standardise else x
        if shared is None:
            near, origin = _candidates(points, min(3, rows.size - 1)), points
        else:  # each row's first 3 candidates that the subset keeps
            first = np.argsort(~keep[shared[rows]], axis=1, kind="stable")[:, : min(3, rows.size - 1)]
            near, origin = np.take_along_axis(shared[rows], first, axis=1), points[rows]
        exact = np.sort(np.linalg.norm(origin[:, None, :] - points[near], axis=2), axis=1)
        out.append((exact[:, 0], exact[:, 1]))
    return out


def twonn_fit(r1: np.ndarray, r2: np.ndarray, fit: str = "linear", discard_fraction: float = 0.1) -> TwoNN:
    """The TwoNN dimension from the neighbour distances (module docstring for the three ``fit`` estimators).

    Args:
        r1: First-neighbour distances.
        r2: Second-neighbour distances.
        fit: ``linear``, ``mle`` or ``tgo_ii``.
        discard_fraction: Largest ratios left out by ``linear`` and ``mle`` (``tgo_ii`` fits the central 10-90 %).
    """
    if fit not in FITS:
        raise ValueError(f"twonn_fit: fit must be one of {FITS}, got {fit!r}")
    r1, r2 = np.asarray(r1, dtype=np.float64), np.asarray(r2, dtype=np.float64)
    duplicates = int(np.count_nonzero(r1 == 0))
    if fit == "tgo_ii":
        good = (r1 > 1e-12) & (r2 > r1)
        mu = np.sort(r2[good] / r1[good])
        n = mu.size
        if n < 5:
            return TwoNN(math.nan, duplicates, n)
        x, y = np.log(mu), -np.log(1.0 - np.arange(1, n + 1) / (n + 1.0))
        lo = int(0.1 * n)
        hi = max(lo + 5, int(0.9 * n))
        slope = float(np.polyfit(x[lo:hi], y[lo:hi], 1)[0])
        return TwoNN(slope if math.isfinite(slope) and slope > 0 else math.nan, duplicates, x[lo:hi].size)
    mu = np.sort(r2[r1 > 0] / r1[r1 > 0])
    total = mu.size
    kept = int(total * (1.0 - discard_fraction))
    if kept < 2:
        return TwoNN(math.nan, duplicates, max(kept, 0))
    mu = mu[:kept]
    log_mu = np.log(mu)
    if fit == "mle":
        denominator = float(log_mu.sum() + (total - kept) * log_mu[-1])
    else:
        y = -np.log(1.0 - np.arange(1, kept + 1) / total)
        denominator = float(log_mu @ log_mu)
    if not denominator > 0:
        return TwoNN(math.nan, duplicates, kept)
    value = (kept - 1) / denominator if fit == "mle" else float(log_mu @ y) / denominator
    return TwoNN(float(value), duplicates, kept)


def twonn(
    x: np.ndarray, subsets: Sequence[np.ndarray | None] = (None,), fit: str = "linear", discard_fraction: float = 0.1
) -> list[TwoNN]:
    """TwoNN of the points ``x`` (float64 ``[N, D]``) and of each subset (`neighbour_distances`, `twonn_fit`)."""
    pairs = neighbour_distances(x, subsets, standardise=fit == "tgo_ii")
    return [twonn_fit(r1, r2, fit, discard_fraction) for r1, r2 in pairs]


def pca_rank(x: np.ndarray, variance: float = 0.95) -> float:
    """Principal components needed for ``variance`` of the points' variance (the smallest ``k`` with
    ``sum_{i<=k} s_i^2 / sum s_i^2 >= variance``), NaN without variance (TGO-III's ``local PCA rank``)."""
    x = np.asarray(x, dtype=np.float64)
    if x.shape[0] < 2:
        return math.nan
    s2 = np.linalg.svd(x - x.mean(axis=0), compute_uv=False) ** 2
    total = float(s2.sum())
    if not total > 0:
        return math.nan
    return float(np.searchsorted(np.cumsum(s2) / total, variance) + 1)
