"""Builds the report of one or more runs: load -> check subsets -> aggregate -> findings -> figures -> HTML.

The single orchestrator of ``tgo.report``; every step is a function of another module, so each can be tested alone.
`build_published_report` runs the same findings and figures on the shipped published TGO-I measurements alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

from tgo.records import RunDir
from tgo.report import cells
from tgo.report.aggregate import (
    Aggregate,
    aggregate_runs,
    check_subsets,
    single_aggregate,
)
from tgo.report.cells import number, percent, plus_minus, q_value, z_value
from tgo.report.early import early_section
from tgo.report.figures import FigureRef, depth_profile_figures, observable_figures, save_figure, spectrum_figures
from tgo.report.findings import FINDINGS_COLUMNS, VERDICTS, Finding, evaluate_findings
from tgo.report.html import Section, Table, render_page
from tgo.report.hypotheses import HYPOTHESES_COLUMNS
from tgo.report.hypotheses_section import (
    HypothesesReport,
    hypotheses_report,
)
from tgo.report.optimisation import optimisation_section
from tgo.report.output import claim_report_dir, staged_report
from tgo.report.phases import phases_section
from tgo.report.reference import (
    PAPER_POINTS,
    compare_with_reference,
    load_reference,
    reference_caveat,
    reference_path,
)
from tgo.report.runinfo import (
    NOT_RECORDED,
    RunInfo,
    check_comparable,
    package_commit,
    package_version,
    read_run_info,
)
from tgo.report.runs import ReportInputError, RunData, discover_runs, load_run_data, run_names
from tgo.report.spreadsheet import write_csv
from tgo.report.statements import count_agreement, csv_rows
from tgo.report.story import build_story, story_caption, story_figure
from tgo.report.summary import verdict_counts_line, verdict_scope_sentence, verdict_summary_section
from tgo.report.verdicts import DEFAULT_SETTINGS, VerdictSettings

__all__ = [
    "FINDINGS_COLUMNS",
    "REFERENCE_MODES",
    "build_published_report",
    "build_report",
    "default_out_dir",
    "header_rows",
]

REFERENCE_MODES = ("none", "tgo1")
"""``--reference``: ``none`` (default) draws the runs alone; ``tgo1`` adds the published TGO-I measurements."""


def default_out_dir(paths: Sequence[str | os.PathLike]) -> Path:
    """The first argument's ``report/`` (`tgo.records.RunDir.report`).

    Inside the run for one run, inside the sweep directory for a sweep, so a report sits beside what it describes.
    """
    return RunDir(paths[0]).report


def _finding_cells(f: Finding) -> list[str]:
    t = f.trend
    if t is None:
        return [f.statement, f.point, f.expected, "", "", "", "", "", "", "", "", f.verdict, f.note]
    return [
        f.statement,
        f.point,
        f.expected,
        number(t.first, nan="nan"),
        number(t.last, nan="nan"),
        plus_minus(t.change, t.uncertainty.total),
        percent(t.relative_change),
        number(t.spearman, 3, nan="nan"),
        t.peak_window,
        z_value(f.extreme.z if f.extreme is not None else t.z),
        q_value(f.q),
        f.verdict,
        f.note,
    ]


FINDING_HEADERS = [
    "claim",
    "point",
    "expected",
    "first (window mean)",
    "last (window mean)",
    "change ± standard error",
    "relative change",
    "Spearman (epoch)",
    "peak/trough window",
    "z",
    "q",
    "verdict",
    "note",
]


def _rule_paragraph(settings: VerdictSettings, what: str) -> str:
    """The verdict rule in words (docs/findings.md has it with its validation)."""
    return (
        f"Each claim is tested on {what}: {settings.describe()}. Every comparison is a contrast (the last window "
        "minus the first, the peak window minus the last, CLS minus the best other point in the final window) "
        "against its combined standard error U = sqrt(J^2 + T^2). J is the jackknife term, taken replicate by "
        "replicate from the recorded leave-one-group-out values (paired: the same images at every epoch and point; "
        "'unpaired' for records without replicates). T is the training-noise term: the run's epoch-to-epoch noise "
        "(the residuals of each series around its best unimodal fit, pooled over the points of the observable in "
        "units of each series' median jackknife error, or of its level for metrics without one such as the weight "
        "spectra; a long series' own median pseudo-residual), and for several runs also the "
        "seed-to-seed spread of the same contrast. Where the observable's series leave fewer than 10 degrees of "
        "freedom (a short, smooth run: no observation contradicts a unimodal curve) T is not estimated and the row "
        "says so: such a verdict is about this run on these images. A contrast counts when it exceeds the threshold "
        "(z = "
        f"{settings.z:g}, Student-t widened for the degrees of freedom of U) and its Benjamini-Hochberg q-value over "
        f"the table's rows is at most {settings.fdr:g}, so the expected share of false directional verdicts in the "
        f"table stays below {settings.fdr:g}. Verdicts: 'holds then reverses' = the best window (peak; trough for "
        "falling claims) is not the last, the last window fell back from it and the peak is beyond the start, both "
        "beyond the threshold, and the fall's uncertainty includes the training noise (judged on image sampling "
        "alone, a fall is reported in the note as a dip of this run, not a reversal of the claim); 'holds' = "
        "otherwise the last window moved the claimed way from the first; 'does not "
        "hold' = it moved the other way (a contradiction); 'inconclusive' = the move is within the threshold; 'n/a' "
        "= fewer than two observations, or first and last windows both below the observable's noise floor. NC1, "
        "the Fisher ratio and the massive-activation ratio are judged on the log of their values. Embeddings count "
        f"as stable when the change lies within ±{settings.stable_tolerance:.0%} of the first window by more than "
        "the threshold, and do not hold when it lies outside by more. 'CLS ends highest/lowest' is judged on the "
        "final window: CLS's margin over the best other point (again on <metric>_vs_noise when recorded). Spearman "
        "is the rank correlation of the observable with epoch (descriptive only)."
    )


def _findings_section(
    findings: Sequence[Finding],
    settings: VerdictSettings,
    what: str,
    extra: Sequence[tuple[str, Callable[[Finding], str]]] = (),
) -> Section:
    """The findings section: the rule in words, verdict counts per claim, and one row per finding.

    Args:
        findings: The judged findings.
        settings: The rule's settings (stated on the page).
        what: What was judged, in words ("this run", "the mean over runs").
        extra: Further columns: (header, cell of a finding).
    """
    section = Section("Findings: the paper's claims tested point by point", "findings")
    section.paragraphs.append(_rule_paragraph(settings, what))
    headers = [*FINDING_HEADERS, *(header for header, _ in extra)]
    rows = [[*_finding_cells(f), *(cell(f) for _, cell in extra)] for f in findings]
    section.tables.append(
        Table(
            headers,
            rows,
            left=[0, 1, 2, 8, 12, *range(13, len(headers))],
            verdict_column=11,
            summary=f"Every finding, one row per claim and point ({len(rows)} rows; the counts are under Verdicts "
            "at a glance)",
        )
    )
    return section


def _figure_sections(figure_refs: Sequence[FigureRef], spectra_run: str | None) -> list[Section]:
    titles = {
        "depth": "Observables against depth, one line per epoch",
        "observables": "Observables against epoch",
        "heatmaps": "Layer x epoch heatmaps",
        "spectra": "Eigenvalue and singular value spectra over epochs"
        + (f" (run {spectra_run})" if spectra_run else ""),
        "decay": "Spectral decay curves",
        "correlation": "Feature correlations at the first and last observation (|off-diagonal correlation| per point)",
    }
    sections = []
    for key, heading in titles.items():
        refs = [f for f in figure_refs if f.section == key]
        if refs:
            sections.append(Section(heading, key, figures=list(refs)))
    return sections


def _write_page(report_dir: Path, title: str, sections: Sequence[Section], embed: bool) -> Path:
    index = report_dir / "index.html"
    index.write_text(render_page(title, sections, report_dir, embed=embed), encoding="utf-8")
    return index


def _use_reference(mode: str) -> bool:
    if mode not in REFERENCE_MODES:
        raise ReportInputError(f"--reference: expected one of {REFERENCE_MODES}, got {mode!r}")
    return mode == "tgo1"


def _pct_or_missing(value: float | None) -> str:
    return NOT_RECORDED if value is None else f"{value:.2%}"


def header_rows(runs: Sequence[RunData], infos: Sequence[RunInfo]) -> list[tuple[str, str]]:
    """The header's (field, value) rows: model, data, image size, epochs, accuracies, seeds, subset, software.

    A field that differs between runs lists each run's value; one a run does not hold reads "not recorded".
    """

    def joined(values: Sequence[str]) -> str:
        distinct = list(dict.fromkeys(values))
        return (
            distinct[0]
            if len(distinct) == 1
            else "; ".join(f"{r.name}: {v}" for r, v in zip(runs, values, strict=False))
        )

    def text(value: object) -> str:
        return NOT_RECORDED if value is None else str(value)

    observed = sorted({e for r in runs for e in r.epochs})
    commits = [i.commit for i in infos if i.commit]
    rows = [
        ("model", joined([text(i.model) for i in infos])),
        ("data source", joined([text(i.data) for i in infos])),
        ("image size", joined([text(i.image_size) for i in infos])),
        ("kind", joined([i.kind for i in infos])),
        (
            "epochs (planned)",
            joined([text(i.epochs) if i.kind == "training run" else "n/a (offline observation)" for i in infos]),
        ),
        (
            "epochs observed",
            f"{', '.join(str(e) for e in observed)} ({len(observed)} observation{'s' if len(observed) != 1 else ''})",
        ),
        ("final val top-1", joined([_pct_or_missing(i.top1) for i in infos])),
        ("final val top-5", joined([_pct_or_missing(i.top5) for i in infos])),
        ("seed(s)", ", ".join(dict.fromkeys(text(i.seed) for i in infos))),
        (
            "analysis subset",
            joined(
                [f"{text(i.subset_size)} images, fingerprint {(i.subset_hash or NOT_RECORDED)[:16]}" for i in infos]
            ),
        ),
        ("observation points", joined([str(len(r.points)) for r in runs])),
    ]
    sources = [i.source for i in infos if i.source]
    if sources:
        rows.append(("observed model(s)", "; ".join(dict.fromkeys(sources))))
    rows.append(("tgo version", package_version()))
    rows.append(("git commit (report)", package_commit() or NOT_RECORDED))
    rows.append(("git commit (run)", ", ".join(dict.fromkeys(commits)) if commits else NOT_RECORDED))
    return rows


def _header_section(runs: Sequence[RunData], infos: Sequence[RunInfo], notes: Sequence[str]) -> Section:
    section = Section("At a glance", "header")
    rows = header_rows(runs, infos)
    half = -(-len(rows) // 2)  # two (field, value) pairs per line: the header takes half the page's height
    pairs = [[*rows[i], *(rows[half + i] if half + i < len(rows) else ("", ""))] for i in range(half)]
    section.tables.append(Table(["field", "value", "field", "value"], pairs, left=[0, 1, 2, 3]))
    section.paragraphs += list(notes)
    return section


def _single_observation_hypotheses(section: Section) -> None:
    """Replaces the prediction tables (all n/a with one observation) by one line saying why."""
    section.paragraphs[1:] = [
        "Only one observation is recorded, so no prediction about a change over training can be judged (each "
        "needs at least two); the verdict tables are left out and the figures show the single observation."
    ]
    section.tables.clear()
    for sub in section.subsections:
        if sub.anchor.startswith("hypothesis-"):
            sub.tables.clear()


def _single_observation_section(runs: Sequence[RunData]) -> Section:
    epoch = runs[0].epochs[0]
    section = Section("Findings: the paper's claims tested point by point", "findings")
    section.paragraphs.append(
        f"Only one observation (epoch {epoch}) is recorded, so no claim about a trend over training can be tested: "
        f"every claim needs at least two observations. The figures show the geometry at epoch {epoch} (the depth "
        f"profiles are the main view); observe more checkpoints (python -m tgo.observe --checkpoints DIR or --run "
        f"RUN) to test the claims."
    )
    return section


def _story_section(
    agg: Aggregate, findings: Sequence[Finding], hypotheses: HypothesesReport, figures_dir: Path
) -> list[Section]:
    """The story figure (`tgo.report.story`) as the page's first section; none when no panel can be drawn."""
    story = build_story(agg, hypotheses.aggregates, findings, hypotheses.results)
    if not story.panels:
        return []
    path = save_figure(story_figure(story), figures_dir, "story")
    return [
        Section("The story in one figure", "story", figures=[FigureRef("story", path, story_caption(story), wide=True)])
    ]


def _judge(agg: Aggregate, settings: VerdictSettings) -> list[Finding]:
    """The findings of an aggregate's mean, with its runs' standard errors and seed-to-seed spread."""
    replicates = agg.replicates if agg.n_runs > 1 else None
    return evaluate_findings(
        agg.mean, agg.points, stderr=agg.stderr, replicates=replicates, leave_out=agg.jackknife, settings=settings
    )


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
) -> Path:
    """Writes ``<out>/index.html``, ``<out>/figures/*.png``, ``<out>/findings.csv`` and ``<out>/hypotheses.csv``.

    The page holds the runs, the findings (the paper's claims), the comparison with the published data where it
    applies, the Hypotheses section (`tgo.report.hypotheses_section`) and the figures.

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

    Returns:
        The path of ``index.html``.

    Raises:
        ReportInputError: no runs, a directory without records, differing analysis subsets, runs that differ in
            model, data or points, a bad option.
    """
    if not paths:
        raise ReportInputError("give at least one run directory (or a directory containing runs)")
    run_dirs = discover_runs(paths)
    names = run_names(run_dirs)
    runs: list[RunData] = [load_run_data(p, name) for p, name in zip(run_dirs, names, strict=False)]
    overlay = _use_reference(reference)
    infos = [read_run_info(r.path) for r in runs]
    check_comparable(runs, infos)
    notes = check_subsets(runs, allow_different=allow_different_subsets)
    agg: Aggregate = aggregate_runs(runs)
    paper = load_reference() if overlay else None
    caveat = reference_caveat(infos, [r.epochs[-1] if r.epochs else None for r in runs]) if overlay else None
    if caveat and messages is not None:
        messages.append(caveat)
    single = len({e for r in runs for e in r.epochs}) == 1

    final_dir = Path(out) if out is not None else default_out_dir(paths)
    claim_report_dir(final_dir)  # before anything is written: a directory a report may replace, or one line
    with staged_report(final_dir) as report_dir:  # built whole beside it, then swapped in as one unit
        figures_dir = report_dir / "figures"

        findings = _judge(agg, settings)
        several = len(runs) > 1
        agreement = None
        extra: list[tuple[str, Callable[[Finding], str]]] = []
        if several:
            agreement = count_agreement([_judge(aggregate_runs([r]), settings) for r in runs], VERDICTS)
            counts = agreement
            extra.append(
                (
                    f"runs agreeing (of {len(runs)})",
                    lambda f: cells.agreement(counts[f.key], len(runs)),
                )
            )
        if paper is not None and not single:
            paper_verdicts = {
                (f.claim, f.metric, f.point): f.verdict for f in evaluate_findings(paper, agg.points, settings=settings)
            }
            extra.append(("verdict on TGO-I data", lambda f: paper_verdicts.get((f.claim, f.metric, f.point), "")))

        header = _header_section(runs, infos, notes)
        summary = Section("Runs", "runs")
        summary.paragraphs.append(
            f"{len(runs)} run(s); points: {', '.join(agg.points)}; epochs observed: "
            f"{', '.join(str(e) for e in runs[0].epochs)}. Generated {datetime.now():%Y-%m-%d %H:%M}."
        )
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

        if single:
            find = _single_observation_section(runs)
        else:
            find = _findings_section(findings, settings, "the mean over runs" if several else "this run", extra)
        if several and not single:
            find.paragraphs.append(
                "The 'runs agreeing' column counts the runs reaching each verdict when every run is tested on its own."
            )
        ref: Section | None = None
        if paper is not None:
            ref_rows = compare_with_reference(agg.mean, paper, agg.points)
            ref = Section("Comparison with the published TGO-I measurements", "reference")
            ref.paragraphs.append(
                "The last observed value of each point beside the paper's value at the same epoch (or the paper's last "
                "epoch, 100, if it has no such epoch). Paper layer names map to points as Layer_00_PatchEmbed = "
                "patch_embed, Layer_00_PosEmbed = pos_embed, Layer_NN_BlockNN = block_NN, Layer_13_CLS_Final = cls; "
                "the six observables share TGO's names and conventions. On the figures the paper has a panel of its "
                "own beside each observable, against the fraction of training."
            )
            if caveat:
                ref.caveats.append(caveat)
                header.caveats.append(caveat)
            ref.tables.append(
                Table(
                    ["observable", "point", "epoch", "this report", "paper epoch", "paper", "ratio"],
                    [
                        [
                            r.metric,
                            r.point,
                            str(r.epoch),
                            number(r.value, nan="nan"),
                            str(r.paper_epoch),
                            number(r.paper_value, nan="nan"),
                            number(r.ratio, 3, nan="nan"),
                        ]
                        for r in ref_rows
                    ],
                    left=[0, 1],
                    summary="The last observed value of every point and observable beside the paper's "
                    f"({len(ref_rows)} rows)",
                )
            )

        hypotheses = hypotheses_report(
            runs, figures_dir, settings, what="the mean over runs" if several else "this run"
        )
        if single:
            _single_observation_hypotheses(hypotheses.section)

        planned = {i.epochs for i in infos}
        run_epochs = planned.pop() if len(planned) == 1 else None
        figure_refs = depth_profile_figures(agg, figures_dir)
        figure_refs += observable_figures(
            agg, figures_dir, reference=paper, run_epochs=run_epochs, reference_differs=caveat is not None
        )
        figure_refs += spectrum_figures(runs[0], figures_dir, correlation=correlation)
        figure_sections = _figure_sections(figure_refs, runs[0].name if several else None)
        if caveat:
            for section in figure_sections:
                if section.anchor == "observables":  # the figures with the published panel beside the run's
                    section.caveats.append(caveat)
        depth = [s for s in figure_sections if s.anchor == "depth"]
        later = [s for s in figure_sections if s.anchor != "depth"]

        # Pictures before tables: the header, the story, what the verdicts found, the figures (the hypotheses' with
        # their folded tables), then the full tables.
        sections = [header, *_story_section(agg, findings, hypotheses, figures_dir)]
        if not single:
            sections.append(verdict_summary_section(findings, hypotheses.results))
            # the first screen: the counts, and what they can conclude (image sampling vs training noise)
            header.paragraphs[:0] = [
                verdict_counts_line(findings, hypotheses.results),
                verdict_scope_sentence(findings, hypotheses.results, len(runs)),
            ]
        phases = phases_section(runs, figures_dir, settings.z)
        early = early_section(runs, figures_dir, settings.z)
        optimisation = optimisation_section(runs, figures_dir)
        sections += [*depth, hypotheses.section, *([phases] if phases else []), *([early] if early else [])]
        sections += [*([optimisation] if optimisation else []), *later, find]
        if ref is not None:
            sections.append(ref)
        sections.append(summary)

        write_csv(
            report_dir / "findings.csv",
            FINDINGS_COLUMNS,
            csv_rows(findings, FINDINGS_COLUMNS, settings.z, agreement, len(runs)),
        )
        write_csv(report_dir / "hypotheses.csv", HYPOTHESES_COLUMNS, hypotheses.rows)
        index = _write_page(report_dir, title or f"TGO report: {', '.join(r.name for r in runs)}", sections, embed)
    return final_dir / index.name


def build_published_report(
    out: str | os.PathLike,
    *,
    settings: VerdictSettings = DEFAULT_SETTINGS,
    title: str | None = None,
    embed: bool = False,
) -> Path:
    """The findings of the shipped published TGO-I measurements alone (no run needed): ``python -m tgo.report
    --published --out DIR``.

    Writes ``findings.csv`` (the same columns as for a run), ``index.html`` (verdict counts, the findings table)
    and the observable figures. The published file holds no standard errors, so every uncertainty is the series'
    epoch-to-epoch noise (its own median absolute pseudo-residual, `tgo.report.training_noise`).

    Args:
        out: Report directory.
        settings: The verdict rule's settings.
        title: Page title.
        embed: Inline the PNGs in ``index.html``.

    Returns:
        The path of ``index.html``.

    Raises:
        ReportInputError: the packaged file is unreadable.
    """
    paper = load_reference()
    final_dir = Path(out)
    claim_report_dir(final_dir)
    with staged_report(final_dir) as report_dir:
        findings = evaluate_findings(paper, PAPER_POINTS, settings=settings)
        data = Section("Published TGO-I measurements", "data")
        first_metric = next(iter(paper.values()))
        epochs = sorted({int(e) for s in first_metric.values() for e in s[0]})
        data.paragraphs.append(
            f"{reference_path().name}: epochs {epochs[0]}..{epochs[-1]} ({len(epochs)}), points "
            f"{', '.join(PAPER_POINTS)}, observables {', '.join(paper)}. The file holds no standard errors, so every "
            f"uncertainty below is the series' own epoch-to-epoch noise. Generated {datetime.now():%Y-%m-%d %H:%M}."
        )
        sections = [
            data,
            verdict_summary_section(findings, {}),
            _findings_section(findings, settings, "the published series"),
        ]
        sections += _figure_sections(
            observable_figures(single_aggregate(paper, PAPER_POINTS), report_dir / "figures"), None
        )
        write_csv(report_dir / "findings.csv", FINDINGS_COLUMNS, csv_rows(findings, FINDINGS_COLUMNS, settings.z))
        index = _write_page(report_dir, title or "TGO report: published TGO-I measurements", sections, embed)
    return final_dir / index.name
