"""The report's *Optimisation geometry* section: the families' declared grids (`tgo.panels.grid_figure`: the weight
spectra against depth, the network-wide metrics against epoch) and the last observation of the network-wide metrics
(what they mean: ``docs/observables.md``). Read from the records alone, so a run observed offline or resumed reads
the same; with several runs the first is drawn (the Hypotheses section judges every run).
"""

from __future__ import annotations

import math

import numpy as np

from tgo import panels
from tgo.observatory.families.base import NETWORK_VIEW
from tgo.report.cells import plus_minus
from tgo.report.context import Context
from tgo.report.figures import FigureRef, save_figure
from tgo.report.html import Section, Table

__all__ = ["optimisation_section"]


_SHARPNESS, _THRESHOLD = "preconditioned_sharpness", "edge_of_stability_threshold"


def optimisation_section(ctx: Context) -> list[Section]:
    """The *Optimisation geometry* section of the first run (none when it recorded no optimisation metric): each
    declared page grid holding a finite value, and the last observation of the network view's declared tables."""
    runs, run = ctx.runs, ctx.runs[0]
    grids = panels.declared("page", kind="grid")
    table = [m for p in panels.declared("page", kind="table") if p.view == NETWORK_VIEW for m in p.metrics]
    wanted = [(c.view, m) for g in grids for c in g.cells for m in (c.metric, c.overlay) if m]
    tables = panels.recorded_tables(run.path, [*wanted, *((NETWORK_VIEW, m) for m in table)], run.points)
    figures = []
    for grid in grids:
        fig = panels.grid_figure(grid, tables, run.points)
        if fig is not None:
            path = save_figure(fig, ctx.figures_dir, f"optimisation_{grid.metric}")
            figures.append(FigureRef("optimisation", path, f"{run.name}: {grid.caption}", wide=True))
    if not figures:
        return []
    point = run.points[-1]
    last = {}  # metric -> (epoch, value, stderr) at its last observation, where the point has a finite value
    for metric in (m for m in table if (NETWORK_VIEW, m) in tables):
        epochs, values, stderrs = tables[(NETWORK_VIEW, metric)]
        if np.any(np.isfinite(values[-1])):
            last[metric] = (epochs[-1], values[-1, -1], stderrs[-1, -1])
    section = Section("Optimisation geometry", "optimisation", figures_first=True)
    section.paragraphs.append(
        "What training does to the weights and the loss landscape, beside the representations: the weight spectra "
        "of every block's linear maps, the gradient noise scale and the curvature (docs/observables.md, sections "
        "Weight geometry, Gradient noise scale and Curvature). The Hypotheses section judges the predictions on "
        "them." + (f" Drawn for {run.name}, the first of {len(runs)} runs." if len(runs) > 1 else "")
    )
    section.figures += figures
    if last:
        rows = [
            [m, str(int(epoch)), plus_minus(float(value), float(se), signed=False, missing="n/a")]
            for m, (epoch, value, se) in last.items()
        ]
        section.tables.append(
            Table(
                ["metric", "epoch", "value ± 1 s.e."],
                rows,
                left=[0],
                summary=f"The last observation of each network-wide metric ({point}, view {NETWORK_VIEW})",
            )
        )
        if _SHARPNESS in last and _THRESHOLD in last and math.isfinite(last[_THRESHOLD][1]):
            ratio = last[_SHARPNESS][1] / last[_THRESHOLD][1]
            where = "at" if abs(ratio - 1) < 0.1 else "above" if ratio > 1 else "below"
            section.paragraphs.append(
                f"At epoch {int(last[_SHARPNESS][0])} the preconditioned sharpness is {ratio:.2g} times the "
                f"edge-of-stability threshold for the current learning rate: {where} the edge of stability."
            )
        if "gradient_noise_scale" not in last:
            section.paragraphs.append(
                "No gradient noise scale: it needs two batch sizes per step (several ranks, or "
                "trainer.accumulate_grad_batches >= 2 on one device)."
            )
    return [section]
