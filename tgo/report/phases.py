"""The report's training phases: every point's consecutive observations labelled and merged into phases.

For every run, point (view ``all``) and consecutive pair of observations, `tgo.spectral.phases` labels the paired
change of ``effective_rank`` and ``power_law_alpha`` (collapse, compression-seeking, entropy-seeking, unresolved;
Li et al., NeurIPS 2025, arXiv:2509.23024) from the run's recorded values and leave-one-group-out replicates
(`tgo.report.runs.RunData`), and runs of equal labels become phases with the change over the whole phase as their
evidence. The significance is the verdict rule's ``z`` (``python -m tgo.report --z``, Student-t widened for the
jackknife's ``G - 1`` degrees of freedom); the collapse threshold is ``observation.phases.collapse_drop`` from the
run's ``config.yaml`` (its default where the run does not name it). The labels are recomputed here from the records,
so they do not depend on the ``phase_code`` the `phases` family recorded live (equal with the same settings).

The section: the rule in a paragraph, a point x epoch colour map of the labels per run (a cell spans the two
observations it compares, so its width is the interval in epochs), and the merged phases as a (folded) table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from tgo.report.figures import FigureRef, save_figure
from tgo.report.html import Section, Table
from tgo.report.runs import RunData
from tgo.spectral.phases import (
    COLLAPSE,
    COMPRESSION,
    DEFAULT_COLLAPSE_DROP,
    ENTROPY,
    UNDEFINED,
    UNRESOLVED,
    Phase,
    PhaseLabel,
    PhaseRule,
    Trajectory,
    label_trajectory,
    merge_phases,
)

__all__ = [
    "PHASE_COLOURS",
    "PointPhases",
    "phase_counts_text",
    "phase_map_figure",
    "phase_rows",
    "phase_table",
    "phases_section",
    "replicate_groups",
    "rule_text",
    "run_phases",
    "run_rule",
]

PHASE_COLOURS: dict[str, str] = {
    COLLAPSE: "#8c1c13",
    COMPRESSION: "#f4a259",
    UNRESOLVED: "#e6e6e6",
    ENTROPY: "#3a7ca5",
}
"""The colour of each label in the map (``undefined`` is left white)."""
_RANK, _ALPHA = "effective_rank", "power_law_alpha"


@dataclass(frozen=True)
class PointPhases:
    """One point of one run: its observations, the label of each consecutive pair, and the merged phases.

    Attributes:
        point: The point.
        trajectory: Its recorded series of both measures (epochs where both are recorded).
        labels: ``E - 1`` labels (pair ``i``: observation ``i`` to ``i + 1``).
        phases: The runs of equal labels.
    """

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
    """The point x epoch colour map of the labels: one row per point (depth downwards), one cell per pair.

    ``series="step"`` (the step series, `tgo.report.early`): the observations are log-spaced optimizer steps, so
    every cell gets the same width and the ticks name the steps at its edges."""
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
    order = [COLLAPSE, COMPRESSION, UNRESOLVED, ENTROPY]
    cmap = ListedColormap([PHASE_COLOURS[k] for k in order]).with_extremes(bad="white")
    norm = BoundaryNorm([-2.5, -1.5, -0.5, 0.5, 1.5], cmap.N)
    fig = Figure(figsize=(max(7.0, 0.35 * len(epochs) + 5.0), 0.32 * len(points) + 1.9), layout="constrained")
    ax = fig.add_subplot()
    ax.pcolormesh(
        edges,
        np.arange(len(points) + 1),
        np.ma.masked_invalid(codes),
        cmap=cmap,
        norm=norm,
        edgecolors="white",
        linewidth=0.5,
    )
    ax.set_yticks(np.arange(len(points)) + 0.5, [p.point for p in points], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"{'optimizer step' if even else 'epoch'} (a cell spans the two observations it compares)")
    ticks = epochs if len(epochs) <= 16 else epochs[:: math.ceil(len(epochs) / 16)]
    if even:
        ax.set_xticks([epochs.index(t) for t in ticks], [str(t) for t in ticks])
    else:
        ax.set_xticks(ticks)
    handles = [Patch(facecolor=PHASE_COLOURS[k], edgecolor="#999", label=k) for k in order]
    handles.append(Patch(facecolor="white", edgecolor="#999", label=UNDEFINED))
    fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
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


def phases_section(runs: Sequence[RunData], figures_dir: Path, z: float) -> Section | None:
    """The "Training phases" section, or ``None`` when no run has two observations of both measures."""
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
        return None
    section = Section("Training phases", "phases", figures=figures, figures_first=True)
    section.paragraphs.append(rule_text(rules[0], groups))
    section.paragraphs.append(phase_counts_text(rows, several))
    section.tables = [phase_table(rows, several)]
    return section
