"""One dict of scalar observables per covariance: what the callback logs and the records store."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tgo.spectral.catalogue import CATALOGUE, SpectralInputs
from tgo.spectral.decomposition import Spectrum, as_float64_matrix

__all__ = ["summarize"]


def summarize(
    cov: np.ndarray | torch.Tensor,
    spectrum: Spectrum,
    *,
    fit_range: Sequence[int] | None = None,
) -> dict[str, float]:
    """Every observable of the catalogue for one covariance and its spectrum, as plain floats.

    If the covariance is undefined (``spectrum.n_rows < 2``) or holds NaN/Inf, every geometry observable is NaN while
    the diagnostics (``n_rows``, ``n_nonfinite``, ``n_clamped``, ``most_negative_eigenvalue``) stay real, so the
    record says *why* it is NaN. Zero total variance gives ``total_variance = top_eigenvalue = 0`` and NaN for every
    ratio (see ``docs/observables.md``).

    Args:
        cov: The ``[D, D]`` covariance the spectrum came from (needed for the diagonality measures).
        spectrum: Output of :func:`~tgo.spectral.eigendecompose` for ``cov``.
        fit_range: ``(start, stop)``, 1-based inclusive indices of the power-law fit; ``None`` for the default
            ``1 .. max(2, D // 2)``.

    Returns:
        ``{name: float}`` for every observable of `tgo.spectral.CATALOGUE`, in catalogue order.

    Raises:
        ValueError: If ``cov`` and ``spectrum`` disagree on ``D``, or the fit range is malformed.
    """
    fit: tuple[int, int] | None = None
    if fit_range is not None:
        if len(fit_range) != 2:
            raise ValueError(f"summarize: fit_range must be (start, stop), got {fit_range!r}")
        fit = (int(fit_range[0]), int(fit_range[1]))
    mat = as_float64_matrix(cov)
    eigs = np.asarray(spectrum.eigenvalues, dtype=np.float64)
    if mat.shape[0] != eigs.size:
        raise ValueError(
            f"summarize: covariance is {mat.shape[0]}x{mat.shape[0]} but the spectrum has {eigs.size} values"
        )
    defined = spectrum.n_rows >= 2 and bool(np.all(np.isfinite(mat))) and bool(np.all(np.isfinite(eigs)))
    return CATALOGUE.compute(SpectralInputs(covariance=mat, spectrum=spectrum, fit_range=fit), geometry=defined)
