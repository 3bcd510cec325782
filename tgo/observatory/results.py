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
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
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
    summarize,
)
from tgo.spectral.jackknife import Moments, combine
from tgo.spectral.jackknife import moments as jackknife_moments

from .images import ImageTable, ImageVectors
from .points import ObservationPoint
from .settings import ProbeSettings
from .views import (
    SubspaceHistory,
    ViewMoments,
    between_image_fraction,
    class_metrics,
    drift_metrics,
    massive_metrics,
    point_views,
)

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
        arrays: Further arrays every spectra record keeps (the probes' eigenvectors and ``max |x|``).
        kept_arrays: Arrays kept only where covariances are kept (the per-image vectors and their labels).
        alias_of: The view whose covariance this one is (e.g. ``patch`` at the patch embedding is ``all``): the
            records keep that covariance once, under the original view.
        jackknife: ``{metric: float64 [G] leave-one-out values}`` (group order; fold order for the decoding
            accuracies, whose ``G`` is the number of folds) of every metric whose standard error came from
            replicates: ``tgo.spectral.jackknife_stderr(jackknife[m]) == stderr[m]`` bit for bit (both NaN where a
            replicate is NaN). No entry where there is no jackknife (diagnostics, drift, massive activations, fewer
            than 2 groups) or the point saw non-finite rows under ``nan_if_nonfinite``. An alias view carries its
            original's. Kept so that paired standard errors of differences (epoch B - epoch A, one point - another)
            can be taken replicate by replicate (`tgo.records.load_jackknife`).
    """

    spectrum: Spectrum
    observables: dict[str, float]
    mean: np.ndarray
    covariance: np.ndarray
    stderr: dict[str, float] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    kept_arrays: dict[str, np.ndarray] = field(default_factory=dict)
    alias_of: str | None = None
    jackknife: dict[str, np.ndarray] = field(default_factory=dict)

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
    images: ImageTable | None = None,
    image_groups: np.ndarray | None = None,
    probes: ProbeSettings | None = None,
    history: SubspaceHistory | None = None,
) -> Results:
    """Eigendecompose (float64) and compute the observables of every point and view; call on one rank after reduction.

    A `GroupedCovariance` (jackknife groups) is summarised from the exact merge of its groups, and each of its ``G``
    leave-one-group-out merges gives the catalogue's observables once more, from which every geometry observable
    gets its delete-a-group jackknife standard error (`tgo.spectral.jackknife_stderr`); diagnostics get none.
    With the per-image vectors (``images``, the hypothesis probes) every point also gets the views and probe metrics
    of `tgo.observatory.views`, with standard errors from the same image groups.

    Args:
        accumulators: Reduced accumulators ``{point name: StreamingCovariance | GroupedCovariance}``.
        points: Order of the result (default: the accumulators' order); every point needs an accumulator.
        nan_if_nonfinite: A point that saw any non-finite row gets NaN geometry observables and standard errors
            (the catalogue's diagnostics stay real so the record says why). The accumulator excludes such rows, so
            without this the observables would quietly describe only the finite part. Spectrum, mean and covariance
            of the finite rows are kept either way, for diagnosis.
        fit_range: ``(start, stop)`` of the power-law fit (``None``: the default).
        images: The reduced per-image vectors (``None``: the ``all`` view only).
        image_groups: Jackknife group of every analysis image (needed with ``images`` and jackknife groups).
        probes: Probe settings (subspace ``k``, ridge strength, folds); default `ProbeSettings()`.
        history: Eigenvectors of earlier observations for subspace drift (``None``: drift is NaN).

    Returns:
        ``{ObservationKey(point, view): PointResult}`` in point order, views of a point in `VIEWS` order.
    """
    names = [p.name for p in points] if points is not None else list(accumulators)
    missing = [n for n in names if n not in accumulators]
    if missing:
        raise ValueError(f"summarize_accumulators: no accumulator for point(s) {missing}")
    probes = probes or ProbeSettings()
    labels = images.labels.detach().cpu().numpy().astype(np.int64) if images is not None else None
    # Every torch op first (the accumulators' sums to float64 numpy moments), then the numpy work of all points in a
    # thread pool, one point per task, under a one-thread BLAS: numpy's BLAS pool (OpenBLAS threads) and torch's
    # OpenMP pool otherwise spin against each other on the same cores (measured on 2 CPU cores: 15 points of D=384
    # took ~7 s with both pools at 2 threads and ~0.5 s like this), while LAPACK releases the GIL, so points run on
    # as many cores as the machine has.
    moments_of: dict[str, tuple[Moments, list[Moments]]] = {}
    for name in names:
        acc = accumulators[name]
        if isinstance(acc, GroupedCovariance):
            group_moments = [jackknife_moments(g) for g in acc.groups]
            moments_of[name] = (combine(group_moments), group_moments)
        else:
            moments_of[name] = (_moments(acc), [])

    def summarize_point(name: str) -> dict[str, PointResult]:
        moments, group_moments = moments_of[name]
        vectors = images.points.get(name) if images is not None else None
        views = point_views(moments, group_moments, vectors, image_groups=image_groups if group_moments else None)
        nonfinite = nan_if_nonfinite and moments[3] > 0
        summaries: dict[str, PointResult] = {}
        for view, vm in views.items():
            if vm.alias_of is not None:
                base = summaries[vm.alias_of]
                summaries[view] = PointResult(
                    base.spectrum,
                    dict(base.observables),
                    base.mean,
                    base.covariance,
                    dict(base.stderr),
                    alias_of=vm.alias_of,
                    jackknife=dict(base.jackknife),
                )
            else:
                summaries[view] = _summarize_view(vm, fit_range, nonfinite)
        if vectors is not None:
            _add_probes(
                name, summaries, views, vectors, labels, image_groups, len(group_moments), probes, history, nonfinite
            )
        return summaries

    workers = max(1, min(len(names), os.cpu_count() or 1))
    with _single_threaded_blas(), ThreadPoolExecutor(max_workers=workers) as pool:
        per_point = list(pool.map(summarize_point, names))
    out = Results()
    for name, summaries in zip(names, per_point, strict=True):
        for view, result in summaries.items():
            out[ObservationKey(name, view)] = result
    return out


def _summarize_view(vm: ViewMoments, fit_range: Sequence[int] | None, nonfinite: bool) -> PointResult:
    """Spectrum, catalogue observables and jackknife standard errors of one view."""
    diagnostics = CATALOGUE.diagnostics
    spectrum, observables = _observables(vm.total, fit_range)
    leave_out = [_observables(m, fit_range)[1] for m in vm.leave_out]
    replicates = (
        {k: np.array([r[k] for r in leave_out], dtype=np.float64) for k in observables if k not in diagnostics}
        if len(leave_out) >= 2
        else {}
    )
    stderr = {k: jackknife_stderr(replicates[k]) if k in replicates else math.nan for k in observables}
    if nonfinite:
        observables = {k: (v if k in diagnostics else math.nan) for k, v in observables.items()}
        stderr = dict.fromkeys(stderr, math.nan)
        replicates = {}
    return PointResult(
        spectrum=spectrum,
        observables=observables,
        mean=vm.total[1],
        covariance=vm.total[0],
        stderr=stderr,
        jackknife=replicates,
    )


def _add_probes(
    name: str,
    summaries: dict[str, PointResult],
    views: Mapping[str, ViewMoments],
    vectors: ImageVectors,
    labels: np.ndarray | None,
    image_groups: np.ndarray | None,
    groups: int,
    probes: ProbeSettings,
    history: SubspaceHistory | None,
    nonfinite: bool,
) -> None:
    """Adds the probe metrics (and the arrays they keep) to the point's views, in place."""

    def put(
        view: str,
        values: Mapping[str, float],
        stderr: Mapping[str, float] | None = None,
        replicates: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        result = summaries[view]
        for metric, value in values.items():
            result.observables[metric] = math.nan if nonfinite else float(value)
            result.stderr[metric] = math.nan if nonfinite or stderr is None else float(stderr[metric])
            if not nonfinite and replicates and metric in replicates:
                result.jackknife[metric] = replicates[metric]
            else:
                result.jackknife.pop(metric, None)

    whole = summaries["all"]
    fraction, fraction_se, fraction_replicates = between_image_fraction(views)
    put(
        "all",
        {"between_image_fraction": fraction},
        {"between_image_fraction": fraction_se},
        {"between_image_fraction": fraction_replicates} if fraction_replicates.size >= 2 else None,
    )
    massive, peak = massive_metrics(vectors, whole.covariance)
    put("all", massive)
    whole.arrays["max_abs"] = peak
    drift, kept, k90 = drift_metrics(
        name,
        whole.covariance,
        whole.observables.get("components_90", math.nan),
        history,
        probes.subspace_k,
        whole.n_rows,
    )
    put("all", drift)
    whole.arrays["eigenvectors"] = kept
    whole.arrays["components_90"] = np.asarray(k90, dtype=np.int64)
    if labels is None:
        return
    for view, kind in (("cls", "cls"), ("patch", "patch" if "patch" in vectors.values else "mean")):
        if view not in summaries or kind not in vectors.values:
            continue
        x = vectors.values[kind].detach().cpu().numpy().astype(np.float64, copy=False)
        values, stderr, replicates = class_metrics(
            x,
            labels,
            image_groups=image_groups if groups else None,
            groups=groups,
            folds=probes.folds,
            ridge_alpha=probes.ridge_alpha,
        )
        put(view, values, stderr, replicates)
        summaries[view].kept_arrays["vectors"] = x.astype(np.float32)
        summaries[view].kept_arrays["labels"] = labels


def _single_threaded_blas() -> contextlib.AbstractContextManager[Any]:
    """numpy's BLAS limited to one thread for the enclosed block (threadpoolctl ships with scikit-learn)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - scikit-learn, a dependency, requires threadpoolctl
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")
