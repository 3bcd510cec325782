"""The training-phase family: each observation's change of every point since the previous one, labelled.

`tgo.spectral.phases` labels the paired change of ``effective_rank`` and ``power_law_alpha`` between two
observations as collapse, compression-seeking, entropy-seeking or unresolved (Li et al., NeurIPS 2025,
arXiv:2509.23024). This family records that label on every point's view ``all`` as the observation is made, so a
live dashboard shows it; the report recomputes the same labels from the records (`tgo.report.phases`).

It hooks nothing and sums nothing (no collective, nothing on the other ranks): `read_history` reads, on rank 0,
the previous recorded observation's values and leave-one-group-out replicates of both measures
(``metrics.csv`` and `tgo.records.load_jackknife`: every observation uses the same image groups, so the replicates
pair), and `relate_history` compares them with this observation's, after every point is summarised.

**Records** (per point, view ``all``, no standard error):

* ``phase_code``: ``-2`` collapse, ``-1`` compression-seeking, ``0`` unresolved, ``+1`` entropy-seeking
  (`tgo.spectral.phases.PHASE_CODES`); NaN at the first observation, without a jackknife (``observation.groups =
  0``) or where a value is undefined.
* ``rank_change_z``, ``alpha_change_z``: the paired z-scores ``(after - before) / se`` of the two changes (NaN as
  above; ``±inf`` for a change whose paired error is exactly 0).

The previous observation is the latest epoch recorded before this one (rows in ``metrics.csv`` and a spectra
file), as the records hold it when the observation is made: a resumed run and ``tgo.observe`` compare against what
is on disk. Settings: ``observation.phases`` (`PhaseSettings`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tgo.panels import Panel
from tgo.records import DEFAULT_VIEW, RunPath, as_run_dir, load_jackknife, read_metric_rows, recorded_epochs
from tgo.spectral.phases import PHASE_CODES, PhaseRule, classify, paired_change

from ..settings import PREFIX, ObservationSettingsError, check_flags
from .base import (
    Contribution,
    FamilyContext,
    FamilyState,
    HistorySummary,
    HookSpec,
    MeasurementFamily,
    Metric,
    family_metric,
    register_family,
)

__all__ = [
    "MEASURES",
    "PHASES",
    "PHASE_COLOURS",
    "PHASE_METRICS",
    "PhaseFamily",
    "PhaseHistory",
    "PhaseSettings",
    "PhaseState",
]

MEASURES: tuple[str, str] = ("effective_rank", "power_law_alpha")
"""The two catalogue observables whose paired changes are labelled (rank first)."""
PHASE_METRICS: tuple[str, ...] = ("phase_code", "rank_change_z", "alpha_change_z")
"""What the family records on every point's view ``all``, in record order."""
_DOC = "docs/observables.md#8-training-phases"
PHASE_COLOURS = dict(zip(PHASE_CODES, ("#8c1c13", "#f4a259", "#e6e6e6", "#3a7ca5"), strict=False))
"""The colour of each training-phase label on the phase map card, collapse to entropy-seeking (``undefined``, the
last code, is left white)."""


@dataclass(frozen=True)
class PhaseHistory:
    """The previous recorded observation, as `read_history` found it.

    Attributes:
        epoch: Its epoch label (``None``: there is none).
        values: ``{point: {measure: value}}`` of its view ``all``.
        replicates: ``{point: {measure: float64 [G]}}`` leave-one-group-out values (absent: none recorded).
    """

    epoch: int | None = None
    values: dict[str, dict[str, float]] = field(default_factory=dict)
    replicates: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


def read_phase_history(run_dir: RunPath, epoch: int) -> PhaseHistory:
    """What `PhaseFamily.read_history` returns: both measures of the latest observation recorded before ``epoch``
    (in ``run_dir``'s series: in the step series ``epoch`` is the optimizer step)."""
    run = as_run_dir(run_dir)
    if not run.root.is_dir():
        return PhaseHistory()
    earlier = [e for e in recorded_epochs(run) if e < int(epoch)]
    if not earlier:
        return PhaseHistory()
    previous = earlier[-1]
    values: dict[str, dict[str, float]] = {}
    for row in read_metric_rows(run):
        if row["view"] == DEFAULT_VIEW and row["metric"] in MEASURES and int(row[run.key]) == previous:
            values.setdefault(row["point"], {})[row["metric"]] = float(row["value"])
    replicates: dict[str, dict[str, np.ndarray]] = {}
    for metric, per_point in load_jackknife(run, metrics=MEASURES, epochs=[previous]).items():
        for point, (epochs, rows) in per_point.items():
            hit = np.flatnonzero(epochs == previous)
            if hit.size:
                replicates.setdefault(point, {})[metric] = rows[int(hit[0])]
    return PhaseHistory(previous, values, replicates)


class PhaseState(FamilyState):
    """Nothing during the pass; on rank 0, each point's phase against the previous observation."""

    def __init__(self, context: FamilyContext) -> None:
        settings = context.settings.phases
        self.rule = PhaseRule(z=settings.z, collapse_drop=settings.collapse_drop)

    def update(self, key: str, x: object, batch: object) -> None:  # pragma: no cover - no hooks
        raise AssertionError("the phases family hooks nothing")

    def relate_history(self, summary: HistorySummary) -> Contribution:
        """``phase_code`` and the two paired z-scores of the point's view ``all`` (NaN without a previous record)."""
        nan = [Metric(DEFAULT_VIEW, name, math.nan) for name in PHASE_METRICS]
        history = summary.history
        whole = summary.results.get(DEFAULT_VIEW)
        name = summary.point.name
        if not isinstance(history, PhaseHistory) or whole is None or name not in history.values:
            return nan
        earlier, earlier_reps = history.values[name], history.replicates.get(name, {})
        changes = [
            paired_change(
                earlier.get(m, math.nan),
                whole.observables.get(m, math.nan),
                earlier_reps.get(m),
                whole.jackknife.get(m),
            )
            for m in MEASURES
        ]
        label = classify(changes[0], changes[1], self.rule)
        return [
            Metric(DEFAULT_VIEW, "phase_code", label.code),
            Metric(DEFAULT_VIEW, "rank_change_z", label.rank.z if math.isfinite(label.code) else math.nan),
            Metric(DEFAULT_VIEW, "alpha_change_z", label.alpha.z if math.isfinite(label.code) else math.nan),
        ]


@dataclass(frozen=True)
class PhaseSettings:
    """The training-phase family (``tgo.observatory.families.phases``): each observation's change since the previous
    one labelled collapse, compression-seeking, entropy-seeking or unresolved (``tgo.spectral.phases``).

    Attributes:
        enabled: Record ``phase_code``, ``rank_change_z`` and ``alpha_change_z`` on every point's view ``all`` from
            the paired changes of ``effective_rank`` and ``power_law_alpha`` (``docs/observables.md``, "Training
            phases"). Reads the previous observation's records; nothing is hooked or summed.
        z: Normal quantile of a significant change (widened to Student's t for the jackknife's ``G - 1`` degrees of
            freedom), the verdict rule's default 3.
        collapse_drop: Smallest relative loss of effective rank between two observations that is a collapse, in
            ``(0, 1)``.
    """

    enabled: bool = True
    z: float = 3.0
    collapse_drop: float = 0.5

    def __post_init__(self) -> None:
        check_flags("phases", self, "enabled")
        for key, ok, expected in (
            ("z", lambda v: math.isfinite(v) and v > 0, "a finite number > 0"),
            ("collapse_drop", lambda v: 0 < v < 1, "a number in (0, 1)"),
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(float(value)):
                raise ObservationSettingsError(f"{PREFIX}.phases.{key}: expected {expected}, got {value!r}")
            object.__setattr__(self, key, float(value))


class PhaseFamily(MeasurementFamily):
    """Training phases from the records: no hooks, no summables, a rank-0 comparison with the previous observation."""

    name = "phases"
    order = 60
    settings = PhaseSettings
    observables = (
        family_metric(
            "phase_code",
            "phase of the change since the previous observation: -2 collapse, -1 compression, 0 unresolved, +1 entropy",
            charted=False,  # a category, not a magnitude: TensorBoard draws it as the phase map card, not a heatmap
            doc=_DOC,
        ),
        family_metric("rank_change_z", "paired z of effective_rank(now) - effective_rank(previous)", doc=_DOC),
        family_metric("alpha_change_z", "paired z of power_law_alpha(now) - power_law_alpha(previous)", doc=_DOC),
    )
    panels = (  # the phase map card: a category per cell (the report draws its own phases section)
        Panel(
            "map",
            "phase_code",
            title="training phases",
            switch="layer_epoch",
            page=False,
            tag="layer_epoch/phase",
            categories=tuple((PHASE_CODES[k], k, c) for k, c in PHASE_COLOURS.items()),
        ),
    )

    def hooks(self, context: FamilyContext) -> Sequence[HookSpec]:
        return ()

    def start(self, context: FamilyContext) -> PhaseState:
        return PhaseState(context)

    def read_history(self, run_dir: RunPath, epoch: int) -> PhaseHistory:
        return read_phase_history(run_dir, epoch)


PHASES = register_family(PhaseFamily())
"""The one instance, registered here (imported by `tgo.observatory.families`)."""
