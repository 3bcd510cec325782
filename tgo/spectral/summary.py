"""One dict of scalar observables per covariance: what the callback logs and the records store."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from tgo.spectral import observables as obs
from tgo.spectral.decomposition import Spectrum, as_float64_matrix

__all__ = ["OBSERVABLES", "summarize"]

OBSERVABLES: tuple[str, ...] = (
    "effective_rank",
    "stable_rank",
    "participation_ratio",
    "spectral_entropy",
    "spectral_entropy_normalized",
    "spectral_anisotropy",
    "spectral_flatness",
    "components_90",
    "components_95",
    "components_99",
    "power_law_alpha",
    "power_law_r2",
    "offdiag_energy_fraction",
    "mean_abs_offdiag_correlation",
    "total_variance",
    "top_eigenvalue",
    # bookkeeping: always real numbers, so a NaN row can be explained
    "n_rows",
    "n_nonfinite",
    "n_clamped",
    "most_negative_eigenvalue",
)
"""Keys of :func:`summarize`'s result, in a stable order (column order of ``geometry/metrics.csv``)."""

_COUNTS = ("n_rows", "n_nonfinite", "n_clamped", "most_negative_eigenvalue")


def summarize(
    cov: np.ndarray | torch.Tensor,
    spectrum: Spectrum,
    *,
    fit_start: int | None = None,
    fit_stop: int | None = None,
    fit_range: Sequence[int] | None = None,
) -> dict[str, float]:
    """Every scalar observable of one covariance and its spectrum, as plain floats keyed by :data:`OBSERVABLES`.

    If the covariance is undefined (``spectrum.n_rows < 2``) or holds NaN/Inf, every observable is NaN while the counts
    (``n_rows``, ``n_nonfinite``, ``n_clamped``) stay real, so the record says *why* it is NaN. Zero total variance
    gives ``total_variance = top_eigenvalue = 0`` and NaN for every ratio (see ``docs/observables.md``).

    Args:
        cov: The ``[D, D]`` covariance the spectrum came from (needed for the diagonality measures).
        spectrum: Output of :func:`~tgo.spectral.eigendecompose` for ``cov``.
        fit_start: First 1-based index of the power-law fit (default 1).
        fit_stop: Last 1-based index of the power-law fit, inclusive (default ``max(2, D // 2)``).
        fit_range: ``(start, stop)`` shorthand for ``fit_start``/``fit_stop`` (how configs spell it); ``None`` for the
            default. Give either this or the two separate arguments, not both.

    Returns:
        ``{name: float}`` for every name in :data:`OBSERVABLES`, in that order.

    Raises:
        ValueError: If ``cov`` and ``spectrum`` disagree on ``D``, or the fit range is malformed.
    """
    if fit_range is not None:
        if fit_start is not None or fit_stop is not None:
            raise ValueError("summarize: give fit_range or fit_start/fit_stop, not both")
        if len(fit_range) != 2:
            raise ValueError(f"summarize: fit_range must be (start, stop), got {fit_range!r}")
        fit_start, fit_stop = int(fit_range[0]), int(fit_range[1])
    mat = as_float64_matrix(cov)
    eigs = np.asarray(spectrum.eigenvalues, dtype=np.float64)
    if mat.shape[0] != eigs.size:
        raise ValueError(
            f"summarize: covariance is {mat.shape[0]}x{mat.shape[0]} but the spectrum has {eigs.size} values"
        )
    out: dict[str, float] = dict.fromkeys(OBSERVABLES, math.nan)
    out["n_rows"] = float(spectrum.n_rows)
    out["n_nonfinite"] = float(spectrum.n_nonfinite)
    out["n_clamped"] = float(spectrum.n_clamped)
    out["most_negative_eigenvalue"] = float(spectrum.most_negative)
    if spectrum.n_rows < 2 or not np.all(np.isfinite(mat)) or not np.all(np.isfinite(eigs)):
        return out

    alpha, r2 = obs.power_law_fit(eigs, start=fit_start, stop=fit_stop)
    out.update(
        effective_rank=obs.effective_rank(eigs),
        stable_rank=obs.stable_rank(eigs),
        participation_ratio=obs.participation_ratio(eigs),
        spectral_entropy=obs.spectral_entropy(eigs),
        spectral_anisotropy=obs.spectral_anisotropy(eigs),
        spectral_flatness=obs.spectral_flatness(eigs),
        spectral_entropy_normalized=obs.spectral_entropy(eigs, normalized=True),
        components_90=float(obs.components_for_variance(eigs, 0.90)),
        components_95=float(obs.components_for_variance(eigs, 0.95)),
        components_99=float(obs.components_for_variance(eigs, 0.99)),
        power_law_alpha=alpha,
        power_law_r2=r2,
        offdiag_energy_fraction=obs.offdiag_energy_fraction(mat),
        mean_abs_offdiag_correlation=obs.mean_abs_offdiag_correlation(mat),
        total_variance=float(eigs.sum()),
        top_eigenvalue=float(eigs.max()),
    )
    return {name: float(out[name]) for name in OBSERVABLES}
