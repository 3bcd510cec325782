"""What one observation yields: per (point, view) a float64 spectrum, the catalogue's observables, mean, covariance.

A view is one covariance derived from what a point streams, never folded into point names: `ObservationKey` is that
identity. `summarize_accumulators` is the rank-0 step after the reduction."""

from __future__ import annotations

import contextlib
import math
import os
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from tgo.records import DEFAULT_VIEW
from tgo.spectral import (
    CATALOGUE,
    GroupedCovariance,
    Spectrum,
    StreamingCovariance,
)
from tgo.spectral.decomposition import eigendecompose_many, row_subset_spectra

if TYPE_CHECKING:  # pragma: no cover
    from tgo.spectral.eigensolver import Eigvalsh
from tgo.spectral.jackknife import Moments, combine, jackknife_stderrs
from tgo.spectral.jackknife import moments as jackknife_moments
from tgo.spectral.summary import summarize_many

from .families.base import Array, Contribution, FamilyRun, HistorySummary, Metric, PointSummary
from .points import ObservationPoint
from .views import ViewMoments, ViewRows, all_view, order_views

__all__ = [
    "DEFAULT_VIEW",
    "ObservationKey",
    "PointResult",
    "Results",
    "relate_histories",
    "summarize_accumulators",
    "summarize_view",
    "summarize_views",
    "summary_workers",
    "view_chunks",
]


class ObservationKey(NamedTuple):
    """Which covariance a result describes: the observation point and the view of it."""

    point: str
    view: str = DEFAULT_VIEW


@dataclass(frozen=True, repr=False)
class PointResult:
    """Everything recorded about one (point, view) at one observation.

    ``kept_arrays`` are kept only where covariances are; ``alias_of`` names the view whose covariance this one is (the
    records keep it once). ``jackknife`` holds the leave-one-group-out values of every metric whose standard error came
    from replicates (``jackknife_stderr(jackknife[m]) == stderr[m]`` bit for bit), so paired standard errors of
    differences can be taken replicate by replicate (`tgo.records.load_jackknife`)."""

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

    @classmethod
    def metrics_only(cls) -> PointResult:
        """A view without a covariance of its own, holding only a family's metrics and arrays (e.g. ``attention``)."""
        empty = np.empty(0, dtype=np.float64)
        return cls(Spectrum(empty, 0, 0, 0, math.nan), {}, empty, np.empty((0, 0), dtype=np.float64))

    @property
    def has_covariance(self) -> bool:
        """False for a `metrics_only` view."""
        return self.covariance.size > 0 or self.spectrum.n_rows > 0

    def __repr__(self) -> str:
        """What it holds, never the arrays (one observation's default repr ran to 269,093 characters)."""
        held = [f"D={self.spectrum.dim}, n_rows={self.n_rows}" if self.has_covariance else "metrics only"]
        held += [f"{len(self.observables)} observables"] + [f"alias_of={self.alias_of!r}"] * bool(self.alias_of)
        arrays = {"arrays": self.arrays, "kept_arrays": self.kept_arrays}
        held += [f"{what}=[{', '.join(names)}]" for what, names in arrays.items() if names]
        return f"PointResult({', '.join(held)})"


class Results(dict[ObservationKey, PointResult]):
    """One observation in point (depth) order, views of a point together; a bare point name means its ``all`` view."""

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

    def __repr__(self) -> str:
        """Its points and views with counts, never the arrays (``results[key]`` shows one result)."""
        points = list(dict.fromkeys(key.point for key in self))
        shown = points if len(points) <= 6 else [*points[:3], "...", *points[-2:]]
        views = Counter(key.view for key in self)
        return (
            f"Results({len(points)} points, {len(views)} views, {len(self)} (point, view) results; points: "
            f"{', '.join(shown)}; views (points): {', '.join(f'{v} ({n})' for v, n in views.items())})"
        )


def _moments(acc: StreamingCovariance) -> tuple[np.ndarray, np.ndarray, int, int]:
    cov = acc.covariance().detach().cpu().numpy().astype(np.float64, copy=False)
    mean = acc.mean().detach().cpu().numpy().astype(np.float64, copy=False)
    return cov, mean, int(acc.n), int(acc.n_nonfinite)


def summarize_accumulators(
    accumulators: Mapping[str, StreamingCovariance | GroupedCovariance],
    points: Sequence[ObservationPoint] | None = None,
    *,
    nan_if_nonfinite: bool = False,
    fit_range: Sequence[int] | None = None,
    families: Sequence[FamilyRun] = (),
    image_groups: np.ndarray | None = None,
    only: Collection[str] | None = None,
    relate_history: bool = True,
    eigvalsh: Eigvalsh | None = None,
) -> Results:
    """Eigendecompose (float64) and compute the observables of every point and view; call after the reduction.

    A `GroupedCovariance` also gives each observable its delete-a-group jackknife standard error. Each enabled family
    adds its views, then its metrics and arrays. With ``nan_if_nonfinite`` a point that saw non-finite rows gets NaN
    observables (the accumulator excluded those rows, so they would quietly describe only the finite part); its
    diagnostics, spectrum and moments stay, for diagnosis. ``only`` summarises a rank's share (`tgo.observatory.share`),
    which leaves ``relate_history`` to rank 0, holding the records."""
    if families and points is None:
        raise ValueError("summarize_accumulators: families need the observation points")
    point_of = {p.name: p for p in points} if points is not None else {}
    names = [p.name for p in points] if points is not None else list(accumulators)
    if only is not None:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise ValueError(f"summarize_accumulators: only= names unknown point(s) {unknown}")
        names = [n for n in names if n in only]
    missing = [n for n in names if n not in accumulators]
    if missing:
        raise ValueError(f"summarize_accumulators: no accumulator for point(s) {missing}")
    # Every torch op first, then the numpy work in a thread pool under a one-thread BLAS: numpy's and torch's thread
    # pools otherwise spin against each other (2 cores, 15 points of D=384: ~7 s against ~0.5 s), while LAPACK
    # releases the GIL, so points run on every core.
    moments_of: dict[str, tuple[Moments, list[Moments]]] = {}
    for name in names:
        acc = accumulators[name]
        if isinstance(acc, GroupedCovariance):
            group_moments = [jackknife_moments(g) for g in acc.groups]
            moments_of[name] = (combine(group_moments), group_moments)
        else:
            moments_of[name] = (_moments(acc), [])

    def views_of(name: str) -> dict[str, ViewMoments]:
        """Phase 1, one task per point: the moments of every view the point has."""
        moments, group_moments = moments_of[name]
        groups_of_images = image_groups if group_moments else None
        views = {"all": all_view(moments, group_moments)}
        for run in families:
            for view, vm in run.state.views(point_of[name], views["all"], group_moments, groups_of_images).items():
                if view in views:
                    raise ValueError(f"family {run.family.name!r}: point {name!r} already has a view {view!r}")
                views[view] = vm
        return order_views(views)

    def nonfinite_at(name: str) -> bool:
        return nan_if_nonfinite and moments_of[name][0][3] > 0

    def finish_point(name: str) -> dict[str, PointResult]:
        """Phase 3, one task per point: alias views, then every family's metrics and arrays."""
        views, group_moments = point_views[name], moments_of[name][1]
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
                summaries[view] = spectral[(name, view)]
        for run in families:
            summary = PointSummary(
                point=point_of[name],
                results=summaries,
                views=views,
                image_groups=image_groups if group_moments else None,
                groups=len(group_moments),
                settings=run.context.settings,
            )
            _contribute(run.family.name, name, summaries, run.state.summarize_point(summary), nonfinite_at(name))
        return summaries

    # Three phases on one pool, each a list of independent, deterministic tasks whose results are taken in task
    # order: the views of each point, then every (point, view) spectrum (the bulk of the LAPACK work, in tasks small
    # enough to keep every worker busy to the end), then each point's aliases and family metrics.
    workers = summary_workers(len(names))
    with _single_threaded_blas(), ThreadPoolExecutor(max_workers=workers) as pool:
        point_views = dict(zip(names, pool.map(views_of, names), strict=True))
        tasks = [(name, view) for name in names for view, vm in point_views[name].items() if vm.alias_of is None]
        vms = [point_views[name][view] for name, view in tasks]
        chunks = view_chunks([(int(vm.total[0].shape[0]), 1 + len(vm.leave_out)) for vm in vms], workers)
        done = pool.map(
            lambda chunk: summarize_views(
                [vms[i] for i in chunk],
                fit_range=fit_range,
                nonfinite=[nonfinite_at(tasks[i][0]) for i in chunk],
                eigvalsh=eigvalsh,
            ),
            chunks,
        )
        spectral = {
            tasks[i]: result
            for chunk, results in zip(chunks, done, strict=True)
            for i, result in zip(chunk, results, strict=True)
        }
        per_point = list(pool.map(finish_point, names))
    out = Results()
    for name, summaries in zip(names, per_point, strict=True):
        for view, result in summaries.items():
            out[ObservationKey(name, view)] = result
    if relate_history and families:
        relate_histories(out, [point_of[n] for n in names], families, nan_if_nonfinite=nan_if_nonfinite)
    return out


def relate_histories(
    results: Results, points: Sequence[ObservationPoint], families: Sequence[FamilyRun], *, nan_if_nonfinite: bool
) -> None:
    """Rank 0: every family's ``relate_history`` contribution, in place: the last step of a summary wherever its points
    were summarised, with the same inputs in the same order, so the same bits."""
    for point in points:
        summaries = {key.view: result for key, result in results.items() if key.point == point.name}
        nonfinite = nan_if_nonfinite and summaries["all"].spectrum.n_nonfinite > 0
        for run in families:
            summary = HistorySummary(point, summaries, run.history, run.context.settings)
            _contribute(run.family.name, point.name, summaries, run.state.relate_history(summary), nonfinite)
        created = [view for view in summaries if ObservationKey(point.name, view) not in results]
        for view in created:  # a view only the history step contributes to: after the point's other views
            results[ObservationKey(point.name, view)] = summaries[view]
        if created:
            order = {p.name: i for i, p in enumerate(points)}
            items = sorted(results.items(), key=lambda item: order.get(item[0].point, len(order)))
            results.clear()
            results.update(items)


def summarize_view(
    vm: ViewMoments,
    *,
    fit_range: Sequence[int] | None = None,
    nonfinite: bool = False,
    eigvalsh: Eigvalsh | None = None,
) -> PointResult:
    """Spectrum, observables and jackknife standard errors of one view: a pure function of its moments, so (point, view)
    tasks can be split across ranks."""
    return summarize_views([vm], fit_range=fit_range, nonfinite=[nonfinite], eigvalsh=eigvalsh)[0]


def summarize_views(
    vms: Sequence[ViewMoments],
    *,
    fit_range: Sequence[int] | None = None,
    nonfinite: Sequence[bool] | None = None,
    eigvalsh: Eigvalsh | None = None,
) -> list[PointResult]:
    """`summarize_view` of several views at once, equal bit for bit to one call per view.

    Every view of one size is decomposed in one stacked LAPACK call and its observables taken as array functions over
    that stack (``tests/spectral/test_stack.py``): at small ``D`` the per-call Python work, not LAPACK, was most of the
    summary."""
    flags = [False] * len(vms) if nonfinite is None else [bool(f) for f in nonfinite]
    if len(flags) != len(vms):
        raise ValueError(f"summarize_views: {len(vms)} views but {len(flags)} nonfinite flags")
    moments = [[vm.total, *vm.leave_out] for vm in vms]
    by_dim: dict[int, list[int]] = {}
    for v, ms in enumerate(moments):
        by_dim.setdefault(int(ms[0][0].shape[0]), []).append(v)
    spectra_of: list[list[Spectrum]] = [[] for _ in vms]
    rows_of: list[list[dict[str, float]]] = [[] for _ in vms]
    for dim, members in by_dim.items():
        flat = [m for v in members for m in moments[v]]
        covs = np.stack([m[0] for m in flat])  # one [S, D, D] copy that both steps read
        # A view with one row per image and fewer images than features takes its spectra from [n, n] products (the
        # CLS and between-image views of a small analysis subset: 28 of 69 views at vit_small with 200 images); the
        # others share one stacked call.
        solved_at: list[Spectrum | None] = [None] * len(flat)
        by_covariance: list[int] = []
        at = 0
        for v in members:
            count, small = len(moments[v]), _small_rows(vms[v], dim)
            if small is None:
                by_covariance += range(at, at + count)
            else:
                ns = [m[3] for m in moments[v]]
                solved_at[at : at + count] = row_subset_spectra(
                    small.values, small.subsets, ddof=small.ddof, n_nonfinite=ns, eigvalsh=eigvalsh
                )
            at += count
        if by_covariance:
            stack = covs if len(by_covariance) == len(flat) else covs[by_covariance]
            solved = eigendecompose_many(
                stack, [flat[i][2] for i in by_covariance], [flat[i][3] for i in by_covariance], eigvalsh=eigvalsh
            )
            for i, spectrum in zip(by_covariance, solved, strict=True):
                solved_at[i] = spectrum
        spectra = [s for s in solved_at if s is not None]
        if len(spectra) != len(flat):
            raise RuntimeError(f"summarize_views: {len(flat) - len(spectra)} of {len(flat)} spectra were not computed")
        rows = summarize_many(covs, spectra, fit_range=fit_range, spectra_of_covs=True)
        start = 0
        for v in members:
            stop = start + len(moments[v])
            spectra_of[v], rows_of[v] = spectra[start:stop], rows[start:stop]
            start = stop
    return [_view_result(vm, spectra_of[v], rows_of[v], flags[v]) for v, vm in enumerate(vms)]


def _small_rows(vm: ViewMoments, dim: int) -> ViewRows | None:
    """A view's rows where its spectra come from their ``[n, n]`` products: one row per image, fewer than ``dim``, and
    a subset for each of its moments; else None."""
    rows = vm.rows
    if rows is not None and rows.values.shape[0] < dim and len(rows.subsets) == 1 + len(vm.leave_out):
        return rows
    return None


def view_chunks(sizes: Sequence[tuple[int, int]], workers: int, budget_bytes: int = 24 << 20) -> list[list[int]]:
    """Consecutive chunks of views (``(D, matrices)`` each): one size per chunk, within ``budget_bytes`` (one view may
    exceed it), and at least ``2 * workers`` chunks where there are enough, so every worker stays busy to the end."""
    total = sum(d * d * 8 * m for d, m in sizes)
    target = min(budget_bytes, max(1, -(-total // max(2 * workers, 1))))
    chunks: list[list[int]] = []
    held, dim = 0, None
    for i, (d, m) in enumerate(sizes):
        cost = d * d * 8 * m
        if not chunks or d != dim or (held + cost > target and held > 0):
            chunks.append([])
            held, dim = 0, d
        chunks[-1].append(i)
        held += cost
    return chunks


def _view_result(
    vm: ViewMoments, spectra: Sequence[Spectrum], rows: Sequence[dict[str, float]], nonfinite: bool
) -> PointResult:
    """One view's `PointResult` from its ``1 + G`` spectra and observable rows (total first)."""
    diagnostics = CATALOGUE.diagnostics
    spectrum, observables, leave_out = spectra[0], rows[0], list(rows[1:])
    replicates: dict[str, np.ndarray] = {}
    stderr = dict.fromkeys(observables, math.nan)
    if len(leave_out) >= 2:
        names = [k for k in observables if k not in diagnostics]
        table = np.array([[r[k] for r in leave_out] for k in names], dtype=np.float64).reshape(len(names), -1)
        for name, row, se in zip(names, table, jackknife_stderrs(table), strict=True):
            replicates[name] = row.copy()
            stderr[name] = float(se)
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


def _contribute(
    family: str, point: str, summaries: dict[str, PointResult], contribution: Contribution, nonfinite: bool
) -> None:
    """Adds a family's metrics and arrays to the point's views, in place and in order; a missing view is created
    `PointResult.metrics_only`, and with ``nonfinite`` every metric is NaN without replicates."""
    for item in contribution:
        if item.view not in summaries:
            summaries[item.view] = PointResult.metrics_only()
        result = summaries[item.view]
        if isinstance(item, Array):
            (result.kept_arrays if item.kept else result.arrays)[item.name] = item.array
            continue
        if not isinstance(item, Metric):
            raise TypeError(f"family {family!r}: summarize_point must give Metric or Array items, got {item!r}")
        result.observables[item.name] = math.nan if nonfinite else float(item.value)
        result.stderr[item.name] = math.nan if nonfinite else float(item.stderr)
        if not nonfinite and item.replicates is not None:
            result.jackknife[item.name] = np.asarray(item.replicates, dtype=np.float64)
        else:
            result.jackknife.pop(item.name, None)


def summary_workers(tasks: int) -> int:
    """One thread per core this process may use (its affinity, shared by the node's ``LOCAL_WORLD_SIZE`` ranks, which
    summarise at once), at most one per task."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    local_ranks = os.environ.get("LOCAL_WORLD_SIZE", "")
    if local_ranks.isdigit() and int(local_ranks) > 1:
        cores = max(1, cores // int(local_ranks))
    return max(1, min(int(tasks), cores))


def _single_threaded_blas() -> contextlib.AbstractContextManager[Any]:
    """numpy's BLAS limited to one thread for the enclosed block (threadpoolctl ships with scikit-learn)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - scikit-learn, a dependency, requires threadpoolctl
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")
