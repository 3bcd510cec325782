"""The Hypotheses section's figures: depth profiles of each prediction's metric, and CKA matrices between points.

Drawn with matplotlib's object API (no pyplot state), like `tgo.viz`; every function takes plain arrays and returns a
``Figure`` that `tgo.report.figures` saves. Nothing here decides a verdict: the profile figure colours the markers
with the verdicts it is given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

__all__ = ["VERDICT_COLOURS", "Profile", "cka_figure", "profiles_figure"]

VERDICT_COLOURS: dict[str, str] = {
    "consistent": "#2e9e44",
    "inconsistent": "#d62728",
    "inconclusive": "#6b8fc7",
    "n/a": "#b0b0b0",
}
"""Marker colour of each verdict (the page's table colours, darker)."""
_FIRST, _LAST, _BETWEEN = "#e08a2c", "#1f3b73", "#9a9a9a"


@dataclass(frozen=True)
class Profile:
    """One panel: a metric across points (depth) at every observed epoch.

    Attributes:
        title: Panel title (metric, view, predicted direction).
        points: Point names, x axis in depth order.
        epochs: Observed epochs, ascending.
        values: ``[len(epochs), len(points)]`` values (NaN where a point lacks an epoch).
        low: Lower band edge of the first and last epoch (``[2, len(points)]``), or ``None`` for no band.
        high: Upper band edge, same shape.
        verdicts: The verdict at each point (marker colour on the last epoch's profile).
    """

    title: str
    points: Sequence[str]
    epochs: Sequence[int]
    values: np.ndarray
    low: np.ndarray | None
    high: np.ndarray | None
    verdicts: Sequence[str]


def _draw_profile(ax: Axes, profile: Profile) -> None:
    x = np.arange(len(profile.points), dtype=np.float64)
    values = np.asarray(profile.values, dtype=np.float64)
    single = len(x) == 1  # one point: lines and bands are invisible, so draw error bars side by side
    for row in values[1:-1]:
        ax.plot(x, row, color=_BETWEEN, lw=0.6, alpha=0.35, marker="." if single else None)
    ends = [(0, values[0], _FIRST)] + ([(1, values[-1], _LAST)] if values.shape[0] > 1 else [])
    for i, row, colour in ends:
        lo = hi = None
        if profile.low is not None and profile.high is not None:
            lo, hi = profile.low[i], profile.high[i]
        if single:
            shift = -0.08 if i == 0 else 0.08
            err = None if lo is None or hi is None else np.abs(np.array([[row[0] - lo[0]], [hi[0] - row[0]]]))
            ax.errorbar(x + shift, row, yerr=err, fmt="o", color=colour, ms=4, capsize=3)
            continue
        ax.plot(x, row, color=colour, lw=1.4, marker="o" if i == 0 else None, ms=3)
        if lo is not None and hi is not None and np.any(np.isfinite(lo) & np.isfinite(hi)):
            ax.fill_between(x, lo, hi, color=colour, alpha=0.18, lw=0)
    colours = [VERDICT_COLOURS.get(v, VERDICT_COLOURS["n/a"]) for v in profile.verdicts]
    last_x = x + (0.08 if single and values.shape[0] > 1 else 0.0)
    ax.scatter(last_x, values[-1], c=colours, s=28, zorder=3, edgecolors="white", linewidths=0.6)
    ax.set_xticks(x, labels=list(profile.points), rotation=55, ha="right", fontsize=6)
    ax.tick_params(axis="y", labelsize=6)
    ax.set_xlim(-0.5, len(x) - 0.5)
    ax.set_title(profile.title, fontsize=7.5)
    ax.grid(True, alpha=0.2)


def profiles_figure(profiles: Sequence[Profile], *, title: str, band: str, columns: int = 4) -> Figure:
    """One panel per prediction, its metric against depth at the first and the last epoch.

    Intermediate epochs are thin grey lines; the first epoch is orange with dots, the last dark blue, each with its
    band; the markers on the last profile are coloured by the prediction's verdict at that point.

    Args:
        profiles: The panels, in order.
        title: The figure's title (the hypothesis).
        band: What the bands are, for the legend (``±1 jackknife standard error``).
        columns: Panels per row.
    """
    count = max(len(profiles), 1)
    rows = math.ceil(count / max(1, columns))
    columns = math.ceil(count / rows)  # balanced rows: 5 panels are 3 + 2, not 4 + 1
    fig = Figure(figsize=(3.1 * columns, 2.55 * rows + 0.8), dpi=100, layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax, profile in zip(axes.flat, profiles, strict=False):
        _draw_profile(ax, profile)
    for ax in list(axes.flat)[len(profiles) :]:
        ax.set_visible(False)
    first = profiles[0].epochs[0] if profiles and len(profiles[0].epochs) else ""
    last = profiles[0].epochs[-1] if profiles and len(profiles[0].epochs) else ""
    handles = [
        Line2D([], [], color=_FIRST, lw=1.4, marker="o", ms=3, label=f"first epoch ({first})"),
        Line2D([], [], color=_LAST, lw=1.4, label=f"last epoch ({last})"),
        Line2D([], [], color=_BETWEEN, lw=0.6, label="epochs between"),
        *(
            Line2D([], [], color="white", marker="o", markerfacecolor=c, ms=6, label=v)
            for v, c in VERDICT_COLOURS.items()
        ),
    ]
    fig.legend(
        handles=handles, loc="outside lower center", ncol=4 if columns < 3 else len(handles), fontsize=7, frameon=False
    )
    fig.suptitle(f"{title}   (bands: {band})", fontsize=9)
    return fig


def cka_figure(matrices: Mapping[str, np.ndarray], points: Sequence[str], *, title: str) -> Figure:
    """Heatmaps of linear CKA between points, one panel per label (``epoch 0``, ``epoch 30``), values written in.

    Args:
        matrices: label -> ``[P, P]`` CKA matrix (NaN where a pair is undefined: a constant representation).
        points: The ``P`` point names.
        title: The figure's title.
    """
    count = max(len(matrices), 1)
    size = max(3.0, 0.34 * len(points) + 1.6)
    fig = Figure(figsize=(size * count + 0.8, size + 0.5), dpi=100, layout="constrained")
    axes = fig.subplots(1, count, squeeze=False)[0]
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#dddddd")
    image = None
    for ax, (label, matrix) in zip(axes, matrices.items(), strict=False):
        m = np.asarray(matrix, dtype=np.float64)
        image = ax.imshow(np.ma.masked_invalid(m), cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest")
        ticks = range(len(points))
        ax.set_xticks(ticks, labels=list(points), rotation=60, ha="right", fontsize=6)
        ax.set_yticks(ticks, labels=list(points), fontsize=6)
        ax.set_title(label, fontsize=8)
        if len(points) <= 16:
            for i in range(m.shape[0]):
                for j in range(m.shape[1]):
                    text = "n/a" if not np.isfinite(m[i, j]) else f"{m[i, j]:.2f}"
                    shade = "black" if not np.isfinite(m[i, j]) or m[i, j] > 0.6 else "white"
                    ax.text(j, i, text, ha="center", va="center", fontsize=5, color=shade)
    if image is not None:
        fig.colorbar(image, ax=list(axes), fraction=0.03, pad=0.02, label="linear CKA")
    fig.suptitle(title, fontsize=9)
    return fig
