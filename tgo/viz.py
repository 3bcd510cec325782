"""Matplotlib figures shared by the geometry callback (TensorBoard) and the report (PNG files).

Every function returns a ``matplotlib.figure.Figure`` built with the object API (no pyplot state, so importing this
module never selects a backend for the user's process): figures can be made from callbacks and worker threads,
rendered by TensorBoard's Agg canvas or ``fig.savefig`` and closed deterministically by the caller (``close(fig)``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Colormap, Normalize
from matplotlib.figure import Figure
from numpy.typing import ArrayLike

EPOCH_CMAP = "viridis"
"""Epoch colour ramp: dark purple (first observation) to yellow (last); every use draws a colourbar."""
CARD_FONTSIZE = 16.0
"""Text size (pt) of figures made for a TensorBoard card; tick labels are 0.85 of it (13.6 pt, ~15 px drawn)."""
CARD_FIGSIZE = (6.0, 3.0)
CARD_DPI = 80
"""A card figure is ``CARD_FIGSIZE * CARD_DPI`` = 480 x 240 px. TensorBoard's Time Series fits an image into a
~450 x 210 px box (the card's width, a fixed height), so what sets the on-screen text size is the image's *height*:
a 2:1 card is shown at ~90 % (tick labels ~13 px on screen), where a 3:2 one of the same width is shown at ~65 %
and a 15-panel grid at ~25 % (6 pt text became ~2 px). The depth profiles keep 480 x 320 px: their rotated point
names need the height."""
CARD_PIXELS = 240
"""Least side (px) of a correlation card: smaller matrices are enlarged by a whole factor (every entry a square).

TensorBoard's Time Series fits an image into a ~450 x 210 px box, so a card taller than ~240 px is shrunk, and its
text with it; 240 px keeps the colour scale's labels at about their drawn size."""


def close(fig: Figure) -> None:
    """Releases a figure's memory (object-API figures are not tracked by pyplot, clearing is enough)."""
    fig.clear()


def render_rgb(fig: Figure) -> np.ndarray:
    """The figure drawn by its own Agg canvas, as an RGB ``uint8`` image ``(H, W, 3)``; then cleared (`close`).

    Thread-safe where pyplot is not: no global figure manager, no backend switch (TensorBoard's ``add_figure``
    imports pyplot). The background figure worker writes this with ``add_image(..., dataformats="HWC")``.
    """
    image = _rgb(fig)
    close(fig)
    return image


def _rgb(fig: Figure) -> np.ndarray:
    """`render_rgb` without closing: for a figure that is drawn again with other data (`spectrum_cards`)."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


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


def _draw_history(
    ax: Any, history: Sequence[tuple[int, np.ndarray]], norm: Normalize, cmap: Colormap, *, lw: float = 1.0
) -> None:
    """Draws spectra as log10 values on linear axes, one line per epoch on the epoch ramp, the latest one thicker.

    log10 values on linear axes instead of log-scale axes: matplotlib's log-scale tick machinery costs ~0.1 s per
    axes to render, which dominated an observation's figure time; the picture is the same. The colour says the
    epoch (read on the colourbar the caller draws with ``norm`` and ``cmap``), not a legend: with ~8 observations
    a legend would cover the spectra at a card's text size.
    """
    for i, (epoch, values) in enumerate(history):
        x, y = _positive(values)
        if y.size == 0:
            continue
        latest = i == len(history) - 1
        ax.plot(
            np.log10(x),
            np.log10(y),
            color=cmap(norm(epoch)),
            lw=2.0 * lw if latest else lw,
            marker="o" if y.size == 1 else None,  # a single eigenvalue is a point, not a line
            zorder=3 if latest else 2,
        )


def _card_axes(fig: Figure, *, left: int = 72, right: int = 90) -> tuple[Any, Any]:
    """The plot and colourbar axes of a card figure, at fixed pixel margins (no ``tight_layout``).

    ``tight_layout`` draws the whole figure once more to measure its text, which would nearly double a card's
    rendering time; a card's pixel size and text size are fixed, so fixed margins fit its labels. ``left`` is the
    room for the y tick and axis labels, ``right`` that for the colourbar's tick and axis labels (px).
    """
    width, height = (size * fig.dpi for size in fig.get_size_inches())
    bottom, top, bar, gap = 50, 30, 14, 10  # x ticks + x label; title; colourbar width and its gap to the plot
    plot_height = (height - bottom - top) / height
    ax = fig.add_axes((left / width, bottom / height, (width - left - right - bar - gap) / width, plot_height))
    cax = fig.add_axes(((width - right - bar) / width, bottom / height, bar / width, plot_height))
    return ax, cax


def _card_colourbar(
    fig: Figure, cax: Any, norm: Normalize, cmap: Colormap, ticks: Sequence[float], labels: Sequence[str], label: str
) -> None:
    """A colourbar on ``cax`` with the given ticks and labels at the card's text size."""
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), cax=cax)
    bar.set_ticks(list(ticks))
    bar.set_ticklabels(list(labels))
    bar.set_label(label, fontsize=CARD_FONTSIZE)
    bar.ax.tick_params(labelsize=0.85 * CARD_FONTSIZE)


def _thin(count: int, most: int) -> list[int]:
    """Indices of at most ~``most`` of ``count`` tick labels, evenly spaced, always the first and the last.

    The last is the one a reader looks for (the latest epoch, the CLS token); if the even spacing would put a
    label right before it, that label gives way, so two labels never overlap.
    """
    if count <= 0:
        return []
    step = -(-count // most)
    shown = list(range(0, count, step))
    if shown[-1] != count - 1:
        if count - 1 - shown[-1] <= step // 2 and len(shown) > 1:
            shown[-1] = count - 1
        else:
            shown.append(count - 1)
    return shown


def _epoch_ticks(epochs: Sequence[int], most: int = 6) -> list[int]:
    """At most ~``most`` of the observed epochs for a card's colourbar or axis (`_thin`)."""
    ticks = sorted(set(epochs))
    return [ticks[i] for i in _thin(len(ticks), most)]


def spectrum_history_figure(
    history: Sequence[tuple[int, np.ndarray]], *, title: str, ylabel: str = "eigenvalue"
) -> Figure:
    """One point's spectra over the observed epochs, a TensorBoard card (log10 rank plot, epoch colourbar).

    The callback logs one per point (``spectra/<NN>_<point>``, drawn by `spectrum_cards`) rather than all points
    in one grid: a 15-panel grid shrunk to a card's width has 6 pt text, a card per point keeps ``CARD_FONTSIZE``.

    Args:
        history: ``(epoch, values)`` pairs in epoch order; values sorted descending.
        title: Figure title (usually the point name).
        ylabel: What the values are (eigenvalue or singular value).
    """
    card = _SpectrumCard([epoch for epoch, _ in history], ylabel)
    card.draw(history, title)
    return card.fig


def spectrum_cards(
    histories: Mapping[str, Sequence[tuple[int, np.ndarray]]], *, ylabel: str = "eigenvalue"
) -> Iterator[tuple[str, np.ndarray]]:
    """Every point's `spectrum_history_figure`, rendered: ``(point, RGB image)`` in the order of ``histories``.

    The cards are drawn on one figure whose lines and title are replaced from card to card: building a card's
    axes and colourbar (and clearing them) costs about as much as drawing it, and an observation draws one card
    per point. All cards share one epoch ramp, over every epoch of ``histories``, so a colour is the same epoch on
    every card. A generator, so that the background figure worker may pause between cards.
    """
    card = _SpectrumCard(sorted({epoch for history in histories.values() for epoch, _ in history}), ylabel)
    try:
        for name, history in histories.items():
            card.draw(history, name)
            yield name, _rgb(card.fig)
    finally:
        close(card.fig)


class _SpectrumCard:
    """A spectrum card's figure, axes and epoch colourbar, built once; `draw` replaces its lines and title."""

    def __init__(self, epochs: Sequence[int], ylabel: str) -> None:
        self.fig = Figure(figsize=CARD_FIGSIZE, dpi=CARD_DPI)
        self.ax, cax = _card_axes(self.fig, right=70)
        self.norm, self.cmap = epoch_colours(epochs)
        ticks = _epoch_ticks(epochs)
        _card_colourbar(self.fig, cax, self.norm, self.cmap, ticks, [str(t) for t in ticks], "epoch")
        _card_text(self.ax, "", "log10 index i", f"log10 {ylabel}")

    def draw(self, history: Sequence[tuple[int, np.ndarray]], title: str) -> None:
        for line in list(self.ax.lines):
            line.remove()
        _draw_history(self.ax, history, self.norm, self.cmap, lw=1.6)
        self.ax.relim()  # the limits of this card's lines only, not the union with the previous card's
        self.ax.autoscale_view()
        self.ax.set_title(title, fontsize=1.1 * CARD_FONTSIZE)


def _card_text(ax: Any, title: str, xlabel: str, ylabel: str) -> None:
    """Title, axis labels, tick labels and grid of a card's plot axes at the card's text sizes."""
    ax.set_title(title, fontsize=1.1 * CARD_FONTSIZE)
    ax.set_xlabel(xlabel, fontsize=CARD_FONTSIZE)
    ax.set_ylabel(ylabel, fontsize=CARD_FONTSIZE)
    ax.tick_params(labelsize=0.85 * CARD_FONTSIZE)
    ax.grid(True, alpha=0.25)


def decay_curves_figure(spectra: Mapping[str, np.ndarray], *, title: str) -> Figure:
    """Spectral decay ``lambda_i / lambda_1`` per point at one observation, a TensorBoard card.

    One line per point, coloured by depth (plasma: dark = patch embedding, light = CLS), read on a colourbar
    labelled with the point names: a legend of 15 names does not fit a card at a legible size. Plotted as log10
    values on linear axes (cheap to render, the same picture as a log-log plot; see `_draw_history`).

    Args:
        spectra: point -> eigenvalues (sorted descending), in depth order.
        title: Figure title (the epoch).
    """
    fig = Figure(figsize=CARD_FIGSIZE, dpi=CARD_DPI)
    ax, cax = _card_axes(fig, right=130)
    cmap = matplotlib.colormaps["plasma"]
    names = list(spectra)
    norm = Normalize(vmin=-0.5, vmax=max(len(names), 1) - 0.5)
    for i, name in enumerate(names):
        x, y = _positive(spectra[name])
        if y.size:
            ax.plot(np.log10(x), np.log10(y / y[0]), color=cmap(norm(i)), lw=1.6, label=name)
    ticks = _thin(len(names), 8)
    _card_colourbar(fig, cax, norm, cmap, ticks, [names[i] for i in ticks], "")
    bar_axis = cax.yaxis
    bar_axis.set_inverted(True)  # depth reads downwards, as in the point list
    _card_text(ax, title, "log10 index i", r"log10 $\lambda_i / \lambda_1$")
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
    values: np.ndarray, points: Sequence[str], epochs: Sequence[int], *, title: str, card: bool = False
) -> Figure:
    """Heatmap of one observable with points (depth) on the y axis and epochs on the x axis.

    The report embeds it at a grid cell's width (matplotlib's default text, every point named); the callback logs
    one per charted observable as a TensorBoard card (``card=True``, drawn by `layer_epoch_cards`): a fixed
    480 x 240 px canvas at ``CARD_FONTSIZE``, at most 8 point names and 6 epochs labelled, so that nothing is
    clipped or shrunk to 5 pt (as in the former single figure of every observable's panel).

    Args:
        values: Array [len(points), len(epochs)], NaN where missing.
        points: Point names in depth order.
        epochs: Observed epochs.
        title: The observable's name.
        card: Draw for a TensorBoard card instead of the report.
    """
    values = np.asarray(values, dtype=np.float64)
    if card:
        heatmap = _LayerEpochCard(points, epochs)
        heatmap.draw(values, title)
        return heatmap.fig
    fig = Figure(figsize=(max(4.0, 0.35 * len(epochs) + 2.5), max(3.0, 0.25 * len(points) + 1.2)), dpi=90)
    ax = fig.add_subplot()
    image = ax.imshow(values, aspect="auto", cmap="magma", interpolation="nearest")
    fig.colorbar(image, ax=ax)
    ax.set_yticks(range(len(points)), labels=list(points), fontsize=6)
    step = max(1, len(epochs) // 12)
    ax.set_xticks(range(0, len(epochs), step), labels=[str(e) for e in list(epochs)[::step]], fontsize=7)
    ax.set_xlabel("epoch")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def layer_epoch_cards(
    tables: Mapping[str, np.ndarray], points: Sequence[str], epochs: Sequence[int]
) -> Iterator[tuple[str, np.ndarray]]:
    """Every observable's layer x epoch card (`layer_epoch_heatmap_figure`), rendered: ``(metric, RGB image)``.

    Drawn on one figure whose image data, colour limits and title are replaced from card to card (see
    `spectrum_cards` for why); each card's colourbar spans its own observable's range.
    """
    heatmap = _LayerEpochCard(points, epochs)
    try:
        for metric, values in tables.items():
            heatmap.draw(np.asarray(values, dtype=np.float64), metric)
            yield metric, _rgb(heatmap.fig)
    finally:
        close(heatmap.fig)


class _LayerEpochCard:
    """A layer x epoch card's figure, heatmap and colourbar, built once; `draw` replaces its data and title."""

    def __init__(self, points: Sequence[str], epochs: Sequence[int]) -> None:
        self.fig = Figure(figsize=CARD_FIGSIZE, dpi=CARD_DPI)
        self.ax, cax = _card_axes(self.fig, left=118, right=60)
        blank = np.zeros((len(points), len(epochs)))
        self.image = self.ax.imshow(blank, aspect="auto", cmap="magma", interpolation="nearest")
        self.fig.colorbar(self.image, cax=cax).ax.tick_params(labelsize=0.85 * CARD_FONTSIZE)
        rows = _thin(len(points), 8)
        self.ax.set_yticks(rows, labels=[points[i] for i in rows])
        columns = _thin(len(epochs), 6)
        self.ax.set_xticks(columns, labels=[str(epochs[j]) for j in columns])
        _card_text(self.ax, "", "epoch", "")
        self.ax.grid(False)

    def draw(self, values: np.ndarray, title: str) -> None:
        self.image.set_data(values)
        finite = values[np.isfinite(values)]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        self.image.set_clim(low, high)  # what a fresh imshow scales to; the colourbar follows
        self.ax.set_title(title, fontsize=1.1 * CARD_FONTSIZE)


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


def correlation_image(cov: np.ndarray, *, max_dim: int = 384) -> np.ndarray:
    """The correlation matrix as an RGB image (H, W, 3) uint8 in the RdBu_r map over [-1, 1], one pixel per entry.

    Rendered with numpy instead of a matplotlib figure: exact pixels and about a millisecond instead of 150 ms.
    """
    corr = correlation_from_covariance(cov)[:max_dim, :max_dim]
    rgba = matplotlib.colormaps["RdBu_r"]((np.clip(corr, -1.0, 1.0) + 1.0) / 2.0)
    return (rgba[..., :3] * 255).round().astype(np.uint8)


def correlation_card(cov: np.ndarray, *, max_dim: int = 384, side: int = CARD_PIXELS) -> np.ndarray:
    """`correlation_image` for a TensorBoard card: enlarged to at least ``side`` px, with a labelled colour scale.

    TensorBoard shows an image no larger than it is, so a 96-feature matrix at one pixel per entry was a 96 px
    thumbnail without a scale. The matrix is enlarged by a whole factor ``k`` (every entry a ``k x k`` square,
    still exact, still numpy-cheap) and a colour-scale strip (-1 .. +1, drawn by matplotlib once per height and
    cached) is appended on the right. The point is in the tag (``correlation/<NN>_<point>``).

    Returns:
        RGB ``uint8`` image ``(k*D, k*D + strip width, 3)``, the matrix in its first ``k*D`` columns.
    """
    image = correlation_image(cov, max_dim=max_dim)
    k = max(1, -(-side // max(image.shape[0], 1)))
    image = np.repeat(np.repeat(image, k, axis=0), k, axis=1)
    return np.concatenate([image, _correlation_scale(image.shape[0])], axis=1)


@functools.lru_cache(maxsize=8)
def _correlation_scale(height: int) -> np.ndarray:
    """The RdBu_r colour scale from -1 to +1 labelled ``correlation``, as an RGB strip ``height`` px high.

    Its width and text grow with ``height`` beyond `CARD_PIXELS`: TensorBoard shrinks a taller card to the same
    on-screen height, and the labels should stay as legible as on a `CARD_PIXELS` card. Cached per height
    (read-only): an observation's correlation cards share one size, so it is drawn once a run.
    """
    scale = max(1.0, height / CARD_PIXELS)
    fig = Figure(figsize=(120 * scale / CARD_DPI, height / CARD_DPI), dpi=CARD_DPI)
    cax = fig.add_axes((0.12, 0.06, 0.15, 0.88))
    bar = fig.colorbar(ScalarMappable(norm=Normalize(-1.0, 1.0), cmap=matplotlib.colormaps["RdBu_r"]), cax=cax)
    bar.set_ticks([-1.0, -0.5, 0.0, 0.5, 1.0])
    bar.ax.tick_params(labelsize=0.85 * CARD_FONTSIZE * scale)
    bar.set_label("correlation", fontsize=CARD_FONTSIZE * scale)
    strip = render_rgb(fig)
    rows = np.full((height, strip.shape[1], 3), 255, dtype=np.uint8)  # canvas rounding may differ by a pixel
    rows[: min(height, strip.shape[0])] = strip[:height]
    rows.setflags(write=False)
    return rows


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


# ------------------------------------------------------------------------------------------------ attention geometry
def attention_heads_figure(
    values: ArrayLike,
    blocks: Sequence[str],
    *,
    title: str,
    reference: float | None = None,
    card: bool = False,
) -> Figure:
    """One attention metric per block and head: a blocks (y, depth downwards) x heads (x) heatmap.

    Which heads of which block attend far or near, to the CLS sink or to themselves, peaked or flat, at a glance.
    The report embeds it at a grid cell's width with every value written in (up to 16 x 16 cells); the callback logs
    one per head metric as a TensorBoard card (``card=True``, drawn by `attention_cards`: 480 x 240 px at
    ``CARD_FONTSIZE``, at most 8 block names labelled, no values written).

    Args:
        values: ``[len(blocks), H]`` per-head values (NaN where a block lacks one: a metric undefined there).
        blocks: Block (point) names in depth order.
        title: The metric's name (and the epoch).
        reference: The metric's value under uniform attention (the noise reference), named in the colourbar label.
        card: Draw for a TensorBoard card instead of the report.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[0] != len(blocks):
        raise ValueError(f"attention_heads_figure: values must be [{len(blocks)} blocks, heads], got {values.shape}")
    if card:
        heatmap = _AttentionHeadsCard(blocks, values.shape[1])
        heatmap.draw(values, title, reference)
        return heatmap.fig
    heads = values.shape[1]
    fig = Figure(figsize=(max(3.6, 0.42 * heads + 2.6), max(3.0, 0.28 * len(blocks) + 1.3)), dpi=90)
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["magma"].with_extremes(bad="#dddddd")
    image = ax.imshow(np.ma.masked_invalid(values), aspect="auto", cmap=cmap, interpolation="nearest")
    bar = fig.colorbar(image, ax=ax)
    if reference is not None and np.isfinite(reference):
        bar.set_label(f"uniform attention: {reference:.4g}", fontsize=7)
    ax.set_yticks(range(len(blocks)), labels=list(blocks), fontsize=6)
    ax.set_xticks(range(heads), labels=[str(h) for h in range(heads)], fontsize=7)
    ax.set_xlabel("head")
    ax.set_title(title, fontsize=9)
    if len(blocks) <= 16 and heads <= 16:
        finite = values[np.isfinite(values)]
        middle = float(np.mean([finite.min(), finite.max()])) if finite.size else 0.0
        for i in range(values.shape[0]):
            for j in range(heads):
                v = values[i, j]
                text = "n/a" if not np.isfinite(v) else f"{v:.3g}"
                shade = "black" if not np.isfinite(v) or v > middle else "white"
                ax.text(j, i, text, ha="center", va="center", fontsize=5, color=shade)
    fig.tight_layout()
    return fig


class _AttentionHeadsCard:
    """A blocks x heads card's figure, heatmap and colourbar, built once; `draw` replaces its data and title."""

    def __init__(self, blocks: Sequence[str], heads: int) -> None:
        self.fig = Figure(figsize=CARD_FIGSIZE, dpi=CARD_DPI)
        self.ax, cax = _card_axes(self.fig, left=118, right=60)
        cmap = matplotlib.colormaps["magma"].with_extremes(bad="#dddddd")
        self.image = self.ax.imshow(np.zeros((len(blocks), heads)), aspect="auto", cmap=cmap, interpolation="nearest")
        self.fig.colorbar(self.image, cax=cax).ax.tick_params(labelsize=0.85 * CARD_FONTSIZE)
        rows = _thin(len(blocks), 8)
        self.ax.set_yticks(rows, labels=[blocks[i] for i in rows])
        columns = _thin(heads, 12)
        self.ax.set_xticks(columns, labels=[str(j) for j in columns])
        _card_text(self.ax, "", "head", "")
        self.ax.grid(False)

    def draw(self, values: np.ndarray, title: str, reference: float | None = None) -> None:
        self.image.set_data(np.ma.masked_invalid(values))
        finite = values[np.isfinite(values)]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        self.image.set_clim(low, high if high > low else low + 1e-12)
        suffix = f" (uniform {reference:.3g})" if reference is not None and np.isfinite(reference) else ""
        self.ax.set_title(title + suffix, fontsize=1.1 * CARD_FONTSIZE)


def attention_cards(
    per_head: Mapping[str, ArrayLike],
    blocks: Sequence[str],
    *,
    references: Mapping[str, float] | None = None,
    profiles: Mapping[str, Mapping[int, tuple[np.ndarray, np.ndarray]]] | None = None,
) -> Iterator[tuple[str, np.ndarray]]:
    """The attention family's TensorBoard cards, rendered: ``(tag, RGB image)``, one card at a time.

    First one blocks x heads card per head metric (``attention_heads/<metric>``, `attention_heads_figure`, all drawn
    on one figure whose data are replaced from card to card), then one depth profile per metric of ``profiles``
    (``attention_depth/<metric>``, `depth_profile_figure`: the block means over depth, one line per observed epoch,
    +-1 jackknife standard error). The callback writes each with
    ``writer.add_image(tag, image, global_step=epoch, dataformats="HWC")``; a generator, so that the background
    figure worker may pause between cards.

    Args:
        per_head: metric -> ``[len(blocks), H]`` per-head values at this observation
            (`tgo.observatory.families.attention.head_tables`).
        blocks: Block names in depth order.
        references: metric -> its value under uniform attention (named in the card's title).
        profiles: metric -> epoch -> (block means ``[len(blocks)]``, standard errors), e.g. from
            ``tgo.observatory.families.attention.depth_profiles(run_dir, blocks, epoch)``.
    """
    if per_head and blocks:
        heads = max(np.asarray(v).shape[1] for v in per_head.values())
        card = _AttentionHeadsCard(blocks, heads)
        try:
            for metric, values in per_head.items():
                table = np.full((len(blocks), heads), np.nan)
                given = np.asarray(values, dtype=np.float64)
                table[:, : given.shape[1]] = given
                card.draw(table, metric, (references or {}).get(metric))
                yield f"attention_heads/{metric}", _rgb(card.fig)
        finally:
            close(card.fig)
    for metric, by_epoch in (profiles or {}).items():
        if by_epoch:
            figure = depth_profile_figure(by_epoch, blocks, title=metric, fontsize=CARD_FONTSIZE)
            yield f"attention_depth/{metric}", render_rgb(figure)
