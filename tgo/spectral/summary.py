"""One dict of scalar observables per covariance: what the callback logs and the records store.

The built-in entries share their intermediate results through one `EigenvalueStats` per spectrum (validation, total,
entropy, cumulative shares; ``*_vs_noise`` reuse what they divide) with the public functions' operations, so every
value is theirs bit for bit (``tests/spectral/test_stack.py``); a later or replaced entry runs its own ``compute``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from tgo.spectral import observables as obs
from tgo.spectral.catalogue import BASELINED, CATALOGUE, Observable, SpectralInputs, noise_expectation
from tgo.spectral.decomposition import Spectrum, as_float64_matrix

__all__ = ["compute_observables", "summarize", "summarize_many"]


class _Shared:
    """What the built-in observables of one covariance share, each computed on first use."""

    __slots__ = ("_diagonal", "_power_law", "_stats", "inputs")

    def __init__(self, inputs: SpectralInputs) -> None:
        self.inputs = inputs
        self._stats: obs.EigenvalueStats | None = None
        self._diagonal: obs.EigenvalueStats | None = None
        self._power_law: tuple[float, float] | None = None

    @property
    def stats(self) -> obs.EigenvalueStats:
        if self._stats is None:
            self._stats = obs.EigenvalueStats(self.inputs.eigenvalues)
        return self._stats

    @property
    def diagonal(self) -> obs.EigenvalueStats:
        if self._diagonal is None:
            self._diagonal = obs.EigenvalueStats(self.inputs.diagonal_spectrum)
        return self._diagonal

    @property
    def power_law(self) -> tuple[float, float]:
        if self._power_law is None:
            start, stop = self.inputs.fit_range if self.inputs.fit_range is not None else (None, None)
            self._power_law = self.stats.power_law_fit(start, stop)
        return self._power_law


# The baselined observables as functions of shared eigenvalue statistics (the same operations as BASELINED's).
_BASELINED_STATS: dict[str, tuple[Callable[[np.ndarray], float], Callable[[obs.EigenvalueStats], float]]] = {
    "effective_rank": (obs.effective_rank, lambda s: s.effective_rank),
    "stable_rank": (obs.stable_rank, lambda s: s.stable_rank),
    "participation_ratio": (obs.participation_ratio, lambda s: s.participation_ratio),
    "spectral_entropy": (obs.spectral_entropy, lambda s: s.spectral_entropy()),
    "spectral_anisotropy": (obs.spectral_anisotropy, lambda s: s.spectral_anisotropy),
}


def _vs_noise(name: str, shared: _Shared, value: Callable[[obs.EigenvalueStats], float]) -> float:
    noise = noise_expectation(name, shared.inputs.n_rows, shared.inputs.dim)
    v = value(shared.stats)
    return v / noise if noise > 0 else math.nan


def _fast_table() -> dict[str, Callable[[_Shared], float]]:
    """The built-in covariance observables as functions of the shared intermediates."""
    table: dict[str, Callable[[_Shared], float]] = {
        **{name: (lambda s, v=value: v(s.stats)) for name, (_, value) in _BASELINED_STATS.items()},  # type: ignore[misc]
        "spectral_entropy_normalized": lambda s: s.stats.spectral_entropy(normalized=True),
        "spectral_flatness": lambda s: s.stats.spectral_flatness(),
        "components_90": lambda s: float(s.stats.components_for_variance(0.90)),
        "components_95": lambda s: float(s.stats.components_for_variance(0.95)),
        "components_99": lambda s: float(s.stats.components_for_variance(0.99)),
        "power_law_alpha": lambda s: s.power_law[0],
        "power_law_r2": lambda s: s.power_law[1],
        "offdiag_energy_fraction": lambda s: obs.offdiag_energy_fraction(s.inputs.covariance),
        "mean_abs_offdiag_correlation": lambda s: obs.mean_abs_offdiag_correlation(s.inputs.covariance),
        "total_correlation": lambda s: obs.total_correlation(s.inputs.covariance, s.inputs.eigenvalues),
        "total_variance": lambda s: float(s.stats.e.sum()),
        "top_eigenvalue": lambda s: float(s.stats.top),
        "n_rows": lambda s: float(s.inputs.spectrum.n_rows),
        "n_nonfinite": lambda s: float(s.inputs.spectrum.n_nonfinite),
        "n_clamped": lambda s: float(s.inputs.spectrum.n_clamped),
        "most_negative_eigenvalue": lambda s: float(s.inputs.spectrum.most_negative),
    }
    for name, (_, value) in _BASELINED_STATS.items():
        table[f"{name}_noise"], table[f"{name}_diagonal"], table[f"{name}_vs_noise"] = _baselines(name, value)
    return table


def _baselines(
    name: str, value: Callable[[obs.EigenvalueStats], float]
) -> tuple[Callable[[_Shared], float], Callable[[_Shared], float], Callable[[_Shared], float]]:
    """The ``_noise``, ``_diagonal`` and ``_vs_noise`` entries of one baselined observable."""

    def noise(s: _Shared) -> float:
        return noise_expectation(name, s.inputs.n_rows, s.inputs.dim)

    def diagonal(s: _Shared) -> float:
        return value(s.diagonal)

    def vs_noise(s: _Shared) -> float:
        return _vs_noise(name, s, value)

    return noise, diagonal, vs_noise


_FAST = _fast_table()
_BUILTIN = {o.name: o.compute for o in CATALOGUE if o.name in _FAST}
"""The catalogue's own functions of the entries `_FAST` mirrors, as registered at import."""


_BASELINE_OF = {f"{n}_{suffix}": n for n in _BASELINED_STATS for suffix in ("noise", "diagonal", "vs_noise")}
"""The entries that call ``BASELINED[name]`` when they run (so a replaced baseline function is theirs too)."""


Evaluator = tuple[Observable, Callable[[_Shared], float] | None]
"""A covariance entry of the catalogue and its shared-intermediate function (``None``: its own ``compute`` runs)."""


def _evaluators() -> list[Evaluator]:
    """Every covariance entry with its shared-intermediate function, or ``None`` where its own ``compute`` runs."""
    replaced = {name for name, (f, _) in _BASELINED_STATS.items() if BASELINED.get(name) is not f}
    out: list[Evaluator] = []
    for o in CATALOGUE:
        if o.scope != "covariance":
            continue
        builtin = _BUILTIN.get(o.name) is o.compute and _BASELINE_OF.get(o.name) not in replaced
        out.append((o, _FAST[o.name] if builtin else None))
    return out


def compute_observables(
    inputs: SpectralInputs, *, geometry: bool = True, evaluators: Sequence[Evaluator] | None = None
) -> dict[str, float]:
    """``CATALOGUE.compute(inputs, geometry=geometry)`` bit for bit, the shared work done once."""
    shared = _Shared(inputs)
    return {
        o.name: (float(fast(shared)) if fast is not None else float(o.compute(inputs)))
        if geometry or o.kind == "diagnostic"
        else math.nan
        for o, fast in (_evaluators() if evaluators is None else evaluators)
    }


def summarize(
    cov: np.ndarray | torch.Tensor,
    spectrum: Spectrum,
    *,
    fit_range: Sequence[int] | None = None,
) -> dict[str, float]:
    """Every observable of the catalogue for one covariance and its spectrum, as floats in catalogue order; an undefined
    or non-finite covariance gives NaN geometry with real diagnostics, so the record says why."""
    return summarize_many([cov], [spectrum], fit_range=fit_range)[0]


def _fit(fit_range: Sequence[int] | None) -> tuple[int, int] | None:
    if fit_range is None:
        return None
    if len(fit_range) != 2:
        raise ValueError(f"summarize: fit_range must be (start, stop), got {fit_range!r}")
    return int(fit_range[0]), int(fit_range[1])


def _defined(mat: np.ndarray, spectrum: Spectrum) -> bool:
    """Whether the geometry observables of this covariance are computed (else NaN)."""
    eigs = np.asarray(spectrum.eigenvalues, dtype=np.float64)
    if mat.shape[0] != eigs.size:
        raise ValueError(
            f"summarize: covariance is {mat.shape[0]}x{mat.shape[0]} but the spectrum has {eigs.size} values"
        )
    return spectrum.n_rows >= 2 and bool(np.all(np.isfinite(mat))) and bool(np.all(np.isfinite(eigs)))


def summarize_many(
    covs: Sequence[np.ndarray | torch.Tensor] | np.ndarray,
    spectra: Sequence[Spectrum],
    *,
    fit_range: Sequence[int] | None = None,
    spectra_of_covs: bool = False,
) -> list[dict[str, float]]:
    """`summarize` of a view's total and jackknife covariances, bit for bit, over stacks; what a stack cannot take is
    summarised one by one. ``spectra_of_covs``: a defined spectrum then means a finite covariance (saves a pass)."""
    fit = _fit(fit_range)
    if len(covs) != len(spectra):
        raise ValueError(f"summarize_many: {len(covs)} covariances but {len(spectra)} spectra")
    mats = [as_float64_matrix(c) for c in covs]
    if spectra_of_covs:
        for m, s in zip(mats, spectra, strict=True):
            if m.shape[0] != s.dim:
                raise ValueError(f"summarize: covariance is {m.shape[0]}x{m.shape[0]} but the spectrum has {s.dim}")
        defined = [s.n_rows >= 2 and s.is_defined for s in spectra]
    else:
        defined = [_defined(m, s) for m, s in zip(mats, spectra, strict=True)]
    evaluators = _evaluators()
    out: list[dict[str, float] | None] = [None] * len(mats)
    rows = [i for i, ok in enumerate(defined) if ok and mats[i].shape == mats[0].shape]
    if len(rows) >= 2:
        whole = isinstance(covs, np.ndarray) and covs.ndim == 3 and covs.dtype == np.float64 and len(rows) == len(mats)
        stack = np.asarray(covs) if whole else np.stack([mats[i] for i in rows])
        eigs, diagonal = _stack_spectra(stack, [spectra[i] for i in rows])
        # the rows the stack cannot take (e.g. zero variance) are summarised one by one below
        usable = obs.EigenvalueStack.usable_rows(eigs) & obs.EigenvalueStack.usable_rows(diagonal)
        if usable.sum() >= 2:
            if not usable.all():
                keep = np.flatnonzero(usable)
                rows = [rows[k] for k in keep]
                stack, eigs, diagonal = stack[keep], eigs[keep], diagonal[keep]
            stacked = _stacked(stack, [spectra[i] for i in rows], fit, evaluators, eigs, diagonal)
            for i, values in zip(rows, stacked, strict=True):
                out[i] = values
    for i, row in enumerate(out):
        if row is None:
            inputs = SpectralInputs(covariance=mats[i], spectrum=spectra[i], fit_range=fit)
            out[i] = compute_observables(inputs, geometry=defined[i], evaluators=evaluators)
    return [row for row in out if row is not None]


class _Stack:
    """What the built-in observables of a stack of defined covariances share, each computed on first use."""

    def __init__(
        self,
        covs: np.ndarray,
        spectra: Sequence[Spectrum],
        fit: tuple[int, int] | None,
        eigs: np.ndarray,
        diagonal_eigs: np.ndarray,
    ) -> None:
        self.covs, self.spectra, self.fit = covs, spectra, fit
        self.eigs, self.diagonal_eigs = eigs, diagonal_eigs
        self.stats = obs.EigenvalueStack(self.eigs, checked=True)  # `_stacked` checked both stacks
        self._diagonal: obs.EigenvalueStack | None = None
        self._power_law: list[tuple[float, float]] | None = None

    @property
    def diagonal(self) -> obs.EigenvalueStack:
        if self._diagonal is None:
            self._diagonal = obs.EigenvalueStack(self.diagonal_eigs, checked=True)
        return self._diagonal

    @property
    def power_law(self) -> list[tuple[float, float]]:
        if self._power_law is None:
            start, stop = self.fit if self.fit is not None else (None, None)
            self._power_law = self.stats.power_law_fit(start, stop)
        return self._power_law

    def noise(self, name: str) -> list[float]:
        dim = self.covs.shape[1]
        return [noise_expectation(name, int(s.n_rows), dim) for s in self.spectra]


def _stack_vs_noise(stack: _Stack, name: str, values: Sequence[float]) -> list[float]:
    return [v / n if n > 0 else math.nan for v, n in zip(values, stack.noise(name), strict=True)]


# An EigenvalueStack has the EigenvalueStats attributes, one value per row: the same accessors serve both.
_STACK_BASELINED: dict[str, Callable[[Any], Any]] = {n: v for n, (_, v) in _BASELINED_STATS.items()}


def _stack_table() -> dict[str, Callable[[_Stack], Sequence[float]]]:
    """The built-in covariance observables as array functions of a `_Stack` (one value per covariance)."""
    table: dict[str, Callable[[_Stack], Sequence[float]]] = {
        **{name: (lambda s, f=f: f(s.stats)) for name, f in _STACK_BASELINED.items()},  # type: ignore[misc]
        "spectral_entropy_normalized": lambda s: s.stats.spectral_entropy(normalized=True),
        "spectral_flatness": lambda s: s.stats.spectral_flatness(),
        "components_90": lambda s: s.stats.components_for_variance(0.90),
        "components_95": lambda s: s.stats.components_for_variance(0.95),
        "components_99": lambda s: s.stats.components_for_variance(0.99),
        "power_law_alpha": lambda s: [a for a, _ in s.power_law],
        "power_law_r2": lambda s: [r for _, r in s.power_law],
        "offdiag_energy_fraction": lambda s: obs.offdiag_energy_fractions(s.covs),
        "mean_abs_offdiag_correlation": lambda s: obs.mean_abs_offdiag_correlations(s.covs),
        "total_correlation": lambda s: obs.total_correlations(s.covs, s.eigs),
        "total_variance": lambda s: [float(t) for t in s.stats.total],
        "top_eigenvalue": lambda s: [float(t) for t in s.stats.top],
        "n_rows": lambda s: [float(x.n_rows) for x in s.spectra],
        "n_nonfinite": lambda s: [float(x.n_nonfinite) for x in s.spectra],
        "n_clamped": lambda s: [float(x.n_clamped) for x in s.spectra],
        "most_negative_eigenvalue": lambda s: [float(x.most_negative) for x in s.spectra],
    }
    for name, value in _STACK_BASELINED.items():
        table[f"{name}_noise"] = lambda s, n=name: s.noise(n)  # type: ignore[misc]
        table[f"{name}_diagonal"] = lambda s, v=value: v(s.diagonal)  # type: ignore[misc]
        table[f"{name}_vs_noise"] = lambda s, n=name, v=value: _stack_vs_noise(s, n, v(s.stats))  # type: ignore[misc]
    return table


_STACK = _stack_table()


def _stack_spectra(covs: np.ndarray, spectra: Sequence[Spectrum]) -> tuple[np.ndarray, np.ndarray]:
    """``[S, D]`` eigenvalues of a stack and its diagonal spectra (the variances clipped at 0, descending)."""
    eigs = np.stack([np.asarray(s.eigenvalues, dtype=np.float64) for s in spectra])
    variances = np.ascontiguousarray(np.diagonal(covs, axis1=1, axis2=2))
    diagonal = np.ascontiguousarray(np.sort(np.clip(variances, 0.0, None), axis=1)[:, ::-1])
    return eigs, diagonal


def _stacked(
    covs: np.ndarray,
    spectra: Sequence[Spectrum],
    fit: tuple[int, int] | None,
    evaluators: Sequence[Evaluator],
    eigs: np.ndarray,
    diagonal: np.ndarray,
) -> list[dict[str, float]]:
    """Every observable of a stack of defined covariances whose spectra are all `EigenvalueStack.usable_rows`."""
    stack = _Stack(covs, spectra, fit, eigs, diagonal)
    columns: dict[str, Sequence[float]] = {}
    for o, fast in evaluators:
        if fast is not None:
            columns[o.name] = _STACK[o.name](stack)
        else:
            columns[o.name] = [
                float(o.compute(SpectralInputs(covariance=c, spectrum=s, fit_range=fit)))
                for c, s in zip(covs, spectra, strict=True)
            ]
    names = [o.name for o, _ in evaluators]
    return [dict(zip(names, map(float, row), strict=True)) for row in zip(*(columns[n] for n in names), strict=True)]
