"""The report's own matplotlib figures (object API, no pyplot state): epoch colour ramps with a colourbar, integer
epoch ticks, markers where a series has few observations, depth profiles, and the published data on its own axes.

`tgo.viz` draws the TensorBoard figures; these are the report's versions, made to be read without the page around
them: every colour ramp has a colourbar, every axis range is the meaningful one. The epoch ramp and the depth
profile live in `tgo.viz` (TensorBoard draws them too) and are re-exported here for the report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from numpy.typing import ArrayLike

from tgo.viz import EPOCH_CMAP, depth_profile_figure, epoch_colourbar, epoch_colours

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
) -> Figure:
    """One observable against epoch, one line per point (depth coloured), integer epoch ticks.

    Series with few observations get markers (a single observation is a marker alone). With ``reference``, a
    second panel on its own y axis draws the published series against the fraction of training (epoch /
    ``reference_epochs``), and the run's panel uses epoch / ``run_epochs`` too when ``run_epochs`` is known, so
    neither hides the other.
    """
    panels = 2 if reference else 1
    fig = Figure(figsize=(6.0 if panels == 1 else 10.0, 4.0), dpi=90)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    ax = axes[0]
    cmap = matplotlib.colormaps["plasma"]
    names = list(series)
    fraction = bool(reference) and bool(run_epochs)
    for i, name in enumerate(names):
        color = cmap(i / max(len(names) - 1, 1))
        epochs = np.asarray(series[name][0], dtype=np.float64)
        values = np.asarray(series[name][1], dtype=np.float64)
        x = epochs / run_epochs if fraction and run_epochs else epochs
        marker = "o" if epochs.size <= MARKERS_UP_TO else None
        ax.plot(x, values, color=color, lw=1.2, label=name, marker=marker, ms=4 if epochs.size > 1 else 6)
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
    ax.legend(fontsize=6, ncol=2)
    if reference:
        ref_ax = axes[1]
        for i, name in enumerate(names):
            if name in reference:
                ref_epochs, ref_values = (np.asarray(a, dtype=np.float64) for a in reference[name])
                ref_ax.plot(ref_epochs / reference_epochs, ref_values, color=cmap(i / max(len(names) - 1, 1)), lw=1.0)
        ref_ax.set_xlabel("fraction of training (epoch / 100)")
        ref_ax.set_title("published TGO-I (ViT-S/16, ImageNet-100)", fontsize=9)
        ref_ax.grid(True, alpha=0.2)
        if fraction:
            ref_ax.set_xlim(ax.get_xlim())
    fig.tight_layout()
    return fig


def spectrum_history_figure(
    history: Sequence[tuple[int, np.ndarray]], *, title: str, ylabel: str = "eigenvalue"
) -> Figure:
    """Log-log rank plot of a point's spectra, one line per epoch on the epoch colour ramp, with a colourbar."""
    fig = Figure(figsize=(5.2, 3.6), dpi=90)
    ax = fig.add_subplot()
    epochs = [e for e, _ in history]
    norm, cmap = epoch_colours(epochs)
    for epoch, values in history:
        values = np.asarray(values, dtype=np.float64)
        index = np.arange(1, values.size + 1)
        keep = np.isfinite(values) & (values > 0)
        if np.any(keep):
            ax.loglog(
                index[keep], values[keep], color=cmap(norm(epoch)), lw=1.1, marker="o" if keep.sum() == 1 else None
            )
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
    cmap = matplotlib.colormaps["plasma"]
    names = list(spectra)
    lowest = 1.0
    for i, name in enumerate(names):
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
            ax.loglog(idx[meaningful], ratio[meaningful], color=cmap(i / max(len(names) - 1, 1)), lw=1.0, label=name)
    ax.set_ylim(max(lowest, floor) / 2.0, 2.0)
    ax.set_xlabel("index i")
    ax.set_ylabel(r"$\lambda_i / \lambda_1$")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig
