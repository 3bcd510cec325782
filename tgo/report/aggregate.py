"""Several runs as one: mean curves with ±1 standard deviation bands, and how many runs agree on each verdict.

Runs are only comparable when they measured the same images, so `check_subsets` refuses runs whose analysis
subset fingerprints differ (unless told otherwise). Aggregation uses the points and epochs that every run recorded.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tgo.records import RunDir
from tgo.report.findings import VERDICTS, Finding
from tgo.report.runs import ReportInputError, RunData

__all__ = ["Aggregate", "SubsetMismatchError", "aggregate_runs", "agreement_text", "check_subsets", "verdict_agreement"]

FindingKey = tuple[str, str, str]  # (claim, metric, point)


class SubsetMismatchError(ReportInputError):
    """Runs measured different analysis subsets (their manifests' fingerprints disagree)."""


def check_subsets(runs: Sequence[RunData], *, allow_different: bool = False) -> list[str]:
    """Refuses to compare runs whose analysis subsets differ; returns notes for the report.

    Args:
        runs: The runs of one report.
        allow_different: Compare anyway (the report then says so).

    Returns:
        Human-readable notes (runs without a manifest, an override in effect); empty when all agree.

    Raises:
        SubsetMismatchError: two runs carry different fingerprints and ``allow_different`` is false.
    """
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
    """The runs' mean series and spread.

    Attributes:
        mean: metric -> point -> (epochs, mean over runs).
        low: metric -> point -> mean - std per epoch.
        high: metric -> point -> mean + std per epoch.
        n_runs: How many runs went in.
        points: Points every run recorded, in the first run's order.
    """

    mean: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]
    low: dict[str, dict[str, np.ndarray]]
    high: dict[str, dict[str, np.ndarray]]
    n_runs: int
    points: list[str]

    def bands(self, metric: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """point -> (low, high) for `tgo.viz.observable_lines_figure`."""
        return {p: (self.low[metric][p], self.high[metric][p]) for p in self.low.get(metric, {})}


def aggregate_runs(runs: Sequence[RunData]) -> Aggregate:
    """Mean and ±1 standard deviation (``ddof=1``; zero for a single run) per metric, point and epoch.

    Only points and epochs recorded by every run are used, so each mean is over the same number of runs. NaN
    values (a point with non-finite activations) are ignored in the mean and spread (``nanmean``/``nanstd``).

    Args:
        runs: One or more runs.

    Returns:
        The `Aggregate`.

    Raises:
        ReportInputError: no runs, or the runs share no point.
    """
    if not runs:
        raise ReportInputError("no runs to aggregate")
    points = [p for p in runs[0].points if all(p in r.points for r in runs[1:])]
    if not points:
        raise ReportInputError(f"the runs share no observation point ({', '.join(r.name for r in runs)})")
    metrics = [m for m in runs[0].series if all(m in r.series for r in runs[1:])]
    mean: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    low: dict[str, dict[str, np.ndarray]] = {}
    high: dict[str, dict[str, np.ndarray]] = {}
    for metric in metrics:
        for point in points:
            if not all(point in r.series[metric] for r in runs):
                continue
            tables = [dict(zip(*(a.tolist() for a in r.series[metric][point]), strict=False)) for r in runs]
            epochs = sorted(set.intersection(*(set(t) for t in tables)))
            if not epochs:
                continue
            stack = np.array([[t[e] for e in epochs] for t in tables], dtype=np.float64)
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN epochs: NaN mean is the answer
                mu = np.nanmean(stack, axis=0)
                sd = np.nanstd(stack, axis=0, ddof=1) if len(runs) > 1 else np.zeros_like(mu)
            sd = np.where(np.isfinite(sd), sd, 0.0)
            mean.setdefault(metric, {})[point] = (np.array(epochs, dtype=np.int64), mu)
            low.setdefault(metric, {})[point] = mu - sd
            high.setdefault(metric, {})[point] = mu + sd
    return Aggregate(mean=mean, low=low, high=high, n_runs=len(runs), points=points)


def verdict_agreement(per_run: Sequence[Sequence[Finding]]) -> dict[FindingKey, Counter]:
    """How many runs reached each verdict, per (claim, metric, point).

    Args:
        per_run: Each run's findings (`tgo.report.findings.evaluate_findings`).

    Returns:
        ``{(claim, metric, point): Counter({verdict: runs})}`` with every verdict of `VERDICTS` present (0 if none).
    """
    counts: dict[FindingKey, Counter] = {}
    for findings in per_run:
        for f in findings:
            counter = counts.setdefault((f.claim, f.metric, f.point), Counter({v: 0 for v in VERDICTS}))
            counter[f.verdict] += 1
    return counts


def agreement_text(counter: Mapping[str, int], n_runs: int) -> str:
    """``holds 2/3, does not hold 1/3`` (verdicts no run reached are left out)."""
    return ", ".join(f"{verdict} {counter[verdict]}/{n_runs}" for verdict in VERDICTS if counter.get(verdict))
