"""Matplotlib figures for TensorBoard cards and the report; object API only, so no backend is selected on import and
figures can be made in worker threads."""

from __future__ import annotations

import functools
import math
import textwrap
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Colormap, ListedColormap, LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import Formatter, LogFormatter, ScalarFormatter
from numpy.typing import ArrayLike

EPOCH_CMAP = "viridis"
"""Epoch colour ramp: dark purple (first observation) to yellow (last); every use draws a colourbar."""
DEPTH_CMAP = "turbo"
DEPTH_RAMP = (0.05, 0.95)
"""Depth ramp of the points other than CLS, dark blue (patch embedding) to dark red (last block): the part of ``turbo``
that changes hue fastest, so neighbouring blocks stay apart and no point is as pale as the page."""
CLS_POINT = "cls"
CLS_STYLE: dict[str, Any] = {"color": "black", "marker": "s"}
"""CLS (the final norm's token 0, what the classifier reads) is not one more block: black with square markers."""
CARD_FONTSIZE = 16.0
"""Text size (pt) of figures made for a TensorBoard card; tick labels are 0.85 of it (13.6 pt, ~15 px drawn)."""
CARD_FIGSIZE = (6.0, 3.0)
CARD_DPI = 80
"""A card is ``CARD_FIGSIZE * CARD_DPI`` = 480 x 240 px. TensorBoard fits an image into a ~450 x 210 px box, so the
image's height sets the on-screen text size: a 2:1 card is shown at ~90 %, a 15-panel grid at ~25 %. Depth profiles
keep 480 x 320 px for their rotated point names."""
CARD_PIXELS = 240
"""Least side (px) of a correlation card: smaller matrices are enlarged by a whole factor (every entry a square)."""


def close(fig: Figure) -> None:
    """Releases a figure's memory (object-API figures are not tracked by pyplot, clearing is enough)."""
    fig.clear()


def render_rgb(fig: Figure) -> np.ndarray:
    """The figure drawn by its own Agg canvas as RGB ``uint8`` ``(H, W, 3)``, then cleared; thread-safe."""
    image = rgb(fig)
    close(fig)
    return image


def rgb(fig: Figure) -> np.ndarray:
    """`render_rgb` without closing: for a figure that is drawn again with other data (`spectrum_cards`)."""
    plain_tick_labels(fig)
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def plain_tick_labels(fig: Figure) -> None:
    """Every linear axis of ``fig`` (colourbars included) labels its ticks in full: no offset (``+2.833``) or
    multiplier (``1e6``) text above the axis, where it would collide with the title. Called by every renderer
    (`rgb`, the report's ``save_figure``) just before drawing, so no figure can forget it."""
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            formatter = axis.get_major_formatter()
            if isinstance(formatter, ScalarFormatter):
                formatter.set_useOffset(False)
                formatter.set_scientific(False)


def roundoff_floor(values: ArrayLike) -> float:
    """``lambda_max * D * eps`` (``matrix_rank``'s tolerance): below it eigenvalues are round-off of zeros, which would
    stretch a log axis over 15 empty decades, so spectrum figures leave them out."""
    values = np.asarray(values, dtype=np.float64).ravel()
    finite = values[np.isfinite(values)]
    top = float(finite.max()) if finite.size else 0.0
    return max(top, 0.0) * values.size * float(np.finfo(np.float64).eps)


def above_roundoff(values: ArrayLike) -> np.ndarray:
    """Boolean mask of the eigenvalues above `roundoff_floor` (finite and positive): the ones a spectrum draws."""
    values = np.asarray(values, dtype=np.float64).ravel()
    with np.errstate(invalid="ignore"):
        return np.isfinite(values) & (values > roundoff_floor(values))


def nonfinite_note(spectra: Iterable[tuple[str, ArrayLike]], *, most: int = 4) -> str:
    """Which spectra hold non-finite eigenvalues (``"cls (2 of 48)"``), or ``""``: a missing curve is never silent."""
    labels = []
    for label, values in spectra:
        v = np.asarray(values, dtype=np.float64).ravel()
        bad = int(v.size - np.count_nonzero(np.isfinite(v)))
        if bad:
            labels.append(f"{label} ({'all ' + str(v.size) if bad == v.size else f'{bad} of {v.size}'})")
    if not labels:
        return ""
    shown = ", ".join(labels[:most]) + (f" and {len(labels) - most} more" if len(labels) > most else "")
    return f"non-finite, not drawn: {shown}"


def _note_nonfinite(ax: Any, note: str, fontsize: float) -> None:
    """Writes `nonfinite_note`'s sentence in the plot's lower left corner (gid ``nonfinite``) on a white box."""
    if note:
        ax.text(
            0.02, 0.03, textwrap.fill(note, 36), transform=ax.transAxes, ha="left", va="bottom", fontsize=fontsize,
            color="#b00000", gid="nonfinite", bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none"},
        )  # fmt: skip


def _positive(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """1-based indices and values of the spectrum above its numerical floor (`above_roundoff`), for log axes."""
    values = np.asarray(values, dtype=np.float64)
    index = np.arange(1, values.size + 1)
    keep = above_roundoff(values)
    return index[keep], values[keep]


def is_log_scale(metric: str | None) -> bool:
    """Whether the catalogue draws ``metric`` on a log axis, read lazily at call time (`tgo.viz` stays torch-free)."""
    if not metric:
        return False
    from tgo.spectral.catalogue import CATALOGUE  # lazy: the catalogue imports torch

    observable = CATALOGUE.get(metric) or CATALOGUE.get(metric.removesuffix("_vs_noise"))
    return observable is not None and observable.scale == "log"


class _PlainLogFormatter(LogFormatter):
    """`LogFormatter`'s choice of which ticks to label, written as plain numbers (``0.3``, not ``3e-01``)."""

    def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
        return f"{x:g}"


def log_axis(ax: Any, axis: str = "y", *, labelsize: float | None = None) -> None:
    """Puts ``axis`` on a log scale with plain number labels (``0.2``, ``3``), minor ones where the span is short."""
    getattr(ax, f"set_{axis}scale")("log")
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_formatter(_PlainLogFormatter(labelOnlyBase=False))
    target.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(1.2, 0.6)))
    if labelsize is not None:
        ax.tick_params(axis=axis, which="both", labelsize=labelsize)


DEPTH_MAX_LUMINANCE = 0.7
"""The brightest a depth colour may be (relative luminance): turbo's lime and yellow are darkened to it, keeping hue."""


def _legible(colour: Any) -> tuple[float, float, float]:
    """``colour`` scaled towards black until its relative luminance is at most `DEPTH_MAX_LUMINANCE`."""
    rgb = np.asarray(matplotlib.colors.to_rgb(colour), dtype=np.float64)
    luminance = float(rgb @ np.array([0.2126, 0.7152, 0.0722]))
    if luminance > DEPTH_MAX_LUMINANCE:
        rgb = rgb * (DEPTH_MAX_LUMINANCE / luminance)
    return float(rgb[0]), float(rgb[1]), float(rgb[2])


def depth_styles(names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Line colour and marker of each point (`DEPTH_CMAP` in the given depth order; CLS black with square markers)."""
    others = [n for n in names if n != CLS_POINT]
    cmap = matplotlib.colormaps[DEPTH_CMAP]
    low, high = DEPTH_RAMP
    styles = {
        name: {"color": _legible(cmap(low + (high - low) * i / max(len(others) - 1, 1))), "marker": "o"}
        for i, name in enumerate(others)
    }
    return {name: dict(CLS_STYLE) if name == CLS_POINT else styles[name] for name in names}


def mark_cls_axis(ax: Any, points: Sequence[str], *, separator: bool = True) -> None:
    """On an axis with one tick per point, names CLS in bold and separates it from the blocks by a dotted line."""
    if CLS_POINT not in points:
        return
    i = list(points).index(CLS_POINT)
    for label in ax.get_xticklabels():
        if label.get_text() == CLS_POINT:
            label.set_fontweight("bold")
            label.set_color(CLS_STYLE["color"])
    if separator and i > 0:
        ax.axvline(i - 0.5, color="#777777", lw=0.8, ls=":", zorder=1)


def _draw_history(
    ax: Any, history: Sequence[tuple[int, np.ndarray]], norm: Normalize, cmap: Colormap, *, lw: float = 1.0
) -> None:
    """Draws spectra as log10 values on linear axes (log-scale axes cost ~0.1 s each to render), one line per epoch on
    the epoch ramp, the latest thicker; colour rather than a legend, which would cover a card."""
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


def card_axes(fig: Figure, *, left: int = 72, right: int = 90, bottom: int = 50) -> tuple[Any, Any]:
    """The plot and colourbar axes of a card figure at fixed pixel margins: ``tight_layout`` would draw it twice."""
    width, height = (size * fig.dpi for size in fig.get_size_inches())
    top, bar, gap = 30, 14, 10  # the title; the colourbar's width and its gap to the plot
    plot_height = (height - bottom - top) / height
    ax = fig.add_axes((left / width, bottom / height, (width - left - right - bar - gap) / width, plot_height))
    cax = fig.add_axes(((width - right - bar) / width, bottom / height, bar / width, plot_height))
    return ax, cax


def card_colourbar(
    fig: Figure, cax: Any, norm: Normalize, cmap: Any, ticks: Sequence[float], labels: Sequence[str], label: str = ""
) -> Any:
    """A colourbar on ``cax`` with the given ticks and labels at the card's text size."""
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), cax=cax)
    bar.set_ticks(list(ticks))
    bar.set_ticklabels(list(labels))
    bar.set_label(label, fontsize=CARD_FONTSIZE)
    bar.ax.tick_params(labelsize=0.85 * CARD_FONTSIZE)
    return bar


def thin_indices(count: int, most: int) -> list[int]:
    """Indices of at most ~``most`` of ``count`` tick labels, evenly spaced, always the first and the last."""
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
    """At most ~``most`` of the observed epochs for a card's colourbar or axis (`thin_indices`)."""
    ticks = sorted(set(epochs))
    return [ticks[i] for i in thin_indices(len(ticks), most)]


def class_count_label(classes: int) -> str:
    """The label of the class-count line on a spectrum: ``C = 10 classes``."""
    return f"C = {classes} class{'es' if classes != 1 else ''}"


def mark_class_count(ax: Any, classes: int | None, *, log10: bool = False, fontsize: float | None = None) -> None:
    """A dashed line at index ``C`` (the class count), where class-structured spectra kink."""
    if classes is None or classes < 1:
        return
    x = math.log10(classes) if log10 else float(classes)
    ax.axvline(x, color="#444444", lw=1.0, ls="--", zorder=1.5, gid="class-count")
    ax.text(
        x,
        0.97,
        " " + class_count_label(classes),
        transform=ax.get_xaxis_transform(),
        ha="left",
        va="top",
        fontsize=fontsize or 7,
        color="#444444",
        gid="class-count",
    )


def spectrum_history_figure(
    history: Sequence[tuple[int, np.ndarray]],
    *,
    title: str,
    ylabel: str = "eigenvalue",
    classes: int | None = None,
    keep: Sequence[np.ndarray] | None = None,
    card: bool = True,
) -> Figure:
    """One point's spectra over the observed epochs on the epoch ramp: a TensorBoard card (log10 on linear axes) or the
    report's log-log figure. One card per point: a 15-panel grid at a card's width has 6 pt text."""
    epochs = [epoch for epoch, _ in history]
    if card:
        drawn = _SpectrumCard(epochs, ylabel, classes)
        drawn.draw(history, title)
        return drawn.fig
    fig = Figure(figsize=(5.2, 3.6), dpi=90)
    ax = fig.add_subplot()
    norm, cmap = epoch_colours(epochs)
    for k, (epoch, values) in enumerate(history):
        values = np.asarray(values, dtype=np.float64)
        index = np.arange(1, values.size + 1)
        shown = above_roundoff(values) if keep is None else np.asarray(keep[k], dtype=bool) & (values > 0)
        if np.any(shown):
            ax.loglog(index[shown], values[shown], color=cmap(norm(epoch)), lw=1.1,
                      marker="o" if shown.sum() == 1 else None)  # fmt: skip
    mark_class_count(ax, classes)
    ax.set_xlabel("index i")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.2)
    epoch_colourbar(fig, ax, norm, cmap, epochs)
    fig.tight_layout()
    return fig


def spectrum_cards(
    histories: Mapping[str, Sequence[tuple[int, np.ndarray]]], *, ylabel: str = "eigenvalue", classes: int | None = None
) -> Iterator[tuple[str, np.ndarray]]:
    """Every point's spectrum card, rendered on one shared epoch ramp by one redrawn figure; a generator."""
    epochs = sorted({epoch for history in histories.values() for epoch, _ in history})
    card = _SpectrumCard(epochs, ylabel, classes)
    try:
        for name, history in histories.items():
            card.draw(history, name)
            yield name, rgb(card.fig)
    finally:
        close(card.fig)


class _SpectrumCard:
    """A spectrum card's figure, axes and epoch colourbar, built once; `draw` replaces its lines and title."""

    def __init__(self, epochs: Sequence[int], ylabel: str, classes: int | None = None) -> None:
        self.fig = Figure(figsize=CARD_FIGSIZE, dpi=CARD_DPI)
        self.ax, cax = card_axes(self.fig, right=70)
        self.norm, self.cmap = epoch_colours(epochs)
        self.classes = classes
        ticks = _epoch_ticks(epochs)
        card_colourbar(self.fig, cax, self.norm, self.cmap, ticks, [str(t) for t in ticks], "epoch")
        _card_text(self.ax, "", "log10 index i", f"log10 {ylabel}")

    def draw(self, history: Sequence[tuple[int, np.ndarray]], title: str) -> None:
        for artist in [*self.ax.lines, *self.ax.texts]:
            artist.remove()
        _draw_history(self.ax, history, self.norm, self.cmap, lw=1.6)
        self.ax.relim()  # the limits of this card's lines only, not the union with the previous card's
        self.ax.autoscale_view()
        _note_nonfinite(self.ax, nonfinite_note((f"epoch {e}", v) for e, v in history), 0.85 * CARD_FONTSIZE)
        mark_class_count(self.ax, self.classes, log10=True, fontsize=0.85 * CARD_FONTSIZE)
        self.ax.set_title(title, fontsize=1.1 * CARD_FONTSIZE)


def _card_text(ax: Any, title: str, xlabel: str, ylabel: str) -> None:
    """Title, axis labels, tick labels and grid of a card's plot axes at the card's text sizes."""
    ax.set_title(title, fontsize=1.1 * CARD_FONTSIZE)
    ax.set_xlabel(xlabel, fontsize=CARD_FONTSIZE)
    ax.set_ylabel(ylabel, fontsize=CARD_FONTSIZE)
    ax.tick_params(labelsize=0.85 * CARD_FONTSIZE)
    ax.grid(True, alpha=0.25)


DECAY_FLOOR = 1e-12
"""Relative eigenvalues (lambda_i / lambda_1) below this are round-off, left off the report's decay figure."""


def decay_curves_figure(
    spectra: Mapping[str, np.ndarray], *, title: str, card: bool = True, floor: float = DECAY_FLOOR
) -> Figure:
    """Spectral decay ``lambda_i / lambda_1`` per point, coloured by depth on a colourbar of point names (a legend of 15
    names does not fit a card): a TensorBoard card or the report's figure."""
    if not card:
        return _decay_page(spectra, title=title, floor=floor)
    fig = Figure(figsize=CARD_FIGSIZE, dpi=CARD_DPI)
    ax, cax = card_axes(fig, right=130)
    names = list(spectra)
    styles = depth_styles(names)
    cmap = ListedColormap([styles[n]["color"] for n in names] or ["black"])
    norm = Normalize(vmin=-0.5, vmax=max(len(names), 1) - 0.5)
    for name in names:
        x, y = _positive(spectra[name])
        if y.size:
            cls = name == CLS_POINT
            ax.plot(
                np.log10(x),
                np.log10(y / y[0]),
                color=styles[name]["color"],
                lw=2.4 if cls else 1.6,
                label=name,
                zorder=3 if cls else 2,
            )
    ticks = thin_indices(len(names), 8)
    card_colourbar(fig, cax, norm, cmap, ticks, [names[i] for i in ticks], "")
    bar_axis = cax.yaxis
    bar_axis.set_inverted(True)  # depth reads downwards, as in the point list
    _card_text(ax, title, "log10 index i", r"log10 $\lambda_i / \lambda_1$")
    _note_nonfinite(ax, nonfinite_note(spectra.items()), 0.85 * CARD_FONTSIZE)
    return fig


def _decay_page(spectra: Mapping[str, np.ndarray], *, title: str, floor: float) -> Figure:
    fig = Figure(figsize=(6.2, 3.9), dpi=90)
    ax = fig.add_subplot()
    styles = depth_styles(list(spectra))
    lowest = 1.0
    for name, given in spectra.items():
        values = np.asarray(given, dtype=np.float64)
        keep = np.isfinite(values) & (values > 0)
        if not np.any(keep):
            continue
        ratio, index = values[keep] / values[keep][0], np.arange(1, values.size + 1)[keep]
        meaningful = ratio >= floor
        if np.any(meaningful):
            lowest = min(lowest, float(ratio[meaningful].min()))
            cls = name == CLS_POINT
            ax.loglog(index[meaningful], ratio[meaningful], color=styles[name]["color"], lw=1.8 if cls else 1.0,
                      label=name, zorder=3 if cls else 2)  # fmt: skip
    ax.set_ylim(max(lowest, floor) / 2.0, 2.0)
    ax.set_xlabel("index i")
    ax.set_ylabel(r"$\lambda_i / \lambda_1$")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def correlation_from_covariance(cov: np.ndarray) -> np.ndarray:
    """Correlation matrix of a covariance; dimensions with zero variance get zero correlation (not NaN)."""
    cov = np.asarray(cov, dtype=np.float64)
    std = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    scale = np.where(std > 0, 1.0 / np.where(std > 0, std, 1.0), 0.0)
    return cov * scale[:, None] * scale[None, :]


FIRST_COLOUR, LAST_COLOUR = "#e08a2c", "#1f3b73"
"""The first and the last observation (or window) in figures that compare the two: orange and dark blue."""


def offdiag_abs_correlations(cov: ArrayLike) -> np.ndarray:
    """``|corr_ij|`` over ordered pairs of dimensions with variance: the pairs and arithmetic of
    `tgo.spectral.observables.mean_abs_offdiag_correlation`, so ``values.mean()`` is that observable."""
    mat = np.asarray(cov, dtype=np.float64)
    if mat.ndim != 2 or mat.shape[0] != mat.shape[1] or not np.all(np.isfinite(mat)):
        return np.zeros(0)
    var = np.diag(mat).copy()
    keep = var > max(float(var.max(initial=0.0)) * var.size * float(np.finfo(np.float64).eps), 0.0)
    if keep.sum() < 2:
        return np.zeros(0)
    std = np.sqrt(var[keep])
    corr = np.abs(np.clip(mat[np.ix_(keep, keep)] / np.outer(std, std), -1.0, 1.0))
    return corr[~np.eye(corr.shape[0], dtype=bool)]


def correlation_histograms_figure(
    covariances: Mapping[str, Mapping[str, ArrayLike]], *, title: str, columns: int = 5, bins: int = 40
) -> Figure:
    """``|off-diagonal correlation|`` histograms per point, first vs last observation (the paper's "the covariance
    becomes diagonal" in numbers); each mean line (gid ``"<point>|<label>"``) is ``mean_abs_offdiag_correlation``."""
    names = list(covariances)
    count = max(len(names), 1)
    rows = -(-count // max(1, columns))
    columns = -(-count // rows)
    fig = Figure(figsize=(2.35 * columns + 0.3, 1.85 * rows + 0.75), dpi=100, layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False)
    edges = np.linspace(0.0, 1.0, bins + 1)
    labels: list[str] = []
    for ax, name in zip(axes.flat, names, strict=False):
        means = []
        for k, (label, cov) in enumerate(covariances[name].items()):
            colour = FIRST_COLOUR if k == 0 else LAST_COLOUR
            values = offdiag_abs_correlations(cov)
            if label not in labels:
                labels.append(label)
            if values.size == 0:
                means.append("n/a")
                continue
            weights = np.full(values.size, 1.0 / values.size)
            if k == 0:
                ax.hist(values, bins=edges, weights=weights, color=colour, alpha=0.35, lw=0)
            else:
                ax.hist(values, bins=edges, weights=weights, histtype="step", color=colour, lw=1.3)
            mean = float(values.mean())
            ax.axvline(mean, color=colour, lw=1.1, ls="--", gid=f"{name}|{label}")
            means.append(f"{mean:.3f}")
        ax.text(
            0.97, 0.95, "mean |r|\n" + " \u2192 ".join(means), transform=ax.transAxes, ha="right", va="top", fontsize=7
        )
        ax.set_title(name, fontsize=8, fontweight="bold" if name == CLS_POINT else None)
        ax.set_xlim(0.0, 1.0)
        ax.tick_params(labelsize=6)
        ax.grid(True, alpha=0.2)
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("|correlation| of a feature pair", fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("share of pairs", fontsize=7)
    handles = [
        Patch(facecolor=FIRST_COLOUR, alpha=0.35, label=labels[0] if labels else "first"),
        *([Line2D([], [], color=LAST_COLOUR, lw=1.3, label=labels[1])] if len(labels) > 1 else []),
        Line2D([], [], color="#555555", lw=1.1, ls="--", label="mean |r| = mean_abs_offdiag_correlation"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    return fig


def _log_norm(values: np.ndarray) -> LogNorm | None:
    """A log colour scale over the positive finite values (``None`` when there are none)."""
    positive = values[np.isfinite(values) & (values > 0)]
    if positive.size == 0:
        return None
    low, high = float(positive.min()), float(positive.max())
    return LogNorm(vmin=low, vmax=high if high > low else low * 10.0)


def layer_epoch_heatmap_figure(
    values: np.ndarray,
    points: Sequence[str],
    epochs: Sequence[int],
    *,
    title: str,
    card: bool = False,
    log: bool | None = None,
) -> Figure:
    """Heatmap of one observable, points on y and epochs on x: the report's figure, or a 480 x 240 px card with at most
    8 points and 6 epochs labelled. ``log=None``: the catalogue's scale of ``title``."""
    values = np.asarray(values, dtype=np.float64)
    log = is_log_scale(title) if log is None else log
    if card:
        heatmap = LayerEpochCard(points, epochs)
        heatmap.draw(values, title, log=log)
        return heatmap.fig
    fig = Figure(figsize=(max(4.0, 0.35 * len(epochs) + 2.5), max(3.0, 0.25 * len(points) + 1.2)), dpi=90)
    ax = fig.add_subplot()
    norm = _log_norm(values) if log else None
    shown = np.where(values > 0, values, np.nan) if norm is not None else values
    image = ax.imshow(shown, aspect="auto", cmap="magma", interpolation="nearest", norm=norm)
    fig.colorbar(image, ax=ax, label="log scale" if norm is not None else None)
    ax.set_yticks(range(len(points)), labels=list(points), fontsize=6)
    step = max(1, len(epochs) // 12)
    ax.set_xticks(range(0, len(epochs), step), labels=[str(e) for e in list(epochs)[::step]], fontsize=7)
    ax.set_xlabel("epoch")
    ax.set_title(title)
    fig.tight_layout()
    return fig


class LayerEpochCard:
    """A layer x epoch card's figure, heatmap and colourbar, built once; `draw` replaces its data and title."""

    def __init__(self, points: Sequence[str], epochs: Sequence[int]) -> None:
        self.fig = Figure(figsize=CARD_FIGSIZE, dpi=CARD_DPI)
        self.ax, cax = card_axes(self.fig, left=118, right=60)
        blank = np.zeros((len(points), len(epochs)))
        self.image = self.ax.imshow(blank, aspect="auto", cmap="magma", interpolation="nearest")
        self.fig.colorbar(self.image, cax=cax).ax.tick_params(labelsize=0.85 * CARD_FONTSIZE)
        rows = thin_indices(len(points), 8)
        self.ax.set_yticks(rows, labels=[points[i] for i in rows])
        columns = thin_indices(len(epochs), 6)
        self.ax.set_xticks(columns, labels=[str(epochs[j]) for j in columns])
        _card_text(self.ax, "", "epoch", "")
        self.ax.grid(False)

    def draw(self, values: np.ndarray, title: str, *, log: bool = False) -> None:
        if log:  # log10 of the values on the card's linear scale: cheap, and the title says it
            with np.errstate(divide="ignore", invalid="ignore"):
                values = np.where(values > 0, np.log10(np.where(values > 0, values, 1.0)), np.nan)
            title = f"{title} (log10)"
        self.image.set_data(values)
        finite = values[np.isfinite(values)]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        self.image.set_clim(low, high)  # what a fresh imshow scales to; the colourbar follows
        self.ax.set_title(title, fontsize=1.1 * CARD_FONTSIZE)


def correlation_image(cov: np.ndarray, *, max_dim: int = 384) -> np.ndarray:
    """The correlation matrix as RdBu_r ``uint8`` RGB over [-1, 1], one pixel per entry (numpy: ~1 ms, not 150 ms)."""
    corr = correlation_from_covariance(cov)[:max_dim, :max_dim]
    rgba = matplotlib.colormaps["RdBu_r"]((np.clip(corr, -1.0, 1.0) + 1.0) / 2.0)
    return (rgba[..., :3] * 255).round().astype(np.uint8)


def correlation_card(cov: np.ndarray, *, max_dim: int = 384, side: int = CARD_PIXELS) -> np.ndarray:
    """`correlation_image` enlarged to at least ``side`` px, with a colour scale (not a 96 px thumbnail)."""
    image = correlation_image(cov, max_dim=max_dim)
    k = max(1, -(-side // max(image.shape[0], 1)))
    image = np.repeat(np.repeat(image, k, axis=0), k, axis=1)
    return np.concatenate([image, _correlation_scale(image.shape[0])], axis=1)


@functools.lru_cache(maxsize=8)
def _correlation_scale(height: int) -> np.ndarray:
    """The RdBu_r scale as an RGB strip ``height`` px high, text growing with it; cached per height, read-only."""
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


# ------------------------------------------------------------------------------------------------ attention geometry
def attention_heads_figure(
    values: ArrayLike,
    blocks: Sequence[str],
    *,
    title: str,
    reference: float | None = None,
    card: bool = False,
) -> Figure:
    """One attention metric as a blocks x heads heatmap: the report's figure or a TensorBoard card."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[0] != len(blocks):
        raise ValueError(f"attention_heads_figure: values must be [{len(blocks)} blocks, heads], got {values.shape}")
    if card:
        heatmap = AttentionHeadsCard(blocks, values.shape[1])
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


class DistinctTicks(Formatter):
    """Tick labels with the fewest significant digits (3 to 8, ``%g``) that tell every tick apart: short where the
    range is wide (``0.0002``), as long as needed where it is narrow around a large value (``2.83296``, ``2.83298``),
    where a fixed precision would print the same label at every tick."""

    def __init__(self) -> None:
        self.digits = 3

    def set_locs(self, locs: list[float]) -> None:
        super().set_locs(locs)
        for digits in range(3, 9):
            self.digits = digits
            if len({f"{v:.{digits}g}" for v in locs}) == len(locs):
                break

    def __call__(self, x: float, pos: int | None = None) -> str:
        return f"{x:.{self.digits}g}"


class AttentionHeadsCard:
    """A blocks x heads card's figure, heatmap and colourbar, built once; `draw` replaces its data and title."""

    def __init__(self, blocks: Sequence[str], heads: int) -> None:
        self.fig = Figure(figsize=CARD_FIGSIZE, dpi=CARD_DPI)
        # short colourbar labels (`DistinctTicks`: 0.00015, -0.0015, 2.833, 2.8330, 1e-09) in 90 px of margin
        self.ax, cax = card_axes(self.fig, left=118, right=90)
        cmap = matplotlib.colormaps["magma"].with_extremes(bad="#dddddd")
        self.image = self.ax.imshow(np.zeros((len(blocks), heads)), aspect="auto", cmap=cmap, interpolation="nearest")
        bar = self.fig.colorbar(self.image, cax=cax, format=DistinctTicks())
        bar.ax.tick_params(labelsize=0.85 * CARD_FONTSIZE)
        rows = thin_indices(len(blocks), 8)
        self.ax.set_yticks(rows, labels=[blocks[i] for i in rows])
        columns = thin_indices(heads, 12)
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
