"""The report's own matplotlib figures (object API, no pyplot state): epoch colour ramps with a colourbar, integer
epoch ticks, markers where a series has few observations, depth profiles, and the published data on its own axes.

`tgo.viz` draws the TensorBoard figures; these are the report's versions, made to be read without the page around
them: every colour ramp has a colourbar, every axis range is the meaningful one (log axes for the catalogue's
ratio-type observables, no round-off eigenvalues), CLS is black with square markers beside the depth ramp of the
other points (`tgo.viz.depth_styles`). The epoch ramp and the depth profile live in `tgo.viz` (TensorBoard draws
them too) and are re-exported here for the report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from numpy.typing import ArrayLike

from tgo.viz import (
    CLS_POINT,
    EPOCH_CMAP,
    above_roundoff,
    depth_profile_figure,
    depth_styles,
    epoch_colourbar,
    epoch_colours,
    is_log_scale,
    log_axis,
    mark_class_count,
)

__all__ = [
    "DECAY_FLOOR",
    "EPOCH_CMAP",
    "decay_figure",
    "depth_profile_figure",
    "epoch_colours",
    "lines_figure",
    "spectrum_history_figure",
]

DECAY_FLOOR = 1e-12
"""Relative eigenvalues below this (lambda_i / lambda_1) are float64 round-off of a rank-deficient covariance, not
geometry, and are left off the decay figure."""
MARKERS_UP_TO = 12
"""Series with at most this many observations are drawn with markers."""


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
    """One observable against epoch, one line per point (depth coloured, CLS black with squares), integer epochs.

    Series with few observations get markers (a single observation is a marker alone). With ``reference``, a
    second panel on its own y axis draws the published series against the fraction of training (epoch /
    ``reference_epochs``), and the run's panel uses epoch / ``run_epochs`` too when ``run_epochs`` is known, so
    neither hides the other. ``log``: log y axes (``None``: the catalogue's scale of ``title``,
    `tgo.viz.is_log_scale`).
    """
    panels = 2 if reference else 1
    fig = Figure(figsize=(6.0 if panels == 1 else 10.0, 4.0), dpi=90)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    ax = axes[0]
    names = list(series)
    styles = depth_styles(names)
    log = is_log_scale(title) if log is None else log
    fraction = bool(reference) and bool(run_epochs)
    for name in names:
        style = styles[name]
        color = style["color"]
        cls = name == CLS_POINT
        epochs = np.asarray(series[name][0], dtype=np.float64)
        values = np.asarray(series[name][1], dtype=np.float64)
        x = epochs / run_epochs if fraction and run_epochs else epochs
        marker = style["marker"] if epochs.size <= MARKERS_UP_TO or cls else None
        ax.plot(
            x,
            values,
            color=color,
            lw=1.8 if cls else 1.2,
            label=name,
            marker=marker,
            ms=(4 if epochs.size > 1 else 6) + (1 if cls else 0),
            markevery=None if epochs.size <= MARKERS_UP_TO else max(1, epochs.size // 10),
            zorder=3 if cls else 2,
        )
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
        log_axis(ax)
    ax.legend(fontsize=6, ncol=2)
    if reference:
        ref_ax = axes[1]
        for name in names:
            if name in reference:
                ref_epochs, ref_values = (np.asarray(a, dtype=np.float64) for a in reference[name])
                cls = name == CLS_POINT
                ref_ax.plot(
                    ref_epochs / reference_epochs,
                    ref_values,
                    color=styles[name]["color"],
                    lw=1.6 if cls else 1.0,
                    marker=styles[name]["marker"] if cls else None,
                    ms=4,
                    markevery=max(1, ref_epochs.size // 10),
                    zorder=3 if cls else 2,
                )
        if log:
            log_axis(ref_ax)
        ref_ax.set_xlabel("fraction of training (epoch / 100)")
        ref_ax.set_title("published TGO-I (ViT-S/16, ImageNet-100)", fontsize=9)
        ref_ax.grid(True, alpha=0.2)
        if fraction:
            ref_ax.set_xlim(ax.get_xlim())
    fig.tight_layout()
    return fig


def spectrum_history_figure(
    history: Sequence[tuple[int, np.ndarray]],
    *,
    title: str,
    ylabel: str = "eigenvalue",
    classes: int | None = None,
    keep: Sequence[np.ndarray] | None = None,
) -> Figure:
    """Log-log rank plot of a point's spectra, one line per epoch on the epoch colour ramp, with a colourbar.

    Args:
        history: ``(epoch, values)`` pairs in epoch order, values sorted descending.
        title: The figure's title.
        ylabel: What the values are.
        classes: The analysis subset's class count, marked by a dashed line at index ``C`` (`tgo.viz.mark_class_count`);
            ``None``: unknown, no line.
        keep: Per epoch, which values to draw (default: the eigenvalues above the round-off floor,
            `tgo.viz.above_roundoff`; a singular-value history passes its eigenvalues' masks).
    """
    fig = Figure(figsize=(5.2, 3.6), dpi=90)
    ax = fig.add_subplot()
    epochs = [e for e, _ in history]
    norm, cmap = epoch_colours(epochs)
    for k, (epoch, values) in enumerate(history):
        values = np.asarray(values, dtype=np.float64)
        index = np.arange(1, values.size + 1)
        shown = above_roundoff(values) if keep is None else np.asarray(keep[k], dtype=bool) & (values > 0)
        if np.any(shown):
            ax.loglog(
                index[shown], values[shown], color=cmap(norm(epoch)), lw=1.1, marker="o" if shown.sum() == 1 else None
            )
    mark_class_count(ax, classes)
    ax.set_xlabel("index i")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.2)
    epoch_colourbar(fig, ax, norm, cmap, epochs)
    fig.tight_layout()
    return fig


def decay_figure(spectra: Mapping[str, np.ndarray], *, title: str, floor: float = DECAY_FLOOR) -> Figure:
    """``lambda_i / lambda_1`` per point (log-log), one line per point (depth coloured), values below ``floor``
    (round-off) left off so the y axis spans the meaningful range."""
    fig = Figure(figsize=(6.2, 3.9), dpi=90)
    ax = fig.add_subplot()
    names = list(spectra)
    styles = depth_styles(names)
    lowest = 1.0
    for name in names:
        values = np.asarray(spectra[name], dtype=np.float64)
        index = np.arange(1, values.size + 1)
        keep = np.isfinite(values) & (values > 0)
        if not np.any(keep):
            continue
        ratio = values[keep] / values[keep][0]
        idx = index[keep]
        meaningful = ratio >= floor
        if np.any(meaningful):
            lowest = min(lowest, float(ratio[meaningful].min()))
            cls = name == CLS_POINT
            ax.loglog(
                idx[meaningful],
                ratio[meaningful],
                color=styles[name]["color"],
                lw=1.8 if cls else 1.0,
                label=name,
                zorder=3 if cls else 2,
            )
    ax.set_ylim(max(lowest, floor) / 2.0, 2.0)
    ax.set_xlabel("index i")
    ax.set_ylabel(r"$\lambda_i / \lambda_1$")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig
