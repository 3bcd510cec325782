"""The report's *Optimisation geometry* section: the weight spectra against depth and the network-wide metrics
(gradient noise scale, curvature against the edge of stability) against epoch, as the families declare them
(`tgo.panels.declared`; what they mean: ``docs/observables.md``). Read from the records alone, so a run observed
offline or resumed reads the same; with several runs the first is drawn (the Hypotheses section judges every run).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from tgo import panels
from tgo.observatory.families.base import NETWORK_VIEW
from tgo.observatory.families.weights import WEIGHT_VIEWS
from tgo.records import RecordsError, load_series
from tgo.report.cells import plus_minus
from tgo.report.context import Context
from tgo.report.figures import FigureRef, save_figure
from tgo.report.html import Section, Table
from tgo.report.runs import RunData
from tgo.spectral.catalogue import CATALOGUE

__all__ = ["optimisation_section"]


def _weight_panels() -> tuple[list[str], list[str]]:
    """The weight metrics (one row of panels each) and block maps (one column each) of the page's declared depth
    panels on the weights family's views."""
    declared = [p for p in panels.declared("page", kind="depth") if p.view in WEIGHT_VIEWS.values()]
    return list(dict.fromkeys(p.metric for p in declared)), list(dict.fromkeys(p.view for p in declared))


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


def _drawn_epochs(epochs: Sequence[int]) -> list[int]:
    """The first, the middle and the last observed epoch (fewer when there are fewer)."""
    unique = sorted(set(int(e) for e in epochs))
    return sorted({unique[0], unique[len(unique) // 2], unique[-1]}) if unique else []


def _weights_figure(run: RunData, figures_dir: Path) -> FigureRef | None:
    """The grid of weight-spectrum depth profiles, or ``None`` when the run recorded no block map."""
    weight_panels, block_maps = _weight_panels()
    tables = {view: _series(run, view, weight_panels) for view in block_maps}
    maps = [view for view in block_maps if tables[view][0]]
    metrics = [m for m in weight_panels if any(m in tables[view][0] for view in maps)]
    if not maps or not metrics:
        return None
    blocks = [p for p in run.points if any(p in tables[view][0].get(m, {}) for view in maps for m in metrics)]
    epochs = _drawn_epochs([e for view in maps for m in metrics for e, _ in _points(tables[view][0], m)])
    ramp = colormaps["viridis"]
    colours = [ramp(0.85 * k / max(len(epochs) - 1, 1)) for k in range(len(epochs))]  # the dashboard's epoch ramp
    fig = Figure(figsize=(3.2 * len(maps) + 1.0, 2.5 * len(metrics) + 0.6), layout="constrained")
    axes = fig.subplots(len(metrics), len(maps), squeeze=False, sharex=True)
    x = np.arange(len(blocks), dtype=np.float64)
    for r, metric in enumerate(metrics):
        for c, view in enumerate(maps):
            ax = axes[r][c]
            values, stderrs = tables[view][0].get(metric, {}), tables[view][1].get(metric, {})
            for k, epoch in enumerate(epochs):
                y = np.array([_at(values.get(p), epoch) for p in blocks])
                se = np.array([_at(stderrs.get(p), epoch) for p in blocks])
                if not np.any(np.isfinite(y)):
                    continue
                colour = colours[k]
                ax.plot(x, y, marker="o", ms=3, lw=1.6, color=colour, label=f"epoch {epoch}")
                ok = np.isfinite(y) & np.isfinite(se)
                if ok.any():
                    ax.fill_between(x[ok], (y - se)[ok], (y + se)[ok], color=colour, alpha=0.18, lw=0)
            if CATALOGUE[metric].scale == "log" and _all_positive(values):
                ax.set_yscale("log")
            ax.set_title(f"{metric} ({view.removeprefix('weights_')})", fontsize=9)
            ax.grid(True, alpha=0.25)
            ax.tick_params(labelsize=7)
            ax.set_xticks(x, labels=[p.removeprefix("block_") for p in blocks])
        axes[r][0].set_ylabel(metric.removeprefix("weight_"), fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("block", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside upper center", ncols=len(handles), fontsize=8, frameon=False)
    path = save_figure(fig, figures_dir, "optimisation_weights")
    return FigureRef(
        "optimisation",
        path,
        f"{run.name}: the blocks' weight spectra against depth, one column per linear map (attention qkv and output "
        "projection, MLP fc1 and fc2), at the first, middle and last observation. weight_alpha is WeightWatcher's "
        "power-law exponent of the eigenvalues of W^T W (band: +-1 fit standard error; lower: heavier tail, more "
        "learned correlation); stable and effective rank of W; the relative update ||W_t - W_prev||_F / ||W_prev||_F "
        "since the previous observation (none at the first).",
        wide=True,
    )


def _points(series: dict, metric: str) -> list[tuple[int, float]]:
    recorded = series.get(metric, {}).values()
    return [(int(e), float(v)) for epochs, values in recorded for e, v in zip(epochs, values, strict=True)]


def _at(recorded: tuple[np.ndarray, np.ndarray] | None, epoch: int) -> float:
    if recorded is None:
        return math.nan
    epochs, values = recorded
    hit = np.flatnonzero(np.asarray(epochs) == epoch)
    return float(values[hit[0]]) if hit.size else math.nan


def _all_positive(values: dict) -> bool:
    finite = [v for _, vs in values.values() for v in vs if math.isfinite(v)]
    return bool(finite) and min(finite) > 0


def _network(run: RunData) -> tuple[str, dict, dict]:
    """The network point and its recorded network metrics: ``(point, values, stderrs)`` metric -> (epochs, values)."""
    table = _network_table()
    values, stderrs = _series(run, NETWORK_VIEW, table)
    point = run.points[-1] if run.points else ""
    recorded = {m: values[m][point] for m in table if point in values.get(m, {})}  # in the table's order
    pick = {m: series for m, series in recorded.items() if np.any(np.isfinite(series[1]))}
    errors = {m: per[point] for m, per in stderrs.items() if m in pick and point in per}
    return point, pick, errors


def _network_figure(run: RunData, values: dict, stderrs: dict, figures_dir: Path) -> FigureRef | None:
    """One panel per recorded network metric against epoch; the sharpness with its threshold on one panel."""
    shown = [m for m in values if m not in (_THRESHOLD, "gradient_noise_steps")]
    if not shown:
        return None
    fig = Figure(figsize=(3.3 * min(len(shown), 3) + 0.4, 2.6 * math.ceil(len(shown) / 3) + 0.3), layout="constrained")
    axes = fig.subplots(math.ceil(len(shown) / 3), min(len(shown), 3), squeeze=False).ravel()
    for ax in axes[len(shown) :]:
        ax.set_visible(False)
    for ax, metric in zip(axes, shown, strict=False):
        epochs, y = values[metric]
        ax.plot(epochs, y, marker="o", ms=3.5, lw=1.6, color="#1f4e79", label=metric)
        if metric in stderrs:
            se = stderrs[metric][1]
            ok = np.isfinite(y) & np.isfinite(se)
            if ok.any():
                ax.fill_between(epochs[ok], (y - se)[ok], (y + se)[ok], color="#1f4e79", alpha=0.18, lw=0)
        if metric == _SHARPNESS and _THRESHOLD in values:
            t_epochs, threshold = values[_THRESHOLD]
            ax.plot(t_epochs, threshold, ls="--", lw=1.4, color="#b03a2e", label="edge of stability")
            ax.legend(fontsize=7, frameon=False)
        if metric == "sharpness_over_threshold":
            ax.axhline(1.0, ls="--", lw=1.0, color="#b03a2e")
        finite = y[np.isfinite(y)]
        if metric == _SHARPNESS and _THRESHOLD in values:  # the threshold, 38 / lr, grows by decades as lr decays
            finite = np.concatenate([finite, values[_THRESHOLD][1][np.isfinite(values[_THRESHOLD][1])]])
        logged = CATALOGUE[metric].scale == "log" or metric in (_SHARPNESS, "sharpness_over_threshold")
        if logged and finite.size and finite.min() > 0:
            ax.set_yscale("log")
        ax.xaxis.get_major_locator().set_params(integer=True)  # epochs
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel("epoch", fontsize=8)
        ax.grid(True, alpha=0.25)
        ax.tick_params(labelsize=7)
    path = save_figure(fig, figures_dir, "optimisation_network")
    return FigureRef(
        "optimisation",
        path,
        f"{run.name}: the network-wide metrics against epoch (the last point's network view), +-1 standard error "
        "where the estimator has one: the gradient noise scale B_simple = tr(Sigma) / |G|^2 averaged over the steps "
        "since the previous observation (McCandlish et al. 2018), the Hessian's top eigenvalue and trace on the "
        "fixed curvature batch, and the preconditioned sharpness against the edge-of-stability threshold for the "
        "current learning rate (dashed; Cohen et al. 2022).",
        wide=len(shown) > 2,
    )


def optimisation_section(ctx: Context) -> list[Section]:
    """The *Optimisation geometry* section of the first run (none when it recorded no optimisation metric)."""
    runs, figures_dir = ctx.runs, ctx.figures_dir
    run = runs[0]
    weights = _weights_figure(run, figures_dir)
    point, values, stderrs = _network(run)
    network = _network_figure(run, values, stderrs, figures_dir)
    if weights is None and network is None:
        return []
    section = Section("Optimisation geometry", "optimisation", figures_first=True)
    section.paragraphs.append(
        "What training does to the weights and the loss landscape, beside the representations: the weight spectra "
        "of every block's linear maps, the gradient noise scale and the curvature (docs/observables.md, sections "
        "Weight geometry, Gradient noise scale and Curvature). The Hypotheses section judges the predictions on "
        "them." + (f" Drawn for {run.name}, the first of {len(runs)} runs." if len(runs) > 1 else "")
    )
    section.figures += [f for f in (weights, network) if f is not None]
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
