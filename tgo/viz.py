"""Matplotlib figures shared by the geometry callback (TensorBoard) and the report (PNG files).

Every function returns a ``matplotlib.figure.Figure`` built with the object API (no pyplot state, so importing this
module never selects a backend for the user's process): figures can be made from callbacks and worker threads,
rendered by TensorBoard's Agg canvas or ``fig.savefig`` and closed deterministically by the caller (``close(fig)``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Colormap, Normalize
from matplotlib.figure import Figure
from numpy.typing import ArrayLike

SMALL = (4.5, 3.4)
EPOCH_CMAP = "viridis"
"""Epoch colour ramp: dark purple (first observation) to yellow (last); every use draws a colourbar."""
CARD_FONTSIZE = 16.0
"""Text size (pt) of figures made for a TensorBoard card, which shows a 480 px wide image at ~60-75 % of its width."""


def close(fig: Figure) -> None:
    """Releases a figure's memory (object-API figures are not tracked by pyplot, clearing is enough)."""
    fig.clear()


def render_rgb(fig: Figure) -> np.ndarray:
    """The figure drawn by its own Agg canvas, as an RGB ``uint8`` image ``(H, W, 3)``; then cleared (`close`).

    Thread-safe where pyplot is not: no global figure manager, no backend switch (TensorBoard's ``add_figure``
    imports pyplot). The background figure worker writes this with ``add_image(..., dataformats="HWC")``.
    """
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    image = np.asarray(canvas.buffer_rgba())[..., :3].copy()
    close(fig)
    return image


def _positive(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """1-based indices and values of the spectrum above its numerical floor, for log axes.

    Eigenvalues below ``lambda_max * n * eps`` (float64) are zero to working precision: a rank-deficient covariance
    (fewer rows than features, a constant embedding) returns them as +-1e-17 round-off, which would stretch a log
    axis over 15 empty decades. They are left out, like non-positive and non-finite values.
    """
    values = np.asarray(values, dtype=np.float64)
    index = np.arange(1, values.size + 1)
    finite = np.isfinite(values)
    top = float(np.max(values[finite])) if finite.any() else 0.0
    floor = max(top, 0.0) * values.size * np.finfo(np.float64).eps
    keep = finite & (values > floor)
    return index[keep], values[keep]


def _draw_history(ax: Any, history: Sequence[tuple[int, np.ndarray]], *, log_axes: bool) -> int:
    """Draws spectra oldest to newest, earlier ones fainter; log-scale axes, or log10 values on linear axes.

    Returns:
        The number of observations in ``history``.
    """
    count = len(history)
    cmap = matplotlib.colormaps["viridis"]
    for i, (epoch, values) in enumerate(history):
        x, y = _positive(values)
        if y.size == 0:
            continue
        position = (i + 1) / count
        style = dict(
            color=cmap(position),
            alpha=0.25 + 0.75 * position,
            lw=1.6 if i == count - 1 else 0.9,
            label=f"epoch {epoch}" if i in (0, count - 1) else None,
        )
        if log_axes:
            ax.loglog(x, y, **style)
        else:
            ax.plot(np.log10(x), np.log10(y), **style)
    return count


def spectrum_history_figure(
    history: Sequence[tuple[int, np.ndarray]], *, title: str, ylabel: str = "eigenvalue"
) -> Figure:
    """Log-log rank plot of spectra over observations; earlier observations are drawn fainter.

    Args:
        history: ``(epoch, values)`` pairs in epoch order; values sorted descending.
        title: Figure title (usually the point name).
        ylabel: Y-axis label (eigenvalue or singular value).
    """
    fig = Figure(figsize=SMALL, dpi=90)
    ax = fig.add_subplot()
    count = _draw_history(ax, history, log_axes=True)
    ax.set_xlabel("index i")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.2)
    if count:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def decay_curves_figure(spectra: Mapping[str, np.ndarray], *, title: str) -> Figure:
    """Spectral decay ``lambda_i / lambda_1`` per point at one observation, one line per point (depth coloured).

    Plotted as log10 values on linear axes (cheap to render, same picture as a log-log plot).
    """
    fig = Figure(figsize=(5.5, 3.8), dpi=90)
    fig.subplots_adjust(left=0.12, right=0.78, bottom=0.13, top=0.92)
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["plasma"]
    names = list(spectra)
    for i, name in enumerate(names):
        x, y = _positive(spectra[name])
        if y.size:
            ax.plot(np.log10(x), np.log10(y / y[0]), color=cmap(i / max(len(names) - 1, 1)), lw=1.0, label=name)
    ax.set_xlabel("log10 index i")
    ax.set_ylabel(r"log10 $\lambda_i / \lambda_1$")
    ax.set_title(title)
    ax.grid(True, alpha=0.2)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def correlation_from_covariance(cov: np.ndarray) -> np.ndarray:
    """Correlation matrix of a covariance; dimensions with zero variance get zero correlation (not NaN)."""
    cov = np.asarray(cov, dtype=np.float64)
    std = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    scale = np.where(std > 0, 1.0 / np.where(std > 0, std, 1.0), 0.0)
    return cov * scale[:, None] * scale[None, :]


def correlation_heatmap_figure(cov: np.ndarray, *, title: str, max_dim: int = 384) -> Figure:
    """Heatmap of the feature correlation matrix (the paper's 'covariance becomes diagonal' view).

    Args:
        cov: Covariance matrix [D, D].
        title: Figure title.
        max_dim: Show at most the first ``max_dim`` features (rendering cost grows with D^2).
    """
    corr = correlation_from_covariance(cov)[:max_dim, :max_dim]
    fig = Figure(figsize=(4.2, 3.6), dpi=90)
    ax = fig.add_subplot()
    image = ax.imshow(corr, cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set_title(title)
    ax.set_xlabel("feature")
    ax.set_ylabel("feature")
    fig.tight_layout()
    return fig


def layer_epoch_heatmap_figure(
    values: np.ndarray, points: Sequence[str], epochs: Sequence[int], *, title: str
) -> Figure:
    """Heatmap of one observable with points (depth) on the y axis and epochs on the x axis.

    Args:
        values: Array [len(points), len(epochs)], NaN where missing.
        points: Point names in depth order.
        epochs: Observed epochs.
        title: The observable's name.
    """
    fig = Figure(figsize=(max(4.0, 0.35 * len(epochs) + 2.5), max(3.0, 0.25 * len(points) + 1.2)), dpi=90)
    ax = fig.add_subplot()
    image = ax.imshow(np.asarray(values, dtype=np.float64), aspect="auto", cmap="magma", interpolation="nearest")
    fig.colorbar(image, ax=ax)
    ax.set_yticks(range(len(points)), labels=list(points), fontsize=6)
    step = max(1, len(epochs) // 12)
    ax.set_xticks(range(0, len(epochs), step), labels=[str(e) for e in list(epochs)[::step]], fontsize=7)
    ax.set_xlabel("epoch")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def observable_lines_figure(
    series: Mapping[str, tuple[ArrayLike, ArrayLike]],
    *,
    title: str,
    bands: Mapping[str, tuple[ArrayLike, ArrayLike]] | None = None,
    reference: Mapping[str, tuple[ArrayLike, ArrayLike]] | None = None,
) -> Figure:
    """One observable against epoch, one line per point, optional spread bands and dashed reference lines.

    Args:
        series: point -> (epochs, values).
        title: The observable's name.
        bands: point -> (low, high) per epoch (for multi-run aggregates).
        reference: point -> (epochs, values) drawn dashed (e.g. the published TGO-I measurements).
    """
    fig = Figure(figsize=(6.0, 4.0), dpi=90)
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["plasma"]
    names = list(series)
    for i, name in enumerate(names):
        color = cmap(i / max(len(names) - 1, 1))
        epochs, values = series[name]
        ax.plot(epochs, values, color=color, lw=1.2, label=name)
        if bands and name in bands:
            low, high = bands[name]
            ax.fill_between(epochs, low, high, color=color, alpha=0.15, lw=0)
        if reference and name in reference:
            ref_epochs, ref_values = reference[name]
            ax.plot(ref_epochs, ref_values, color=color, lw=0.8, ls="--")
    ax.set_xlabel("epoch")
    ax.set_title(title + (" (dashed: reference)" if reference else ""))
    ax.grid(True, alpha=0.2)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


def _grid(count: int) -> tuple[int, int]:
    columns = min(4, max(count, 1))
    return -(-max(count, 1) // columns), columns


def spectra_grid_figure(
    histories: Mapping[str, Sequence[tuple[int, np.ndarray]]], *, ylabel: str = "eigenvalue"
) -> Figure:
    """All points' spectrum histories in one figure (one log-log panel per point, earlier epochs fainter).

    One figure per observation instead of one per point keeps TensorBoard logging cheap and shows the depth
    progression at a glance. Panels plot log10 values on linear axes: matplotlib's log-scale tick machinery costs
    ~0.1 s per panel to render, which dominated the observation's logging time.
    """
    rows, columns = _grid(len(histories))
    fig = Figure(figsize=(3.0 * columns, 2.3 * rows), dpi=80)
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.06, top=0.95, wspace=0.25, hspace=0.5)
    for panel, (name, history) in enumerate(histories.items()):
        ax = fig.add_subplot(rows, columns, panel + 1)
        _draw_history(ax, history, log_axes=False)
        epochs = f" (epochs {history[0][0]}..{history[-1][0]})" if history else ""
        ax.set_title(name + epochs, fontsize=8)
        ax.tick_params(labelsize=6)
        ax.grid(True, alpha=0.2)
        if panel % columns == 0:
            ax.set_ylabel(f"log10 {ylabel}", fontsize=7)
        if panel >= len(histories) - columns:
            ax.set_xlabel("log10 index", fontsize=7)
    return fig


def correlation_image(cov: np.ndarray, *, max_dim: int = 384) -> np.ndarray:
    """The correlation matrix as an RGB image (H, W, 3) uint8 in the RdBu_r map over [-1, 1], one pixel per entry.

    Rendered with numpy instead of a matplotlib figure: exact pixels and about a millisecond instead of 150 ms.
    """
    corr = correlation_from_covariance(cov)[:max_dim, :max_dim]
    rgba = matplotlib.colormaps["RdBu_r"]((np.clip(corr, -1.0, 1.0) + 1.0) / 2.0)
    return (rgba[..., :3] * 255).round().astype(np.uint8)


def layer_epoch_grid_figure(tables: Mapping[str, np.ndarray], points: Sequence[str], epochs: Sequence[int]) -> Figure:
    """One layer x epoch heatmap panel per observable (points on y, epochs on x), in a single figure."""
    rows, columns = _grid(len(tables))
    fig = Figure(figsize=(3.6 * columns, 0.18 * len(points) * rows + 1.2 * rows), dpi=80)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.08, top=0.94, wspace=0.3, hspace=0.35)
    step = max(1, len(epochs) // 8)
    for panel, (metric, values) in enumerate(tables.items()):
        ax = fig.add_subplot(rows, columns, panel + 1)
        image = ax.imshow(np.asarray(values, dtype=np.float64), aspect="auto", cmap="magma", interpolation="nearest")
        fig.colorbar(image, ax=ax)
        ax.set_yticks(range(len(points)), labels=list(points) if panel % columns == 0 else [], fontsize=5)
        ax.set_xticks(range(0, len(epochs), step), labels=[str(e) for e in list(epochs)[::step]], fontsize=6)
        ax.set_title(metric, fontsize=8)
    return fig


def epoch_colours(epochs: Sequence[int]) -> tuple[Normalize, Colormap]:
    """The normalisation and colour map of an epoch ramp (a single epoch gets the middle of the ramp)."""
    low, high = (float(min(epochs)), float(max(epochs))) if epochs else (0.0, 1.0)
    if low == high:
        low, high = low - 0.5, high + 0.5
    return Normalize(vmin=low, vmax=high), matplotlib.colormaps[EPOCH_CMAP]


def epoch_colourbar(
    fig: Figure, ax: Any, norm: Normalize, cmap: Colormap, epochs: Sequence[int], *, fontsize: float | None = None
) -> None:
    """A colourbar labelled ``epoch`` with at most ~8 integer ticks, always including the last observed epoch."""
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, pad=0.02)
    bar.set_label("epoch", fontsize=fontsize)
    ticks = sorted(set(epochs))
    shown = ticks[:: -(-len(ticks) // 8)] if ticks else []
    if ticks and shown[-1] != ticks[-1]:
        shown.append(ticks[-1])
    bar.set_ticks(shown)
    bar.set_ticklabels([str(t) for t in shown])
    if fontsize is not None:
        bar.ax.tick_params(labelsize=fontsize * 0.85)


def depth_profile_figure(
    profiles: Mapping[int, tuple[np.ndarray, np.ndarray]],
    points: Sequence[str],
    *,
    title: str,
    fontsize: float | None = None,
) -> Figure:
    """An observable against depth (points in depth order on x), one line per epoch on the epoch colour ramp.

    The figure that tells TGO's depth story at a glance: how each observation's profile over the layers moves as
    training goes on. The report embeds it at page width (matplotlib's default text); TensorBoard shows it on a
    card less than half its pixel width, so the callback passes ``fontsize=CARD_FONTSIZE``, which also draws a
    smaller canvas, thicker lines, every second point label when there are many points and no x-axis label.

    Args:
        profiles: epoch -> (values [P], standard errors [P], NaN where none) over ``points``; a band of
            +-1 standard error is drawn where it is finite.
        points: Point names in depth order.
        title: The observable's name.
        fontsize: Text size for every label (``None``: matplotlib's defaults, point labels at 7 pt).
    """
    card = fontsize is not None
    small = None if fontsize is None else 0.85 * fontsize  # tick labels
    fig = Figure(figsize=(6.0, 4.0) if card else (max(6.0, 0.38 * len(points) + 2.5), 4.0), dpi=80 if card else 90)
    ax = fig.add_subplot()
    epochs = sorted(profiles)
    norm, cmap = epoch_colours(epochs)
    x = np.arange(len(points))
    for epoch in epochs:
        values, se = (np.asarray(a, dtype=np.float64) for a in profiles[epoch])
        color = cmap(norm(epoch))
        ax.plot(x, values, color=color, lw=2.2 if card else 1.2, marker="o", ms=5 if card else 3)
        if np.any(np.isfinite(se)):
            ax.fill_between(x, values - se, values + se, color=color, alpha=0.2, lw=0)
    step = 2 if card and len(points) > 10 else 1
    labels = [name if i % step == 0 or i == len(points) - 1 else "" for i, name in enumerate(points)]
    ax.set_xticks(x, labels=labels, rotation=45 if card else 60, ha="right", fontsize=small or 7)
    if not card:  # on a card the point names say it, and the axis label would squeeze the plot
        ax.set_xlabel("point (depth order)")
    ax.set_title(title, fontsize=None if fontsize is None else 1.15 * fontsize)
    ax.tick_params(axis="y", labelsize=small)
    ax.grid(True, alpha=0.25)
    epoch_colourbar(fig, ax, norm, cmap, epochs, fontsize=fontsize)
    fig.tight_layout()
    return fig
