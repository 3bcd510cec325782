"""The page's own sections, each ``section(ctx) -> list[Section]`` of the report's `Context` (none when it has
nothing to show): the header, the verdicts at a glance, the figures, the claims' table, the comparison with the
published data and the runs; `published_section` opens the published data's page (a context of no runs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from tgo.report import cells
from tgo.report.cells import number, percent, plus_minus, q_value, z_value
from tgo.report.context import Context, own_view_panels
from tgo.report.figures import FigureRef, depth_profile_figures, observable_figures, spectrum_figures
from tgo.report.findings import Finding, evaluate_findings
from tgo.report.html import Section, Table
from tgo.report.reference import compare_with_reference, reference_path
from tgo.report.runinfo import NOT_RECORDED, RunInfo, package_commit, package_version
from tgo.report.runs import RunData
from tgo.report.summary import learning_sentence, verdict_counts_line, verdict_scope_sentence, verdict_summary_section
from tgo.report.verdicts import VerdictSettings

__all__ = [
    "depth_section",
    "figures_section",
    "findings_section",
    "header_rows",
    "header_section",
    "published_section",
    "reference_section",
    "runs_section",
    "summary_section",
]


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


def findings_section(ctx: Context) -> list[Section]:
    """The claims' table: the rule in words and one row per finding (the counts are under Verdicts at a glance); with
    one observation, a line saying why no claim can be tested."""
    if ctx.single:
        epoch = ctx.runs[0].epochs[0]
        section = Section("Findings: the paper's claims tested point by point", "findings")
        section.paragraphs.append(
            f"Only one observation (epoch {epoch}) is recorded, so no claim about a trend over training can be "
            f"tested: every claim needs at least two observations. The figures show the geometry at epoch {epoch} "
            "(the depth profiles are the main view); observe more checkpoints (python -m tgo.observe --checkpoints "
            "DIR or --run RUN) to test the claims."
        )
        return [section]
    extra: list[tuple[str, Callable[[Finding], str]]] = []
    counts = ctx.finding_agreement
    if counts is not None:
        n = len(ctx.runs)
        extra.append((f"runs agreeing (of {n})", lambda f: cells.agreement(counts[f.key], n)))
    if ctx.paper is not None:
        paper = {f.key: f.verdict for f in evaluate_findings(ctx.paper, ctx.agg.points, settings=ctx.settings)}
        extra.append(("verdict on TGO-I data", lambda f: paper.get(f.key, "")))
    section = Section("Findings: the paper's claims tested point by point", "findings")
    section.paragraphs.append(_rule_paragraph(ctx.settings, ctx.what))
    headers = [*FINDING_HEADERS, *(header for header, _ in extra)]
    rows = [[*_finding_cells(f), *(cell(f) for _, cell in extra)] for f in ctx.findings]
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
    if counts is not None:
        section.paragraphs.append(
            "The 'runs agreeing' column counts the runs reaching each verdict when every run is tested on its own."
        )
    return [section]


_FIGURE_TITLES = {
    "depth": "Observables against depth, one line per epoch",
    "observables": "Observables against epoch",
    "heatmaps": "Layer x epoch heatmaps",
    "spectra": "Eigenvalue and singular value spectra over epochs",
    "decay": "Spectral decay curves",
    "correlation": "Feature correlations at the first and last observation (|off-diagonal correlation| per point)",
}


def _figure_sections(figure_refs: Sequence[FigureRef], spectra_run: str | None = None) -> list[Section]:
    sections = []
    for key, heading in _FIGURE_TITLES.items():
        refs = [f for f in figure_refs if f.section == key]
        if refs:
            title = heading + (f" (run {spectra_run})" if key == "spectra" and spectra_run else "")
            sections.append(Section(title, key, figures=list(refs)))
    return sections


def depth_section(ctx: Context) -> list[Section]:
    """The observables against depth, one line per epoch (the main view of a short run), then the families' depth
    panels on views of their own (`tgo.report.context.own_view_panels`) where recorded."""
    refs = depth_profile_figures(ctx.agg, ctx.figures_dir)
    for panel in own_view_panels():
        if panel.view in ctx.aggregates:
            refs += depth_profile_figures(
                ctx.aggregates[panel.view], ctx.figures_dir, metrics=[panel.metric], view=panel.view
            )
    return _figure_sections(refs)


def figures_section(ctx: Context) -> list[Section]:
    """The observables against epoch (with the paper's panel beside them when compared), the heatmaps, the spectra,
    the decay curves and the correlations."""
    planned = {i.epochs for i in ctx.infos}
    run_epochs = planned.pop() if len(planned) == 1 else None
    refs = observable_figures(
        ctx.agg, ctx.figures_dir, reference=ctx.paper, run_epochs=run_epochs, reference_differs=ctx.caveat is not None
    )
    refs += spectrum_figures(ctx.runs[0], ctx.figures_dir, correlation=ctx.correlation) if ctx.runs else []
    sections = _figure_sections(refs, ctx.runs[0].name if ctx.several else None)
    for section in sections:
        if ctx.caveat and section.anchor == "observables":  # the figures with the published panel beside the run's
            section.caveats.append(ctx.caveat)
    return sections


def published_section(ctx: Context) -> list[Section]:
    """What the published data holds (the opening of its page; none for runs)."""
    if ctx.runs:
        return []
    data = Section("Published TGO-I measurements", "data")
    epochs = sorted({int(e) for s in next(iter(ctx.agg.mean.values())).values() for e in s[0]})
    data.paragraphs.append(
        f"{reference_path().name}: epochs {epochs[0]}..{epochs[-1]} ({len(epochs)}), points "
        f"{', '.join(ctx.agg.points)}, observables {', '.join(ctx.agg.mean)}. The file holds no standard errors, so "
        "every uncertainty below is the series' own epoch-to-epoch noise. Generated "
        f"{datetime.now():%Y-%m-%d %H:%M}."
    )
    return [data]


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
        ("final val top-1", joined([NOT_RECORDED if i.top1 is None else f"{i.top1:.2%}" for i in infos])),
        ("final val top-5", joined([NOT_RECORDED if i.top5 is None else f"{i.top5:.2%}" for i in infos])),
        ("seed(s)", ", ".join(dict.fromkeys(text(i.seed) for i in infos))),
        (
            "analysis subset",
            joined(
                [f"{text(i.subset_size)} images, fingerprint {(i.subset_hash or NOT_RECORDED)[:16]}" for i in infos]
            ),
        ),
        ("observation points", joined([str(len(r.points)) for r in runs])),
    ]
    described = [  # what only run_description.json records: shown where a run has it (older headers unchanged)
        ("parameters", [NOT_RECORDED if i.parameters is None else f"{i.parameters:,}" for i in infos], "parameters"),
        ("validation metrics (last logged)", [validation_words(i) for i in infos], "validation"),
        ("software (run)", [versions_words(i) for i in infos], "versions"),
    ]
    rows += [(name, joined(values)) for name, values, key in described if any(getattr(i, key) for i in infos)]
    sources = [i.source for i in infos if i.source]
    if sources:
        rows.append(("observed model(s)", "; ".join(dict.fromkeys(sources))))
    rows.append(("tgo version", package_version()))
    rows.append(("git commit (report)", package_commit() or NOT_RECORDED))
    rows.append(("git commit (run)", ", ".join(dict.fromkeys(commits)) if commits else NOT_RECORDED))
    return rows


def validation_words(info: RunInfo, shown: int = 6) -> str:
    """The validation metrics a run's module logged last, ``after epoch N: name=value, ...`` (the first ``shown``)."""
    if not info.validation:
        return NOT_RECORDED
    items = [f"{key}={value:.4g}" for key, value in info.validation.items()]
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    when = f"after epoch {info.validation_epoch}: " if info.validation_epoch is not None else ""
    return when + ", ".join(items[:shown]) + more


def versions_words(info: RunInfo) -> str:
    """The software a run recorded, ``torch 2.5.1, lightning 2.4.0, ...``."""
    return ", ".join(f"{name} {version}" for name, version in info.versions.items()) or NOT_RECORDED


def header_section(ctx: Context) -> list[Section]:
    """At a glance: the header's fields two pairs a line, the verdict counts and what they can conclude (the first
    screen), the differing-subset notes and the reference caveat."""
    section = Section("At a glance", "header")
    rows = header_rows(ctx.runs, ctx.infos)
    half = -(-len(rows) // 2)  # two (field, value) pairs per line: the header takes half the page's height
    pairs = [[*rows[i], *(rows[half + i] if half + i < len(rows) else ("", ""))] for i in range(half)]
    section.tables.append(Table(["field", "value", "field", "value"], pairs, left=[0, 1, 2, 3]))
    learned = learning_sentence([r.name for r in ctx.runs], ctx.infos)
    section.paragraphs += [learned] if learned else []
    if not ctx.single:
        section.paragraphs += [
            verdict_counts_line(ctx.findings, ctx.predictions),
            verdict_scope_sentence(ctx.findings, ctx.predictions, len(ctx.runs)),
        ]
    section.paragraphs += list(ctx.notes)
    section.caveats += [ctx.caveat] if ctx.caveat else []
    return [section]


def summary_section(ctx: Context) -> list[Section]:
    """Verdicts at a glance (none with one observation)."""
    return [] if ctx.single else [verdict_summary_section(ctx.findings, ctx.predictions)]


def reference_section(ctx: Context) -> list[Section]:
    """The last observed value of every point beside the published one (with ``--reference tgo1``)."""
    if ctx.paper is None:
        return []
    ref_rows = compare_with_reference(ctx.agg.mean, ctx.paper, ctx.agg.points)
    ref = Section("Comparison with the published TGO-I measurements", "reference")
    ref.paragraphs.append(
        "The last observed value of each point beside the paper's value at the same epoch (or the paper's last "
        "epoch, 100, if it has no such epoch). Paper layer names map to points as Layer_00_PatchEmbed = "
        "patch_embed, Layer_00_PosEmbed = pos_embed, Layer_NN_BlockNN = block_NN, Layer_13_CLS_Final = cls; "
        "the six observables share TGO's names and conventions. On the figures the paper has a panel of its "
        "own beside each observable, against the fraction of training."
    )
    ref.caveats += [ctx.caveat] if ctx.caveat else []
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
            summary=f"The last observed value of every point and observable beside the paper's ({len(ref_rows)} rows)",
        )
    )
    return [ref]


def runs_section(ctx: Context) -> list[Section]:
    """The runs: paths, epochs, points and analysis subsets."""
    runs = ctx.runs
    section = Section("Runs", "runs")
    section.paragraphs.append(
        f"{len(runs)} run(s); points: {', '.join(ctx.agg.points)}; epochs observed: "
        f"{', '.join(str(e) for e in runs[0].epochs)}. Generated {datetime.now():%Y-%m-%d %H:%M}."
    )
    rows = [
        [
            r.name,
            str(r.path),
            f"{r.epochs[0]}..{r.epochs[-1]} ({len(r.epochs)})",
            str(len(r.points)),
            (r.fingerprint or "unknown")[:16],
        ]
        for r in runs
    ]
    section.tables.append(
        Table(["run", "path", "epochs", "points", "analysis subset fingerprint"], rows, left=[0, 1, 4])
    )
    return [section]
