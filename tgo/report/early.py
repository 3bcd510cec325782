"""The report's *Early training* section: the step series (``observation.early``) drawn and labelled.

A run observed with ``observation.early.enabled=true`` holds a second record series, ``geometry/steps/``, keyed by
the optimizer step: step 0 and the log-spaced steps up to the end of the first epoch (or ``early.until_step``;
`tgo.observatory.settings.EarlySettings`). A collapse of the representation during warm-up can come and go between
two epoch observations; this section is where it shows:

* effective rank and the power-law exponent alpha of every point against the optimizer step (a symmetric-log axis:
  step 0 and the log-spaced steps both legible), +-1 jackknife standard error;
* the training-phase map of the step series, each cell the change between two consecutive step observations, by
  the same rule as the *Training phases* section (`tgo.report.phases`: paired jackknife z at the verdict rule's
  threshold, the run's ``collapse_drop``), and the merged phases as a table.

Runs without a step series add nothing; with several runs each one with a step series gets its figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from tgo.records import RecordsError, RunDir
from tgo.report.figures import FigureRef, save_figure
from tgo.report.html import Section
from tgo.report.phases import (
    phase_counts_text,
    phase_map_figure,
    phase_rows,
    phase_table,
    replicate_groups,
    rule_text,
    run_phases,
    run_rule,
)
from tgo.report.runs import RunData, load_run_data
from tgo.spectral.phases import COLLAPSE

__all__ = ["EARLY_PANELS", "early_section", "load_step_series", "step_series_figure"]

EARLY_PANELS: tuple[tuple[str, str], ...] = (
    ("effective_rank", "effective rank"),
    ("power_law_alpha", "power-law exponent alpha"),
)
"""The two measures the phases are labelled from, one panel each."""


def load_step_series(run: RunData) -> RunData | None:
    """The step series of a run as a `RunData` keyed by step (``None``: the run has none, or none readable)."""
    steps = RunDir(run.path).step_series
    if not steps.metrics.is_file():
        return None
    try:
        return load_run_data(steps, name=run.name)
    except (RecordsError, ValueError):  # the report's reader says what is wrong with the epoch series; here: none
        return None


def step_series_figure(run: RunData, figures_dir: Path) -> FigureRef:
    """Effective rank and alpha of every point against the optimizer step, +-1 standard error."""
    fig = Figure(figsize=(11.0, 4.2), layout="constrained")
    axes = fig.subplots(1, len(EARLY_PANELS))
    colours = colormaps["viridis"](np.linspace(0.0, 0.92, max(len(run.points), 1)))
    for ax, (metric, label) in zip(np.atleast_1d(axes), EARLY_PANELS, strict=True):
        for colour, point in zip(colours, run.points, strict=True):
            recorded = run.series.get(metric, {}).get(point)
            if recorded is None:
                continue
            steps, values = recorded
            se = run.stderr.get(metric, {}).get(point, (steps, np.full(values.shape, math.nan)))[1]
            ax.plot(steps, values, marker="o", ms=3, lw=1.2, color=colour, label=point)
            ok = np.isfinite(se) & np.isfinite(values)
            if ok.any():
                ax.fill_between(steps[ok], (values - se)[ok], (values + se)[ok], color=colour, alpha=0.18, lw=0)
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlabel("optimizer step (symmetric log)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.legend(*np.atleast_1d(axes)[0].get_legend_handles_labels(), loc="outside right upper", fontsize=8)
    path = save_figure(fig, figures_dir, f"early_series_{run.name}")
    caption = (
        f"Early training of {run.name}: effective rank and alpha of every point at step 0 and the log-spaced "
        "optimizer steps of its step series (observation.early), +-1 jackknife standard error."
    )
    return FigureRef("early", path, caption, wide=True)


def early_section(runs: Sequence[RunData], figures_dir: Path, z: float) -> Section | None:
    """The "Early training" section, or ``None`` when no run has a step series."""
    figures: list[FigureRef] = []
    rows: list[list[str]] = []
    several = len(runs) > 1
    groups, rule, observed = None, None, []
    for run in runs:
        steps = load_step_series(run)
        if steps is None:
            continue
        observed.append((run.name, steps.epochs))
        figures.append(step_series_figure(steps, figures_dir))
        rule = run_rule(run, z)
        points = run_phases(steps, rule)
        if points:
            figures.append(phase_map_figure(run.name, points, figures_dir, series="step"))
            groups = groups or replicate_groups(points)
            rows += phase_rows(run.name if several else None, points)
    if not figures:
        return None
    section = Section("Early training", "early", figures=figures, figures_first=True)
    listed = "; ".join(f"{name}: steps {', '.join(map(str, steps))}" for name, steps in observed)
    section.paragraphs.append(
        "The step series (observation.early): observations after optimizer step 0 and log-spaced steps early in "
        "training, so that a collapse during warm-up is not missed between two epoch observations. They measure "
        "what the epoch observations measure (the noise scale and curvature aside), on the same images in the "
        f"same jackknife groups. Observed {listed}."
    )
    if rows and rule is not None:
        section.paragraphs.append(
            rule_text(rule, groups).replace("Each consecutive pair", "Here each consecutive pair")
        )
        collapses = [r for r in rows if r[2 if several else 1] == COLLAPSE]
        verdict = (
            f"A collapse during warm-up at {len(collapses)} point(s)."
            if collapses
            else "No collapse during warm-up at any point."
        )
        section.paragraphs.append(f"{phase_counts_text(rows, several)} {verdict}")
        section.tables = [phase_table(rows, several, key="steps")]
    return section
