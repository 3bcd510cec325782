"""The report's *Optimisation geometry* section: the families' declared grids (`tgo.panels.grid_figure`: the weight
spectra against depth, the network-wide metrics against epoch) and the last observation of the network-wide metrics
(what they mean: ``docs/observables.md``). Read from the records alone, so a run observed offline or resumed reads
the same; with several runs the first is drawn (the Hypotheses section judges every run).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tgo import panels
from tgo.observatory.families.base import NETWORK_VIEW
from tgo.records import RecordsError, load_series
from tgo.report.cells import plus_minus
from tgo.report.context import Context
from tgo.report.figures import FigureRef, save_figure
from tgo.report.html import Section, Table
from tgo.report.runs import RunData

__all__ = ["optimisation_section"]


def _network_table() -> list[str]:
    """The network view's metrics of the page's declared tables (the section's table and figure, where recorded)."""
    return [m for p in panels.declared("page", kind="table") if p.view == NETWORK_VIEW for m in p.metrics]


_SHARPNESS, _THRESHOLD = "preconditioned_sharpness", "edge_of_stability_threshold"


def _series(run: RunData, view: str, metrics: Sequence[str]) -> tuple[dict, dict]:
    """``(values, stderrs)`` of a run's view: metric -> point -> (epochs, values); empty where nothing is recorded."""
    try:
        return (
            load_series(run.path, view=view, metrics=metrics),
            load_series(run.path, view=view, metrics=metrics, column="stderr"),
        )
    except RecordsError:
        return {}, {}


def _grid_figures(run: RunData, figures_dir: Path) -> list[FigureRef]:
    """Each declared page grid that holds a finite value, drawn from one read of the run's records."""
    grids = panels.declared("page", kind="grid")
    wanted = [(c.view, m) for g in grids for c in g.cells for m in (c.metric, c.overlay) if m]
    tables = panels.recorded_tables(run.path, wanted, run.points)
    refs = []
    for grid in grids:
        fig = panels.grid_figure(grid, tables, run.points)
        if fig is not None:
            path = save_figure(fig, figures_dir, f"optimisation_{grid.metric}")
            refs.append(FigureRef("optimisation", path, f"{run.name}: {grid.caption}", wide=True))
    return refs


def _network(run: RunData) -> tuple[str, dict, dict]:
    """The network point and its recorded network metrics: ``(point, values, stderrs)`` metric -> (epochs, values)."""
    table = _network_table()
    values, stderrs = _series(run, NETWORK_VIEW, table)
    point = run.points[-1] if run.points else ""
    recorded = {m: values[m][point] for m in table if point in values.get(m, {})}  # in the table's order
    pick = {m: series for m, series in recorded.items() if np.any(np.isfinite(series[1]))}
    errors = {m: per[point] for m, per in stderrs.items() if m in pick and point in per}
    return point, pick, errors


def optimisation_section(ctx: Context) -> list[Section]:
    """The *Optimisation geometry* section of the first run (none when it recorded no optimisation metric)."""
    runs, figures_dir = ctx.runs, ctx.figures_dir
    run = runs[0]
    figures = _grid_figures(run, figures_dir)
    point, values, stderrs = _network(run)
    if not figures:
        return []
    section = Section("Optimisation geometry", "optimisation", figures_first=True)
    section.paragraphs.append(
        "What training does to the weights and the loss landscape, beside the representations: the weight spectra "
        "of every block's linear maps, the gradient noise scale and the curvature (docs/observables.md, sections "
        "Weight geometry, Gradient noise scale and Curvature). The Hypotheses section judges the predictions on "
        "them." + (f" Drawn for {run.name}, the first of {len(runs)} runs." if len(runs) > 1 else "")
    )
    section.figures += figures
    if values:
        last = {m: (values[m][0][-1], values[m][1][-1]) for m in values}
        rows = []
        for metric, (epoch, value) in last.items():
            se_epochs, se = stderrs.get(metric, (np.array([epoch]), np.array([math.nan])))
            hit = np.flatnonzero(se_epochs == epoch)
            error = float(se[hit[0]]) if hit.size else math.nan
            rows.append([metric, str(int(epoch)), plus_minus(float(value), error, signed=False, missing="n/a")])
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
