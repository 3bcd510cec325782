"""Several runs as one: mean curves with ±1 standard deviation bands, and how many runs agree on each verdict.

Every run's values and the root mean square of their standard errors go with the mean, so the verdict rule can weigh the
seed-to-seed spread and the sampling error. Runs are comparable only when they measured the same images
(`check_subsets`); aggregation uses the points and epochs every run recorded."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tgo.records import RunDir
from tgo.report.runs import ReportInputError, RunData

__all__ = [
    "Aggregate",
    "SubsetMismatchError",
    "aggregate_runs",
    "check_subsets",
    "single_aggregate",
]


class SubsetMismatchError(ReportInputError):
    """Runs measured different analysis subsets (their manifests' fingerprints disagree)."""


def check_subsets(runs: Sequence[RunData], *, allow_different: bool = False) -> list[str]:
    """Refuses to compare runs whose analysis subsets differ (unless ``allow_different``); returns notes for the report
    (runs without a manifest, an override in effect)."""
    notes = []
    groups: dict[str, list[str]] = {}
    for run in runs:
        if run.fingerprint is None:
            notes.append(f"{run.name}: no {RunDir.MANIFEST}, so its analysis subset could not be checked")
        else:
            groups.setdefault(run.fingerprint, []).append(run.name)
    if len(groups) > 1:
        described = "; ".join(f"{fp[:12]}: {', '.join(names)}" for fp, names in groups.items())
        if not allow_different:
            raise SubsetMismatchError(
                f"the runs measured different analysis subsets ({RunDir.MANIFEST} fingerprints differ: "
                f"{described}); their geometry is not comparable. Re-run with data.analysis.manifest=<one run's "
                f"{RunDir.MANIFEST}>, or pass --allow-different-subsets to compare anyway"
            )
        notes.append(f"different analysis subsets compared on request (--allow-different-subsets): {described}")
    return notes


@dataclass
class Aggregate:
    """The runs' mean series, their spread, and what the verdict rule needs to judge the mean.

    ``stderr`` is the root mean square of the runs' standard errors, not divided by sqrt(runs): the runs measure one
    analysis subset, so its sampling error is common to them. ``jackknife`` is the mean of the runs' replicates where
    every run recorded them with the same ``G`` (see `_mean_replicates`)."""

    mean: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]
    low: dict[str, dict[str, np.ndarray]]
    high: dict[str, dict[str, np.ndarray]]
    n_runs: int
    points: list[str]
    stderr: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    replicates: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    jackknife: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)

    def bands(self, metric: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """point -> (mean - std, mean + std) for `tgo.viz.observable_lines_figure` (the runs' spread)."""
        return {p: (self.low[metric][p], self.high[metric][p]) for p in self.low.get(metric, {})}

    def stderr_bands(self, metric: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """point -> (mean - stderr, mean + stderr); an epoch without a standard error leaves a gap, not a zero band."""
        bands = {}
        for point, (_, se) in self.stderr.get(metric, {}).items():
            if point in self.mean.get(metric, {}) and np.any(np.isfinite(se)):
                mu = self.mean[metric][point][1]
                bands[point] = (mu - se, mu + se)
        return bands


def _rms(stack: np.ndarray) -> np.ndarray:
    """Root mean square over runs, ignoring NaN (NaN where every run is NaN)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.sqrt(np.nanmean(stack**2, axis=0))


def _table(series: tuple[np.ndarray, np.ndarray]) -> dict[float, float]:
    epochs, values = series
    return dict(zip(np.asarray(epochs).tolist(), np.asarray(values).tolist(), strict=False))


def aggregate_runs(runs: Sequence[RunData]) -> Aggregate:
    """Mean and ±1 standard deviation (``ddof=1``; zero for one run) per metric, point and epoch, over the points and
    epochs every run recorded, so each mean is over the same runs; NaN values are ignored."""
    if not runs:
        raise ReportInputError("no runs to aggregate")
    points = [p for p in runs[0].points if all(p in r.points for r in runs[1:])]
    if not points:
        raise ReportInputError(f"the runs share no observation point ({', '.join(r.name for r in runs)})")
    metrics = [m for m in runs[0].series if all(m in r.series for r in runs[1:])]
    agg = Aggregate(mean={}, low={}, high={}, n_runs=len(runs), points=points)
    for metric in metrics:
        for point in points:
            if not all(point in r.series[metric] for r in runs):
                continue
            tables = [_table(r.series[metric][point]) for r in runs]
            epochs = sorted(set.intersection(*(set(t) for t in tables)))
            if not epochs:
                continue
            stack = np.array([[t[e] for e in epochs] for t in tables], dtype=np.float64)
            errors = [_table(r.stderr[metric][point]) if point in r.stderr.get(metric, {}) else {} for r in runs]
            se_stack = np.array([[t.get(e, np.nan) for e in epochs] for t in errors], dtype=np.float64)
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN epochs: NaN mean is the answer
                mu = np.nanmean(stack, axis=0)
                sd = np.nanstd(stack, axis=0, ddof=1) if len(runs) > 1 else np.zeros_like(mu)
            sd = np.where(np.isfinite(sd), sd, 0.0)
            epoch_array = np.array(epochs, dtype=np.int64)
            agg.mean.setdefault(metric, {})[point] = (epoch_array, mu)
            agg.low.setdefault(metric, {})[point] = mu - sd
            agg.high.setdefault(metric, {})[point] = mu + sd
            agg.stderr.setdefault(metric, {})[point] = (epoch_array, _rms(se_stack))
            agg.replicates.setdefault(metric, {})[point] = (epoch_array, stack)
            leave_out = _mean_replicates([r.jackknife.get(metric, {}).get(point) for r in runs], epochs)
            if leave_out is not None:
                agg.jackknife.setdefault(metric, {})[point] = (epoch_array, leave_out)
    return agg


def _mean_replicates(
    per_run: Sequence[tuple[np.ndarray, np.ndarray] | None], epochs: Sequence[float]
) -> np.ndarray | None:
    """``[E, G]`` mean over runs of their leave-one-group-out values, or ``None`` unless every run has them with one
    ``G``: the jackknife of a mean of runs measured on the same groups is the mean of their replicates."""
    if not per_run or any(r is None for r in per_run):
        return None
    sizes = {np.asarray(r[1]).shape[1] for r in per_run if r is not None and np.asarray(r[1]).ndim == 2}
    if len(sizes) != 1:
        return None
    groups = sizes.pop()
    stack = np.full((len(per_run), len(epochs), groups), np.nan)
    for i, r in enumerate(per_run):
        assert r is not None
        row_of = {float(e): j for j, e in enumerate(np.asarray(r[0]).tolist())}
        for k, e in enumerate(epochs):
            j = row_of.get(float(e))
            if j is not None:
                stack[i, k] = np.asarray(r[1])[j]
    return stack.mean(axis=0)


def single_aggregate(
    series: Mapping[str, Mapping[str, tuple[np.ndarray, np.ndarray]]], points: Sequence[str] | None = None
) -> Aggregate:
    """One set of series (the published measurements) as an `Aggregate` of one run, for the report's figures."""
    points = list(points) if points is not None else list(dict.fromkeys(p for s in series.values() for p in s))
    agg = Aggregate(mean={}, low={}, high={}, n_runs=1, points=points)
    for metric, per_point in series.items():
        for point, (epochs, values) in per_point.items():
            mu = np.asarray(values, dtype=np.float64)
            agg.mean.setdefault(metric, {})[point] = (np.asarray(epochs), mu)
            agg.low.setdefault(metric, {})[point] = mu
            agg.high.setdefault(metric, {})[point] = mu
    return agg
