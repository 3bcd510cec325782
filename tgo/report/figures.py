"""The report's figures as PNG files, drawn with the same `tgo.viz` functions the callback sends to TensorBoard.

Each function writes files under ``<report>/figures/`` and returns `FigureRef` entries (path relative to the
report, caption) that `tgo.report.html` lays out. Which observables are drawn is the catalogue's ``charted`` flag
(`tgo.spectral.catalogue.CATALOGUE`), the same one TensorBoard's charts read, so the two never disagree. Nothing
here decides what a finding is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tgo import viz
from tgo.records import layer_epoch_table
from tgo.report import plots
from tgo.report.aggregate import Aggregate
from tgo.report.runs import RunData
from tgo.spectral.catalogue import CATALOGUE
from tgo.spectral.observables import singular_values

__all__ = [
    "DEPTH_PROFILE_METRICS",
    "FigureRef",
    "depth_profile_figures",
    "observable_figures",
    "save_figure",
    "spectrum_figures",
]

DEPTH_PROFILE_METRICS: tuple[str, ...] = (
    "effective_rank",
    "participation_ratio",
    "stable_rank",
    "spectral_anisotropy",
    "spectral_entropy",
    "spectral_flatness",
)
"""The observables drawn against depth (those recorded), in this order."""


@dataclass(frozen=True)
class FigureRef:
    """One figure of the report.

    Attributes:
        section: Which report section it belongs to.
        path: PNG path relative to the report directory (``figures/<name>.png``).
        caption: What it shows, including how bands and overlays were made.
        wide: Shown at the page's width (a grid of panels) instead of a grid cell's.
    """

    section: str
    path: str
    caption: str
    wide: bool = False


def save_figure(fig: object, figures_dir: Path, name: str) -> str:
    """Writes ``<figures_dir>/<name>.png`` (unsafe characters replaced), closes the figure, returns the page path."""
    safe = re.sub(r"[^A-Za-z0-9_.\-]+", "_", name)
    figures_dir.mkdir(parents=True, exist_ok=True)
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

    Bands: for several runs, the mean ± 1 standard deviation over runs; for one run, the value ± 1 jackknife
    standard error where the records hold one (none otherwise).

    Args:
        aggregate: The runs' mean (a single run is its own mean).
        figures_dir: Where PNGs go.
        reference: Published series, drawn in a panel of their own against the fraction of training (only for
            observables it holds).
        metrics: Observables to draw, in this order; those not recorded are skipped. Default: the catalogue's
            charted observables in record order, read at call time so that an observable registered by a plug-in
            is drawn too.
        run_epochs: The runs' planned epochs: with ``reference``, the run is drawn against the fraction of
            training too.
        reference_differs: The runs are not the published experiment (`tgo.report.reference.reference_caveat`):
            the captions say to compare shapes, not values.

    Returns:
        Two `FigureRef` per drawn observable (lines, heatmap).
    """
    refs: list[FigureRef] = []
    several = aggregate.n_runs > 1
    for metric in CATALOGUE.charted if metrics is None else metrics:
        per_point = aggregate.mean.get(metric)
        if not per_point:
            continue
        points = [p for p in aggregate.points if p in per_point]
        series = {p: per_point[p] for p in points}
        ref = {p: reference[metric][p] for p in points if reference and p in reference.get(metric, {})} or None
        title = f"{metric}" + (f" (mean of {aggregate.n_runs} runs)" if several else "")
        bands = aggregate.bands(metric) if several else aggregate.stderr_bands(metric)
        fig = plots.lines_figure(series, title=title, bands=bands or None, reference=ref, run_epochs=run_epochs)
        n_obs = max(len(series[p][0]) for p in points)
        caption = f"{metric} against epoch, one line per point (colour = depth)"
        if n_obs == 1:
            caption = f"{metric} at the single observation, one marker per point (colour = depth)"
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
        fig = viz.layer_epoch_heatmap_figure(layer_epoch_table(series, points, epochs), points, epochs, title=title)
        refs.append(
            FigureRef(
                "heatmaps",
                save_figure(fig, figures_dir, f"layer_epoch_{metric}"),
                f"{metric}: points (depth) x epoch" + (" (mean over runs)" if several else ""),
            )
        )
    return refs


def spectrum_figures(
    run: RunData, figures_dir: Path, *, heatmap_max_dim: int = 192, correlation: bool = True
) -> list[FigureRef]:
    """Spectra over epochs, decay curves and correlation heatmaps of one run (from its spectra files).

    Args:
        run: The run (for several runs, the report draws the first one's spectra).
        figures_dir: Where PNGs go.
        heatmap_max_dim: Show at most this many features in correlation heatmaps.
        correlation: Draw correlation heatmaps where covariances were stored (first and last observation).

    Returns:
        Per point eigenvalue and singular value histories, decay curves at the first and last epoch, and
        correlation heatmaps at the first and last epoch that stored covariances.
    """
    spectra = run.spectra()
    if not spectra:
        return []
    epochs = sorted(spectra)
    points = [p for p in run.points if any(p in spectra[e] for e in epochs)]
    refs: list[FigureRef] = []
    for point in points:
        eig_history = [(e, spectra[e][point]["eigenvalues"]) for e in epochs if point in spectra[e]]
        fig = plots.spectrum_history_figure(eig_history, title=f"{point}: eigenvalues")
        refs.append(
            FigureRef(
                "spectra",
                save_figure(fig, figures_dir, f"eigenvalues_{point}"),
                f"{point}: covariance eigenvalues by index (log-log), one line per epoch, colour = epoch (dark = "
                f"first, yellow = last; colourbar) (run {run.name})",
            )
        )
        sv_history = [
            (e, singular_values(spectra[e][point]["eigenvalues"], int(spectra[e][point]["n_rows"])))
            for e in epochs
            if point in spectra[e]
        ]
        fig = plots.spectrum_history_figure(sv_history, title=f"{point}: singular values", ylabel="singular value")
        refs.append(
            FigureRef(
                "spectra",
                save_figure(fig, figures_dir, f"singular_values_{point}"),
                f"{point}: singular values sqrt(eigenvalue), colour = epoch (colourbar) (run {run.name})",
            )
        )
    for epoch in dict.fromkeys((epochs[0], epochs[-1])):
        decay = {p: spectra[epoch][p]["eigenvalues"] for p in points if p in spectra[epoch]}
        fig = plots.decay_figure(decay, title=f"decay, epoch {epoch}")
        refs.append(
            FigureRef(
                "decay",
                save_figure(fig, figures_dir, f"decay_epoch_{epoch:04d}"),
                f"spectral decay lambda_i / lambda_1 at epoch {epoch} (log-log), one line per point (colour = "
                f"depth); ratios below {plots.DECAY_FLOOR:g} (round-off) are not drawn (run {run.name})",
            )
        )
    if correlation:
        with_cov = [e for e in epochs if any("covariance" in arrays for arrays in spectra[e].values())]
        for epoch in dict.fromkeys(with_cov[:1] + with_cov[-1:]):
            for point in points:
                cov = spectra[epoch].get(point, {}).get("covariance")
                if cov is None or not np.all(np.isfinite(cov)):
                    continue
                fig = viz.correlation_heatmap_figure(
                    cov, title=f"{point} correlation, epoch {epoch}", max_dim=heatmap_max_dim
                )
                shown = min(int(cov.shape[0]), heatmap_max_dim)
                which = f"all {shown}" if shown == cov.shape[0] else f"first {shown} of {cov.shape[0]}"
                refs.append(
                    FigureRef(
                        "correlation",
                        save_figure(fig, figures_dir, f"correlation_{point}_{epoch:04d}"),
                        f"{point}: feature correlation at epoch {epoch} ({which} features; run {run.name})",
                    )
                )
    return refs


def depth_profile_figures(
    aggregate: Aggregate, figures_dir: Path, *, metrics: Sequence[str] = DEPTH_PROFILE_METRICS
) -> list[FigureRef]:
    """Each main observable against depth, one line per observed epoch (colourbar), ±1 standard error bands.

    The band is the jackknife standard error for one run, the standard deviation over runs for several (as on the
    epoch figures); none where neither exists.
    """
    refs: list[FigureRef] = []
    several = aggregate.n_runs > 1
    for metric in metrics:
        per_point = aggregate.mean.get(metric)
        if not per_point:
            continue
        points = [p for p in aggregate.points if p in per_point]
        epochs = sorted({int(e) for p in points for e in per_point[p][0]})
        bands = aggregate.bands(metric) if several else aggregate.stderr_bands(metric)
        half_widths = {p: (per_point[p][0], (high - low) / 2.0) for p, (low, high) in bands.items() if p in per_point}
        values = layer_epoch_table(per_point, points, epochs)
        se = layer_epoch_table(half_widths, points, epochs)
        profiles = {epoch: (values[:, j], se[:, j]) for j, epoch in enumerate(epochs)}
        title = metric + (f" (mean of {aggregate.n_runs} runs)" if several else "")
        fig = plots.depth_profile_figure(profiles, points, title=title)
        band = "mean ± 1 standard deviation over runs" if several else "value ± 1 jackknife standard error"
        refs.append(
            FigureRef(
                "depth",
                save_figure(fig, figures_dir, f"depth_{metric}"),
                f"{metric} against depth (points in depth order), one line per observed epoch, colour = epoch "
                f"(colourbar); band = {band} where recorded",
            )
        )
    return refs
