"""The Hypotheses section's figures: depth profiles of each prediction's metric, and CKA matrices between points.

Nothing here decides a verdict: the profiles draw the window means and errors the verdicts judged and colour the markers
with the verdicts they are given."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from tgo.viz import CLS_POINT, FIRST_COLOUR, LAST_COLOUR, log_axis, mark_cls_axis

__all__ = ["FIRST_GID", "LAST_GID", "VERDICT_COLOURS", "Profile", "cka_figure", "epochs_label", "profiles_figure"]

VERDICT_COLOURS: dict[str, str] = {
    "consistent": "#2e9e44",
    "inconsistent": "#d62728",
    "inconclusive": "#6b8fc7",
    "n/a": "#b0b0b0",
}
"""Marker colour of each verdict (the page's table colours, darker)."""
_FIRST, _LAST, _BETWEEN = FIRST_COLOUR, LAST_COLOUR, "#9a9a9a"
FIRST_GID, LAST_GID = "first-window", "last-window"
"""The ``gid`` of the lines that draw a panel's first- and last-window means (their y data are the means)."""


@dataclass(frozen=True)
class Profile:
    """One panel: a prediction's metric across points as judged: every observation (``values``, thin lines), the first-
    and last-window means with their band edges (``low``, ``high``: ``[2, points]`` or ``None``), each point's verdict
    and the windows' epochs."""

    title: str
    points: Sequence[str]
    epochs: Sequence[int]
    values: np.ndarray
    first: np.ndarray
    last: np.ndarray
    low: np.ndarray | None
    high: np.ndarray | None
    verdicts: Sequence[str]
    windows: tuple[str, str] = ("", "")
    log: bool = False


def epochs_label(span: str) -> str:
    """``epochs 0-5`` for a window of several observations, ``epoch 30`` for a single one (``""`` for none)."""
    if not span:
        return ""
    return f"epoch{'s' if '-' in span or '/' in span else ''} {span}"


def _draw_profile(ax: Axes, profile: Profile) -> None:
    x = np.arange(len(profile.points), dtype=np.float64)
    values = np.asarray(profile.values, dtype=np.float64)
    single = len(x) == 1  # one point: lines and bands are invisible, so draw error bars side by side
    for row in values:
        ax.plot(x, row, color=_BETWEEN, lw=0.6, alpha=0.35, marker="." if single else None)
    ends = [(0, np.asarray(profile.first, dtype=np.float64), _FIRST, FIRST_GID)]
    ends.append((1, np.asarray(profile.last, dtype=np.float64), _LAST, LAST_GID))
    for i, row, colour, gid in ends:
        lo = hi = None
        if profile.low is not None and profile.high is not None:
            lo, hi = profile.low[i], profile.high[i]
        if single:
            shift = -0.08 if i == 0 else 0.08
            err = None if lo is None or hi is None else np.abs(np.array([[row[0] - lo[0]], [hi[0] - row[0]]]))
            ax.errorbar(x + shift, row, yerr=err, fmt="o", color=colour, ms=4, capsize=3, gid=gid)
            continue
        ax.plot(x, row, color=colour, lw=1.4, marker="o" if i == 0 else None, ms=3, gid=gid)
        if lo is not None and hi is not None and np.any(np.isfinite(lo) & np.isfinite(hi)):
            ax.fill_between(x, lo, hi, color=colour, alpha=0.18, lw=0)
    colours = [VERDICT_COLOURS.get(v, VERDICT_COLOURS["n/a"]) for v in profile.verdicts]
    last_x = x + (0.08 if single else 0.0)
    markers = ["s" if p == CLS_POINT else "o" for p in profile.points]
    for shape in dict.fromkeys(markers):
        pick = [k for k, m in enumerate(markers) if m == shape]
        ax.scatter(
            last_x[pick],
            np.asarray(profile.last, dtype=np.float64)[pick],
            c=[colours[k] for k in pick],
            s=34 if shape == "s" else 28,
            marker=shape,
            zorder=3,
            edgecolors="black" if shape == "s" else "white",
            linewidths=0.6,
        )
    ax.set_xticks(x, labels=list(profile.points), rotation=55, ha="right", fontsize=6)
    mark_cls_axis(ax, profile.points, separator=not single)
    ax.tick_params(axis="y", labelsize=6)
    if profile.log:
        log_axis(ax, labelsize=6)
    ax.set_xlim(-0.5, len(x) - 0.5)
    first, last = profile.windows
    windows = f"\nwindows: {epochs_label(first)} vs {epochs_label(last)}" if first and last else ""
    ax.set_title(profile.title + windows + (" (log axis)" if profile.log else ""), fontsize=7.5)
    ax.grid(True, alpha=0.2)


def profiles_figure(profiles: Sequence[Profile], *, title: str, band: str, columns: int = 4) -> Figure:
    """One panel per prediction, its metric against depth: the first- and last-window means it was judged on, with their
    bands, the last profile's markers coloured by the verdict at each point (CLS a square)."""
    count = max(len(profiles), 1)
    rows = math.ceil(count / max(1, columns))
    columns = math.ceil(count / rows)  # balanced rows: 5 panels are 3 + 2, not 4 + 1
    fig = Figure(figsize=(3.1 * columns, 2.7 * rows + 0.9), dpi=100, layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax, profile in zip(axes.flat, profiles, strict=False):
        _draw_profile(ax, profile)
    for ax in list(axes.flat)[len(profiles) :]:
        ax.set_visible(False)
    windows = {p.windows for p in profiles}
    first, last = next(iter(windows)) if len(windows) == 1 else ("", "")
    handles = [
        Line2D(
            [],
            [],
            color=_FIRST,
            lw=1.4,
            marker="o",
            ms=3,
            label="first window mean" + (f" ({epochs_label(first)})" if first else ""),
        ),
        Line2D([], [], color=_LAST, lw=1.4, label="last window mean" + (f" ({epochs_label(last)})" if last else "")),
        Line2D([], [], color=_BETWEEN, lw=0.6, label="every observed epoch"),
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
    """Heatmaps of linear CKA between points, one panel per label, values written in (NaN: undefined pair)."""
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
