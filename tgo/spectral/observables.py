"""The TGO-I observables (and a few more) as small pure functions of float64 eigenvalues.

Eigenvalues of the unbiased covariance of all tokens pooled, any order, non-negative; natural logarithms, ``0 log 0 =
0`` (why: ``docs/observables.md``). Degenerate inputs give NaN instead of raising, so a record row is always complete.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch

from tgo.spectral.decomposition import as_float64_matrix

__all__ = [
    "FLATNESS_FLOOR",
    "EigenvalueStack",
    "EigenvalueStats",
    "components_for_variance",
    "cumulative_explained_variance",
    "decay_curve",
    "default_fit_range",
    "effective_rank",
    "fit_range_of",
    "mean_abs_offdiag_correlation",
    "mean_abs_offdiag_correlations",
    "offdiag_energy_fraction",
    "offdiag_energy_fractions",
    "participation_ratio",
    "power_law_fit",
    "singular_values",
    "spectral_anisotropy",
    "spectral_entropy",
    "spectral_flatness",
    "stable_rank",
    "total_correlation",
    "total_correlations",
]

FLATNESS_FLOOR = 1e-12
"""The paper's floor on eigenvalues before the logarithm in :func:`spectral_flatness`."""

_EPS = float(np.finfo(np.float64).eps)


def _eigs(eigs: np.ndarray | torch.Tensor | list[float]) -> np.ndarray:
    """Validate and convert eigenvalues to a 1-D float64 numpy array (NaNs pass through, negatives do not)."""
    if isinstance(eigs, torch.Tensor):
        eigs = eigs.detach().to(device="cpu", dtype=torch.float64).numpy()
    e = np.asarray(eigs, dtype=np.float64)
    if e.ndim != 1 or e.size == 0:
        raise ValueError(f"expected a non-empty 1-D array of eigenvalues, got shape {e.shape}")
    if np.any(e < 0):
        raise ValueError(
            f"eigenvalues must be non-negative (most negative: {e.min():.3e}); clamp round-off with eigendecompose()"
        )
    if np.any(np.isposinf(e)):
        raise ValueError("eigenvalues must be finite (NaN marks an undefined spectrum; +inf is an error)")
    return e


def _defined_total(e: np.ndarray) -> float | None:
    """Sum of eigenvalues, or None when the spectrum is undefined (NaN) or has zero total variance."""
    if np.any(np.isnan(e)):
        return None
    total = float(e.sum())
    return total if total > 0 else None


class EigenvalueStats:
    """One spectrum, validated once, with the intermediates several observables share computed once, by the functions'
    own operations (the same bits)."""

    def __init__(self, eigs: np.ndarray | torch.Tensor | list[float]) -> None:
        self.e = _eigs(eigs)
        self._have_total = False
        self._total: float | None = None
        self._max: np.float64 | None = None
        self._entropy: float | None = None
        self._cumulative: np.ndarray | None = None

    @property
    def total(self) -> float | None:
        """``sum(e)``, or ``None`` for an undefined spectrum (NaN) or zero total variance."""
        if not self._have_total:
            self._total, self._have_total = _defined_total(self.e), True
        return self._total

    @property
    def top(self) -> np.float64:
        """``max(e)`` as numpy returns it."""
        if self._max is None:
            self._max = self.e.max()
        return self._max

    @property
    def entropy(self) -> float:
        """Shannon entropy (nats) of ``p = e / sum(e)``, ``0 log 0 = 0``; NaN when undefined."""
        if self._entropy is None:
            total = self.total
            if total is None:
                self._entropy = math.nan
            else:
                p = self.e[self.e > 0] / total
                self._entropy = float(-(p * np.log(p)).sum())
        return self._entropy

    @property
    def effective_rank(self) -> float:
        """`effective_rank`."""
        h = self.entropy
        return math.exp(h) if not math.isnan(h) else math.nan

    @property
    def stable_rank(self) -> float:
        """`stable_rank`."""
        total = self.total
        return total / float(self.top) if total is not None else math.nan

    @property
    def participation_ratio(self) -> float:
        """`participation_ratio`."""
        if self.total is None:
            return math.nan
        q = self.e / self.top
        return float(q.sum() ** 2 / (q * q).sum())

    def spectral_entropy(self, normalized: bool = False) -> float:
        """`spectral_entropy`."""
        h = self.entropy
        if not normalized:
            return h
        return h / math.log(self.e.size) if self.e.size > 1 else math.nan

    @property
    def spectral_anisotropy(self) -> float:
        """`spectral_anisotropy`."""
        total = self.total
        return float(self.top) / total if total is not None else math.nan

    def spectral_flatness(self, floor: float = FLATNESS_FLOOR) -> float:
        """`spectral_flatness`."""
        if self.total is None:
            return math.nan
        geometric = math.exp(float(np.mean(np.log(np.maximum(self.e, floor)))))
        return geometric / float(self.e.mean())

    def components_for_variance(self, fraction: float) -> int | float:
        """`components_for_variance`."""
        if not 0 < fraction <= 1:
            raise ValueError(f"components_for_variance: fraction must be in (0, 1], got {fraction}")
        total = self.total
        if total is None:
            return math.nan
        if self._cumulative is None:
            self._cumulative = np.cumsum(np.sort(self.e)[::-1]) / total
        k = int(np.searchsorted(self._cumulative, fraction - 1e-12, side="left")) + 1
        return min(k, self.e.size)

    def power_law_fit(self, start: int | None = None, stop: int | None = None) -> tuple[float, float]:
        """`power_law_fit`."""
        e = self.e
        start, stop = fit_range_of(e.size, start, stop)
        if self.total is None:
            return math.nan, math.nan
        e = np.sort(e)[::-1]
        tol = float(e[0]) * e.size * _EPS
        idx = np.arange(start, min(stop, e.size) + 1)
        lam = e[idx - 1]
        keep = lam > tol
        if keep.sum() < 2:
            return math.nan, math.nan
        x = np.log(idx[keep].astype(np.float64))
        y = np.log(lam[keep])
        xc, yc = x - x.mean(), y - y.mean()
        slope = float((xc * yc).sum() / (xc * xc).sum())
        ss_res = float(((yc - slope * xc) ** 2).sum())
        ss_tot = float((yc * yc).sum())
        r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else math.nan)
        return -slope, r2


class EigenvalueStack:
    """`EigenvalueStats` of ``S`` usable spectra at once, over ``[S, D]`` (the summary's ``G + 1`` jackknife spectra):
    numpy reduces each row as a 1-D array, so every value is the function's bit for bit
    (``tests/spectral/test_stack.py``)."""

    def __init__(self, eigs: np.ndarray, *, checked: bool = False) -> None:
        self.e = np.ascontiguousarray(eigs, dtype=np.float64)  # C order: numpy reduces rows in memory order
        if self.e.ndim != 2 or self.e.shape[1] == 0:
            raise ValueError(f"EigenvalueStack: expected [S, D] eigenvalues, got shape {self.e.shape}")
        self.rows, self.dim = self.e.shape
        self.total = self.e.sum(axis=1)
        self.top = self.e.max(axis=1)
        if not checked and not self.usable(self.e, self.total):
            raise ValueError("EigenvalueStack: rows must be finite, non-negative, descending, with a positive sum")
        self._entropy: np.ndarray | None = None
        self._cumulative: np.ndarray | None = None

    @staticmethod
    def usable(eigs: np.ndarray, total: np.ndarray | None = None) -> bool:
        """Whether ``eigs`` ``[S, D]`` meets the stack's requirements (else use `EigenvalueStats` row by row)."""
        e = np.asarray(eigs)
        return e.ndim == 2 and e.size > 0 and bool(EigenvalueStack.usable_rows(e, total).all())

    @staticmethod
    def usable_rows(eigs: np.ndarray, total: np.ndarray | None = None) -> np.ndarray:
        """Per row, whether it is finite, non-negative, descending with a positive total."""
        e = np.asarray(eigs, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(e).all(axis=1) & (e >= 0).all(axis=1) & (e[:, :-1] >= e[:, 1:]).all(axis=1)
            return ok & ((e.sum(axis=1) if total is None else np.asarray(total)) > 0)

    def _positive_groups(self) -> list[tuple[np.ndarray, int]]:
        """``(rows, k)``: the rows whose first ``k`` eigenvalues are the positive ones (descending: a prefix)."""
        counts = (self.e > 0).sum(axis=1)
        return [(np.flatnonzero(counts == k), int(k)) for k in np.unique(counts)]

    @property
    def entropy(self) -> np.ndarray:
        """float64 ``[S]``: `EigenvalueStats.entropy` of every row."""
        if self._entropy is None:
            h = np.empty(self.rows)
            for rows, k in self._positive_groups():
                p = np.ascontiguousarray(self.e[rows, :k]) / self.total[rows, None]
                h[rows] = -(p * np.log(p)).sum(axis=1)
            self._entropy = h
        return self._entropy

    @property
    def effective_rank(self) -> list[float]:
        return [math.exp(float(h)) for h in self.entropy]

    @property
    def stable_rank(self) -> list[float]:
        return [float(t) / float(m) for t, m in zip(self.total, self.top, strict=True)]

    @property
    def participation_ratio(self) -> list[float]:
        q = self.e / self.top[:, None]
        sums, squares = q.sum(axis=1), (q * q).sum(axis=1)
        return [float(sums[i] ** 2 / squares[i]) for i in range(self.rows)]

    def spectral_entropy(self, normalized: bool = False) -> list[float]:
        h = [float(v) for v in self.entropy]
        if not normalized:
            return h
        return [v / math.log(self.dim) for v in h] if self.dim > 1 else [math.nan] * self.rows

    @property
    def spectral_anisotropy(self) -> list[float]:
        return [float(m) / float(t) for t, m in zip(self.total, self.top, strict=True)]

    def spectral_flatness(self, floor: float = FLATNESS_FLOOR) -> list[float]:
        logs = np.log(np.maximum(self.e, floor)).mean(axis=1)
        means = self.e.mean(axis=1)
        return [math.exp(float(g)) / float(m) for g, m in zip(logs, means, strict=True)]

    def components_for_variance(self, fraction: float) -> list[int]:
        if not 0 < fraction <= 1:
            raise ValueError(f"components_for_variance: fraction must be in (0, 1], got {fraction}")
        if self._cumulative is None:
            totals = np.array([float(t) for t in self.total])
            self._cumulative = np.cumsum(np.sort(self.e, axis=1)[:, ::-1], axis=1) / totals[:, None]
        # cumulative shares never decrease, so searchsorted(left) is the count of those below the target
        below = (self._cumulative < fraction - 1e-12).sum(axis=1)
        return [min(int(k) + 1, self.dim) for k in below]

    def power_law_fit(self, start: int | None = None, stop: int | None = None) -> list[tuple[float, float]]:
        start, stop = fit_range_of(self.dim, start, stop)
        e = np.sort(self.e, axis=1)[:, ::-1]
        tol = e[:, 0] * self.dim * _EPS
        idx = np.arange(start, min(stop, self.dim) + 1)
        lam = e[:, idx - 1]
        kept = (lam > tol[:, None]).sum(axis=1)  # lam descends, so the kept indices are a prefix
        out: list[tuple[float, float]] = [(math.nan, math.nan)] * self.rows
        for m in np.unique(kept):
            if m < 2:
                continue
            rows = np.flatnonzero(kept == m)
            x = np.log(idx[:m].astype(np.float64))
            y = np.log(np.ascontiguousarray(lam[rows, :m]))
            xc, yc = x - x.mean(), y - y.mean(axis=1, keepdims=True)
            slopes = (xc * yc).sum(axis=1) / (xc * xc).sum()
            slope = np.array([float(v) for v in slopes])
            ss_res = ((yc - slope[:, None] * xc) ** 2).sum(axis=1)
            ss_tot = (yc * yc).sum(axis=1)
            for row, b, res, tot in zip(rows, slope, ss_res, ss_tot, strict=True):
                res, tot = float(res), float(tot)
                r2 = 1.0 - res / tot if tot > 0 else (1.0 if res == 0 else math.nan)
                out[row] = (-float(b), r2)
        return out


def effective_rank(eigs: np.ndarray) -> float:
    """Effective rank (Roy & Vetterli 2007): ``exp(H(p))`` with ``p_i = λ_i / Σλ``; ``k`` for ``k`` equal variances."""
    return EigenvalueStats(eigs).effective_rank


def stable_rank(eigs: np.ndarray) -> float:
    """Stable rank ``Σλ / λ_max`` (``||X||_F^2 / ||X||_2^2`` of the centred data); in ``[1, rank]``."""
    return EigenvalueStats(eigs).stable_rank


def participation_ratio(eigs: np.ndarray) -> float:
    """Participation ratio ``(Σλ)^2 / Σλ^2``, computed on ``λ / λ_max`` so that squaring cannot overflow."""
    return EigenvalueStats(eigs).participation_ratio


def spectral_entropy(eigs: np.ndarray, normalized: bool = False) -> float:
    """Shannon entropy of the normalised spectrum in nats; ``normalized`` divides by ``ln D`` so widths compare."""
    return EigenvalueStats(eigs).spectral_entropy(normalized)


def spectral_anisotropy(eigs: np.ndarray) -> float:
    """Fraction of variance on the top direction, ``λ_max / Σλ`` (``1 / stable_rank``); in ``[1/D, 1]``."""
    return EigenvalueStats(eigs).spectral_anisotropy


def spectral_flatness(eigs: np.ndarray, floor: float = FLATNESS_FLOOR) -> float:
    """Wiener entropy, geometric / arithmetic mean (1 when isotropic), eigenvalues floored as in the paper."""
    return EigenvalueStats(eigs).spectral_flatness(floor)


def components_for_variance(eigs: np.ndarray, fraction: float) -> int | float:
    """Smallest ``k`` whose top eigenvalues explain ``fraction`` of variance, with 1e-12 of slack against round-off."""
    if not 0 < fraction <= 1:
        raise ValueError(f"components_for_variance: fraction must be in (0, 1], got {fraction}")
    return EigenvalueStats(eigs).components_for_variance(fraction)


def default_fit_range(dim: int) -> tuple[int, int]:
    """The default 1-based range of `power_law_fit`, ``1 .. max(2, D // 2)``: the tail bends to the noise floor."""
    return 1, max(2, dim // 2)


def fit_range_of(dim: int, start: int | None, stop: int | None) -> tuple[int, int]:
    """The fit range :func:`power_law_fit` uses: the given bounds, `default_fit_range` where one is ``None``."""
    d_start, d_stop = default_fit_range(dim)
    start = d_start if start is None else int(start)
    stop = d_stop if stop is None else int(stop)
    if start < 1 or stop < start:
        raise ValueError(f"power_law_fit: need 1 <= start <= stop (1-based, inclusive), got start={start}, stop={stop}")
    return start, stop


def power_law_fit(eigs: np.ndarray, start: int | None = None, stop: int | None = None) -> tuple[float, float]:
    """Least-squares fit of ``log λ_i = c - α log i`` over 1-based ``start..stop``, ``(alpha, r2)``, on eigenvalues
    above ``λ_max · D · eps`` only (below is round-off of zeros); ``(nan, nan)`` with fewer than 2."""
    return EigenvalueStats(eigs).power_law_fit(start, stop)


def _offdiag(mat: np.ndarray) -> np.ndarray:
    """Copy of ``mat`` with its diagonal zeroed (computing the off-diagonal part directly avoids cancellation)."""
    out = mat.copy()
    np.fill_diagonal(out, 0.0)
    return out


def offdiag_energy_fraction(cov: np.ndarray | torch.Tensor) -> float:
    """Share of ``||C||_F^2`` off the diagonal: the paper's "covariance becomes diagonal" as a number, deliberately not
    rotation invariant; computed on ``C / max|C|`` against overflow."""
    mat = as_float64_matrix(cov)
    if not np.all(np.isfinite(mat)):
        return math.nan
    scale = float(np.abs(mat).max())
    if scale == 0:
        return math.nan
    mat = mat / scale
    return float((_offdiag(mat) ** 2).sum() / (mat**2).sum())


def mean_abs_offdiag_correlation(cov: np.ndarray | torch.Tensor) -> float:
    """Mean ``|corr_ij|`` over ``i != j`` of the dimensions with variance above round-off, clipped to ``[-1, 1]``."""
    mat = as_float64_matrix(cov)
    if not np.all(np.isfinite(mat)):
        return math.nan
    var = np.diag(mat).copy()
    vmax = float(var.max())
    keep = var > max(vmax * var.size * _EPS, 0.0)
    k = int(keep.sum())
    if k < 2:
        return math.nan
    std = np.sqrt(var[keep])
    corr = np.clip(mat[np.ix_(keep, keep)] / np.outer(std, std), -1.0, 1.0)
    return float(np.abs(_offdiag(corr)).sum() / (k * (k - 1)))


def total_correlation(cov: np.ndarray | torch.Tensor, eigs: np.ndarray) -> float:
    """Gaussian total correlation in nats, ``1/2 (sum_i ln C_ii - ln det C)``: 0 for independent channels; NaN rather
    than infinite for a numerically singular ``C``, so it never enters averages or standard errors."""
    mat = as_float64_matrix(cov)
    e = _eigs(eigs)
    if not np.all(np.isfinite(mat)) or e.size == 0 or not np.all(np.isfinite(e)):
        return math.nan
    top = float(e.max())
    if top <= 0 or float(e.min()) <= top * e.size * _EPS:
        return math.nan
    diag = np.diag(mat)
    if float(diag.min()) <= 0:
        return math.nan
    return float(0.5 * (np.sum(np.log(diag)) - np.sum(np.log(e))))


def offdiag_energy_fractions(covs: np.ndarray) -> list[float]:
    """`offdiag_energy_fraction` of every finite matrix of a ``[S, D, D]`` stack, bit for bit."""
    mats = np.ascontiguousarray(covs, dtype=np.float64)
    count, dim = mats.shape[0], mats.shape[1]
    scales = np.maximum(mats.max(axis=(1, 2)), -mats.min(axis=(1, 2)))  # max |C_ij|, without an |C| copy
    out = [math.nan] * count
    rows = np.flatnonzero(scales != 0)
    if rows.size:
        src = mats if rows.size == count else mats[rows]
        squares = src / np.array([float(v) for v in scales[rows]])[:, None, None]
        np.square(squares, out=squares)
        total = squares.sum(axis=(1, 2))
        squares[:, np.arange(dim), np.arange(dim)] = 0.0
        fractions = squares.sum(axis=(1, 2)) / total
        for i, v in zip(rows, fractions, strict=True):
            out[i] = float(v)
    return out


def mean_abs_offdiag_correlations(covs: np.ndarray) -> list[float]:
    """`mean_abs_offdiag_correlation` of every finite matrix of a ``[S, D, D]`` stack (bit for bit)."""
    mats = np.ascontiguousarray(covs, dtype=np.float64)
    count, dim = mats.shape[0], mats.shape[1]
    var = np.diagonal(mats, axis1=1, axis2=2)
    keep = var > np.maximum(var.max(axis=1) * dim * _EPS, 0.0)[:, None]
    if count == 0:
        return []
    if not np.all(keep == keep[:1]):  # the matrices of each pattern of kept variances together
        out = [math.nan] * count
        patterns: dict[bytes, list[int]] = {}
        for i in range(count):
            patterns.setdefault(keep[i].tobytes(), []).append(i)
        for members in patterns.values():
            part = mats[members] if len(members) > 1 else mats[members[0]][None]
            for i, v in zip(members, _mean_abs_offdiag_one_pattern(part, var[members], keep[members[0]]), strict=True):
                out[i] = v
        return out
    return _mean_abs_offdiag_one_pattern(mats, var, keep[0])


def _mean_abs_offdiag_one_pattern(mats: np.ndarray, var: np.ndarray, kept: np.ndarray) -> list[float]:
    """`mean_abs_offdiag_correlations` of C-contiguous matrices ``[S, D, D]`` whose kept variances are all ``kept``."""
    count, dim = mats.shape[0], mats.shape[1]
    k = int(kept.sum())
    if k < 2:
        return [math.nan] * count
    # C order before any reduction (fancy indexing may lay the copy out otherwise, and numpy reduces in memory order)
    sub = mats if k == dim else np.ascontiguousarray(mats[:, kept][:, :, kept])
    std = np.sqrt(np.ascontiguousarray(var[:, kept]))
    corr = np.empty_like(sub)
    np.multiply(std[:, :, None], std[:, None, :], out=corr)  # np.outer(std, std) of every matrix
    np.divide(sub, corr, out=corr)
    np.clip(corr, -1.0, 1.0, out=corr)
    np.abs(corr, out=corr)
    corr[:, np.arange(k), np.arange(k)] = 0.0
    sums = corr.sum(axis=(1, 2))
    return [float(v / (k * (k - 1))) for v in sums]


def total_correlations(covs: np.ndarray, eigs: np.ndarray) -> list[float]:
    """`total_correlation` of every finite matrix of a ``[S, D, D]`` stack and its eigenvalues, bit for bit."""
    mats = np.asarray(covs, dtype=np.float64)
    e = np.asarray(eigs, dtype=np.float64)
    top = e.max(axis=1)
    diag = np.diagonal(mats, axis1=1, axis2=2)
    ok = (top > 0) & (e.min(axis=1) > top * e.shape[1] * _EPS) & (diag.min(axis=1) > 0)
    out = [math.nan] * mats.shape[0]
    rows = np.flatnonzero(ok)
    if rows.size:
        logs_diag = np.log(np.ascontiguousarray(diag[rows]))
        logs_eigs = np.log(np.ascontiguousarray(e[rows]))
        values = 0.5 * (logs_diag.sum(axis=1) - logs_eigs.sum(axis=1))
        for i, v in zip(rows, values, strict=True):
            out[i] = float(v)
    return out


def singular_values(eigs: np.ndarray, n_rows: int, convention: Literal["sqrt_eig", "data"] = "sqrt_eig") -> np.ndarray:
    """Singular values from covariance eigenvalues: ``sqrt_eig`` (the paper's plots) or ``data`` (``n_rows``)."""
    if convention not in ("sqrt_eig", "data"):
        raise ValueError(f"singular_values: convention must be 'sqrt_eig' or 'data', got {convention!r}")
    e = np.sort(_eigs(eigs))[::-1]
    if convention == "sqrt_eig":
        return np.sqrt(e)
    if int(n_rows) < 2:
        return np.full(e.size, np.nan)
    return np.sqrt((int(n_rows) - 1) * e)


def decay_curve(eigs: np.ndarray) -> np.ndarray:
    """Eigenvalues relative to the largest, ``λ_i / λ_1`` (descending, starts at 1)."""
    e = np.sort(_eigs(eigs))[::-1]
    if _defined_total(e) is None:
        return np.full(e.size, np.nan)
    return e / e[0]


def cumulative_explained_variance(eigs: np.ndarray) -> np.ndarray:
    """Cumulative share of the total variance of the top ``k`` eigenvalues, ``k = 1..D`` (ends at 1)."""
    e = np.sort(_eigs(eigs))[::-1]
    total = _defined_total(e)
    if total is None:
        return np.full(e.size, np.nan)
    return np.cumsum(e) / total
