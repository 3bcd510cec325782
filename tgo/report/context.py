"""What every part of a report reads, built once: the runs' records per view, their aggregates and the verdicts.

`judge` reads each run's views once (view ``all`` is the runs themselves, `tgo.report.runs.load_run_data`; the
others hold the metrics the predictions, the attention panels, the context table and the story's variance split
read), aggregates each view once (`tgo.report.aggregate.aggregate_runs`), and judges the claims (`findings`) and the
predictions (`predictions`) on the aggregates; for several runs each run is judged alone too and the runs reaching
each verdict are counted. The report's sections (`tgo.report.build`) and the live story card
(`tgo.report.story.run_story`, up to the card's epoch) read the same `Context`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tgo import panels
from tgo.panels import Panel
from tgo.records import RecordsError, load_jackknife, load_series
from tgo.report.aggregate import Aggregate, aggregate_runs, single_aggregate
from tgo.report.findings import VERDICTS, Finding, evaluate_findings
from tgo.report.hypotheses import PREDICTION_VERDICTS, PREDICTIONS, Prediction, PredictionResult, evaluate_predictions
from tgo.report.reference import PAPER_POINTS, load_reference
from tgo.report.runinfo import RunInfo
from tgo.report.runs import REPORT_VIEW, ReportInputError, RunData
from tgo.report.statements import count_agreement
from tgo.report.verdicts import DEFAULT_SETTINGS, VerdictSettings

__all__ = [
    "CONTEXT_METRICS",
    "SPLIT_VIEWS",
    "Context",
    "judge",
    "judge_findings",
    "judge_published",
    "judge_views",
    "load_view_runs",
    "runs_until",
]

CONTEXT_METRICS: tuple[str, ...] = (
    "between_image_fraction",
    "subspace_overlap_prev",
    "subspace_overlap_init",
    "massive_activation_ratio",
    "massive_dim_variance_share",
)
"""Probe metrics of view ``all`` shown as context (first -> last value per point): no prediction rests on the drift
and massive-activation probes alone, but they tell how much the principal subspace moved and whether one dimension
dominates (``docs/hypotheses.md``)."""

SPLIT_VIEWS: tuple[str, ...] = ("between_image", "within_image")
"""The views whose total variance is read too: the variance between image means and within images."""


def own_view_panels() -> list[Panel]:
    """The page's depth panels on a view of their own that no section claims (`tgo.panels.Panel.section`): the depth
    section draws them beside view ``all``, so a family's declared panel reaches the report without a section."""
    return [p for p in panels.declared("page", kind="depth") if p.view != REPORT_VIEW and not p.section]


def _needed() -> dict[str, list[str]]:
    """view -> the metrics read on it besides view ``all``'s (which `load_run_data` reads whole): the page's depth
    panels on other views (and the references they quote), the predictions', the story's variance split."""
    needed: dict[str, list[str]] = {}

    def add(view: str, *metrics: str | None) -> None:
        needed.setdefault(view, []).extend(m for m in metrics if m and m not in needed[view])

    for panel in own_view_panels():
        add(panel.view, panel.metric)
    for p in PREDICTIONS:
        add(p.view, p.metric)
    for panel in panels.declared("page", kind="depth"):
        if panel.view != REPORT_VIEW and panel.section:
            add(panel.view, panel.metric, panel.overlay)
    for view in SPLIT_VIEWS:  # the law of total covariance's two traces (the story's variance split)
        add(view, "total_variance")
    needed.pop(REPORT_VIEW, None)
    return needed


def load_view_runs(runs: Sequence[RunData]) -> dict[str, list[RunData]]:
    """Per view, every run's series of the metrics the report reads (same points and names as the runs); view
    ``all`` is ``runs`` themselves.

    Raises:
        ReportInputError: a malformed metrics file (the records' message).
    """
    out: dict[str, list[RunData]] = {REPORT_VIEW: list(runs)}
    for view, metrics in _needed().items():
        per_run = []
        for r in runs:
            try:
                series = load_series(r.path, view=view, metrics=metrics)
                stderr = load_series(r.path, view=view, metrics=metrics, column="stderr")
                jackknife = load_jackknife(r.path, view=view, metrics=metrics)
            except RecordsError as err:
                raise ReportInputError(str(err)) from err
            per_run.append(replace(r, series=series, stderr=stderr, jackknife=jackknife, _spectra=None))
        out[view] = per_run
    return out


def _until(series: Mapping[str, Mapping[str, tuple[np.ndarray, np.ndarray]]], epoch: int) -> dict:
    """``metric -> point -> (epochs, rows)`` restricted to the epochs up to ``epoch``."""
    out: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for metric, per_point in series.items():
        for point, (epochs, rows) in per_point.items():
            keep = np.asarray(epochs) <= epoch
            if np.any(keep):
                out.setdefault(metric, {})[point] = (np.asarray(epochs)[keep], np.asarray(rows)[keep])
    return out


def runs_until(runs: Sequence[RunData], epoch: int | None) -> list[RunData]:
    """The runs as their records stood after ``epoch`` (a later observation may be recorded while a card is drawn;
    ``None``: every epoch)."""
    if epoch is None:
        return list(runs)
    return [
        replace(
            r,
            series=_until(r.series, epoch),
            stderr=_until(r.stderr, epoch),
            jackknife=_until(r.jackknife, epoch),
            epochs=[e for e in r.epochs if e <= epoch],
        )
        for r in runs
    ]


def judge_findings(agg: Aggregate, settings: VerdictSettings = DEFAULT_SETTINGS) -> list[Finding]:
    """The claims judged on an aggregate's mean, with its runs' standard errors and seed-to-seed spread."""
    replicates = agg.replicates if agg.n_runs > 1 else None
    return evaluate_findings(
        agg.mean, agg.points, stderr=agg.stderr, replicates=replicates, leave_out=agg.jackknife, settings=settings
    )


def judge_views(
    aggregates: Mapping[str, Aggregate], points: Sequence[str], settings: VerdictSettings = DEFAULT_SETTINGS
) -> dict[Prediction, list[PredictionResult]]:
    """Every prediction judged on the runs' per-view aggregates."""
    several = next(iter(aggregates.values())).n_runs > 1
    return evaluate_predictions(
        {v: a.mean for v, a in aggregates.items()},
        points,
        stderr={v: a.stderr for v, a in aggregates.items()},
        replicates={v: a.replicates for v, a in aggregates.items()} if several else None,
        leave_out={v: a.jackknife for v, a in aggregates.items()},
        settings=settings,
    )


@dataclass
class Context:
    """What a report's sections read: the runs' records per view, aggregated once, both tables of statements judged
    on them, and the report's options (`tgo.report.build.build_report` fills them; the live story reads the first).

    Attributes:
        runs: The runs (view ``all``).
        settings: The verdict rule's settings.
        views: view -> every run's series of it (``all``: ``runs``).
        aggregates: view -> the runs' aggregate of it.
        findings: The claims judged on the aggregate of view ``all``.
        predictions: prediction -> its per-point results on the per-view aggregates.
        finding_agreement: For several runs, finding key -> runs reaching each verdict when judged alone.
        prediction_agreement: The same for the prediction rows.
        infos: Each run's configuration (`tgo.report.runinfo.read_run_info`).
        notes: Lines the header shows (differing analysis subsets).
        figures_dir: Where the sections write their PNGs.
        paper: The published TGO-I series, when the report compares with them.
        caveat: How the runs differ from the paper's experiment, when they are compared.
        correlation: Draw the correlation heatmaps.
    """

    runs: list[RunData]
    settings: VerdictSettings
    views: dict[str, list[RunData]]
    aggregates: dict[str, Aggregate]
    findings: list[Finding]
    predictions: dict[Prediction, list[PredictionResult]]
    finding_agreement: dict[Hashable, Counter] | None = None
    prediction_agreement: dict[Hashable, Counter] | None = None

    infos: list[RunInfo] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    figures_dir: Path = Path("figures")
    paper: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] | None = None
    caveat: str | None = None
    correlation: bool = True

    @property
    def several(self) -> bool:
        """Several runs: their mean is judged, and each run alone for the agreement counts."""
        return len(self.runs) > 1

    @property
    def single(self) -> bool:
        """One observation only: no change over training can be judged."""
        return len({e for r in self.runs for e in r.epochs}) == 1

    @property
    def what(self) -> str:
        """What is judged, in words."""
        return "the mean over runs" if self.several else "this run" if self.runs else "the published series"

    @property
    def agg(self) -> Aggregate:
        """The aggregate of view ``all``."""
        return self.aggregates[REPORT_VIEW]

    @property
    def points(self) -> list[str]:
        """The points judged (every run's, in the first run's order)."""
        return list(self.runs[0].points) if len(self.runs) == 1 else self.agg.points


def judge_published(settings: VerdictSettings = DEFAULT_SETTINGS, **options: Any) -> Context:
    """The published TGO-I series as a context of no runs: the claims judged on them alone (the file holds no
    standard errors: every uncertainty is a series' own epoch-to-epoch noise, `tgo.report.training_noise`)."""
    paper = load_reference()
    findings = evaluate_findings(paper, PAPER_POINTS, settings=settings)
    return Context([], settings, {}, {REPORT_VIEW: single_aggregate(paper, PAPER_POINTS)}, findings, {}, **options)


def judge(
    runs: Sequence[RunData], settings: VerdictSettings = DEFAULT_SETTINGS, until: int | None = None, **options: Any
) -> Context:
    """Reads the runs' views (records up to epoch ``until``, every epoch for ``None``), aggregates each view once and
    judges the claims and the predictions on them (and, for several runs, each run alone); ``options`` are the
    report's `Context` fields."""
    views = {v: runs_until(rs, until) for v, rs in load_view_runs(runs).items()}
    aggregates = {view: aggregate_runs(per_run) for view, per_run in views.items()}
    judged = Context(views[REPORT_VIEW], settings, views, aggregates, [], {}, **options)
    judged.findings = judge_findings(judged.agg, settings)
    judged.predictions = judge_views(aggregates, judged.points, settings)
    if len(runs) > 1:
        alone = [{v: aggregate_runs([rs[i]]) for v, rs in views.items()} for i in range(len(runs))]
        judged.finding_agreement = count_agreement([judge_findings(a[REPORT_VIEW], settings) for a in alone], VERDICTS)
        judged.prediction_agreement = count_agreement(
            ([r for rs in judge_views(a, judged.points, settings).values() for r in rs] for a in alone),
            PREDICTION_VERDICTS,
        )
    return judged
