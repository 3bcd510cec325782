"""Float64 eigendecomposition of a covariance matrix, with clamping that is reported, not hidden."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tgo.spectral.eigensolver import Eigvalsh, cpu_eigvalsh

__all__ = ["Spectrum", "as_float64_matrix", "eigendecompose", "eigendecompose_many", "row_subset_spectra"]


def as_float64_matrix(cov: np.ndarray | torch.Tensor) -> np.ndarray:
    """A covariance (numpy or torch, any device) as a float64 numpy ``[D, D]`` array, copied only if needed."""
    if isinstance(cov, torch.Tensor):
        cov = cov.detach().to(device="cpu", dtype=torch.float64).numpy()
    arr = np.asarray(cov, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] == 0:
        raise ValueError(f"expected a non-empty square covariance matrix [D, D], got shape {arr.shape}")
    return arr


@dataclass(frozen=True, eq=False)
class Spectrum:
    """Eigenvalues of one covariance (float64 descending, read-only, negatives clamped, structural zeros exact, all NaN
    when undefined) and the bookkeeping to trust them: ``|most_negative| / top`` far above 1e-16 means inexact
    accumulation."""

    eigenvalues: np.ndarray
    n_rows: int
    n_nonfinite: int
    n_clamped: int
    most_negative: float

    @property
    def dim(self) -> int:
        """Feature dimension ``D``."""
        return int(self.eigenvalues.shape[0])

    @property
    def is_defined(self) -> bool:
        """False when the eigenvalues are NaN (too few rows or a non-finite covariance)."""
        return bool(np.all(np.isfinite(self.eigenvalues)))


def eigendecompose(
    cov: np.ndarray | torch.Tensor, n_rows: int, n_nonfinite: int = 0, *, eigvalsh: Eigvalsh | None = None
) -> Spectrum:
    """Eigenvalues of a covariance in float64 (float32 solvers lose the small end), descending, negative round-off
    clamped and counted, those from index ``n_rows`` on exactly 0; degenerate input gives NaN instead of raising."""
    return eigendecompose_many([cov], [n_rows], [n_nonfinite], eigvalsh=eigvalsh)[0]


def eigendecompose_many(
    covs: Sequence[np.ndarray | torch.Tensor] | np.ndarray,
    n_rows: Sequence[int],
    n_nonfinite: Sequence[int] | None = None,
    *,
    eigvalsh: Eigvalsh | None = None,
) -> list[Spectrum]:
    """`eigendecompose` of several covariances, each shape's defined ones in one stacked ``eigvalsh`` call (bit for bit
    LAPACK's per-matrix result, ``tests/spectral/test_decomposition.py``): the seam where a CUDA solver takes over."""
    solve = cpu_eigvalsh if eigvalsh is None else eigvalsh
    mats = [as_float64_matrix(c) for c in covs]
    rows = [int(n) for n in n_rows]
    dropped = [0] * len(mats) if n_nonfinite is None else [int(n) for n in n_nonfinite]
    if not len(mats) == len(rows) == len(dropped):
        raise ValueError(f"eigendecompose_many: {len(mats)} covariances, {len(rows)} and {len(dropped)} counts")
    for n, bad in zip(rows, dropped, strict=True):
        if n < 0 or bad < 0:
            raise ValueError(f"eigendecompose: counts must be >= 0, got n_rows={n}, n_nonfinite={bad}")
    out: list[Spectrum | None] = [None] * len(mats)
    by_dim: dict[int, list[int]] = {}
    for i, (mat, n) in enumerate(zip(mats, rows, strict=True)):
        if n < 2 or not np.all(np.isfinite(mat)):
            out[i] = _undefined(mat.shape[0], n, dropped[i])
        else:
            by_dim.setdefault(mat.shape[0], []).append(i)
    whole = isinstance(covs, np.ndarray) and covs.ndim == 3 and covs.dtype == np.float64
    for members in by_dim.values():
        stack = np.asarray(covs) if whole and len(members) == len(mats) else np.stack([mats[i] for i in members])
        values = np.asarray(solve((stack + stack.transpose(0, 2, 1)) / 2), dtype=np.float64)
        if values.shape != stack.shape[:2]:
            raise ValueError(f"eigendecompose_many: eigvalsh gave shape {values.shape} for a stack {stack.shape}")
        for i, ascending in zip(members, values, strict=True):
            out[i] = _spectrum(ascending, rows[i], dropped[i])
    return [s for s in out if s is not None]


def _undefined(dim: int, n_rows: int, n_nonfinite: int) -> Spectrum:
    """The all-NaN `Spectrum` of a covariance that is not defined (fewer than 2 rows, or not finite)."""
    eigs = np.full(dim, np.nan)
    eigs.setflags(write=False)
    return Spectrum(eigs, n_rows, n_nonfinite, 0, math.nan)


def _spectrum(ascending: np.ndarray, n_rows: int, n_nonfinite: int) -> Spectrum:
    """The `Spectrum` of one matrix's ascending ``eigvalsh`` output: descending, clamped, structural zeros exact."""
    eigs = ascending[::-1].copy()
    negative = eigs < 0
    n_clamped = int(negative.sum())
    most_negative = float(eigs[negative].min()) if n_clamped else 0.0
    eigs[negative] = 0.0
    # A covariance of n rows has rank <= n - 1, so eigenvalues beyond that index are exactly zero; what eigvalsh
    # returns there is round-off (about 1e-16 of the top eigenvalue in float64, 1e-8 with a float32 Gram), which would
    # otherwise leak into log-based observables (flatness, power-law fit). Round-off negatives among them were
    # already counted above.
    eigs[max(n_rows - 1, 0) :] = 0.0
    eigs.setflags(write=False)
    return Spectrum(eigs, n_rows, n_nonfinite, n_clamped, most_negative)


def row_subset_spectra(
    rows: np.ndarray,
    subsets: Sequence[np.ndarray],
    *,
    ddof: int,
    n_nonfinite: Sequence[int] | None = None,
    eigvalsh: Eigvalsh | None = None,
) -> list[Spectrum]:
    """`eigendecompose` of the covariance of each subset of the rows ``[n, D]`` (boolean masks), from the ``[m, m]``
    product of its ``m`` centred rows instead of the ``[D, D]`` matrix: ``X^T X`` and ``X X^T`` share their nonzero
    eigenvalues, and a covariance of ``m`` rows has at most ``m - 1`` of them, so with fewer rows than features (the
    CLS vectors of 200 images at D = 384) the decomposition costs ``(m / D)^3`` of the ``[D, D]`` one and its zeros
    are zeros by construction. ``ddof`` 1 divides by ``m - 1`` (the unbiased covariance), 0 by ``m`` (the population
    one). Equal to `eigendecompose` of the ``[D, D]`` covariance to round-off (tests/spectral/test_decomposition.py);
    ``n_rows`` of each spectrum is ``m``."""
    solve = cpu_eigvalsh if eigvalsh is None else eigvalsh
    x = np.asarray(rows, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"row_subset_spectra: expected rows [n, D], got shape {x.shape}")
    if ddof not in (0, 1):
        raise ValueError(f"row_subset_spectra: ddof must be 0 or 1, got {ddof!r}")
    dim = x.shape[1]
    dropped = [0] * len(subsets) if n_nonfinite is None else [int(n) for n in n_nonfinite]
    out: list[Spectrum | None] = [None] * len(subsets)
    by_size: dict[int, list[tuple[int, np.ndarray]]] = {}
    for i, mask in enumerate(subsets):
        sub = x[np.asarray(mask, dtype=bool)]
        m = sub.shape[0]
        if m < 2 or not np.all(np.isfinite(sub)):
            out[i] = _undefined(dim, m, dropped[i])
            continue
        dev = sub - sub.mean(axis=0)
        gram = dev @ dev.T
        gram /= m - ddof
        by_size.setdefault(m, []).append((i, gram))
    for m, members in by_size.items():
        values = np.asarray(solve(np.stack([gram for _, gram in members])), dtype=np.float64)
        if values.shape != (len(members), m):
            raise ValueError(f"row_subset_spectra: eigvalsh gave shape {values.shape} for {len(members)} x [{m}, {m}]")
        padded = np.zeros(dim)
        for (i, _), ascending in zip(members, values, strict=True):
            padded[dim - m :] = ascending  # the D - m eigenvalues the [m, m] product does not have are zeros
            out[i] = _spectrum(padded, m, dropped[i])
    return [s for s in out if s is not None]
