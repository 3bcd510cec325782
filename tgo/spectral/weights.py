"""Weight-matrix geometry: singular values, stable and effective rank, WeightWatcher's power-law exponent, updates.

Pure float64 numpy for the ``weights`` family. Singular values come from an SVD, never from ``W^T W``'s eigenvalues
(squaring loses every one below ``sqrt(eps) * sigma_1``); the ranks are the activation ones (`stable_rank`,
`effective_rank`) so both read on one scale. Formulas: ``docs/observables.md``, "9. Weight geometry".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .observables import effective_rank, stable_rank

__all__ = [
    "ESD_THRESHOLD",
    "MIN_FIT_EIGENVALUES",
    "PowerLawFit",
    "StepSums",
    "WeightGeometry",
    "fit_power_law",
    "relative_update",
    "singular_values",
    "step_angle",
    "step_sums",
    "weight_geometry",
    "weight_matrix",
]

ESD_THRESHOLD = 1e-5
"""Eigenvalues of ``W^T W`` at or below this are left out of the power-law fit: WeightWatcher's absolute
``EVALS_THRESH``, exactly as it fits."""

MIN_FIT_EIGENVALUES = 20
"""Fewer eigenvalues above `ESD_THRESHOLD` give no exponent (NaN) rather than WeightWatcher's second, bias-corrected
estimator (``SMALL_N_CUTOFF``), whose values do not compare; every ViT map is far above."""

_CHUNK = 1 << 21  # elements of one [rows, N] block of the xmin scan (16 MiB of float64)


def weight_matrix(weight: np.ndarray) -> np.ndarray:
    """The 2-D matrix of a weight: a convolution's ``[out, in, kh, kw]`` as ``[out, in * kh * kw]`` (for a patch
    embedding whose stride is its kernel, exactly the map applied to every patch)."""
    w = np.asarray(weight)
    if w.ndim < 2:
        raise ValueError(f"weight_matrix: expected a weight of >= 2 dimensions, got shape {w.shape}")
    return w.reshape(w.shape[0], -1)


def singular_values(matrix: np.ndarray) -> np.ndarray:
    """float64 singular values of ``matrix``, descending (``min(m, n)`` of them); all NaN if it is not finite."""
    w = np.asarray(matrix, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError(f"singular_values: expected a 2-D matrix, got shape {w.shape}")
    if not np.isfinite(w).all():
        return np.full(min(w.shape), np.nan)
    return np.linalg.svd(w, compute_uv=False)  # LAPACK returns them descending


@dataclass(frozen=True)
class PowerLawFit:
    """A continuous power-law fit ``p(x) ~ x^-alpha`` of a spectrum's tail ``x >= xmin``, with ``stderr =
    (alpha - 1) / sqrt(n_tail)`` (Clauset et al. 2009) and the Kolmogorov-Smirnov distance ``ks``."""

    alpha: float
    stderr: float
    ks: float
    xmin: float
    n_tail: int
    n_fitted: int

    @classmethod
    def none(cls, n_fitted: int = 0) -> PowerLawFit:
        """No fit (too few eigenvalues, a degenerate or non-finite spectrum)."""
        return cls(math.nan, math.nan, math.nan, math.nan, 0, int(n_fitted))


def fit_power_law(
    eigenvalues: np.ndarray, *, threshold: float = ESD_THRESHOLD, min_eigenvalues: int = MIN_FIT_EIGENVALUES
) -> PowerLawFit:
    """WeightWatcher's default power-law fit of an ESD (``weightwatcher`` 0.7, ``WW_powerlaw.WWFit``).

    Each eigenvalue above ``threshold`` but the largest is a candidate ``xmin`` with its tail's MLE and KS distance; the
    least distance wins (the first on a tie). Log-ratios are summed directly (a difference of sums cancels).
    """
    e = np.asarray(eigenvalues, dtype=np.float64).reshape(-1)
    if not np.isfinite(e).all():
        return PowerLawFit.none()
    x = np.sort(e[e > threshold])
    n_all = int(x.size)
    if n_all < max(int(min_eigenvalues), 2):
        return PowerLawFit.none(n_all)
    logs = np.log(x)
    candidates = n_all - 1
    alphas = np.full(candidates, np.nan)
    distances = np.ones(candidates)  # an invalid candidate (a tail of equal values) never wins: every valid D < 1
    rows = max(1, _CHUNK // n_all)
    j = np.arange(n_all)
    for start in range(0, candidates, rows):
        i = np.arange(start, min(start + rows, candidates))
        ratio = logs[None, :] - logs[i, None]  # ln(x_j / x_i), [rows, N]
        in_tail = j[None, :] >= i[:, None]
        ratio = np.where(in_tail, ratio, 0.0)
        n = (n_all - i).astype(np.float64)
        sums = ratio.sum(axis=1)
        ok = sums > 0
        tail_alpha = np.where(ok, 1.0 + n / np.where(ok, sums, 1.0), np.nan)
        fitted = -np.expm1((1.0 - np.where(ok, tail_alpha, 2.0))[:, None] * ratio)  # 1 - (x_j / x_i)^(1 - alpha)
        empirical = (j[None, :] - i[:, None]) / n[:, None]
        gap = np.where(in_tail, np.abs(fitted - empirical), 0.0).max(axis=1)
        alphas[i] = tail_alpha
        distances[i] = np.where(ok, gap, 1.0)
    best = int(np.argmin(distances))
    if not math.isfinite(alphas[best]):
        return PowerLawFit.none(n_all)
    n_tail = n_all - best
    alpha = float(alphas[best])
    return PowerLawFit(
        alpha=alpha,
        stderr=(alpha - 1.0) / math.sqrt(n_tail),
        ks=float(distances[best]),
        xmin=float(x[best]),
        n_tail=n_tail,
        n_fitted=n_all,
    )


@dataclass(frozen=True)
class WeightGeometry:
    """The geometry of one weight matrix: descending singular values, stable and effective rank (NaN for a zero matrix),
    ``||W||_2`` and the power-law fit of the ESD of ``W^T W``."""

    singular_values: np.ndarray
    stable_rank: float
    effective_rank: float
    spectral_norm: float
    fit: PowerLawFit


def weight_geometry(matrix: np.ndarray) -> WeightGeometry:
    """Everything `WeightGeometry` holds, from one float64 SVD of ``matrix`` (2-D; a weight: `weight_matrix`)."""
    sv = singular_values(matrix)
    if sv.size == 0 or not np.isfinite(sv).all():
        nan = math.nan
        return WeightGeometry(sv, nan, nan, nan, PowerLawFit.none())
    eigenvalues = sv * sv  # the eigenvalues of W^T W, each to ~eps relative (squaring a float64 is exact to 1 ulp)
    return WeightGeometry(
        singular_values=sv,
        stable_rank=stable_rank(eigenvalues),
        effective_rank=effective_rank(eigenvalues),
        spectral_norm=float(sv[0]),
        fit=fit_power_law(eigenvalues),
    )


def relative_update(current: np.ndarray, previous: np.ndarray) -> float:
    """``||W_t - W_prev||_F / ||W_prev||_F`` in float64 (NaN: shapes differ, a zero or non-finite ``W_prev``)."""
    a = np.asarray(current, dtype=np.float64)
    b = np.asarray(previous, dtype=np.float64)
    if a.shape != b.shape:
        return math.nan
    base = float(np.linalg.norm(b.reshape(-1)))
    if not (math.isfinite(base) and base > 0):
        return math.nan
    return float(np.linalg.norm((a - b).reshape(-1))) / base


@dataclass(frozen=True)
class StepSums:
    """The float64 sums behind the length of a weight step and its angle with the step before (additive over maps,
    so a network's values come from the sums of its maps).

    Attributes:
        step_sq: ``||W_t - W_prev||_F^2``.
        before_sq: ``||W_prev - W_earlier||_F^2`` (NaN without the earlier weights).
        dot: ``<W_t - W_prev, W_prev - W_earlier>`` (NaN without them).
    """

    step_sq: float
    before_sq: float
    dot: float

    def __add__(self, other: StepSums) -> StepSums:
        return StepSums(self.step_sq + other.step_sq, self.before_sq + other.before_sq, self.dot + other.dot)

    @property
    def length(self) -> float:
        """``||W_t - W_prev||_F``."""
        return math.sqrt(self.step_sq)

    @property
    def angle(self) -> float:
        """`step_angle` of the two steps."""
        return step_angle(self.dot, self.step_sq, self.before_sq)


def step_sums(current: np.ndarray, previous: np.ndarray, earlier: np.ndarray | None) -> StepSums | None:
    """`StepSums` of one map from its weights at three observations (float64; ``None``: shapes differ)."""
    a = np.asarray(current, dtype=np.float64).reshape(-1)
    b = np.asarray(previous, dtype=np.float64).reshape(-1)
    if a.shape != b.shape:
        return None
    step = a - b
    if earlier is None:
        return StepSums(float(step @ step), math.nan, math.nan)
    c = np.asarray(earlier, dtype=np.float64).reshape(-1)
    if c.shape != b.shape:
        return None
    before = b - c
    return StepSums(float(step @ step), float(before @ before), float(step @ before))


def step_angle(dot: float, step_sq: float, before_sq: float) -> float:
    """The angle in degrees between two steps from their inner product and squared lengths: 0 when training keeps
    its direction, 90 for unrelated steps, above 90 when it turns back (NaN when a step is zero or missing).

    ``arccos`` of the cosine: its error near 0 degrees is ``sqrt(2 eps)`` radians (1e-6 degrees), far below any angle
    between two training steps of whole epochs."""
    denominator = math.sqrt(step_sq * before_sq)
    if not (math.isfinite(denominator) and denominator > 0 and math.isfinite(dot)):
        return math.nan
    return math.degrees(math.acos(min(1.0, max(-1.0, dot / denominator))))
