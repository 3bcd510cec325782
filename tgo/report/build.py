"""Builds the report of one or more runs: load -> check subsets -> aggregate -> findings -> figures -> HTML.

The single orchestrator of ``tgo.report``; every step is a function of another module, so each can be tested alone.
"""

from __future__ import annotations

import csv
import math
import os
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from tgo.records import RunDir
from tgo.report.aggregate import Aggregate, aggregate_runs, agreement_text, check_subsets, verdict_agreement
from tgo.report.figures import observable_figures, spectrum_figures
from tgo.report.findings import (
    DEFAULT_STABLE_TOLERANCE,
    DEFAULT_TOLERANCE,
    VERDICTS,
    Finding,
    evaluate_findings,
)
from tgo.report.html import Section, Table, render_page
from tgo.report.reference import compare_with_reference, is_tgo1_like, load_reference
from tgo.report.runs import ReportInputError, RunData, discover_runs, load_run_data, run_names

__all__ = ["REFERENCE_MODES", "build_report", "default_out_dir"]

REFERENCE_MODES = ("auto", "paper", "none")


def default_out_dir(paths: Sequence[str | os.PathLike]) -> Path:
    """The first argument's ``report/`` (`tgo.records.RunDir.report`).

    Inside the run for one run, inside the sweep directory for a sweep, so a report sits beside what it describes.
    """
    return RunDir(paths[0]).report


def _fmt(value: float | int | None, digits: int = 4) -> str:
    if value is None:
        return ""
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return "nan" if math.isnan(value) else str(value)
    return f"{value:.{digits}g}"


def _pct(value: float) -> str:
    return "" if not math.isfinite(value) else f"{value:+.1%}"


def _finding_cells(f: Finding) -> list[str]:
    t = f.trend
    if t is None:
        return [f.statement, f.point, f.expected, "", "", "", "", "", "", f.verdict, f.note]
    return [
        f.statement,
        f.point,
        f.expected,
        _fmt(t.first),
        _fmt(t.last),
        _fmt(t.change),
        _pct(t.relative_change),
        _fmt(t.spearman, 3),
        _fmt(t.extreme_epoch),
        f.verdict,
        f.note,
    ]


FINDING_HEADERS = [
    "claim",
    "point",
    "expected",
    "first",
    "last",
    "change",
    "relative change",
    "Spearman (epoch)",
    "peak/trough epoch",
    "verdict",
    "note",
]


def _claim_summary(findings: Sequence[Finding]) -> Table:
    per_statement: dict[str, Counter] = {}
    for f in findings:
        per_statement.setdefault(f.statement, Counter())[f.verdict] += 1
    rows = [
        [statement, *(str(c.get(v, 0)) for v in VERDICTS), str(sum(c.values()))]
        for statement, c in per_statement.items()
    ]
    return Table(["claim", *VERDICTS, "points"], rows, left=[0])


def _write_findings_csv(path: Path, findings: Sequence[Finding], agreement: dict | None, n_runs: int) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(
            [
                "claim",
                "statement",
                "metric",
                "point",
                "expected",
                "first",
                "last",
                "change",
                "relative_change",
                "spearman",
                "extreme_epoch",
                "verdict",
                "note",
                "agreement",
            ]
        )
        for f in findings:
            t = f.trend
            stats = (
                [
                    repr(t.first),
                    repr(t.last),
                    repr(t.change),
                    repr(t.relative_change),
                    repr(t.spearman),
                    "" if t.extreme_epoch is None else str(t.extreme_epoch),
                ]
                if t
                else [""] * 6
            )
            agree = agreement_text(agreement[(f.claim, f.metric, f.point)], n_runs) if agreement else ""
            writer.writerow([f.claim, f.statement, f.metric, f.point, f.expected, *stats, f.verdict, f.note, agree])


def _use_reference(mode: str, points: Sequence[str]) -> bool:
    if mode not in REFERENCE_MODES:
        raise ReportInputError(f"--reference: expected one of {REFERENCE_MODES}, got {mode!r}")
    return mode == "paper" or (mode == "auto" and is_tgo1_like(points))


def build_report(
    paths: Sequence[str | os.PathLike],
    *,
    out: str | os.PathLike | None = None,
    reference: str = "auto",
    title: str | None = None,
    allow_different_subsets: bool = False,
    embed: bool = False,
    tolerance: float = DEFAULT_TOLERANCE,
    stable_tolerance: float = DEFAULT_STABLE_TOLERANCE,
    correlation: bool = True,
) -> Path:
    """Writes ``<out>/index.html``, ``<out>/figures/*.png`` and ``<out>/findings.csv`` for the given runs.

    Args:
        paths: Run directories or directories containing runs (a Hydra multirun sweep directory).
        out: Report directory (default `default_out_dir`).
        reference: ``auto`` overlays the published TGO-I measurements when the runs' points are the paper's 15;
            ``paper`` always (for the points that match); ``none`` never.
        title: Page title (default names the runs).
        allow_different_subsets: Compare runs whose analysis subsets differ instead of refusing.
        embed: Inline the PNGs in ``index.html`` (they are still written beside it).
        tolerance: Relative change below which a trend counts as noise (`tgo.report.findings.assess_trend`).
        stable_tolerance: Largest relative change of an embedding still called stable.
        correlation: Draw correlation heatmaps (the slowest figures for wide models).

    Returns:
        The path of ``index.html``.

    Raises:
        ReportInputError: no runs, a directory without records, differing analysis subsets, a bad option.
    """
    if not paths:
        raise ReportInputError("give at least one run directory (or a directory containing runs)")
    run_dirs = discover_runs(paths)
    names = run_names(run_dirs)
    runs: list[RunData] = [load_run_data(p, name) for p, name in zip(run_dirs, names, strict=False)]
    notes = check_subsets(runs, allow_different=allow_different_subsets)
    agg: Aggregate = aggregate_runs(runs)
    overlay = _use_reference(reference, agg.points)
    paper = load_reference() if overlay else None

    report_dir = Path(out) if out is not None else default_out_dir(paths)
    figures_dir = report_dir / "figures"
    report_dir.mkdir(parents=True, exist_ok=True)

    findings = evaluate_findings(agg.mean, agg.points, tolerance=tolerance, stable_tolerance=stable_tolerance)
    several = len(runs) > 1
    agreement = None
    if several:
        per_run = [
            evaluate_findings(r.series, r.points, tolerance=tolerance, stable_tolerance=stable_tolerance) for r in runs
        ]
        agreement = verdict_agreement(per_run)
    paper_verdicts = {}
    if paper is not None:
        paper_verdicts = {
            (f.claim, f.metric, f.point): f.verdict
            for f in evaluate_findings(paper, agg.points, tolerance=tolerance, stable_tolerance=stable_tolerance)
        }

    headers = list(FINDING_HEADERS)
    rows = []
    for f in findings:
        cells = _finding_cells(f)
        if agreement is not None:
            cells.append(agreement_text(agreement[(f.claim, f.metric, f.point)], len(runs)))
        if paper is not None:
            cells.append(paper_verdicts.get((f.claim, f.metric, f.point), ""))
        rows.append(cells)
    if agreement is not None:
        headers.append(f"runs agreeing (of {len(runs)})")
    if paper is not None:
        headers.append("verdict on TGO-I data")

    summary = Section("Runs", "runs")
    summary.paragraphs.append(
        f"{len(runs)} run(s); points: {', '.join(agg.points)}; epochs observed: "
        f"{', '.join(str(e) for e in runs[0].epochs)}. Generated {datetime.now():%Y-%m-%d %H:%M}."
    )
    summary.paragraphs += notes
    summary.tables.append(
        Table(
            ["run", "path", "epochs", "points", "analysis subset fingerprint"],
            [
                [
                    r.name,
                    str(r.path),
                    f"{r.epochs[0]}..{r.epochs[-1]} ({len(r.epochs)})",
                    str(len(r.points)),
                    (r.fingerprint or "unknown")[:16],
                ]
                for r in runs
            ],
            left=[0, 1, 4],
        )
    )

    what = "the mean over runs" if several else "this run"
    find = Section("Findings: the paper's claims tested point by point", "findings")
    find.paragraphs.append(
        f"Each claim is tested on {what} from the first to the last observation. Verdicts: 'holds' = moved the "
        f"claimed way by more than {tolerance:.0%} of the series' scale with a positive rank correlation; "
        f"'holds then reverses' = reached a peak (trough for falling claims) strictly inside the observed epochs "
        f"and then gave back more than {tolerance:.0%}; 'does not hold' = neither; 'n/a' = fewer than two "
        f"observations, or first and last values both below the observable's noise floor (indistinguishable from "
        f"zero). Embeddings count as stable within ±{stable_tolerance:.0%}. Spearman is the rank correlation of the "
        f"observable with epoch."
    )
    if several:
        find.paragraphs.append(
            "The last columns count the runs reaching each verdict when every run is tested on its own."
        )
    find.tables += [
        _claim_summary(findings),
        Table(headers, rows, left=[0, 1, 2, 10, *range(11, len(headers))], verdict_column=9),
    ]

    sections = [summary, find]
    if paper is not None:
        ref_rows = compare_with_reference(agg.mean, paper, agg.points)
        ref = Section("Comparison with the published TGO-I measurements", "reference")
        ref.paragraphs.append(
            "The last observed value of each point beside the paper's value at the same epoch (or the paper's last "
            "epoch, 100, if it has no such epoch). Paper layer names map to points as Layer_00_PatchEmbed = "
            "patch_embed, Layer_00_PosEmbed = pos_embed, Layer_NN_BlockNN = block_NN, Layer_13_CLS_Final = cls; "
            "the six observables share TGO's names and conventions. On the figures the paper is drawn dashed."
        )
        ref.tables.append(
            Table(
                ["observable", "point", "epoch", "this report", "paper epoch", "paper", "ratio"],
                [
                    [
                        r.metric,
                        r.point,
                        str(r.epoch),
                        _fmt(r.value),
                        str(r.paper_epoch),
                        _fmt(r.paper_value),
                        _fmt(r.ratio, 3),
                    ]
                    for r in ref_rows
                ],
                left=[0, 1],
            )
        )
        sections.append(ref)

    figure_refs = observable_figures(agg, figures_dir, reference=paper)
    figure_refs += spectrum_figures(runs[0], figures_dir, correlation=correlation)
    titles = {
        "observables": "Observables against epoch",
        "heatmaps": "Layer x epoch heatmaps",
        "spectra": "Eigenvalue and singular value spectra over epochs" + (f" (run {runs[0].name})" if several else ""),
        "decay": "Spectral decay curves",
        "correlation": "Correlation heatmaps at the first and last observation",
    }
    for key, heading in titles.items():
        refs = [f for f in figure_refs if f.section == key]
        if refs:
            sections.append(Section(heading, key, figures=refs))

    _write_findings_csv(report_dir / "findings.csv", findings, agreement, len(runs))
    page = render_page(title or f"TGO report: {', '.join(r.name for r in runs)}", sections, report_dir, embed=embed)
    index = report_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    return index
