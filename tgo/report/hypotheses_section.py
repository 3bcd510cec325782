"""The report's Hypotheses section: each prediction judged on the report's `Context`, drawn and tabulated, with
linear CKA matrices between points from the stored per-image vectors and a context table of the drift and
massive-activation probes; records without the probes give a section that says they were not recorded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from tgo import panels, viz
from tgo.records import RecordsError, load_spectra
from tgo.report.aggregate import Aggregate
from tgo.report.cells import agreement as agreement_text
from tgo.report.cells import number, plus_minus, q_value, z_value
from tgo.report.context import CONTEXT_METRICS, Context
from tgo.report.figures import FigureRef, depth_profile_figures, save_figure
from tgo.report.html import Section, Table
from tgo.report.hypotheses import (
    HYPOTHESES,
    Prediction,
    PredictionResult,
    select_points,
    summary_text,
)
from tgo.report.hypothesis_figures import Profile, cka_figure, epochs_label, profiles_figure
from tgo.report.runs import ReportInputError, RunData
from tgo.report.statements import window_band
from tgo.spectral.probes import cka_matrix, linear_cka

__all__ = ["hypotheses_section"]

CKA_VIEWS: tuple[str, ...] = ("cls", "patch")
_NOT_RECORDED_TEXT = (
    "Not recorded: these records hold none of the views and probe metrics the predictions need (views cls, patch, "
    "between_image, within_image; catalogue entries of scope 'family'). They were written before the hypothesis "
    "probes existed or with observation.probes.enabled=false; re-observing the run's checkpoints with "
    "python -m tgo.observe --run RUN_DIR records them."
)


def _undefined_points(prediction: Prediction, aggregates: dict[str, Aggregate], points: Sequence[str]) -> list[str]:
    """Points the prediction is about whose records hold only non-finite values of its metric (undefined there)."""
    per_point = aggregates[prediction.view].mean.get(prediction.metric, {}) if prediction.view in aggregates else {}
    return [
        p
        for p in select_points(prediction.points, points)
        if p in per_point and not np.any(np.isfinite(per_point[p][1]))
    ]


def _profile(prediction: Prediction, results: Sequence[PredictionResult], agg: Aggregate) -> Profile:
    """The depth profile panel of one prediction: its judged points' first- and last-window means (the numbers its
    table judges, from each result's `Trend`) with ±1 paired standard-error bands, every observed epoch thin."""
    per_point = agg.mean[prediction.metric]
    points = [r.point for r in results]
    epochs = sorted({int(e) for p in points for e in per_point[p][0]})
    column = {e: j for j, e in enumerate(epochs)}
    values = np.full((len(epochs), len(points)), np.nan)
    low = np.full((2, len(points)), np.nan)
    high = np.full((2, len(points)), np.nan)
    for i, p in enumerate(points):
        e, v = per_point[p]
        for k, epoch in enumerate(e):
            values[column[int(epoch)], i] = v[k]
    for i, r in enumerate(results):
        t = r.trend
        low[0, i], high[0, i] = window_band(t.first, t.first_uncertainty, t.scale)
        low[1, i], high[1, i] = window_band(t.last, t.last_uncertainty, t.scale)
    spans = [[r.trend.first_window for r in results], [r.trend.last_window for r in results]]
    windows = ("/".join(dict.fromkeys(w for w in spans[0] if w)), "/".join(dict.fromkeys(w for w in spans[1] if w)))
    title = f"{prediction.metric} ({prediction.view})\npredicted: {prediction.expected}"
    return Profile(
        title,
        points,
        epochs,
        values,
        np.array([r.trend.first for r in results], dtype=np.float64),
        np.array([r.trend.last for r in results], dtype=np.float64),
        low,
        high,
        [r.verdict for r in results],
        windows=windows,
        log=prediction.observable.scale == "log",
    )


def _profiles_caption(title: str, profiles: Sequence[Profile], band: str) -> str:
    """What a hypothesis figure draws, with its windows' epochs and which panels have log axes."""
    windows = list(dict.fromkeys(p.windows for p in profiles))
    if len(windows) == 1:
        first, last = windows[0]
        which = f"the first window ({epochs_label(first)}, orange) and the last ({epochs_label(last)}, dark blue)"
    else:
        which = "the first window (orange) and the last (dark blue), each panel naming its windows' epochs"
    logs = [p.title.split(" ", 1)[0] for p in profiles if p.log]
    return (
        f"{title}: each prediction's metric across points (depth), as its table judges it: the mean over {which} "
        f"of the verdict rule, bands {band} (the J term of the verdicts, replicate by replicate); every observed "
        "epoch in thin grey; markers on the last window's profile are the verdict at that point (green consistent, "
        "red inconsistent, blue inconclusive, grey n/a; cls a square)"
        + (f"; log y axis for the ratios ({', '.join(dict.fromkeys(logs))})" if logs else "")
        + "."
    )


def _point_table(
    prediction: Prediction, results: Sequence[PredictionResult], agreement: dict | None, n_runs: int
) -> Table:
    headers = [
        "point",
        "first (window mean)",
        "last (window mean)",
        "change ± standard error",
        "z",
        "q",
        "terms",
        "verdict",
        "note",
    ]
    rows = [
        [
            r.point,
            number(r.trend.first),
            number(r.trend.last),
            plus_minus(r.trend.change, r.trend.uncertainty.total),
            z_value(r.trend.z),
            q_value(r.q),
            r.trend.uncertainty.describe() if math.isfinite(r.trend.uncertainty.total) else "",
            r.verdict,
            r.note,
        ]
        for r in results
    ]
    if agreement is not None:
        headers.append(f"runs agreeing (of {n_runs})")
        for row, r in zip(rows, results, strict=True):
            row.append(agreement_text(agreement[r.key], n_runs))
    return Table(
        headers,
        rows,
        left=[0, 6, 8, *([9] if agreement is not None else [])],
        verdict_column=7,
        summary=f"{prediction.statement}: {summary_text(results)} (per point)",
    )


def _spectra(run: RunData, *args: Any, **kwargs: Any) -> dict:
    """`tgo.records.load_spectra` of the run, a malformed file refused as `ReportInputError`."""
    try:
        return load_spectra(run.path, *args, **kwargs)
    except RecordsError as err:
        raise ReportInputError(str(err)) from err


def _cka(vectors: Sequence[np.ndarray]) -> np.ndarray:
    """`cka_matrix` with NaN on the diagonal of a constant representation (its CKA with anything is undefined)."""
    matrix = cka_matrix(vectors)
    for i, v in enumerate(vectors):
        matrix[i, i] = linear_cka(v, v)
    return matrix


def _cka_subsection(run: RunData, figures_dir: Path, several: bool) -> Section:
    """Linear CKA between points from the per-image vectors of the first and last epoch that stored them."""
    section = Section("Representation similarity between points (linear CKA)", "hypotheses-cka", figures_first=True)
    section.paragraphs.append(
        "Linear CKA (Kornblith et al. 2019) between the per-image vectors of two points: 1 when one representation "
        "is the other up to a rotation and an isotropic scale, lower the more they differ. cls = the CLS token of "
        "each image; patch = each image's mean patch token. The vectors are stored at the epochs that keep "
        "covariances (observation.keep_covariance); the first and the last such epoch are shown. Similar "
        "neighbouring blocks mean the spreading is carried along the depth; a block unlike its neighbours is where "
        "the representation is re-expressed."
        + (f" Several runs: the matrices are those of the first run, {run.name}." if several else "")
    )
    labels = {view: _spectra(run, view=view, arrays=("labels",)) for view in CKA_VIEWS}
    by_view_epochs = {view: [e for e, pts in found.items() if pts] for view, found in labels.items()}
    if not any(by_view_epochs.values()):
        section.paragraphs.append(
            "Not recorded: this run's spectra files hold no per-image vectors (<point>/cls/vectors, "
            "<point>/patch/vectors), so there is no CKA matrix. They are stored with the probes on, at the epochs "
            "that keep covariances."
        )
        return section
    change_rows: dict[str, dict[str, str]] = {}
    compared: dict[str, str] = {}
    for view, epochs in by_view_epochs.items():
        if not epochs:
            continue
        chosen = list(dict.fromkeys((epochs[0], epochs[-1])))
        vectors = _spectra(run, chosen, view=view, arrays=("vectors",))
        points = [p for p in run.points if all("vectors" in vectors[e].get(p, {}) for e in chosen)]
        if len(points) < 2:
            continue
        matrices = {f"epoch {e}": _cka([vectors[e][p]["vectors"] for p in points]) for e in chosen}
        fig = cka_figure(matrices, points, title=f"linear CKA between points, {view} vectors (run {run.name})")
        path = save_figure(fig, figures_dir, f"cka_{view}")
        caption = (
            f"Linear CKA between points of the {view} per-image vectors at epoch"
            f"{'s ' + ' and '.join(str(e) for e in chosen) if len(chosen) > 1 else ' ' + str(chosen[0])} "
            f"(run {run.name}; grey n/a: a constant representation, e.g. the CLS token before the first block)"
        )
        section.figures.append(FigureRef("hypotheses", path, caption, wide=len(chosen) > 1))
        if len(chosen) > 1:
            compared[view] = f"CKA {view}: epoch {chosen[0]} vs {chosen[-1]}"
            for p in points:
                a, b = vectors[chosen[0]][p]["vectors"], vectors[chosen[-1]][p]["vectors"]
                value = linear_cka(a, b) if a.shape[0] == b.shape[0] else math.nan
                change_rows.setdefault(p, {})[view] = "n/a (constant)" if math.isnan(value) else number(value, 3)
    if change_rows:
        section.tables.append(
            Table(
                ["point", *compared.values()],
                [[p, *(change_rows[p].get(v, "") for v in compared)] for p in run.points if p in change_rows],
                left=[0],
                summary="How much each point's representation changed: CKA between its first and last stored vectors",
            )
        )
    return section


def _attention_subsection(run: RunData, aggregates: dict[str, Aggregate], figures_dir: Path, several: bool) -> Section:
    """The page panels this section claims (`tgo.panels.Panel.section`): depth profiles of the blocks' attention
    metrics, and block x head heatmaps at the last epoch."""
    mine = [p for p in panels.declared("page") if p.section == "hypotheses"]
    depth, heads = ([p for p in mine if p.kind == kind] for kind in ("depth", "heads"))
    agg = aggregates.get(depth[0].view) if depth else None
    section = Section("Attention geometry of the blocks", "hypotheses-attention", figures_first=True)
    section.paragraphs.append(
        "Per block, from q and k as the block's attention uses them (softmax(q k^T / sqrt(d_h)) recomputed exactly, "
        "docs/observables.md section 7): attention_entropy = the patch queries' entropy and cls_attention_entropy "
        "the CLS query's (nats; uniform attention over N keys gives ln N, attention_entropy_noise); cls_mass = the "
        "patch queries' mass on the CLS key (the sink), self_mass on themselves, max_weight their largest weight; "
        "mean_attention_distance = the pixel distance of the patch keys, weights renormalised over the patches (the "
        "CLS and register keys have no position; uniform attention gives mean_attention_distance_noise); "
        "effective_heads = the participation ratio of the heads' attention-map similarity (1: identical heads, H: "
        "disjoint). Values are head means with ±1 jackknife standard error bands"
        + (" (for several runs: ± 1 standard deviation over runs)." if several else ".")
    )
    if agg is None or not any(agg.mean.get(p.metric) for p in depth):
        section.paragraphs.append(
            "Not recorded: these records hold no attention view (recorded with observation.attention.enabled, at "
            "blocks whose attention is timm's standard Attention); re-observing the checkpoints with "
            "python -m tgo.observe --run RUN_DIR records it."
        )
        return section
    noise = []
    for metric in (p.overlay for p in depth if p.overlay):
        values = [v for _, (_, vs) in agg.mean.get(metric, {}).items() for v in vs if np.isfinite(v)]
        if values:
            noise.append(f"{metric} = {values[0]:.4g}")
    if noise:
        section.paragraphs.append("Noise references (uniform attention): " + ", ".join(noise) + ".")
    for ref in depth_profile_figures(agg, figures_dir, metrics=[p.metric for p in depth]):
        section.figures.append(replace(ref, section="hypotheses", caption=f"attention: {ref.caption}"))
    epochs = sorted(e for e in run.run.spectra_files())
    if not epochs or not heads:
        return section
    last = epochs[-1]
    arrays = _spectra(run, [last], view=heads[0].view, arrays=[f"heads_{p.metric}" for p in heads])
    blocks = [p for p in run.points if p in arrays[last]]
    tables = {p.metric: panels.array_table(arrays[last], blocks, f"heads_{p.metric}") for p in heads}
    for metric, table in ((m, t) for m, t in tables.items() if t is not None):
        fig = viz.attention_heads_figure(table, blocks, title=f"{metric} per head, epoch {last}")
        path = save_figure(fig, figures_dir, f"attention_heads_{metric}")
        caption = (
            f"{metric} of every head (x) of every block (y, depth downwards) at epoch {last}"
            + (f" (run {run.name})" if several else "")
            + "; grey: undefined there"
        )
        section.figures.append(FigureRef("hypotheses", path, caption))
    return section


def _context_subsection(agg: Aggregate, points: Sequence[str]) -> Section | None:
    """First -> last value of the drift and massive-activation probes per point (None when none is recorded)."""
    metrics = [m for m in CONTEXT_METRICS if agg.mean.get(m)]
    if not metrics:
        return None
    section = Section("Context: subspace drift and massive activations", "hypotheses-context")
    section.paragraphs.append(
        "First -> last finite value per point (view all). between_image_fraction = tr C_between / tr C_all (the "
        "share of the variance between image means); subspace_overlap_prev/_init = mean cos^2 of the principal "
        "angles between the top-k eigenspace and that of the previous/first observation (1 = same subspace, k/D "
        "for random ones); massive_activation_ratio = the largest per-dimension max|x| over the median one, "
        "massive_dim_variance_share = that dimension's share of the variance. No prediction rests on these alone."
    )
    rows = []
    for p in points:
        cells = [p]
        for m in metrics:
            series = agg.mean[m].get(p)
            if series is None:
                cells.append("")
                continue
            v = np.asarray(series[1], dtype=np.float64)
            v = v[np.isfinite(v)]
            cells.append("" if v.size == 0 else f"{v[0]:.3g} -> {v[-1]:.3g}")
        if any(cells[1:]):
            rows.append(cells)
    section.tables.append(Table(["point", *metrics], rows, left=[0]))
    return section


def hypotheses_section(ctx: Context) -> list[Section]:
    """The Hypotheses section: every prediction judged on the runs (`Context.predictions`), drawn and tabulated per
    hypothesis, with the attention, CKA and context subsections; its figures go to ``ctx.figures_dir``. With one
    observation the prediction tables (all n/a) give way to one line saying why.

    Raises:
        ReportInputError: malformed records.
    """
    section = _hypotheses(ctx)
    if ctx.single:
        section.paragraphs[1:] = [
            "Only one observation is recorded, so no prediction about a change over training can be judged (each "
            "needs at least two); the verdict tables are left out and the figures show the single observation."
        ]
        section.tables.clear()
        for sub in section.subsections:
            if sub.anchor.startswith("hypothesis-"):
                sub.tables.clear()
    return [section]


def _hypotheses(ctx: Context) -> Section:
    runs, settings, figures_dir, several = ctx.runs, ctx.settings, ctx.figures_dir, ctx.several
    results, aggregates, agreement, points = ctx.predictions, ctx.aggregates, ctx.prediction_agreement, ctx.points
    what = ctx.what
    section = Section("Hypotheses: why does variance spread?", "hypotheses")
    section.paragraphs.append(
        "TGO-I ends with three hypotheses for why training spreads variance over more directions: token "
        "diversification, semantic expansion and redundancy reduction. Each makes predictions about the views of a "
        "point (all tokens, the CLS token per image, the patch tokens, the image means and the tokens around their "
        "image mean) and about the probe metrics; they are declared in tgo/report/hypotheses.py and explained in "
        "docs/hypotheses.md."
    )
    section.paragraphs.append(
        f"Each prediction is judged on {what} at every point it is about, with the findings' rule "
        f"({settings.describe()}): consistent = the last window moved the predicted way from the first beyond the "
        f"threshold (z = {settings.z:g}, Student-t widened) of its combined standard error U = sqrt(J^2 + T^2), "
        "J the paired jackknife term and T the training-noise term (columns 'terms'), and its Benjamini-Hochberg "
        f"q-value over every prediction row is at most {settings.fdr:g}; inconsistent = it moved the other way by as "
        "much; inconclusive = neither, or no uncertainty; n/a = fewer than two finite observations. A row whose note "
        "says 'training noise not estimated' is judged on the jackknife alone: a statement about this run on these "
        "images. The hypotheses are not exclusive and share some predictions, so the counts below are evidence for "
        "or against each prediction at each point, not a verdict on a hypothesis."
    )
    if not any(results.values()):
        section.paragraphs.append(_NOT_RECORDED_TEXT)
        section.subsections.append(_cka_subsection(runs[0], figures_dir, several))
        return section

    section.paragraphs.append(
        "The verdict counts of every prediction are under 'Verdicts at a glance' at the top of the page; each "
        "hypothesis below draws its predictions first, then folds the table of every judged point."
    )
    band = "±1 paired jackknife standard error of each window mean" + (
        f" (of the mean over {len(runs)} runs)" if several else ""
    )
    for hypothesis in HYPOTHESES.values():
        sub = Section(hypothesis.title, f"hypothesis-{hypothesis.key.replace('_', '-')}", figures_first=True)
        sub.paragraphs.append(f"Hypothesis: {hypothesis.statement}")
        sub.paragraphs.append(f"What would contradict it: {hypothesis.contradicted_by}")
        mine = {p: r for p, r in results.items() if p.hypothesis == hypothesis.key}
        sub.tables.append(
            Table(
                ["prediction", "points", "why", "verdicts", "undefined at"],
                [
                    [
                        p.statement,
                        p.points,
                        p.reasoning,
                        summary_text(r),
                        ", ".join(_undefined_points(p, aggregates, points)),
                    ]
                    for p, r in mine.items()
                ],
                left=[0, 1, 2, 3, 4],
            )
        )
        drawn = [p for p, r in mine.items() if r]
        if drawn:
            profiles = [_profile(p, mine[p], aggregates[p.view]) for p in drawn]
            fig = profiles_figure(profiles, title=hypothesis.title, band=band)
            path = save_figure(fig, figures_dir, f"hypothesis_{hypothesis.key}")
            sub.figures.append(
                FigureRef("hypotheses", path, _profiles_caption(hypothesis.title, profiles, band), wide=True)
            )
        for p, judged_points in mine.items():
            if judged_points:
                sub.tables.append(_point_table(p, judged_points, agreement, len(runs)))
        section.subsections.append(sub)
    section.subsections.append(_attention_subsection(runs[0], aggregates, figures_dir, several))
    section.subsections.append(_cka_subsection(runs[0], figures_dir, several))
    context = _context_subsection(ctx.agg, points)
    if context is not None:
        section.subsections.append(context)
    return section
