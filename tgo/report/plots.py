"""The report's spectra figures (object API, no pyplot state): a point's spectra over epochs and the decay curves.

Made to be read without the page around them: every colour ramp has a colourbar, every axis range is the meaningful
one (no round-off eigenvalues), CLS is black beside the depth ramp of the other points (`tgo.viz.depth_styles`).
The panels both renderers draw (depth profiles, bands against epoch) are `tgo.panels`; `lines_figure` (the bands'
page drawer) is re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from tgo.panels import lines_figure
from tgo.viz import CLS_POINT, above_roundoff, depth_styles, epoch_colourbar, epoch_colours, mark_class_count

__all__ = ["DECAY_FLOOR", "decay_figure", "lines_figure", "spectrum_history_figure"]

DECAY_FLOOR = 1e-12
"""Relative eigenvalues below this (lambda_i / lambda_1) are float64 round-off of a rank-deficient covariance, not
geometry, and are left off the decay figure."""


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
