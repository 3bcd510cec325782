"""The TGO-I observables (and a few more) as small pure functions of float64 eigenvalues.

Conventions (see ``docs/observables.md`` for the why): eigenvalues are those of the unbiased covariance of all tokens
pooled, natural logarithms throughout, ``0 log 0 = 0``. Every function accepts the eigenvalues in any order (they are
sorted internally where order matters) and must be given non-negative values (use
:func:`~tgo.spectral.eigendecompose`, which clamps round-off negatives and reports them).

Degenerate inputs return NaN instead of raising, so a record row is always complete:

* NaN anywhere in the eigenvalues (an undefined spectrum) -> NaN.
* Zero total variance (all eigenvalues 0) -> NaN for every ratio (nothing to normalise by).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch

from tgo.spectral.decomposition import as_float64_matrix

__all__ = [
    "FLATNESS_FLOOR",
    "components_for_variance",
    "cumulative_explained_variance",
    "decay_curve",
    "default_fit_range",
    "effective_rank",
    "mean_abs_offdiag_correlation",
    "offdiag_energy_fraction",
    "participation_ratio",
    "power_law_fit",
    "singular_values",
    "spectral_anisotropy",
    "spectral_entropy",
    "spectral_flatness",
    "stable_rank",
    "total_correlation",
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


def _entropy(e: np.ndarray) -> float:
    """Shannon entropy (nats) of ``p = e / sum(e)``, ``0 log 0 = 0``; NaN when undefined."""
    total = _defined_total(e)
    if total is None:
        return math.nan
    p = e[e > 0] / total
    return float(-(p * np.log(p)).sum())


def effective_rank(eigs: np.ndarray) -> float:
    """Effective rank (Roy & Vetterli 2007): ``exp(H(p))`` with ``p_i = λ_i / Σλ`` and natural-log entropy ``H``.

    Equals ``k`` for ``k`` equal non-zero eigenvalues; ranges over ``[1, D]``.

    Args:
        eigs: Non-negative eigenvalues.

    Returns:
        The effective rank; NaN for zero total variance or an undefined spectrum.
    """
    h = _entropy(_eigs(eigs))
    return math.exp(h) if not math.isnan(h) else math.nan


def stable_rank(eigs: np.ndarray) -> float:
    """Stable rank ``Σλ / λ_max`` (``||X||_F^2 / ||X||_2^2`` of the centred data); in ``[1, rank]``.

    Args:
        eigs: Non-negative eigenvalues.

    Returns:
        The stable rank; NaN for zero total variance or an undefined spectrum.
    """
    e = _eigs(eigs)
    total = _defined_total(e)
    return total / float(e.max()) if total is not None else math.nan


def participation_ratio(eigs: np.ndarray) -> float:
    """Participation ratio ``(Σλ)^2 / Σλ^2``; in ``[1, rank]``.

    Computed on ``λ / λ_max`` so that squaring large variances cannot overflow.

    Args:
        eigs: Non-negative eigenvalues.

    Returns:
        The participation ratio; NaN for zero total variance or an undefined spectrum.
    """
    e = _eigs(eigs)
    if _defined_total(e) is None:
        return math.nan
    q = e / e.max()
    return float(q.sum() ** 2 / (q * q).sum())


def spectral_entropy(eigs: np.ndarray, normalized: bool = False) -> float:
    """Shannon entropy of the normalised spectrum in nats; optionally divided by ``ln D``.

    The paper reports the unnormalised value. The normalised variant divides by the maximum ``ln D`` with ``D`` the
    number of eigenvalues *including zeros* (the ambient dimension), so it lies in ``[0, 1]`` and compares layers of
    different width.

    Args:
        eigs: Non-negative eigenvalues.
        normalized: Divide by ``ln D``.

    Returns:
        The entropy; NaN for zero total variance, an undefined spectrum, or ``normalized`` with ``D == 1``.
    """
    e = _eigs(eigs)
    h = _entropy(e)
    if not normalized:
        return h
    return h / math.log(e.size) if e.size > 1 else math.nan


def spectral_anisotropy(eigs: np.ndarray) -> float:
    """Fraction of variance on the top direction, ``λ_max / Σλ`` (``1 / stable_rank``); in ``[1/D, 1]``.

    Args:
        eigs: Non-negative eigenvalues.

    Returns:
        The anisotropy; NaN for zero total variance or an undefined spectrum.
    """
    e = _eigs(eigs)
    total = _defined_total(e)
    return float(e.max()) / total if total is not None else math.nan


def spectral_flatness(eigs: np.ndarray, floor: float = FLATNESS_FLOOR) -> float:
    """Wiener entropy: geometric mean / arithmetic mean of the eigenvalues; in ``(0, 1]``, 1 for an isotropic spectrum.

    Following the paper, eigenvalues are floored at ``1e-12`` before the logarithm so that exact zeros (``n <= D``)
    give a small finite value instead of ``log 0``. The floor is absolute, so flatness is scale invariant only while
    every eigenvalue stays above it; for rank-deficient covariances the result is dominated by the floor (and by
    float64 round-off of the null-space eigenvalues, about ``1e-16 λ_max``) and should be read as "essentially zero".

    Args:
        eigs: Non-negative eigenvalues.
        floor: Lower bound applied before the logarithm (geometric mean only).

    Returns:
        The flatness; NaN for zero total variance or an undefined spectrum.
    """
    e = _eigs(eigs)
    if _defined_total(e) is None:
        return math.nan
    geometric = math.exp(float(np.mean(np.log(np.maximum(e, floor)))))
    return geometric / float(e.mean())


def components_for_variance(eigs: np.ndarray, fraction: float) -> int | float:
    """Smallest ``k`` such that the top ``k`` eigenvalues explain at least ``fraction`` of the total variance.

    The comparison allows 1e-12 of slack so that, for example, 10 equal eigenvalues need exactly 9 for 90% despite
    round-off in the cumulative sum.

    Args:
        eigs: Non-negative eigenvalues.
        fraction: Target in ``(0, 1]``.

    Returns:
        ``k`` as an int in ``[1, D]``; NaN (a float) for zero total variance or an undefined spectrum.

    Raises:
        ValueError: If ``fraction`` is outside ``(0, 1]``.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"components_for_variance: fraction must be in (0, 1], got {fraction}")
    e = _eigs(eigs)
    total = _defined_total(e)
    if total is None:
        return math.nan
    cumulative = np.cumsum(np.sort(e)[::-1]) / total
    k = int(np.searchsorted(cumulative, fraction - 1e-12, side="left")) + 1
    return min(k, e.size)


def default_fit_range(dim: int) -> tuple[int, int]:
    """The default 1-based inclusive index range of :func:`power_law_fit`: ``1 .. max(2, D // 2)``.

    The top half of the spectrum is where ViT spectra are close to a power law; the tail bends down towards the noise
    floor (and is exactly zero when ``n <= D``).

    Args:
        dim: Number of eigenvalues ``D``.

    Returns:
        ``(start, stop)``.
    """
    return 1, max(2, dim // 2)


def power_law_fit(eigs: np.ndarray, start: int | None = None, stop: int | None = None) -> tuple[float, float]:
    """Least-squares fit of ``log λ_i = c - α log i`` over 1-based indices ``start..stop`` (inclusive).

    Eigenvalues are sorted descending first. Only numerically positive eigenvalues enter the fit: those above
    ``λ_max · D · eps`` (the ``numpy.linalg.matrix_rank`` tolerance), since anything below is round-off of a zero
    eigenvalue and its logarithm is meaningless. ``r2`` is the coefficient of determination of the fit in log-log space;
    for a constant spectrum (``α = 0``, zero residual) it is 1.

    Args:
        eigs: Non-negative eigenvalues.
        start: First 1-based index (default 1).
        stop: Last 1-based index, inclusive (default ``max(2, D // 2)``); clipped to ``D``.

    Returns:
        ``(alpha, r2)``; ``(nan, nan)`` when fewer than 2 usable eigenvalues fall in the range, for zero total variance,
        or an undefined spectrum.

    Raises:
        ValueError: If ``start < 1`` or ``stop < start``.
    """
    e = _eigs(eigs)
    d_start, d_stop = default_fit_range(e.size)
    start = d_start if start is None else int(start)
    stop = d_stop if stop is None else int(stop)
    if start < 1 or stop < start:
        raise ValueError(f"power_law_fit: need 1 <= start <= stop (1-based, inclusive), got start={start}, stop={stop}")
    if _defined_total(e) is None:
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


def _offdiag(mat: np.ndarray) -> np.ndarray:
    """Copy of ``mat`` with its diagonal zeroed (computing the off-diagonal part directly avoids cancellation)."""
    out = mat.copy()
    np.fill_diagonal(out, 0.0)
    return out


def offdiag_energy_fraction(cov: np.ndarray | torch.Tensor) -> float:
    """Share of the covariance's squared Frobenius norm off the diagonal: ``||C - diag C||_F^2 / ||C||_F^2``.

    0 for a diagonal covariance (axis-aligned features), approaching 1 when correlations dominate; the paper's
    "covariance becomes diagonal" finding as a number. Not rotation invariant, by design: it measures alignment of the
    variance with the neuron basis. Computed on ``C / max|C|`` to avoid overflow.

    Args:
        cov: ``[D, D]`` covariance.

    Returns:
        The fraction; NaN for a zero or non-finite covariance.
    """
    mat = as_float64_matrix(cov)
    if not np.all(np.isfinite(mat)):
        return math.nan
    scale = float(np.abs(mat).max())
    if scale == 0:
        return math.nan
    mat = mat / scale
    return float((_offdiag(mat) ** 2).sum() / (mat**2).sum())


def mean_abs_offdiag_correlation(cov: np.ndarray | torch.Tensor) -> float:
    """Mean of ``|corr_ij|`` over ``i != j``, with ``corr = C_ij / sqrt(C_ii C_jj)``.

    Dimensions with zero variance have no correlation and are excluded; "zero" means
    ``C_ii <= max(diag C) · D · eps``, because a constant feature accumulates round-off of that size and its
    "correlations" would be noise.
    Correlations are clipped to ``[-1, 1]`` against round-off.

    Args:
        cov: ``[D, D]`` covariance.

    Returns:
        The mean absolute correlation; NaN for a non-finite covariance or fewer than 2 dimensions with variance.
    """
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
    """Gaussian total correlation in nats: ``1/2 (sum_i ln C_ii - ln det C)`` = ``-1/2 ln det R``.

    The multi-information of a Gaussian with this covariance: 0 for independent channels, growing with redundancy
    (how much of each channel the others predict). Scale invariant per channel (it only depends on the correlation
    matrix ``R``). ``ln det C`` is taken from the float64 eigenvalues (``sum ln lambda_i``).

    Rank-deficient covariances: the Gaussian total correlation is infinite there (some direction has no variance,
    i.e. one channel combination is exactly determined by the others). TGO records NaN instead of ``inf``, so the
    value never enters averages or standard errors; "numerically singular" means an eigenvalue
    ``<= lambda_1 * D * eps`` (numpy's ``matrix_rank`` tolerance) or a channel without variance.

    Args:
        cov: ``[D, D]`` covariance.
        eigs: Its eigenvalues (any order, non-negative).

    Returns:
        The total correlation (>= 0 up to round-off); NaN for singular or non-finite input.
    """
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


def singular_values(eigs: np.ndarray, n_rows: int, convention: Literal["sqrt_eig", "data"] = "sqrt_eig") -> np.ndarray:
    """Singular values derived from covariance eigenvalues, descending.

    * ``"sqrt_eig"``: ``sqrt(λ)``, the convention of the paper's plotting code (the singular values of ``X /
      sqrt(n - 1)`` for centred data ``X``; scale free in ``n``).
    * ``"data"``: ``sqrt((n - 1) λ)``, the singular values of the centred ``[n, D]`` data matrix itself.

    Args:
        eigs: Non-negative eigenvalues.
        n_rows: Rows ``n`` that entered the covariance (used by ``"data"``).
        convention: ``"sqrt_eig"`` or ``"data"``.

    Returns:
        float64 ``[D]``; all-NaN for ``"data"`` when ``n_rows < 2``; NaN entries propagate.

    Raises:
        ValueError: For an unknown convention.
    """
    if convention not in ("sqrt_eig", "data"):
        raise ValueError(f"singular_values: convention must be 'sqrt_eig' or 'data', got {convention!r}")
    e = np.sort(_eigs(eigs))[::-1]
    if convention == "sqrt_eig":
        return np.sqrt(e)
    if int(n_rows) < 2:
        return np.full(e.size, np.nan)
    return np.sqrt((int(n_rows) - 1) * e)


def decay_curve(eigs: np.ndarray) -> np.ndarray:
    """Eigenvalues relative to the largest, ``λ_i / λ_1`` (descending, starts at 1).

    Args:
        eigs: Non-negative eigenvalues.

    Returns:
        float64 ``[D]``; all-NaN for zero total variance or an undefined spectrum.
    """
    e = np.sort(_eigs(eigs))[::-1]
    if _defined_total(e) is None:
        return np.full(e.size, np.nan)
    return e / e[0]


def cumulative_explained_variance(eigs: np.ndarray) -> np.ndarray:
    """Cumulative share of the total variance of the top ``k`` eigenvalues, ``k = 1..D`` (ends at 1).

    Args:
        eigs: Non-negative eigenvalues.

    Returns:
        float64 ``[D]``; all-NaN for zero total variance or an undefined spectrum.
    """
    e = np.sort(_eigs(eigs))[::-1]
    total = _defined_total(e)
    if total is None:
        return np.full(e.size, np.nan)
    return np.cumsum(e) / total
