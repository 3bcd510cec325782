"""What TGO draws, declared once as data (`Panel`), and one drawer per kind of panel at two sizes (`CARD`, `PAGE`).

TensorBoard's cards (`tgo.callbacks.dashboard`) and the report's figures (`tgo.report.figures`) are two renderers of
the same declarations: the core's (`core_panels`) and each measurement family's (its class attribute ``panels``, in
its own module), listed together by `declared`. A panel names
its kind, its metric and view, its title, and where it is drawn (``card``/``page``, and the ``observation.figures``
switch that turns its card off); nothing else decides what a figure shows. The kinds:

* ``depth``: one observable against depth, one line per observed epoch on the epoch ramp (`tgo.viz.epoch_colours`),
  +-1 standard-error band (`depth_figure`; cards: `depth_cards` through `cards`);
* ``bands``: one observable against epoch, one line per point on the depth ramp (`tgo.viz.depth_styles`), +-1 s.e.
  band, an optional ``overlay`` metric on the same axes (`_EpochBandCard` for a card, `lines_figure` for a page);
* ``map``: one observable as a point x epoch heatmap (`tgo.viz.layer_epoch_heatmap_figure`), or with
  ``categories`` a map of discrete labels (`category_map`: the training phases);
* ``heads``: an array heatmap, block x head (`tgo.viz.attention_heads_figure`), from the observation's arrays;
* ``grid``: its ``cells`` (``depth`` and ``bands`` panels), ``columns`` a row: one page figure of small charts drawn
  by the same line drawers (`grid_figure`; a family's figure beside the others, e.g. weights x maps), and on
  TensorBoard its cells' own cards (a grid of small charts is unreadable on a card);
* ``table``: the last observation's values of ``metrics`` (the report's table; no card);
* ``spectra``: each point's eigenvalue spectra over epochs (`tgo.viz.spectrum_cards`, the report's spectra).

TensorBoard's scalar charts smooth (0.6) and leave the top and bottom 5 % of a chart's values out of its y range, so
a chart of 15 points whose last blocks stand apart draws those blocks off its top; the cards are images of the
recorded values (every one on the axes) with their jackknife bands. A card is drawn on a figure built once per shape
whose lines are replaced from card to card, at fixed pixel margins (no ``tight_layout``, which draws a figure
twice); a page figure is sized to its points and laid out by matplotlib. Ratio-type observables (catalogue
``scale == "log"``) are drawn on log axes with plain-number labels (`tgo.viz.log_axis`) where every value is
positive. Everything uses matplotlib's object API (no pyplot), so cards can be drawn on the figure worker's thread.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.colors import BoundaryNorm, ListedColormap, Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator
from numpy.typing import ArrayLike

from tgo import viz
from tgo.records import DEFAULT_VIEW, RunDir, read_metric_rows

__all__ = [
    "BAND_PIXELS",
    "CARD",
    "PAGE",
    "PROFILE_PIXELS",
    "RECORDED_KINDS",
    "Panel",
    "array_table",
    "cards",
    "category_map",
    "class_count",
    "core_panels",
    "declared",
    "depth_figure",
    "grid_figure",
    "lines_figure",
    "recorded_tables",
]

CARD, PAGE = "card", "page"
"""The two sizes (renderers): a TensorBoard card (fixed pixels, `tgo.viz.CARD_FONTSIZE`) and a report page figure."""
PROFILE_PIXELS = (480, 320)
"""A depth-profile card's size (px): the rotated point names need the height."""
BAND_PIXELS = (480, 240)
"""An against-epoch card's size (px): TensorBoard's ~450 x 210 px image box shows a 2:1 card at ~90 %."""
CATEGORY_PIXELS = (640, 400)
"""A category map card's size (px)."""
_FONT = viz.CARD_FONTSIZE
_TICK = 0.85 * viz.CARD_FONTSIZE

RECORDED_KINDS = ("depth", "bands", "map")
"""The kinds drawn from the recorded series (``metrics.csv``); ``heads`` is drawn from an observation's arrays."""
Profiles = Mapping[int, tuple[np.ndarray, np.ndarray]]
"""epoch -> (values [P], standard errors [P]) over the points in depth order (NaN where none)."""
Table = tuple[Sequence[int], np.ndarray, np.ndarray]
"""(epochs, values [P, E], stderrs [P, E]) of one (view, metric), NaN where a point has no value at an epoch."""


@dataclass(frozen=True)
class Panel:
    """One panel, drawn by both renderers from the records.

    Attributes:
        kind: ``depth``, ``bands``, ``map``, ``heads``, ``grid``, ``table`` or ``spectra`` (the module docstring).
        metric: The observable (``heads``: the per-head array ``heads_<metric>``; ``grid``: its figure's name;
            ``table``: unused).
        view: The records' view it is read from.
        title: The card's title (default: the metric).
        switch: The ``observation.figures`` flag (`tgo.observatory.settings.FigureSettings`) that draws its card.
        card: Drawn as a TensorBoard card.
        page: Drawn in the report.
        rows: ``points``: every point on the axis (NaN where none); ``recorded``: the points that recorded ``view``
            at this observation (a family's blocks, the last point's network view).
        scale: ``None``: the catalogue's scale of the metric (`tgo.viz.is_log_scale`), else ``log`` or ``linear``.
        overlay: A second metric drawn on the same axes of the page (``bands``: the sharpness' threshold; a card
            draws it as its own panel); ``depth``: a reference the page quotes beside it (uniform attention's).
        metrics: The metrics of a ``table``.
        categories: A ``map`` of discrete labels: ``(code, label, colour)`` per label, codes ascending by one.
        tag: The card's TensorBoard tag (default from the kind: `tag_of`).
        line: A horizontal reference line on the page (``bands``: the sharpness ratio's 1).
        cells: A ``grid``'s panels, row by row; ``columns``: how many a row (default: all in one).
        caption: A ``grid``'s caption in the report.
        section: The report section that draws it on the page (``hypotheses``); none: the report's figures do (a
            ``depth`` panel on a view of its own beside view ``all``'s, `tgo.report.context.own_view_panels`).
    """

    kind: str
    metric: str = ""
    view: str = DEFAULT_VIEW
    title: str = ""
    switch: str = ""
    card: bool = True
    page: bool = True
    rows: str = "points"
    scale: str | None = None
    overlay: str | None = None
    metrics: tuple[str, ...] = ()
    categories: tuple[tuple[float, str, str], ...] = ()
    tag: str = ""
    line: float | None = None
    cells: tuple[Panel, ...] = ()
    columns: int = 0
    caption: str = ""
    section: str = ""

    @property
    def label(self) -> str:
        return self.title or self.metric

    def tag_of(self) -> str:
        """``1_depth_profile[_<view>]/<metric>``, ``2_vs_epoch/<metric>``, ``layer_epoch/<metric>`` or
        ``<view>_heads/<metric>``: TensorBoard's Time Series page sorts groups in natural order, so the numbered
        ones open first (`tgo.callbacks.dashboard`)."""
        if self.tag:
            return self.tag
        if self.kind == "depth":
            return (
                f"1_depth_profile/{self.metric}"
                if self.view == DEFAULT_VIEW
                else f"1_depth_profile_{self.view}/{self.metric}"
            )
        group = {"bands": "2_vs_epoch", "map": "layer_epoch", "heads": f"{self.view}_heads"}.get(self.kind, self.kind)
        return f"{group}/{self.metric}"


# ------------------------------------------------------------------------------------------------ declarations
def core_panels() -> tuple[Panel, ...]:
    """The core's panels: depth profiles of the covariance observables, the against-epoch bands and
    the layer x epoch maps of the catalogue's charted observables (read at call time: a plug-in's observable counts),
    the spectra. TensorBoard keeps to fewer depth profiles than the report: every card costs background rendering
    time at each observation."""
    from tgo.spectral.catalogue import CATALOGUE  # lazy: the catalogue imports torch

    depth = ("effective_rank", "participation_ratio", "stable_rank", "spectral_anisotropy")
    bands = depth
    return (
        *(Panel("depth", m, switch="depth_profiles") for m in depth),
        Panel("depth", "spectral_entropy", card=False),
        Panel("depth", "spectral_flatness", card=False),
        Panel("depth", "mean_abs_offdiag_correlation", switch="depth_profiles", page=False),
        *(Panel("bands", m, switch="bands", card=m in bands) for m in CATALOGUE.charted),
        *(Panel("map", m, switch="layer_epoch") for m in CATALOGUE.charted),
        Panel("spectra", "eigenvalues", switch="spectra"),
    )


def declared(renderer: str | None = None, *, kind: str | None = None) -> list[Panel]:
    """The core's panels, then each registered family's (in ``order``), of one renderer (`CARD`, `PAGE`) and kind
    where named; a card is a grid's cell (a grid is one figure on the page only)."""
    from tgo.observatory.families import registered_families  # lazy: the families import `Panel` from here

    found = [*core_panels(), *(p for family in registered_families() for p in family.panels)]
    if renderer == CARD:
        found = [c for p in found for c in (p.cells if p.kind == "grid" else (p,))]
    return [p for p in found if (renderer is None or getattr(p, renderer)) and (kind is None or p.kind == kind)]


# ------------------------------------------------------------------------------------------------ card helpers
def _card_figure(pixels: tuple[int, int]) -> Figure:
    return Figure(figsize=(pixels[0] / viz.CARD_DPI, pixels[1] / viz.CARD_DPI), dpi=viz.CARD_DPI)


def _band_polygons(x: np.ndarray, values: np.ndarray, se: np.ndarray, *, log: bool) -> list[np.ndarray]:
    """The ``values -/+ se`` band as polygons, one per run of points where both edges are finite (and, on a log
    axis, the lower edge is above zero: a band reaching zero or below is left out there)."""
    low, high = values - se, values + se
    good = np.isfinite(low) & np.isfinite(high) & np.isfinite(x)
    if log:
        good &= low > 0
    polygons = []
    edges = np.flatnonzero(np.diff(np.concatenate([[0], good.astype(np.int8), [0]])))
    for start, stop in zip(edges[::2], edges[1::2], strict=True):
        xs = x[start:stop]
        polygons.append(
            np.column_stack([np.concatenate([xs, xs[::-1]]), np.concatenate([low[start:stop], high[start:stop][::-1]])])
        )
    return polygons


def _bands(ax: Any, polygons: list[np.ndarray], colours: list[Any], alpha: float) -> None:
    """Every band of a figure as one collection (15 ``fill_between`` calls cost as much as drawing the card)."""
    if polygons:
        ax.add_collection(PolyCollection(polygons, facecolors=colours, alpha=alpha, linewidths=0), autolim=True)


def _positive(values: Any) -> bool:
    """Whether every finite value is > 0: a log axis can show them (a ratio estimated below 0, e.g. the noise scale
    from too few steps, is drawn on a linear axis instead, not left off)."""
    v = np.asarray(values, dtype=np.float64)
    return bool(np.all(v[np.isfinite(v)] > 0))


def _scale(ax: Any, log: bool, labelsize: float | None) -> None:
    """Linear or log y axis (`tgo.viz.log_axis`), limits from every line and band drawn now (none left off)."""
    if log:
        viz.log_axis(ax, labelsize=labelsize)
    else:
        ax.set_yscale("linear")
    ax.relim()
    ax.autoscale_view()
    if not log:  # a flat profile still gets a readable span
        low, high = ax.get_ylim()
        if not high > low:
            ax.set_ylim(low - 0.5, high + 0.5)


def _clear(ax: Any) -> None:
    for artist in [*ax.lines, *ax.collections]:
        artist.remove()


# ------------------------------------------------------------------------------------------------ depth
class _DepthProfile:
    """One depth-profile figure (axes, point labels, epoch colourbar) built once at ``size``; `draw` replaces the
    lines, so a card per observable costs only its lines."""

    def __init__(self, points: Sequence[str], epochs: Sequence[int], size: str = CARD) -> None:
        self.points, self.size = list(points), size
        self.norm, self.cmap = viz.epoch_colours(list(epochs))
        x = np.arange(len(self.points))
        if size == CARD:
            self.fig = _card_figure(PROFILE_PIXELS)
            self.ax, cax = viz.card_axes(self.fig, left=74, right=56, bottom=108)
            ticks = [sorted(set(epochs))[i] for i in viz.thin_indices(len(set(epochs)), 6)]
            viz.card_colourbar(self.fig, cax, self.norm, self.cmap, ticks, [str(t) for t in ticks], "epoch")
            step = 2 if len(self.points) > 10 else 1
            labels = [p if i % step == 0 or i == len(self.points) - 1 else "" for i, p in enumerate(self.points)]
            self.ax.set_xticks(x, labels=labels, rotation=45, ha="right", rotation_mode="anchor", fontsize=_TICK)
            self.ax.tick_params(axis="y", labelsize=_TICK)
        else:
            self.fig = Figure(figsize=(max(6.0, 0.38 * len(self.points) + 2.5), 4.0), dpi=90)
            self.ax = self.fig.add_subplot()
            self.ax.set_xticks(x, labels=self.points, rotation=60, ha="right", fontsize=7)
            self.ax.set_xlabel("point (depth order)")
            viz.epoch_colourbar(self.fig, self.ax, self.norm, self.cmap, list(epochs))
        self.cls = [i for i, p in enumerate(self.points) if p == viz.CLS_POINT]
        self.ax.set_xlim(-0.4, len(self.points) - 0.6)
        self.ax.grid(True, alpha=0.25)

    def draw(self, profiles: Profiles, title: str, *, log: bool) -> Figure:
        card = self.size == CARD
        _clear(self.ax)
        log = log and all(_positive(values) for values, _ in profiles.values())
        viz.mark_cls_axis(self.ax, self.points)  # its dotted line before CLS went with the previous card's lines
        _depth_lines(self.ax, profiles, lambda epoch: self.cmap(self.norm(epoch)), self.cls, log=log, card=card)
        self.ax.set_title(title + (", log axis" if log else ""), fontsize=1.1 * _FONT if card else None)
        if not card:
            self.fig.tight_layout()
        return self.fig


def _depth_lines(ax: Any, profiles: Profiles, colour_of: Any, cls: list[int], *, log: bool, card: bool) -> None:
    """Each epoch's profile against depth in its ramp colour (labelled ``epoch <e>``), its +-1 s.e. band and CLS as a
    square with a black edge: a depth card, a page figure and a grid's cell."""
    x = np.arange(len(next(iter(profiles.values()))[0]), dtype=np.float64) if profiles else np.zeros(0)
    blocks = [i for i in range(x.size) if i not in cls]
    polygons, colours = [], []
    for epoch in sorted(profiles):
        values, se = (np.asarray(a, dtype=np.float64) for a in profiles[epoch])
        colour = colour_of(epoch)
        ax.plot(x, values, color=colour, lw=2.2 if card else 1.2, marker="o", ms=5 if card else 3, markevery=blocks,
                label=f"epoch {epoch}")  # fmt: skip
        if cls:
            ax.plot(x[cls], values[cls], color=colour, ls="none", marker="s", ms=7 if card else 5, mec="black",
                    mew=0.8)  # fmt: skip
        band = _band_polygons(x, values, se, log=log)
        polygons += band
        colours += [colour] * len(band)
    _bands(ax, polygons, colours, 0.2)
    _scale(ax, log, _TICK if card else None)


def depth_figure(
    profiles: Profiles, points: Sequence[str], *, title: str, log: bool | None = None, size: str = PAGE
) -> Figure:
    """One observable against depth: one line per epoch on the epoch ramp, +-1 s.e. band, CLS marked apart (square
    markers, bold name, a dotted line before it: `tgo.viz.mark_cls_axis`).

    Args:
        profiles: epoch -> (values, standard errors) over ``points`` (NaN where none; a band where both are finite).
        points: Point names in depth order.
        title: The observable (and its view).
        log: A log y axis where every value is positive; ``None``: the catalogue's scale of ``title``.
        size: `CARD` (`PROFILE_PIXELS`) or `PAGE`.
    """
    return _DepthProfile(points, sorted(profiles), size).draw(
        profiles, title, log=viz.is_log_scale(title) if log is None else log
    )


# ------------------------------------------------------------------------------------------------ bands
class _EpochBandCard:
    """One against-epoch card (axes, depth colourbar naming the points) built once; `draw` replaces the lines."""

    def __init__(self, points: Sequence[str], epochs: Sequence[int]) -> None:
        self.fig = _card_figure(BAND_PIXELS)
        self.ax, cax = viz.card_axes(self.fig, left=74, right=118)
        self.points = list(points)
        self.styles = viz.depth_styles(self.points)
        cmap = ListedColormap([self.styles[p]["color"] for p in self.points] or ["black"])
        norm = Normalize(vmin=-0.5, vmax=max(len(self.points), 1) - 0.5)
        ticks = viz.thin_indices(len(self.points), 8)
        bar = viz.card_colourbar(self.fig, cax, norm, cmap, ticks, [self.points[i] for i in ticks])
        bar.ax.invert_yaxis()  # the patch embedding on top, CLS at the bottom: reading order
        for label in bar.ax.get_yticklabels():
            if label.get_text() == viz.CLS_POINT:
                label.set_fontweight("bold")
        shown = [sorted(set(epochs))[i] for i in viz.thin_indices(len(set(epochs)), 7)]
        self.ax.set_xticks(shown, labels=[str(e) for e in shown])
        self.ax.set_xlabel("epoch", fontsize=_FONT)
        self.ax.tick_params(labelsize=_TICK)
        self.ax.grid(True, alpha=0.25)

    def draw(self, epochs: Sequence[int], values: np.ndarray, stderrs: np.ndarray, title: str, *, log: bool) -> Figure:
        _clear(self.ax)
        log = log and _positive(values)
        _epoch_lines(self.ax, epochs, values, stderrs, self.points, self.styles, log=log)
        _scale(self.ax, log, _TICK)
        self.ax.set_title(title + (", log axis" if log else ""), fontsize=1.1 * _FONT)
        return self.fig


def _epoch_lines(
    ax: Any, epochs: Sequence[int], values: np.ndarray, stderrs: np.ndarray, points: Sequence[str], styles: Any, *,
    log: bool,
) -> None:  # fmt: skip
    """Each point's series against epoch in its depth style, with its +-1 s.e. band: a bands card and a grid's cell."""
    x = np.asarray(list(epochs), dtype=np.float64)
    polygons, colours = [], []
    for i, point in enumerate(points):
        cls = point == viz.CLS_POINT
        colour, row = styles[point]["color"], values[i]
        if not np.any(np.isfinite(row)):
            continue
        ax.plot(x, row, color=colour, lw=2.6 if cls else 1.6, marker=styles[point]["marker"], ms=4.5 if cls else 3.5,
                zorder=3 if cls else 2, label=point)  # fmt: skip
        band = _band_polygons(x, row, stderrs[i], log=log)
        polygons += band
        colours += [colour] * len(band)
    _bands(ax, polygons, colours, 0.12)


MARKERS_UP_TO = 12
"""Page series with at most this many observations are drawn with markers."""


def lines_figure(
    series: Mapping[str, tuple[ArrayLike, ArrayLike]],
    *,
    title: str,
    bands: Mapping[str, tuple[ArrayLike, ArrayLike]] | None = None,
    reference: Mapping[str, tuple[ArrayLike, ArrayLike]] | None = None,
    run_epochs: int | None = None,
    reference_epochs: int = 100,
    log: bool | None = None,
) -> Figure:
    """One observable against epoch at page size, one line per point (depth coloured, CLS black with squares).

    Series with few observations get markers (a single observation is a marker alone, with error bars for its
    band). With ``reference``, a second panel on its own y axis draws the published series against the fraction of
    training (epoch / ``reference_epochs``), and the run's panel uses epoch / ``run_epochs`` too when ``run_epochs``
    is known, so neither hides the other. ``log``: log y axes (``None``: the catalogue's scale of ``title``).
    """
    panels = 2 if reference else 1
    fig = Figure(figsize=(6.0 if panels == 1 else 10.0, 4.0), dpi=90)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    ax = axes[0]
    names = list(series)
    styles = viz.depth_styles(names)
    log = viz.is_log_scale(title) if log is None else log
    fraction = bool(reference) and bool(run_epochs)
    for name in names:
        color, cls = styles[name]["color"], name == viz.CLS_POINT
        epochs = np.asarray(series[name][0], dtype=np.float64)
        values = np.asarray(series[name][1], dtype=np.float64)
        x = epochs / run_epochs if fraction and run_epochs else epochs
        few = epochs.size <= MARKERS_UP_TO
        ax.plot(x, values, color=color, lw=1.8 if cls else 1.2, label=name,
                marker=styles[name]["marker"] if few or cls else None, ms=(4 if epochs.size > 1 else 6) + cls,
                markevery=None if few else max(1, epochs.size // 10), zorder=3 if cls else 2)  # fmt: skip
        if bands and name in bands:
            low, high = (np.asarray(b, dtype=np.float64) for b in bands[name])
            if epochs.size > 1:
                ax.fill_between(x, low, high, color=color, alpha=0.15, lw=0)
            else:
                ax.errorbar(x, values, yerr=[values - low, high - values], color=color, capsize=3, lw=1)
    ax.set_xlabel("fraction of training (epoch / max epochs)" if fraction else "epoch")
    if not fraction:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title)
    ax.grid(True, alpha=0.2)
    if log:
        viz.log_axis(ax)
    ax.legend(fontsize=6, ncol=2)
    if reference:
        ref_ax = axes[1]
        for name in (n for n in names if n in reference):
            ref_epochs, ref_values = (np.asarray(a, dtype=np.float64) for a in reference[name])
            cls = name == viz.CLS_POINT
            ref_ax.plot(ref_epochs / reference_epochs, ref_values, color=styles[name]["color"], lw=1.6 if cls else 1.0,
                        marker=styles[name]["marker"] if cls else None, ms=4,
                        markevery=max(1, ref_epochs.size // 10), zorder=3 if cls else 2)  # fmt: skip
        if log:
            viz.log_axis(ref_ax)
        ref_ax.set_xlabel("fraction of training (epoch / 100)")
        ref_ax.set_title("published TGO-I (ViT-S/16, ImageNet-100)", fontsize=9)
        ref_ax.grid(True, alpha=0.2)
        if fraction:
            ref_ax.set_xlim(ax.get_xlim())
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------------ category map
def category_map(
    codes: np.ndarray,
    points: Sequence[str],
    edges: Sequence[float] | np.ndarray,
    categories: Sequence[tuple[float, str, str]],
    *,
    title: str = "",
    size: str = PAGE,
    ticks: Sequence[float] | None = None,
    tick_labels: Sequence[str] | None = None,
    xlabel: str = "epoch (a cell spans the two observations it compares)",
) -> Figure:
    """A point x interval map of discrete labels, one colour each (a ``map`` panel's ``categories``: the phases).

    A continuous heatmap would read the codes as magnitudes; these are categories: ``codes[p, j]`` is the label of
    point ``p``'s change between the observations at ``edges[j]`` and ``edges[j + 1]`` (NaN: undefined, white), so
    a cell's width is its interval.

    Args:
        codes: ``[len(points), len(edges) - 1]`` codes, each one of ``categories``' (code, label, colour).
        points: Point names in depth order (rows, the patch embedding on top).
        edges: The observations' positions on x (epochs, or ``0..E-1`` for log-spaced steps drawn evenly).
        title: The card's title.
        size: `CARD` (`CATEGORY_PIXELS`) or `PAGE`.
        ticks: x ticks (default: up to 8 of ``edges`` on a card, 16 on a page); ``tick_labels`` their labels.
        xlabel: The x axis label.
    """
    x = np.asarray(list(edges), dtype=np.float64)
    card = size == CARD
    if x.size < 2:  # one observation: no change to label, an empty cell around it
        codes = np.full((len(points), 1), np.nan)
        x = np.array([x[0] - 0.5, x[0] + 0.5]) if x.size else np.arange(2.0)
    if card:
        fig = _card_figure(CATEGORY_PIXELS)
        ax, cax = viz.card_axes(fig, left=120, right=150)
        cax.set_axis_off()  # the legend names the colours, in the room the colourbar would take
    else:
        fig = Figure(figsize=(max(7.0, 0.35 * x.size + 5.0), 0.32 * len(points) + 1.9), layout="constrained")
        ax = fig.add_subplot()
    cmap = ListedColormap([colour for _, _, colour in categories]).with_extremes(bad="white")
    bounds = [code - 0.5 for code, _, _ in categories] + [categories[-1][0] + 0.5]
    ax.pcolormesh(x, np.arange(len(points) + 1), np.ma.masked_invalid(np.asarray(codes, dtype=np.float64)),
                  cmap=cmap, norm=BoundaryNorm(bounds, cmap.N), edgecolors="white", linewidth=0.5)  # fmt: skip
    ax.set_ylim(len(points), 0)  # the patch embedding on top: reading order
    rows = viz.thin_indices(len(points), 16) if card else range(len(points))
    ax.set_yticks([i + 0.5 for i in rows], labels=[points[i] for i in rows], fontsize=_TICK if card else 8)
    if ticks is None:
        shown = viz.thin_indices(x.size, 8) if card else range(0, x.size, math.ceil(x.size / 16))
        ticks = [float(x[i]) for i in shown]
    ax.set_xticks(list(ticks), labels=list(tick_labels) if tick_labels else [f"{t:g}" for t in ticks])
    ax.set_xlabel(xlabel, fontsize=_TICK if card else None)
    handles = [Patch(facecolor=colour, edgecolor="#999", label=label) for _, label, colour in categories]
    if card:
        ax.tick_params(labelsize=_TICK)
        ax.set_title(title, fontsize=_FONT)
        for handle in handles:
            handle.set_label(str(handle.get_label()).replace("-", "-\n"))
        box = cax.get_position()
        fig.legend(handles=handles, loc="center left", bbox_to_anchor=(box.x0 - 0.02, 0.5), fontsize=0.8 * _TICK,
                   frameon=False, handlelength=1.0)  # fmt: skip
    else:
        handles.append(Patch(facecolor="white", edgecolor="#999", label="undefined"))
        fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
    return fig


# ------------------------------------------------------------------------------------------------ spectra
def class_count(run_dir: str | os.PathLike[str]) -> int | None:
    """The analysis subset's class count, marked on every spectrum (`tgo.viz.mark_class_count`): the run's
    ``analysis_subset.json`` ``num_classes``, else its class names, else the distinct labels of its items; ``None``
    when the run has no manifest or it does not say."""
    try:
        manifest = json.loads(RunDir(run_dir).manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict):
        return None
    count = manifest.get("num_classes")
    if isinstance(count, int) and not isinstance(count, bool) and count > 0:
        return count
    if isinstance(names := manifest.get("class_names"), list) and names:
        return len(names)
    labels = {item.get("label") for item in manifest.get("items") or [] if isinstance(item, Mapping)}
    labels.discard(None)
    return len(labels) or None


# ------------------------------------------------------------------------------------------------ grid
def grid_figure(panel: Panel, tables: Mapping[tuple[str, str], Table], points: Sequence[str]) -> Figure | None:
    """A ``grid`` panel at page size from ``tables`` over ``points`` (`recorded_tables`, overlays included): each page
    cell holding a finite value as a small chart of its kind, ``columns`` a row (``None``: no cell has a value). A
    ``depth`` cell draws the first, middle and last observation on the epoch ramp over the points that recorded its
    view; a ``bands`` cell each such point against epoch, its ``overlay`` dashed and its ``line`` dotted."""
    drawn = []
    for cell in (c for c in panel.cells if c.page and (c.view, c.metric) in tables):
        epochs, values, stderrs = tables[(cell.view, cell.metric)]
        keep = [i for i in range(len(points)) if cell.rows == "points" or np.any(np.isfinite(values[i]))]
        if keep and np.any(np.isfinite(values[keep])):
            drawn.append((cell, [points[i] for i in keep], epochs, values[keep], stderrs[keep]))
    if not drawn:
        return None
    columns = min(panel.columns or len(drawn), len(drawn))
    rows = math.ceil(len(drawn) / columns)
    fig = Figure(figsize=(3.2 * columns + 1.0, 2.5 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for ax in axes[len(drawn) :]:
        ax.set_visible(False)
    norm, cmap = viz.epoch_colours(sorted({e for _, _, epochs, _, _ in drawn for e in epochs}))  # one ramp for all
    for ax, (cell, names, epochs, values, stderrs) in zip(axes, drawn, strict=False):
        overlay = tables.get((cell.view, cell.overlay or ""))
        shown = [values, overlay[1]] if overlay else [values]
        log = cell.scale == "log" or (cell.scale is None and viz.is_log_scale(cell.metric))
        log = log and all(_positive(v) for v in shown)
        if cell.kind == "depth":
            finite = [e for j, e in enumerate(epochs) if np.any(np.isfinite(values[:, j]))]
            picked = sorted({finite[0], finite[len(finite) // 2], finite[-1]})
            profiles = {e: (values[:, j], stderrs[:, j]) for j, e in enumerate(epochs) if e in picked}
            _depth_lines(ax, profiles, lambda e: cmap(norm(e)), [], log=log, card=False)
            ax.set_xticks(range(len(names)), labels=[n.removeprefix("block_") for n in names], fontsize=7)
            ax.set_xlim(-0.4, len(names) - 0.6)
        else:
            _epoch_lines(ax, epochs, values, stderrs, names, viz.depth_styles(names), log=log)
            if overlay:
                row = overlay[1][list(points).index(names[-1])]
                ax.legend(handles=ax.plot(overlay[0], row, ls="--", lw=1.4, color="#b03a2e", label=cell.overlay),
                          fontsize=7, frameon=False)  # fmt: skip
            if cell.line is not None:
                ax.axhline(cell.line, ls=":", lw=1.0, color="#b03a2e")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
            ax.set_xlabel("epoch", fontsize=8)
            _scale(ax, log, 7)
        ax.set_title(cell.label, fontsize=9)
        ax.grid(True, alpha=0.25)
        ax.tick_params(which="both", labelsize=7)
    depth = [ax for ax, (cell, *_) in zip(axes, drawn, strict=False) if cell.kind == "depth"]
    if depth:  # one legend of the epochs drawn
        handles, labels = depth[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside upper center", ncols=len(handles), fontsize=8, frameon=False)
    return fig


# ------------------------------------------------------------------------------------------------ the card renderer
def recorded_tables(
    root: str | os.PathLike[str], wanted: Sequence[tuple[str, str]], points: Sequence[str], up_to: int | None = None
) -> dict[tuple[str, str], Table]:
    """``{(view, metric): (epochs, values [P, E], stderrs [P, E])}`` of the epochs ``<= up_to`` (all: ``None``).

    One read of ``metrics.csv`` for every table a figure job draws (the file holds every view and epoch; reading it
    once per table cost more than drawing). Rows follow ``points`` (NaN where a point has no value at an epoch);
    each table's epochs are those at which its metric was recorded; metrics never recorded are left out.
    """
    wanted_keys = set(wanted)
    row_of = {point: i for i, point in enumerate(points)}
    cells: dict[tuple[str, str], list[tuple[int, int, float, float]]] = {}
    for row in read_metric_rows(root):
        key = (row["view"], row["metric"])
        if key in wanted_keys and row["point"] in row_of and (up_to is None or int(row["epoch"]) <= up_to):
            cells.setdefault(key, []).append(
                (row_of[row["point"]], int(row["epoch"]), float(row["value"]), float(row["stderr"]))
            )
    tables: dict[tuple[str, str], Table] = {}
    for key in (k for k in wanted if k in cells):
        epochs = sorted({e for _, e, _, _ in cells[key]})
        column = {e: j for j, e in enumerate(epochs)}
        values, stderrs = np.full((2, len(points), len(epochs)), np.nan)
        for i, e, value, se in cells[key]:
            values[i, column[e]], stderrs[i, column[e]] = value, se
        tables[key] = (epochs, values, stderrs)
    return tables


def array_table(arrays: Mapping[str, Mapping[str, np.ndarray]], rows: Sequence[str], name: str) -> np.ndarray | None:
    """``[len(rows), width]`` of each row's array ``name`` (NaN padded), or ``None`` when none holds a value: a
    ``heads`` panel's table, card or page."""
    found = [np.asarray(arrays.get(r, {}).get(name, ()), dtype=np.float64).reshape(-1) for r in rows]
    width = max((a.size for a in found), default=0)
    if width == 0 or not any(np.any(np.isfinite(a)) for a in found):
        return None
    table = np.full((len(rows), width), np.nan)
    for i, a in enumerate(found):
        table[i, : a.size] = a
    return table


def cards(
    panels: Iterable[Panel],
    tables: Mapping[tuple[str, str], Table],
    points: Sequence[str],
    viewed: Mapping[str, Sequence[str]],
    arrays: Mapping[str, Mapping[str, Mapping[str, np.ndarray]]],
) -> Iterator[tuple[str, np.ndarray]]:
    """Every card of ``panels`` (kinds ``depth``, ``bands``, ``map``, ``heads``), rendered: ``(tag, RGB image)``.

    A generator, so that the figure worker may pause between cards. A card is drawn on a figure built once per kind
    and shape (points, epochs) whose lines or image data are replaced from card to card; all depth cards of one
    table shape share one epoch ramp, so a colour is the same epoch on every card. A panel whose data hold no
    finite value is not drawn (no relative update at the first observation, a family off).

    Args:
        panels: The panels to draw, in order.
        tables: (view, metric) -> (epochs, values, stderrs) over ``points`` (`recorded_tables`).
        points: Every point in depth order.
        viewed: view -> the points that recorded it at this observation (a panel's ``rows="recorded"``).
        arrays: view -> point -> the observation's arrays (``heads``: ``heads_<metric>``).
    """
    figures: dict[tuple[Any, ...], Any] = {}

    def figure(build: Any, rows: Sequence[str], shape: Any) -> Any:  # one figure per kind and shape, reused
        key = (build, tuple(rows), shape)
        if key not in figures:
            figures[key] = build(rows, shape)
        return figures[key]

    try:
        for panel in panels:
            if panel.kind not in (*RECORDED_KINDS, "heads"):
                continue  # the spectra and tables have their own drawers
            rows = list(points) if panel.rows == "points" else [p for p in points if p in viewed.get(panel.view, ())]
            log = panel.scale == "log" or (panel.scale is None and viz.is_log_scale(panel.metric))
            if panel.kind == "heads":
                table = array_table(arrays.get(panel.view, {}), rows, f"heads_{panel.metric}")
                if table is not None:
                    heatmap = figure(viz.AttentionHeadsCard, rows, table.shape[1])
                    heatmap.draw(table, panel.label)
                    yield panel.tag_of(), viz.rgb(heatmap.fig)
                continue
            if (panel.view, panel.metric) not in tables or not rows:
                continue
            epochs, values, stderrs = tables[(panel.view, panel.metric)]
            index = [list(points).index(p) for p in rows]
            values, stderrs = values[index], stderrs[index]
            if not np.any(np.isfinite(values)):
                continue
            if panel.kind == "depth":
                profiles = {
                    e: (values[:, j], stderrs[:, j]) for j, e in enumerate(epochs) if np.any(np.isfinite(values[:, j]))
                }
                fig = figure(_DepthProfile, rows, tuple(epochs)).draw(profiles, panel.label, log=log)
            elif panel.kind == "bands":
                fig = figure(_EpochBandCard, rows, tuple(epochs)).draw(epochs, values, stderrs, panel.label, log=log)
            elif panel.categories:  # a label per change: the first observation's code is NaN
                shown = values[:, 1:] if len(epochs) > 1 else values
                label = "epoch (a cell: the change since the previous observation)"
                yield (
                    panel.tag_of(),
                    viz.render_rgb(
                        category_map(shown, rows, epochs, panel.categories, title=panel.label, size=CARD, xlabel=label)
                    ),
                )
                continue
            else:
                fig = figure(viz.LayerEpochCard, rows, tuple(epochs))
                fig.draw(values, panel.label, log=log)
                fig = fig.fig
            yield panel.tag_of(), viz.rgb(fig)
    finally:
        for drawn in figures.values():
            viz.close(drawn.fig)
