"""Float64 eigendecomposition of a covariance matrix, with clamping that is reported, not hidden."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Spectrum", "as_float64_matrix", "eigendecompose"]


def as_float64_matrix(cov: np.ndarray | torch.Tensor) -> np.ndarray:
    """Convert a covariance (numpy or torch, any device) to a float64 numpy ``[D, D]`` array.

    Args:
        cov: Square matrix.

    Returns:
        A float64 numpy array (a copy when a conversion was needed).

    Raises:
        ValueError: If ``cov`` is not a non-empty square 2-D matrix.
    """
    if isinstance(cov, torch.Tensor):
        cov = cov.detach().to(device="cpu", dtype=torch.float64).numpy()
    arr = np.asarray(cov, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] == 0:
        raise ValueError(f"expected a non-empty square covariance matrix [D, D], got shape {arr.shape}")
    return arr


@dataclass(frozen=True, eq=False)
class Spectrum:
    """Eigenvalues of one covariance plus the bookkeeping needed to trust them.

    Attributes:
        eigenvalues: float64 ``[D]``, descending, negatives clamped to 0, structural zeros (index >= ``n_rows``,
            1-based) exactly 0 (read-only array). All-NaN when the covariance was undefined (``n_rows < 2``) or
            non-finite.
        n_rows: Rows that entered the covariance.
        n_nonfinite: Rows dropped because they held NaN/Inf.
        n_clamped: How many eigenvalues were negative (round-off of a PSD matrix) and set to 0.
        most_negative: The most negative eigenvalue before clamping; 0.0 if none was negative, NaN if undefined.
            Compare it with ``eigenvalues[0]``: ``|most_negative| / top`` near 1e-16 is round-off, anything large means
            the covariance was not accumulated exactly.
    """

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


def eigendecompose(cov: np.ndarray | torch.Tensor, n_rows: int, n_nonfinite: int = 0) -> Spectrum:
    """Eigenvalues of a covariance in float64, descending, with negative round-off clamped and reported.

    The matrix is symmetrised (``(C + C^T) / 2``) and passed to ``numpy.linalg.eigvalsh`` in float64 whatever its
    input dtype: float32 eigensolvers lose the small end of spectra spanning many decades. Negative eigenvalues
    (round-off of a PSD matrix) are set to 0 and counted. When ``n_rows <= D`` the covariance has rank at most
    ``n_rows - 1``, so eigenvalues ``n_rows, n_rows + 1, ...`` (1-based) are set to exactly 0: they are structurally
    zero and their computed values are pure round-off.

    Degenerate inputs do not raise, so one bad observation point cannot abort the others: if ``n_rows < 2`` or the
    matrix holds NaN/Inf, every eigenvalue is NaN, ``n_clamped`` is 0 and ``most_negative`` is NaN; the counts are kept.

    Args:
        cov: ``[D, D]`` covariance (numpy or torch, any dtype/device).
        n_rows: Rows that entered the covariance.
        n_nonfinite: Rows that were dropped for holding NaN/Inf (bookkeeping only).

    Returns:
        The :class:`Spectrum`.

    Raises:
        ValueError: If ``cov`` is not square 2-D, or the counts are negative.
    """
    mat = as_float64_matrix(cov)
    n_rows, n_nonfinite = int(n_rows), int(n_nonfinite)
    if n_rows < 0 or n_nonfinite < 0:
        raise ValueError(f"eigendecompose: counts must be >= 0, got n_rows={n_rows}, n_nonfinite={n_nonfinite}")
    dim = mat.shape[0]
    if n_rows < 2 or not np.all(np.isfinite(mat)):
        eigs = np.full(dim, np.nan)
        eigs.setflags(write=False)
        return Spectrum(eigs, n_rows, n_nonfinite, 0, math.nan)
    eigs = np.linalg.eigvalsh((mat + mat.T) / 2)[::-1].copy()
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
