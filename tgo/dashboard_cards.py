"""TensorBoard cards that cannot clip or smooth: depth profiles and against-epoch bands of recorded values, as images.

TensorBoard's scalar charts smooth (0.6 by default, and Custom Scalars ignores ``?smoothing=0``) and leave out the
top and bottom 5 % of a chart's values when scaling its y axis ("Ignore outliers in chart scaling", on by default),
so a chart of 15 points whose last blocks stand apart draws those blocks off its top. An image shows what was drawn:
these cards plot the recorded values themselves, every one on the axes (matplotlib scales to all of them), with the
jackknife band of +-1 standard error. Both kinds are drawn for many observables per observation, so each builds its
figure, axes and colourbar once (`depth_profile_cards`, `epoch_band_cards`) and replaces only the lines from card to
card, at fixed pixel margins (no ``tight_layout``, which draws a figure twice).

* **Depth profile** (`depth_profile_figure`): one observable against depth (points in depth order on x), one line
  per observed epoch on the epoch ramp (`tgo.viz.epoch_colours`: dark = first, yellow = latest, read on the
  colourbar), +-1 s.e. band. The depth story of one observable in one picture.
* **Against-epoch band** (`epoch_band_figure`): one observable against epoch, one line per point on the depth ramp
  (`tgo.viz.depth_styles`: dark blue = patch embedding to dark red = last block, CLS black with squares, read on a
  colourbar naming the points), +-1 s.e. band. TensorBoard colours scalar lines by run from a palette of 7 colours,
  so 15 point runs repeat colours; here every point has its own.

The styles are the report's (`tgo.viz`): CLS marked apart from the blocks (`tgo.viz.mark_cls_axis`), ratio-type
observables (catalogue ``scale == "log"``: the Fisher ratio, NC1, the massive-activation ratio) on a log axis with
plain-number labels (`log_scale`, `tgo.viz.log_axis`). Every function uses matplotlib's object API (no pyplot), so
cards can be drawn on the background figure worker's thread.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.collections import PolyCollection
from matplotlib.colors import ListedColormap, Normalize
from matplotlib.figure import Figure

from tgo import viz

__all__ = [
    "BAND_PIXELS",
    "PROFILE_PIXELS",
    "depth_profile_cards",
    "depth_profile_figure",
    "epoch_band_cards",
    "epoch_band_figure",
    "log_scale",
]

PROFILE_PIXELS = (480, 320)
"""A depth-profile card's size (px): the rotated point names need the height (as `tgo.viz.depth_profile_figure`)."""
BAND_PIXELS = (480, 240)
"""An against-epoch card's size (px): TensorBoard's ~450 x 210 px image box shows a 2:1 card at ~90 %."""
_FONT = viz.CARD_FONTSIZE
_TICK = 0.85 * viz.CARD_FONTSIZE

Profiles = Mapping[int, tuple[np.ndarray, np.ndarray]]
"""epoch -> (values [P], standard errors [P]) over the points in depth order (NaN where none)."""


def log_scale(metric: str) -> bool:
    """Whether ``metric`` is drawn on a log axis: its catalogue entry's ``scale`` is ``log`` (ratio-type observables
    that move by decades; `tgo.viz.is_log_scale`). Names outside the catalogue are linear."""
    return viz.is_log_scale(metric)


def _axes(fig: Figure, *, left: int, right: int, bottom: int, top: int = 30) -> tuple[Any, Any]:
    """The plot and colourbar axes of a card at fixed pixel margins; ``right`` is the colourbar's label room."""
    width, height = (size * fig.dpi for size in fig.get_size_inches())
    bar, gap = 14, 10
    plot_height = (height - bottom - top) / height
    ax = fig.add_axes((left / width, bottom / height, (width - left - right - bar - gap) / width, plot_height))
    cax = fig.add_axes(((width - right - bar) / width, bottom / height, bar / width, plot_height))
    return ax, cax


def _colourbar(fig: Figure, cax: Any, norm: Normalize, cmap: Any, ticks: Sequence[float], labels: Sequence[str]) -> Any:
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), cax=cax)
    bar.set_ticks(list(ticks))
    bar.set_ticklabels(list(labels))
    bar.ax.tick_params(labelsize=_TICK)
    return bar


def _clear(ax: Any) -> None:
    for artist in [*ax.lines, *ax.collections]:
        artist.remove()


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
    """Every band of a card as one collection (15 ``fill_between`` calls cost as much as drawing the card)."""
    if polygons:
        collection = PolyCollection(polygons, facecolors=colours, alpha=alpha, linewidths=0)
        ax.add_collection(collection, autolim=True)


def _positive(values: Any) -> bool:
    """Whether every finite value is > 0: a log axis can show them (a ratio estimated below 0, e.g. the noise scale
    from too few steps, is drawn on a linear axis instead, not left off)."""
    v = np.asarray(values, dtype=np.float64)
    return bool(np.all(v[np.isfinite(v)] > 0))


def _scale(ax: Any, log: bool) -> None:
    """Linear or log y axis (`tgo.viz.log_axis`: plain-number labels), limits from every line and band drawn now
    (nothing is left off the axes)."""
    if log:
        viz.log_axis(ax, labelsize=_TICK)
    else:
        ax.set_yscale("linear")
    ax.relim()
    ax.autoscale_view()
    if not log:  # a flat profile still gets a readable span
        low, high = ax.get_ylim()
        if not high > low:
            ax.set_ylim(low - 0.5, high + 0.5)


# ------------------------------------------------------------------------------------------------ depth profiles
class _DepthProfileCard:
    """One depth-profile figure (axes, point labels, epoch colourbar) built once; `draw` replaces the lines."""

    def __init__(self, points: Sequence[str], epochs: Sequence[int]) -> None:
        width, height = PROFILE_PIXELS
        self.fig = Figure(figsize=(width / viz.CARD_DPI, height / viz.CARD_DPI), dpi=viz.CARD_DPI)
        self.ax, cax = _axes(self.fig, left=74, right=56, bottom=108)
        self.points = list(points)
        self.norm, self.cmap = viz.epoch_colours(list(epochs))
        ticks = [sorted(set(epochs))[i] for i in viz.thin_indices(len(set(epochs)), 6)]
        _colourbar(self.fig, cax, self.norm, self.cmap, ticks, [str(t) for t in ticks]).set_label(
            "epoch", fontsize=_FONT
        )
        x = np.arange(len(self.points))
        step = 2 if len(self.points) > 10 else 1
        labels = [p if i % step == 0 or i == len(self.points) - 1 else "" for i, p in enumerate(self.points)]
        self.ax.set_xticks(x, labels=labels, rotation=45, ha="right", rotation_mode="anchor", fontsize=_TICK)
        self.cls = [i for i, p in enumerate(self.points) if p == viz.CLS_POINT]
        self.blocks = [i for i in range(len(self.points)) if i not in self.cls]
        self.ax.set_xlim(-0.4, len(self.points) - 0.6)
        self.ax.tick_params(axis="y", labelsize=_TICK)
        self.ax.grid(True, alpha=0.25)

    def draw(self, profiles: Profiles, title: str, *, log: bool) -> None:
        _clear(self.ax)
        log = log and all(_positive(values) for values, _ in profiles.values())
        viz.mark_cls_axis(self.ax, self.points)  # its dotted line before CLS went with the previous card's lines
        x = np.arange(len(self.points), dtype=np.float64)
        polygons, colours = [], []
        for epoch in sorted(profiles):
            values, se = (np.asarray(a, dtype=np.float64) for a in profiles[epoch])
            colour = self.cmap(self.norm(epoch))
            self.ax.plot(x, values, color=colour, lw=2.2, marker="o", ms=5, markevery=self.blocks)
            if self.cls:  # CLS as the report draws it: a square with a black edge
                self.ax.plot(x[self.cls], values[self.cls], color=colour, ls="none", marker="s", ms=7, mec="black",
                             mew=0.8)  # fmt: skip
            band = _band_polygons(x, values, se, log=log)
            polygons += band
            colours += [colour] * len(band)
        _bands(self.ax, polygons, colours, 0.2)
        _scale(self.ax, log)
        self.ax.set_title(title + (", log axis" if log else ""), fontsize=1.1 * _FONT)


def depth_profile_figure(profiles: Profiles, points: Sequence[str], *, title: str, log: bool = False) -> Figure:
    """One observable against depth, a TensorBoard card (`PROFILE_PIXELS`): one line per epoch, +-1 s.e. band.

    Args:
        profiles: epoch -> (values, standard errors) over ``points`` (NaN where none; a band where both are finite).
        points: Point names in depth order (the x axis; CLS named in bold).
        title: The observable (and its view).
        log: A log y axis (`log_scale`); a band that reaches zero is left out where it does.
    """
    card = _DepthProfileCard(points, sorted(profiles))
    card.draw(profiles, title, log=log)
    return card.fig


def depth_profile_cards(
    profiles: Mapping[str, Profiles], points: Sequence[str], *, titles: Mapping[str, str] | None = None
) -> Iterator[tuple[str, np.ndarray]]:
    """`depth_profile_figure` of every entry of ``profiles``, rendered: ``(key, RGB image)``, one at a time.

    Drawn on one figure whose lines are replaced from card to card, all on one epoch ramp (the union of the epochs),
    so a colour is the same epoch on every card. A key's log axis follows `log_scale` of its metric: keys are metric
    names, or ``"<view>/<metric>"``. A generator, so that the background figure worker may pause between cards.

    Args:
        profiles: key -> epoch -> (values, standard errors) over ``points``; empty entries are skipped.
        points: Point names in depth order.
        titles: key -> title (default: the key).
    """
    epochs = sorted({e for by_epoch in profiles.values() for e in by_epoch})
    if not epochs:
        return
    card = _DepthProfileCard(points, epochs)
    try:
        for key, by_epoch in profiles.items():
            if by_epoch:
                card.draw(by_epoch, (titles or {}).get(key, key), log=log_scale(key.rsplit("/", 1)[-1]))
                yield key, _rgb(card.fig)
    finally:
        viz.close(card.fig)


# ------------------------------------------------------------------------------------------------ against epoch
class _EpochBandCard:
    """One against-epoch figure (axes, depth colourbar naming the points) built once; `draw` replaces the lines."""

    def __init__(self, points: Sequence[str], epochs: Sequence[int]) -> None:
        width, height = BAND_PIXELS
        self.fig = Figure(figsize=(width / viz.CARD_DPI, height / viz.CARD_DPI), dpi=viz.CARD_DPI)
        self.ax, cax = _axes(self.fig, left=74, right=118, bottom=50)
        self.points = list(points)
        self.styles = viz.depth_styles(self.points)
        self.colours = {p: style["color"] for p, style in self.styles.items()}
        cmap = ListedColormap([self.colours[p] for p in self.points] or ["black"])
        norm = Normalize(vmin=-0.5, vmax=max(len(self.points), 1) - 0.5)
        ticks = viz.thin_indices(len(self.points), 8)
        bar = _colourbar(self.fig, cax, norm, cmap, ticks, [self.points[i] for i in ticks])
        bar.ax.invert_yaxis()  # the patch embedding on top, CLS at the bottom: reading order
        for label in bar.ax.get_yticklabels():
            if label.get_text() == viz.CLS_POINT:
                label.set_fontweight("bold")
        shown = [sorted(set(epochs))[i] for i in viz.thin_indices(len(set(epochs)), 7)]
        self.ax.set_xticks(shown, labels=[str(e) for e in shown])
        self.ax.set_xlabel("epoch", fontsize=_FONT)
        self.ax.tick_params(labelsize=_TICK)
        self.ax.grid(True, alpha=0.25)

    def draw(self, epochs: Sequence[int], values: np.ndarray, stderrs: np.ndarray, title: str, *, log: bool) -> None:
        _clear(self.ax)
        log = log and _positive(values)
        x = np.asarray(list(epochs), dtype=np.float64)
        polygons, colours = [], []
        for i, point in enumerate(self.points):
            cls = point == viz.CLS_POINT
            colour = self.colours[point]
            row, se = values[i], stderrs[i]
            if not np.any(np.isfinite(row)):
                continue
            self.ax.plot(x, row, color=colour, lw=2.6 if cls else 1.6, marker=self.styles[point]["marker"],
                         ms=4.5 if cls else 3.5, zorder=3 if cls else 2)  # fmt: skip
            band = _band_polygons(x, row, se, log=log)
            polygons += band
            colours += [colour] * len(band)
        _bands(self.ax, polygons, colours, 0.12)
        _scale(self.ax, log)
        self.ax.set_title(title + (", log axis" if log else ""), fontsize=1.1 * _FONT)


def epoch_band_figure(
    epochs: Sequence[int], values: np.ndarray, stderrs: np.ndarray, points: Sequence[str], *, title: str, log: bool
) -> Figure:
    """One observable against epoch, a TensorBoard card (`BAND_PIXELS`): one line per point, +-1 s.e. band.

    Args:
        epochs: The observed epochs (x).
        values: ``[len(points), len(epochs)]`` (`tgo.records.layer_epoch_table`), NaN where none.
        stderrs: The same table of jackknife standard errors (a band where finite).
        points: Point names in depth order (the colours, `tgo.viz.depth_styles`).
        title: The observable.
        log: A log y axis (`log_scale`).
    """
    card = _EpochBandCard(points, epochs)
    card.draw(epochs, values, stderrs, title, log=log)
    return card.fig


def epoch_band_cards(
    tables: Mapping[str, tuple[np.ndarray, np.ndarray]],
    points: Sequence[str],
    epochs: Sequence[int],
    *,
    titles: Mapping[str, str] | None = None,
) -> Iterator[tuple[str, np.ndarray]]:
    """`epoch_band_figure` of every entry of ``tables`` (key -> (values, stderrs) ``[P, E]``), rendered, on one figure
    whose lines are replaced from card to card; log axes as `depth_profile_cards`. A generator."""
    if not epochs or not tables:
        return
    card = _EpochBandCard(points, epochs)
    try:
        for key, (values, stderrs) in tables.items():
            card.draw(epochs, values, stderrs, (titles or {}).get(key, key), log=log_scale(key.rsplit("/", 1)[-1]))
            yield key, _rgb(card.fig)
    finally:
        viz.close(card.fig)


def _rgb(fig: Figure) -> np.ndarray:
    """The figure drawn by an Agg canvas as RGB ``uint8`` ``(H, W, 3)``, without clearing it (it is drawn again)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


# ------------------------------------------------------------------------------------------------ training phases
PHASE_PIXELS = (640, 400)
"""Width and height of the phase map card."""


def phase_map_card(codes: np.ndarray, points: Sequence[str], epochs: Sequence[int]) -> np.ndarray:
    """The training phases as a point x epoch map of discrete colours, rendered (RGB ``uint8``).

    ``codes[p, e]`` is the recorded ``phase_code`` of point ``p`` at epoch ``epochs[e]``: the label of the change from
    the previous observation to that one (-2 collapse, -1 compression-seeking, 0 unresolved, +1 entropy-seeking; NaN
    at the first observation or undefined), drawn in the report's colours (`tgo.report.phases.PHASE_COLOURS`) over
    the interval it labels. A continuous heatmap would read the codes as magnitudes; these are categories.
    """
    from matplotlib.colors import BoundaryNorm
    from matplotlib.patches import Patch

    from tgo.report.phases import PHASE_COLOURS
    from tgo.spectral.phases import COLLAPSE, COMPRESSION, ENTROPY, UNRESOLVED

    order = [COLLAPSE, COMPRESSION, UNRESOLVED, ENTROPY]
    width, height = PHASE_PIXELS
    fig = Figure(figsize=(width / viz.CARD_DPI, height / viz.CARD_DPI), dpi=viz.CARD_DPI)
    try:
        ax, cax = _axes(fig, left=120, right=150, bottom=50)
        cax.set_axis_off()  # the legend names the colours, in the room the colourbar would take
        edges = np.asarray(list(epochs), dtype=np.float64)
        values = np.asarray(codes, dtype=np.float64)[:, 1:] if len(edges) > 1 else np.full((len(points), 1), np.nan)
        x = edges if len(edges) > 1 else np.array([edges[0] - 0.5, edges[0] + 0.5]) if len(edges) else np.arange(2.0)
        cmap = ListedColormap([PHASE_COLOURS[k] for k in order]).with_extremes(bad="white")
        ax.pcolormesh(
            x,
            np.arange(len(points) + 1),
            np.ma.masked_invalid(values),
            cmap=cmap,
            norm=BoundaryNorm([-2.5, -1.5, -0.5, 0.5, 1.5], cmap.N),
            edgecolors="white",
            linewidth=0.5,
        )
        ax.set_ylim(len(points), 0)  # the patch embedding on top: reading order
        ticks = viz.thin_indices(len(points), 16)
        ax.set_yticks([i + 0.5 for i in ticks], labels=[points[i] for i in ticks], fontsize=_TICK)
        shown = [int(edges[i]) for i in viz.thin_indices(len(edges), 8)] if len(edges) > 1 else []
        ax.set_xticks(shown, labels=[str(e) for e in shown])
        ax.set_xlabel("epoch (a cell: the change since the previous observation)", fontsize=_TICK)
        ax.tick_params(labelsize=_TICK)
        ax.set_title("training phases", fontsize=_FONT)
        box = cax.get_position()
        fig.legend(
            handles=[Patch(facecolor=PHASE_COLOURS[k], edgecolor="grey", label=k.replace("-", "-\n")) for k in order],
            loc="center left",
            bbox_to_anchor=(box.x0 - 0.02, 0.5),
            fontsize=0.8 * _TICK,
            frameon=False,
            handlelength=1.0,
        )
        return _rgb(fig)
    finally:
        viz.close(fig)
