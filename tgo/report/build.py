"""Builds a report: find and read the runs, judge them once (`tgo.report.context.judge`; the published data alone:
`judge_published`), then every section from that context (each ``section(ctx) -> list[Section]``, none importing
another), the CSVs and the page."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tgo.records import RunDir
from tgo.report.aggregate import check_subsets
from tgo.report.context import Context, judge, judge_published
from tgo.report.findings import FINDINGS_COLUMNS
from tgo.report.html import Section, render_page
from tgo.report.hypotheses import HYPOTHESES_COLUMNS
from tgo.report.hypotheses import csv_rows as hypotheses_rows
from tgo.report.hypotheses_section import hypotheses_section
from tgo.report.optimisation import optimisation_section
from tgo.report.output import claim_report_dir, staged_report
from tgo.report.phases import early_section, phases_section
from tgo.report.reference import load_reference, reference_caveat
from tgo.report.runinfo import check_comparable, read_run_info
from tgo.report.runs import ReportInputError, discover_runs, load_run_data, run_names
from tgo.report.sections import (
    depth_section,
    figures_section,
    findings_section,
    header_section,
    published_section,
    reference_section,
    runs_section,
    summary_section,
)
from tgo.report.spreadsheet import write_csv
from tgo.report.statements import csv_rows
from tgo.report.story import story_section
from tgo.report.verdicts import DEFAULT_SETTINGS, VerdictSettings

__all__ = ["FINDINGS_COLUMNS", "REFERENCE_MODES", "build_published_report", "build_report", "default_out_dir"]

REFERENCE_MODES = ("none", "tgo1")
"""``--reference``: ``none`` (default) draws the runs alone; ``tgo1`` adds the published TGO-I measurements."""


def default_out_dir(paths: Sequence[str | os.PathLike]) -> Path:
    """The first argument's ``report/`` (`tgo.records.RunDir.report`): inside the run, or the sweep directory, so a
    report sits beside what it describes."""
    return RunDir(paths[0]).report


SECTIONS: tuple[Callable[[Context], list[Section]], ...] = (
    header_section,
    story_section,
    summary_section,
    depth_section,
    hypotheses_section,
    phases_section,
    early_section,
    optimisation_section,
    figures_section,
    findings_section,
    reference_section,
    runs_section,
)
"""The page's sections in order, each a function of the report's `Context`: pictures before tables (the header,
the story, what the verdicts found, the figures with the hypotheses' folded tables), then the full tables."""


PUBLISHED_SECTIONS: tuple[Callable[[Context], list[Section]], ...] = (
    published_section,
    summary_section,
    findings_section,
    figures_section,
)
"""The published data's page: what it holds, the verdicts at a glance, the claims' table, the observables' figures."""


Say = Callable[[str], None]
"""Prints one progress line (``tgo-report`` prints them to stderr; ``None``: silent)."""


@contextmanager
def _step(say: Say | None, what: str, figures_dir: Path | None = None) -> Iterator[None]:
    """``<what>: N figures in S s`` (without figures: ``<what> in S s``) once the step is done."""
    if say is None:
        yield
        return
    before, start = _count_figures(figures_dir), time.perf_counter()
    yield
    drawn = _count_figures(figures_dir) - before
    count = f": {drawn} figure{'s' if drawn != 1 else ''}" if figures_dir is not None else ""
    say(f"{what}{count} in {time.perf_counter() - start:.1f} s")


def _count_figures(figures_dir: Path | None) -> int:
    return sum(1 for _ in figures_dir.glob("*.png")) if figures_dir is not None and figures_dir.is_dir() else 0


def _sections(makers: Sequence[Callable[[Context], list[Section]]], ctx: Context, say: Say | None) -> list[Section]:
    """Every section of the page, each timed with its figures counted when ``say`` is given."""
    sections: list[Section] = []
    for make in makers:
        with _step(say, f"section {make.__name__.removesuffix('_section')}", ctx.figures_dir):
            sections.extend(make(ctx))
    return sections


def _write(report_dir: Path, ctx: Context, sections: Sequence[Section], title: str, embed: bool) -> None:
    """The CSVs (``hypotheses.csv`` for runs) and the page."""
    z, n = ctx.settings.z, len(ctx.runs)
    rows = csv_rows(ctx.findings, FINDINGS_COLUMNS, z, ctx.finding_agreement, n)
    write_csv(report_dir / "findings.csv", FINDINGS_COLUMNS, rows)
    if ctx.runs:
        rows = hypotheses_rows(ctx.predictions, z, ctx.prediction_agreement, n)
        write_csv(report_dir / "hypotheses.csv", HYPOTHESES_COLUMNS, rows)
    (report_dir / "index.html").write_text(render_page(title, sections, report_dir, embed=embed), encoding="utf-8")


def build_report(
    paths: Sequence[str | os.PathLike],
    *,
    out: str | os.PathLike | None = None,
    reference: str = "none",
    title: str | None = None,
    allow_different_subsets: bool = False,
    embed: bool = False,
    settings: VerdictSettings = DEFAULT_SETTINGS,
    correlation: bool = True,
    messages: list[str] | None = None,
    progress: Say | None = None,
) -> Path:
    """Writes ``<out>/index.html`` (`SECTIONS`), ``<out>/figures/*.png``, ``<out>/findings.csv`` and
    ``<out>/hypotheses.csv``.

    Args:
        paths: Run directories or directories containing runs (a Hydra multirun sweep directory).
        out: Report directory (default `default_out_dir`).
        reference: ``none`` (default) reports the runs alone; ``tgo1`` adds the published TGO-I measurements (a
            comparison table, a verdict column and a panel of their own beside each observable, with a caveat
            naming each way the runs differ from the paper's experiment: model, image size, data, epochs;
            `tgo.report.reference.reference_caveat`).
        title: Page title (default names the runs).
        allow_different_subsets: Compare runs whose analysis subsets differ instead of refusing.
        embed: Inline the PNGs in ``index.html`` (they are still written beside it).
        settings: The verdict rule's window, minimum window, z and stable tolerance (`tgo.report.verdicts`).
        correlation: Draw correlation heatmaps (the slowest figures for wide models).
        messages: When given, the lines a command line prints beside the page's path are appended to it (the
            reference caveat, when there is one).
        progress: Called with one line per step as it finishes (reading, judging, each section with its figures,
            writing), so a long report is not silent; ``None``: silent.

    Returns:
        The path of ``index.html``.

    Raises:
        ReportInputError: no runs, a directory without records, differing analysis subsets, runs that differ in
            model, data or points, a bad option.
    """
    if not paths:
        raise ReportInputError("give at least one run directory (or a directory containing runs)")
    run_dirs = discover_runs(paths)
    start = time.perf_counter()
    runs = [load_run_data(p, name) for p, name in zip(run_dirs, run_names(run_dirs), strict=False)]
    read = f"read {len(runs)} run{'s' if len(runs) != 1 else ''} in {time.perf_counter() - start:.1f} s"
    if reference not in REFERENCE_MODES:
        raise ReportInputError(f"--reference: expected one of {REFERENCE_MODES}, got {reference!r}")
    overlay = reference == "tgo1"
    infos = [read_run_info(r.path) for r in runs]
    check_comparable(runs, infos)
    notes = check_subsets(runs, allow_different=allow_different_subsets)
    caveat = reference_caveat(infos, [r.epochs[-1] if r.epochs else None for r in runs]) if overlay else None
    if caveat and messages is not None:
        messages.append(caveat)
    final_dir = Path(out) if out is not None else default_out_dir(paths)
    claim_report_dir(final_dir)  # before anything is written: a directory a report may replace, or one line
    with staged_report(final_dir) as report_dir:  # built whole beside it, then swapped in as one unit
        if progress is not None:  # bad input is refused in one line: progress starts once the work does
            progress(read)
        with _step(progress, "judged the claims and predictions"):
            ctx = judge(
                runs,
                settings,
                infos=infos,
                notes=notes,
                figures_dir=report_dir / "figures",
                paper=load_reference() if overlay else None,
                caveat=caveat,
                correlation=correlation,
            )
        sections = _sections(SECTIONS, ctx, progress)
        with _step(progress, "wrote the page and the CSVs"):
            _write(report_dir, ctx, sections, title or f"TGO report: {', '.join(r.name for r in runs)}", embed)
    return final_dir / "index.html"


def build_published_report(
    out: str | os.PathLike,
    *,
    settings: VerdictSettings = DEFAULT_SETTINGS,
    title: str | None = None,
    embed: bool = False,
    progress: Say | None = None,
) -> Path:
    """The findings of the shipped published TGO-I measurements alone (no run needed): ``python -m tgo.report
    --published --out DIR`` writes ``findings.csv`` (a run's columns), ``index.html`` (`PUBLISHED_SECTIONS`) and the
    observable figures.

    ``progress``: one line per step, as `build_report`.

    Raises:
        ReportInputError: the packaged file is unreadable.
    """
    final_dir = Path(out)
    claim_report_dir(final_dir)
    with staged_report(final_dir) as report_dir:
        with _step(progress, "judged the claims"):
            ctx = judge_published(settings, figures_dir=report_dir / "figures")
        sections = _sections(PUBLISHED_SECTIONS, ctx, progress)
        with _step(progress, "wrote the page and the CSVs"):
            _write(report_dir, ctx, sections, title or "TGO report: published TGO-I measurements", embed)
    return final_dir / "index.html"
