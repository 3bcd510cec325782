"""The report's training phases: every point's consecutive observations labelled by `tgo.spectral.phases` (the rule:
``docs/observables.md`` section 8), merged into phases and drawn as a point x epoch map per run with a folded table;
`early_section` does the same for the step series. The labels are recomputed from the records with the report's ``z``,
so they do not depend on the ``phase_code`` recorded live (equal with the same settings)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from tgo import panels
from tgo.records import RecordsError, RunDir
from tgo.report.context import Context
from tgo.report.figures import FigureRef, save_figure
from tgo.report.html import Section, Table
from tgo.report.runs import RunData, load_run_data
from tgo.spectral.phases import (
    COLLAPSE,
    COMPRESSION,
    DEFAULT_COLLAPSE_DROP,
    ENTROPY,
    UNRESOLVED,
    Phase,
    PhaseLabel,
    PhaseRule,
    Trajectory,
    label_trajectory,
    merge_phases,
)

__all__ = ["early_section", "phases_section", "run_phases"]

_RANK, _ALPHA = "effective_rank", "power_law_alpha"


@dataclass(frozen=True)
class PointPhases:
    """One point of one run: its observations, the label of each consecutive pair, and the merged phases."""

    point: str
    trajectory: Trajectory
    labels: list[PhaseLabel]
    phases: list[Phase]


def _replicates_at(run: RunData, metric: str, point: str, epochs: np.ndarray) -> np.ndarray | None:
    """``[E, G]`` replicates at ``epochs`` (NaN rows where an epoch has none), ``None`` when none are recorded."""
    recorded = run.jackknife.get(metric, {}).get(point)
    if recorded is None:
        return None
    rep_epochs, rows = recorded
    out = np.full((epochs.size, rows.shape[1]), math.nan)
    index = {int(e): i for i, e in enumerate(rep_epochs)}
    for j, e in enumerate(epochs):
        if int(e) in index:
            out[j] = rows[index[int(e)]]
    return out


def run_rule(run: RunData, z: float) -> PhaseRule:
    """The rule for a run: the report's ``z`` and the run's ``observation.phases.collapse_drop`` (or the default)."""
    drop = DEFAULT_COLLAPSE_DROP
    config = run.path / "config.yaml"
    if config.is_file():
        try:
            from omegaconf import OmegaConf

            value = OmegaConf.select(OmegaConf.load(config), "observation.phases.collapse_drop", default=None)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < float(value) < 1:
                drop = float(value)
        except Exception:  # a config the report cannot read leaves the default (the page states the threshold)
            pass
    return PhaseRule(z=z, collapse_drop=drop)


def run_phases(run: RunData, rule: PhaseRule) -> list[PointPhases]:
    """Every point of a run with both measures recorded at two or more epochs, in recorded order."""
    out = []
    for point in run.points:
        rank = run.series.get(_RANK, {}).get(point)
        alpha = run.series.get(_ALPHA, {}).get(point)
        if rank is None or alpha is None:
            continue
        alpha_at = dict(zip((int(e) for e in alpha[0]), alpha[1], strict=True))
        epochs = np.array([int(e) for e in rank[0] if int(e) in alpha_at], dtype=np.int64)
        if epochs.size < 2:
            continue
        rank_at = dict(zip((int(e) for e in rank[0]), rank[1], strict=True))
        trajectory = Trajectory(
            epochs,
            np.array([rank_at[int(e)] for e in epochs], dtype=np.float64),
            np.array([alpha_at[int(e)] for e in epochs], dtype=np.float64),
            _replicates_at(run, _RANK, point, epochs),
            _replicates_at(run, _ALPHA, point, epochs),
        )
        labels = label_trajectory(trajectory, rule)
        out.append(PointPhases(point, trajectory, labels, merge_phases(trajectory, labels, rule)))
    return out


def phase_map_figure(
    run_name: str, points: Sequence[PointPhases], figures_dir: Path, *, series: str = "epoch"
) -> FigureRef:
    """The point x epoch colour map of the labels, one row per point, one cell per pair; the step series' log-spaced
    steps get cells of equal width, with the steps named at their edges."""
    epochs = sorted({int(e) for p in points for e in p.trajectory.epochs})
    even = series == "step"
    edges = np.arange(len(epochs), dtype=np.float64) if even else np.array(epochs, dtype=np.float64)
    codes = np.full((len(points), max(len(epochs) - 1, 1)), math.nan)
    column = {e: j for j, e in enumerate(epochs)}
    for i, p in enumerate(points):
        for lab, (a, b) in zip(
            p.labels, zip(p.trajectory.epochs[:-1], p.trajectory.epochs[1:], strict=True), strict=True
        ):
            for j in range(column[int(a)], column[int(b)]):  # a pair spanning epochs another point observed
                codes[i, j] = lab.code
    ticks = epochs if len(epochs) <= 16 else epochs[:: math.ceil(len(epochs) / 16)]
    fig = panels.category_map(
        codes,
        [p.point for p in points],
        edges,
        next(p.categories for p in panels.declared(kind="map") if p.metric == "phase_code"),
        ticks=[epochs.index(t) for t in ticks] if even else None,
        tick_labels=[str(t) for t in ticks] if even else None,
        xlabel=f"{'optimizer step' if even else 'epoch'} (a cell spans the two observations it compares)",
    )
    path = save_figure(fig, figures_dir, f"{'early_' if even else ''}phases_{run_name}")
    where = " over its early optimizer steps" if even else ""
    caption = (
        f"Training phases of {run_name}{where}: each cell labels the change of effective rank and alpha between two "
        "consecutive observations of a point (paired jackknife z, verdict rule's threshold); white: undefined "
        "(no replicates or a NaN value)."
    )
    return FigureRef("early" if even else "phases", path, caption, wide=True)


def _change_text(before: float, after: float, z: float) -> str:
    return f"{before:.4g} -> {after:.4g} (z {z:+.1f})"


def rule_text(rule: PhaseRule, groups: int | None) -> str:
    critical = f"{rule.critical(groups - 1):.2f}" if groups else "z widened to Student's t for G - 1"
    return (
        "Each consecutive pair of observations of a point is labelled from the paired changes of its effective rank "
        "(RankMe) and its eigenspectrum decay exponent alpha (alpha-ReQ), after Li et al. (NeurIPS 2025, "
        "arXiv:2509.23024): the same images in the same jackknife groups at both observations, so the standard "
        "error of each change is the jackknife of the replicate differences. A change counts when |z| exceeds "
        f"{critical} (the verdict rule's z = {rule.z:g}, Student-t widened for the jackknife's degrees of freedom). "
        f"collapse: rank falls significantly by at least {rule.collapse_drop:.0%} of its earlier value; "
        "compression-seeking: rank falls or alpha rises significantly, and neither moves the other way; "
        "entropy-seeking: rank rises or alpha falls significantly, and neither moves the other way; unresolved: "
        "no significant change, or the two contradict each other (both up, or both down). Runs of equal labels "
        "are merged into phases; the evidence is the change over the whole phase. The labels are about this run "
        "on these images: the epoch-to-epoch training noise is not in the error (docs/observables.md, "
        "'Training phases', has the rule's validation)."
    )


def phase_rows(run_name: str | None, points: Sequence[PointPhases]) -> list[list[str]]:
    """The table rows of every merged phase of every point (the run's name first when ``run_name`` is given)."""
    rows = []
    for p in points:
        for phase in p.phases:
            ev = phase.evidence
            rows.append(
                [
                    *([run_name] if run_name is not None else []),
                    p.point,
                    phase.label,
                    f"{phase.start_epoch}-{phase.end_epoch}",
                    str(phase.pairs),
                    _change_text(ev.rank.before, ev.rank.after, ev.rank.z),
                    _change_text(ev.alpha.before, ev.alpha.after, ev.alpha.z),
                    ev.reason,
                ]
            )
    return rows


def replicate_groups(points: Sequence[PointPhases]) -> int | None:
    """The jackknife groups ``G`` of the replicates behind the labels (``None``: none recorded)."""
    for p in points:
        if p.trajectory.rank_replicates is not None:
            return int(p.trajectory.rank_replicates.shape[1])
    return None


def phase_counts_text(rows: Sequence[Sequence[str]], several: bool) -> str:
    """``N phases over P points: n collapse, ...`` of `phase_rows`."""
    counts = {k: sum(r[2 if several else 1] == k for r in rows) for k in (COLLAPSE, COMPRESSION, ENTROPY, UNRESOLVED)}
    points = len({(r[0], r[1]) if several else r[0] for r in rows})
    return f"{len(rows)} phases over {points} points: " + ", ".join(f"{n} {k}" for k, n in counts.items() if n) + "."


def phase_table(rows: list[list[str]], several: bool, *, key: str = "epochs") -> Table:
    """The folded table of `phase_rows` (``key``: the heading of the span column, ``epochs`` or ``steps``)."""
    headers = [
        *(["run"] if several else []),
        "point",
        "phase",
        key,
        "pairs",
        "effective rank (whole phase)",
        "alpha (whole phase)",
        "evidence",
    ]
    offset = 1 if several else 0
    return Table(
        headers, rows, left=[*range(offset + 2), offset + 6], summary=f"Every phase of every point ({len(rows)} rows)"
    )


def phases_section(ctx: Context) -> list[Section]:
    """The "Training phases" section (none when no run has two observations of both measures)."""
    runs, figures_dir, z = ctx.runs, ctx.figures_dir, ctx.settings.z
    figures, rules = [], []
    rows: list[list[str]] = []
    several = len(runs) > 1
    groups = None
    for run in runs:
        rule = run_rule(run, z)
        points = run_phases(run, rule)
        if not points:
            continue
        rules.append(rule)
        figures.append(phase_map_figure(run.name, points, figures_dir))
        groups = groups or replicate_groups(points)
        rows += phase_rows(run.name if several else None, points)
    if not figures:
        return []
    section = Section("Training phases", "phases", figures=figures, figures_first=True)
    section.paragraphs.append(rule_text(rules[0], groups))
    section.paragraphs.append(phase_counts_text(rows, several))
    section.tables = [phase_table(rows, several)]
    return [section]


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


def early_section(ctx: Context) -> list[Section]:
    """The "Early training" section (none when no run has a step series): a collapse during warm-up can come and go
    between two epoch observations, so here every point's effective rank and alpha against the optimizer step, and the
    step series' phase map and merged phases by the rule of the Training phases section."""
    runs, figures_dir, z = ctx.runs, ctx.figures_dir, ctx.settings.z
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
        return []
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
    return [section]
