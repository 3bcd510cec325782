"""What one observation yields: per (point, view) a float64 spectrum, the catalogue's observables, mean, covariance.

A *point* is where the model is read (`tgo.observatory.points`); a *view* is one covariance derived from what that
point streams. Today every point has the view ``all`` (every row the point selects); views such as ``cls`` and
``patch`` tokens of a block, or the between-image and within-image parts of the pooled covariance, are further
covariances of the same point and are keyed, recorded and charted the same way, never folded into point names.
`ObservationKey` is that identity; records store it as two columns.

`summarize_accumulators` is the rank-0 step after the reduction: covariance -> float64 eigendecomposition ->
`tgo.spectral.summarize`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from tgo.spectral import (
    CATALOGUE,
    GroupedCovariance,
    Spectrum,
    StreamingCovariance,
    eigendecompose,
    jackknife_stderr,
    leave_one_group_out,
    summarize,
)
from tgo.spectral.jackknife import combine
from tgo.spectral.jackknife import moments as jackknife_moments

from .points import ObservationPoint

__all__ = ["DEFAULT_VIEW", "ObservationKey", "PointResult", "Results", "summarize_accumulators"]

DEFAULT_VIEW = "all"
"""The view of every row a point selects (the only view the paper measured)."""


class ObservationKey(NamedTuple):
    """Which covariance a result describes: the observation point and the view of it."""

    point: str
    view: str = DEFAULT_VIEW


@dataclass(frozen=True)
class PointResult:
    """Everything recorded about one (point, view) at one observation.

    Attributes:
        spectrum: ``tgo.spectral.Spectrum`` (float64 descending eigenvalues, row counts, clamping diagnostics).
        observables: ``{metric: value}`` from ``tgo.spectral.summarize`` (NaN where undefined), catalogue order.
        mean: float64 ``[D]`` mean activation.
        covariance: float64 ``[D, D]`` unbiased covariance (kept so records can store it on chosen epochs).
        stderr: ``{metric: jackknife standard error}`` (NaN where there is none: no jackknife, or a diagnostic).
    """

    spectrum: Spectrum
    observables: dict[str, float]
    mean: np.ndarray
    covariance: np.ndarray
    stderr: dict[str, float] = field(default_factory=dict)

    @property
    def n_rows(self) -> int:
        """Rows (tokens x images) that entered the covariance."""
        return int(self.spectrum.n_rows)


class Results(dict[ObservationKey, PointResult]):
    """One observation: ``{ObservationKey: PointResult}`` in point (depth) order, views of a point together.

    A bare point name looks up that point's default view: ``results["cls"] is results[ObservationKey("cls")]``.
    """

    @staticmethod
    def _key(key: object) -> object:
        return ObservationKey(key) if isinstance(key, str) else key

    def __getitem__(self, key: object) -> PointResult:
        return super().__getitem__(self._key(key))  # type: ignore[index]

    def __contains__(self, key: object) -> bool:
        return super().__contains__(self._key(key))

    def get(self, key: object, default: PointResult | None = None) -> PointResult | None:  # type: ignore[override]
        return super().get(self._key(key), default)  # type: ignore[call-overload]

    def by_point(self, view: str = DEFAULT_VIEW) -> dict[str, PointResult]:
        """``{point: PointResult}`` of one view, in point order."""
        return {key.point: result for key, result in self.items() if key.view == view}


def _moments(acc: StreamingCovariance) -> tuple[np.ndarray, np.ndarray, int, int]:
    cov = acc.covariance().detach().cpu().numpy().astype(np.float64, copy=False)
    mean = acc.mean().detach().cpu().numpy().astype(np.float64, copy=False)
    return cov, mean, int(acc.n), int(acc.n_nonfinite)


def _observables(
    moments: tuple[np.ndarray, np.ndarray, int, int], fit_range: Sequence[int] | None
) -> tuple[Spectrum, dict[str, float]]:
    cov, _, n_rows, n_nonfinite = moments
    spectrum = eigendecompose(cov, n_rows=n_rows, n_nonfinite=n_nonfinite)
    return spectrum, summarize(cov, spectrum, fit_range=fit_range)


def summarize_accumulators(
    accumulators: Mapping[str, StreamingCovariance | GroupedCovariance],
    points: Sequence[ObservationPoint] | None = None,
    *,
    nan_if_nonfinite: bool = False,
    fit_range: Sequence[int] | None = None,
) -> Results:
    """Eigendecompose (float64) and compute the observables of every point; call on one rank after reduction.

    A `GroupedCovariance` (jackknife groups) is summarised from the exact merge of its groups, and each of its ``G``
    leave-one-group-out merges gives the catalogue's observables once more, from which every geometry observable
    gets its delete-a-group jackknife standard error (`tgo.spectral.jackknife_stderr`); diagnostics get none.

    Args:
        accumulators: Reduced accumulators ``{point name: StreamingCovariance | GroupedCovariance}``.
        points: Order of the result (default: the accumulators' order); every point needs an accumulator.
        nan_if_nonfinite: A point that saw any non-finite row gets NaN geometry observables and standard errors
            (the catalogue's diagnostics stay real so the record says why). The accumulator excludes such rows, so
            without this the observables would quietly describe only the finite part. Spectrum, mean and covariance
            of the finite rows are kept either way, for diagnosis.
        fit_range: ``(start, stop)`` of the power-law fit (``None``: the default).

    Returns:
        ``{ObservationKey(point, "all"): PointResult}`` in point order.
    """
    names = [p.name for p in points] if points is not None else list(accumulators)
    missing = [n for n in names if n not in accumulators]
    if missing:
        raise ValueError(f"summarize_accumulators: no accumulator for point(s) {missing}")
    diagnostics = CATALOGUE.diagnostics
    out = Results()
    for name in names:
        acc = accumulators[name]
        # Every torch op of the point first, then its numpy work under a one-thread BLAS: numpy's BLAS pool
        # (OpenBLAS threads) and torch's OpenMP pool otherwise spin against each other on the same cores. Measured
        # on 2 CPU cores: 15 points of D=384 took ~7 s with both pools at 2 threads and ~0.5 s like this.
        if isinstance(acc, GroupedCovariance):
            group_moments = [jackknife_moments(g) for g in acc.groups]
            moments = combine(group_moments)
            leave_out_moments = leave_one_group_out(moments, group_moments)
        else:
            moments, leave_out_moments = _moments(acc), []
        with _single_threaded_blas():
            spectrum, observables = _observables(moments, fit_range)
            replicates = [_observables(m, fit_range)[1] for m in leave_out_moments]
        stderr = {
            k: jackknife_stderr([r[k] for r in replicates]) if k not in diagnostics else math.nan for k in observables
        }
        if nan_if_nonfinite and moments[3] > 0:
            observables = {k: (v if k in diagnostics else math.nan) for k, v in observables.items()}
            stderr = dict.fromkeys(stderr, math.nan)
        out[ObservationKey(name)] = PointResult(
            spectrum=spectrum, observables=observables, mean=moments[1], covariance=moments[0], stderr=stderr
        )
    return out


def _single_threaded_blas() -> contextlib.AbstractContextManager[Any]:
    """numpy's BLAS limited to one thread for the enclosed block (threadpoolctl ships with scikit-learn)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - scikit-learn, a dependency, requires threadpoolctl
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")
