"""The report's figures as PNG files: the page renderer of the panels TensorBoard's cards draw too (`tgo.panels`).

Which observables are drawn, and on which axis scale, is declared once (`tgo.panels.declared`), so the two renderers
never disagree. Each function returns `FigureRef` entries that `tgo.report.html` lays out; nothing here decides what a
finding is."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tgo import panels, viz
from tgo.records import DEFAULT_VIEW, layer_epoch_table
from tgo.report.aggregate import Aggregate
from tgo.report.runs import RunData
from tgo.spectral.observables import singular_values

__all__ = [
    "FigureRef",
    "correlation_figure",
    "depth_profile_figures",
    "observable_figures",
    "page_metrics",
    "save_figure",
    "spectrum_figures",
]


def page_metrics(kind: str) -> list[str]:
    """The ``all``-view observables the page draws as panels of ``kind`` (``depth`` or ``bands``), declared order."""
    return [p.metric for p in panels.declared("page", kind=kind) if p.view == DEFAULT_VIEW]


@dataclass(frozen=True)
class FigureRef:
    """One figure of the report: section, PNG path relative to the report, caption, and whether it spans the page."""

    section: str
    path: str
    caption: str
    wide: bool = False


def save_figure(fig: object, figures_dir: Path, name: str) -> str:
    """Writes ``<figures_dir>/<name>.png`` (unsafe characters replaced), closes the figure, returns the page path."""
    safe = re.sub(r"[^A-Za-z0-9_.\-]+", "_", name)
    figures_dir.mkdir(parents=True, exist_ok=True)
    viz.plain_tick_labels(fig)  # type: ignore[arg-type]
    fig.savefig(figures_dir / f"{safe}.png", format="png")  # type: ignore[attr-defined]
    viz.close(fig)  # type: ignore[arg-type]
    return f"{figures_dir.name}/{safe}.png"


def observable_figures(
    aggregate: Aggregate,
    figures_dir: Path,
    *,
    reference: Mapping[str, Mapping[str, tuple[np.ndarray, np.ndarray]]] | None = None,
    metrics: Sequence[str] | None = None,
    run_epochs: int | None = None,
    reference_differs: bool = False,
) -> list[FigureRef]:
    """Each observable against epoch (one line per point) and as a layer x epoch heatmap.

    Bands: the standard deviation over several runs, else the jackknife standard error. ``metrics`` defaults to the
    declared ``bands`` panels, read at call time so that a plug-in's observable is drawn too; the published series are
    drawn beside the run against the fraction of training, captioned as another experiment if ``reference_differs``."""
    refs: list[FigureRef] = []
    several = aggregate.n_runs > 1
    for metric in page_metrics("bands") if metrics is None else metrics:
        per_point = aggregate.mean.get(metric)
        if not per_point:
            continue
        points = [p for p in aggregate.points if p in per_point]
        series = {p: per_point[p] for p in points}
        ref = {p: reference[metric][p] for p in points if reference and p in reference.get(metric, {})} or None
        title = f"{metric}" + (f" (mean of {aggregate.n_runs} runs)" if several else "")
        bands = aggregate.bands(metric) if several else aggregate.stderr_bands(metric)
        log = viz.is_log_scale(metric)
        fig = panels.lines_figure(
            series, title=title, bands=bands or None, reference=ref, run_epochs=run_epochs, log=log
        )
        n_obs = max(len(series[p][0]) for p in points)
        colours = "colour = depth" + ("; cls black, squares" if viz.CLS_POINT in points else "")
        caption = f"{metric} against epoch, one line per point ({colours})"
        if n_obs == 1:
            caption = f"{metric} at the single observation, one marker per point ({colours})"
        if log:
            caption += "; log y axis (a ratio: the verdicts compare log ratios)"
        if several:
            caption += f"; line = mean of {aggregate.n_runs} runs, band = mean ± 1 standard deviation"
        elif bands:
            caption += "; " + ("error bar" if n_obs == 1 else "band") + " = value ± 1 jackknife standard error"
        if ref:
            caption += (
                "; right panel = published TGO-I measurements (ViT-S/16, ImageNet-100) on their own y axis, both "
                "against the fraction of training"
            )
            if reference_differs:
                caption += " (a different experiment from this one: compare shapes, not values; see the caveat)"
        refs.append(FigureRef("observables", save_figure(fig, figures_dir, f"lines_{metric}"), caption, wide=bool(ref)))
        epochs = sorted({int(e) for p in points for e in series[p][0]})
        fig = viz.layer_epoch_heatmap_figure(
            layer_epoch_table(series, points, epochs), points, epochs, title=title, log=log
        )
        refs.append(
            FigureRef(
                "heatmaps",
                save_figure(fig, figures_dir, f"layer_epoch_{metric}"),
                f"{metric}: points (depth) x epoch"
                + (" (mean over runs)" if several else "")
                + ("; log colour scale" if log else ""),
            )
        )
    return refs


def _left_out(histories: Sequence[tuple[int, np.ndarray]]) -> tuple[int, int]:
    """The most eigenvalues an epoch leaves out as round-off (non-finite ones are named separately), of how many."""
    counts = [
        (int(np.count_nonzero(np.isfinite(v)) - np.count_nonzero(viz.above_roundoff(v))), int(np.size(v)))
        for _, v in histories
    ]
    return max(counts) if counts else (0, 0)


def _roundoff_text(histories: Sequence[tuple[int, np.ndarray]]) -> str:
    left, size = _left_out(histories)
    if left == 0:
        return "no eigenvalue is at the round-off floor lambda_1 * D * eps (float64), none is left out"
    return (
        f"eigenvalues at or below lambda_1 * D * eps (float64 round-off of a rank-deficient covariance, D = {size}) "
        f"are left out: up to {left} of {size} at an epoch"
    )


def _nonfinite_text(spectra: Iterable[tuple[str, np.ndarray]]) -> str:
    """``"; non-finite, not drawn: epoch 3 (all 48)"``, so a figure missing a curve says so; ``""`` if none."""
    note = viz.nonfinite_note(spectra, most=12)
    return f"; {note}" if note else ""


def spectrum_figures(run: RunData, figures_dir: Path, *, correlation: bool = True) -> list[FigureRef]:
    """Eigenvalue and singular value histories per point (round-off left out, the class count marked), decay curves at
    the first and last epoch and, with ``correlation``, the correlation histograms, of one run's spectra files."""
    spectra = run.spectra()
    if not spectra:
        return []
    epochs = sorted(spectra)
    points = [p for p in run.points if any(p in spectra[e] for e in epochs)]
    classes = panels.class_count(run.path)
    marked = (
        f"; dashed line: C = {classes} classes (the analysis subset's class count: class-structured vectors such as "
        f"the CLS token's have a kink near C eigenvalues)"
        if classes
        else ""
    )
    refs: list[FigureRef] = []
    for point in points:
        eig_history = [(e, spectra[e][point]["eigenvalues"]) for e in epochs if point in spectra[e]]
        fig = viz.spectrum_history_figure(eig_history, title=f"{point}: eigenvalues", classes=classes, card=False)
        roundoff = _roundoff_text(eig_history)
        nonfinite = _nonfinite_text((f"epoch {e}", v) for e, v in eig_history)
        refs.append(
            FigureRef(
                "spectra",
                save_figure(fig, figures_dir, f"eigenvalues_{point}"),
                f"{point}: covariance eigenvalues by index (log-log), one line per epoch, colour = epoch (dark = "
                f"first, yellow = last; colourbar); {roundoff}{nonfinite}{marked} (run {run.name})",
            )
        )
        sv_history = [
            (e, singular_values(spectra[e][point]["eigenvalues"], int(spectra[e][point]["n_rows"])))
            for e in epochs
            if point in spectra[e]
        ]
        keep = [viz.above_roundoff(values) for _, values in eig_history]
        title = f"{point}: singular values"
        fig = viz.spectrum_history_figure(
            sv_history, title=title, ylabel="singular value", classes=classes, keep=keep, card=False
        )
        refs.append(
            FigureRef(
                "spectra",
                save_figure(fig, figures_dir, f"singular_values_{point}"),
                f"{point}: singular values sqrt(eigenvalue), colour = epoch (colourbar)"
                + ("; those of the round-off eigenvalues are left out" if _left_out(eig_history)[0] else "")
                + nonfinite
                + f"{marked} (run {run.name})",
            )
        )
    for epoch in dict.fromkeys((epochs[0], epochs[-1])):
        decay = {p: spectra[epoch][p]["eigenvalues"] for p in points if p in spectra[epoch]}
        fig = viz.decay_curves_figure(decay, title=f"decay, epoch {epoch}", card=False)
        refs.append(
            FigureRef(
                "decay",
                save_figure(fig, figures_dir, f"decay_epoch_{epoch:04d}"),
                f"spectral decay lambda_i / lambda_1 at epoch {epoch} (log-log), one line per point (colour = "
                f"depth{'; cls black' if viz.CLS_POINT in decay else ''}); ratios below {viz.DECAY_FLOOR:g} "
                f"(round-off) are not drawn{_nonfinite_text(decay.items())} (run {run.name})",
            )
        )
    if correlation:
        ref = correlation_figure(run, figures_dir)
        if ref is not None:
            refs.append(ref)
    return refs


def correlation_figure(run: RunData, figures_dir: Path) -> FigureRef | None:
    """The ``|off-diagonal correlation|`` histograms of every point at the first and last epoch that stored covariances
    (each panel's mean is the recorded ``mean_abs_offdiag_correlation``), or ``None``."""
    spectra = run.spectra()
    epochs = sorted(spectra)
    with_cov = [e for e in epochs if any("covariance" in arrays for arrays in spectra[e].values())]
    if not with_cov:
        return None
    chosen = list(dict.fromkeys(with_cov[:1] + with_cov[-1:]))
    panels: dict[str, dict[str, np.ndarray]] = {}
    for point in run.points:
        found = {
            f"epoch {e}": spectra[e][point]["covariance"]
            for e in chosen
            if "covariance" in spectra[e].get(point, {}) and np.all(np.isfinite(spectra[e][point]["covariance"]))
        }
        if found:
            panels[point] = found
    if not panels:
        return None
    which = " and ".join(str(e) for e in chosen)
    fig = viz.correlation_histograms_figure(
        panels, title=f"|off-diagonal correlation| of feature pairs, epoch {which} (run {run.name})"
    )
    dims = sorted({int(np.shape(c)[0]) for found in panels.values() for c in found.values()})
    caption = (
        f"How correlated the features are, per point: the histogram of |corr_ij| over every pair i != j of the "
        f"{'/'.join(str(d) for d in dims)} features at epoch {chosen[0]}"
        + (f" (orange) and epoch {chosen[-1]} (dark blue outline)" if len(chosen) > 1 else "")
        + " (share of pairs per bin; features without variance left out); dashed lines and the panel's text: the "
        "mean |r|, which is the recorded observable mean_abs_offdiag_correlation (lower = less correlated features, "
        f"a covariance closer to diagonal) (run {run.name})"
    )
    return FigureRef("correlation", save_figure(fig, figures_dir, "correlation_histograms"), caption, wide=True)


def depth_profile_figures(
    aggregate: Aggregate, figures_dir: Path, *, metrics: Sequence[str] | None = None, view: str = DEFAULT_VIEW
) -> list[FigureRef]:
    """Each observable against depth, one line per observed epoch, with the bands of `observable_figures`."""
    refs: list[FigureRef] = []
    several = aggregate.n_runs > 1
    for metric in page_metrics("depth") if metrics is None else metrics:
        per_point = aggregate.mean.get(metric)
        if not per_point:
            continue
        points = [p for p in aggregate.points if p in per_point]
        epochs = sorted({int(e) for p in points for e in per_point[p][0]})
        bands = aggregate.bands(metric) if several else aggregate.stderr_bands(metric)
        half_widths = {p: (per_point[p][0], (high - low) / 2.0) for p, (low, high) in bands.items() if p in per_point}
        values = layer_epoch_table(per_point, points, epochs)
        if not np.isfinite(values).any():
            continue  # recorded but undefined everywhere (e.g. a per-class metric with too few images per class)
        se = layer_epoch_table(half_widths, points, epochs)
        profiles = {epoch: (values[:, j], se[:, j]) for j, epoch in enumerate(epochs)}
        shown = metric if view == DEFAULT_VIEW else f"{metric} (view {view})"
        title = shown + (f" (mean of {aggregate.n_runs} runs)" if several else "")
        log = viz.is_log_scale(metric)
        fig = panels.depth_figure(profiles, points, title=title, log=log)
        band = "mean ± 1 standard deviation over runs" if several else "value ± 1 jackknife standard error"
        refs.append(
            FigureRef(
                "depth",
                save_figure(fig, figures_dir, f"depth_{metric}" if view == DEFAULT_VIEW else f"depth_{view}_{metric}"),
                f"{shown} against depth (points in depth order), one line per observed epoch, colour = epoch "
                f"(colourbar); band = {band} where recorded"
                + (
                    "; cls (bold, square markers) is the final CLS token, not a block"
                    if viz.CLS_POINT in points
                    else ""
                )
                + ("; log y axis" if log else ""),
            )
        )
    return refs
