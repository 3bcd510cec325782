"""The observable catalogue: every scalar TGO records, declared once (`Observable`).

The summary, the records, TensorBoard and the report all read this one table, so an observable is one entry here, its
function in ``tgo.spectral.observables`` and a test (``docs/extending.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Literal

import numpy as np

from tgo.spectral import observables as obs
from tgo.spectral.baselines import noise_spectra
from tgo.spectral.decomposition import Spectrum

__all__ = [
    "BASELINED",
    "CATALOGUE",
    "Catalogue",
    "Kind",
    "Observable",
    "Scope",
    "SpectralInputs",
    "Spread",
    "noise_expectation",
]

Spread = Literal["rises", "falls"]
Kind = Literal["geometry", "diagnostic"]
Scope = Literal["covariance", "family"]


@dataclass(frozen=True)
class SpectralInputs:
    """What an observable may look at: one float64 covariance, its `Spectrum` and the fit range (``None``: default)."""

    covariance: np.ndarray
    spectrum: Spectrum
    fit_range: tuple[int, int] | None = None

    @property
    def eigenvalues(self) -> np.ndarray:
        """float64 eigenvalues, descending, non-negative."""
        return np.asarray(self.spectrum.eigenvalues, dtype=np.float64)

    @property
    def n_rows(self) -> int:
        """Rows that entered the covariance."""
        return int(self.spectrum.n_rows)

    @property
    def dim(self) -> int:
        """Feature dimension ``D``."""
        return int(self.covariance.shape[0])

    @cached_property
    def diagonal_spectrum(self) -> np.ndarray:
        """The per-dimension variances, descending: the spectrum if every correlation were zero."""
        return np.sort(np.clip(np.diag(self.covariance), 0.0, None))[::-1].copy()

    @cached_property
    def power_law(self) -> tuple[float, float]:
        """``(alpha, r2)`` of the power-law fit over ``fit_range`` (computed once, read by two observables)."""
        start, stop = self.fit_range if self.fit_range is not None else (None, None)
        return obs.power_law_fit(self.eigenvalues, start=start, stop=stop)


@dataclass(frozen=True)
class Observable:
    """One recorded scalar.

    ``compute`` is a pure function of `SpectralInputs` (NaN where undefined); ``spread``: ``rises`` / ``falls`` when
    variance spreads (``None``: not a spread measure); ``kind``: ``geometry`` (NaN when the covariance is undefined) or
    ``diagnostic`` (stays real so a NaN row can be explained); ``noise_floor``: below it findings read no move;
    ``scope``: ``covariance`` (every view of every point) or ``family`` (recorded by its family on ``views``);
    ``scale``: ``log`` for ratio-type quantities judged as log ratios; ``stderr``: ``jackknife`` (over image groups),
    ``blocks`` (over training steps), ``fit`` or ``probes`` (no replicates).
    """

    name: str
    compute: Callable[[SpectralInputs], float] = field(repr=False)
    formula: str
    spread: Spread | None = None
    charted: bool = False
    kind: Kind = "geometry"
    noise_floor: float = 0.0
    doc: str = "docs/observables.md#3-the-observables"
    scope: Scope = "covariance"
    views: tuple[str, ...] = ()
    scale: str = "linear"
    stderr: str = "jackknife"

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").isalnum():
            raise ValueError(f"Observable name must be a non-empty identifier (letters, digits, _); got {self.name!r}")
        if self.spread not in (None, "rises", "falls"):
            raise ValueError(f"Observable {self.name}: spread must be 'rises', 'falls' or None; got {self.spread!r}")
        if self.kind not in ("geometry", "diagnostic"):
            raise ValueError(f"Observable {self.name}: kind must be 'geometry' or 'diagnostic'; got {self.kind!r}")
        if not self.noise_floor >= 0:
            raise ValueError(f"Observable {self.name}: noise_floor must be >= 0; got {self.noise_floor!r}")
        if self.scope not in ("covariance", "family"):
            raise ValueError(f"Observable {self.name}: scope must be 'covariance' or 'family'; got {self.scope!r}")
        if self.scale not in ("linear", "log"):
            raise ValueError(f"Observable {self.name}: scale must be 'linear' or 'log'; got {self.scale!r}")
        if self.scope == "family" and not self.views:
            raise ValueError(f"Observable {self.name}: a family's observable must name the views that carry it")

    def below_noise_floor(self, *values: float) -> bool:
        """Whether every given value is (in magnitude) below the noise floor, i.e. indistinguishable from zero."""
        return self.noise_floor > 0 and all(abs(float(v)) < self.noise_floor for v in values)


class Catalogue:
    """An ordered, name-keyed collection of observables (iteration order is the records' row order)."""

    def __init__(self, observables: Iterable[Observable] = ()) -> None:
        self._entries: dict[str, Observable] = {}
        for o in observables:
            self.register(o)

    def register(self, observable: Observable) -> Observable:
        """Adds an observable at the end of the geometry entries (before the diagnostics); names are unique."""
        if observable.name in self._entries:
            raise ValueError(f"observable {observable.name!r} is already in the catalogue")
        if observable.kind == "diagnostic":
            self._entries[observable.name] = observable
            return observable
        entries = list(self._entries.values())
        cut = next((i for i, o in enumerate(entries) if o.kind == "diagnostic"), len(entries))
        entries.insert(cut, observable)
        self._entries = {o.name: o for o in entries}
        return observable

    def unregister(self, name: str) -> Observable:
        """Removes and returns an observable (for plug-ins and tests that register temporarily)."""
        return self._entries.pop(name)

    def __getitem__(self, name: str) -> Observable:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"no observable {name!r} in the catalogue; known: {list(self._entries)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Observable]:
        return iter(list(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, name: str) -> Observable | None:
        """The observable called ``name``, or ``None`` (records may hold metrics of a newer TGO)."""
        return self._entries.get(name)

    @property
    def names(self) -> tuple[str, ...]:
        """Every name, in record order."""
        return tuple(self._entries)

    @property
    def covariance_names(self) -> tuple[str, ...]:
        """Names computed from one covariance (what `tgo.spectral.summarize` returns), in record order."""
        return tuple(o.name for o in self._entries.values() if o.scope == "covariance")

    @property
    def charted(self) -> tuple[str, ...]:
        """Covariance observables drawn in dashboards and reports (every view), in record order."""
        return tuple(o.name for o in self._entries.values() if o.charted and o.scope == "covariance")

    @property
    def family_entries(self) -> tuple[Observable, ...]:
        """The measurement families' entries (scope ``family``), in record order."""
        return tuple(o for o in self._entries.values() if o.scope == "family")

    def charted_on(self, view: str) -> tuple[str, ...]:
        """Every charted name recorded on ``view``: the charted covariance observables plus its families' charted."""
        return self.charted + tuple(o.name for o in self.family_entries if o.charted and view in o.views)

    @property
    def diagnostics(self) -> frozenset[str]:
        """Names that stay real numbers when a point's geometry is undefined."""
        return frozenset(o.name for o in self._entries.values() if o.kind == "diagnostic")

    def compute(self, inputs: SpectralInputs, *, geometry: bool = True) -> dict[str, float]:
        """Every covariance observable as ``{name: float}`` in catalogue order; with ``geometry=False`` (an undefined
        covariance) geometry entries are NaN without being computed, diagnostics still computed."""
        entries = (self._entries[name] for name in self.covariance_names)
        return {o.name: float(o.compute(inputs)) if geometry or o.kind == "diagnostic" else math.nan for o in entries}


def _eigs(f: Callable[[np.ndarray], float]) -> Callable[[SpectralInputs], float]:
    """Adapts a function of the eigenvalues to a function of `SpectralInputs`."""
    return lambda inputs: f(inputs.eigenvalues)


def _diagnostic(name: str, attribute: str, formula: str) -> Observable:
    """A bookkeeping entry read from the `Spectrum` (stays real when the point's geometry is undefined)."""
    return Observable(
        name,
        lambda inputs: float(getattr(inputs.spectrum, attribute)),
        formula,
        kind="diagnostic",
        doc="docs/observables.md#4-degenerate-cases",
    )


def _cov(f: Callable[[np.ndarray], float]) -> Callable[[SpectralInputs], float]:
    """Adapts a function of the covariance matrix to a function of `SpectralInputs`."""
    return lambda inputs: f(inputs.covariance)


CATALOGUE = Catalogue(
    [
        Observable("effective_rank", _eigs(obs.effective_rank), "exp(-sum p_i log p_i)", "rises", charted=True),
        Observable("stable_rank", _eigs(obs.stable_rank), "sum lambda_i / lambda_1", "rises", charted=True),
        Observable(
            "participation_ratio",
            _eigs(obs.participation_ratio),
            "(sum lambda_i)^2 / sum lambda_i^2",
            "rises",
            charted=True,
        ),
        Observable("spectral_entropy", _eigs(obs.spectral_entropy), "-sum p_i log p_i (nats)", "rises", charted=True),
        Observable(
            "spectral_entropy_normalized",
            _eigs(lambda e: obs.spectral_entropy(e, normalized=True)),
            "-sum p_i log p_i / log D",
            "rises",
        ),
        Observable(
            "spectral_anisotropy", _eigs(obs.spectral_anisotropy), "lambda_1 / sum lambda_i", "falls", charted=True
        ),
        Observable(
            "spectral_flatness",
            _eigs(obs.spectral_flatness),
            "exp(mean log max(lambda_i, 1e-12)) / mean lambda_i",
            "rises",
            charted=True,
            noise_floor=1e-6,
        ),
        Observable(
            "components_90",
            _eigs(lambda e: float(obs.components_for_variance(e, 0.90))),
            "min k: p_1+..+p_k >= 0.90",
            "rises",
            charted=True,
        ),
        Observable(
            "components_95",
            _eigs(lambda e: float(obs.components_for_variance(e, 0.95))),
            "min k: p_1+..+p_k >= 0.95",
            "rises",
        ),
        Observable(
            "components_99",
            _eigs(lambda e: float(obs.components_for_variance(e, 0.99))),
            "min k: p_1+..+p_k >= 0.99",
            "rises",
        ),
        Observable(
            "power_law_alpha",
            lambda inputs: inputs.power_law[0],
            "-slope of log lambda_i on log i over fit_range",
            "falls",
            charted=True,
        ),
        Observable("power_law_r2", lambda inputs: inputs.power_law[1], "R^2 of that fit"),
        Observable(
            "offdiag_energy_fraction",
            _cov(obs.offdiag_energy_fraction),
            "||C - diag C||_F^2 / ||C||_F^2",
            "falls",
            charted=True,
        ),
        Observable(
            "mean_abs_offdiag_correlation",
            _cov(obs.mean_abs_offdiag_correlation),
            "mean_{i!=j} |R_ij|",
            "falls",
            charted=True,
        ),
        Observable(
            "total_correlation",
            lambda inputs: obs.total_correlation(inputs.covariance, inputs.eigenvalues),
            "1/2 (sum ln C_ii - ln det C) = -1/2 ln det R (nats; NaN when C is singular)",
            "falls",
        ),
        Observable("total_variance", _eigs(lambda e: float(e.sum())), "sum lambda_i = tr C"),
        Observable("top_eigenvalue", _eigs(lambda e: float(e.max())), "lambda_1"),
        _diagnostic("n_rows", "n_rows", "rows that entered the covariance"),
        _diagnostic("n_nonfinite", "n_nonfinite", "rows dropped for NaN/Inf"),
        _diagnostic("n_clamped", "n_clamped", "negative round-off eigenvalues set to 0"),
        _diagnostic("most_negative_eigenvalue", "most_negative", "most negative eigenvalue before clamping"),
    ]
)
"""The observables every observation records, in record order."""

# ------------------------------------------------------------------------------------------- finite-sample baselines
BASELINED: dict[str, Callable[[np.ndarray], float]] = {
    "effective_rank": obs.effective_rank,
    "stable_rank": obs.stable_rank,
    "participation_ratio": obs.participation_ratio,
    "spectral_entropy": obs.spectral_entropy,
    "spectral_anisotropy": obs.spectral_anisotropy,
}
"""Rank-type observables that get a noise baseline, an independent-channel baseline and a noise-normalised form."""


@lru_cache(maxsize=4096)
def noise_expectation(name: str, n_rows: int, dim: int) -> float:
    """Mean of observable ``name`` over the seeded isotropic-noise spectra of ``(n_rows, dim)`` (cached)."""
    if n_rows < 2:
        return math.nan
    f = BASELINED[name]
    return float(np.mean([f(s) for s in noise_spectra(n_rows, dim)]))


def _noise(name: str) -> Callable[[SpectralInputs], float]:
    return lambda inputs: noise_expectation(name, inputs.n_rows, inputs.dim)


def _diagonal(name: str) -> Callable[[SpectralInputs], float]:
    return lambda inputs: BASELINED[name](inputs.diagonal_spectrum)


def _vs_noise(name: str) -> Callable[[SpectralInputs], float]:
    def ratio(inputs: SpectralInputs) -> float:
        noise = noise_expectation(name, inputs.n_rows, inputs.dim)
        value = BASELINED[name](inputs.eigenvalues)
        return value / noise if noise > 0 else math.nan

    return ratio


for _name in BASELINED:
    _base = CATALOGUE[_name]
    CATALOGUE.register(
        Observable(
            f"{_name}_noise",
            _noise(_name),
            f"E[{_name}] of the sample covariance of N i.i.d. N(0, I_D) rows (same N, D)",
            doc="docs/observables.md#finite-sample-baselines",
        )
    )
    CATALOGUE.register(
        Observable(
            f"{_name}_diagonal",
            _diagonal(_name),
            f"{_name} of diag(C) alone (every correlation set to zero)",
            doc="docs/observables.md#finite-sample-baselines",
        )
    )
    CATALOGUE.register(
        Observable(
            f"{_name}_vs_noise",
            _vs_noise(_name),
            f"{_name} / {_name}_noise (1 = what structureless data of this shape gives)",
            _base.spread,
            doc="docs/observables.md#finite-sample-baselines",
        )
    )
