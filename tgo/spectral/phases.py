"""Training phases: each change of a point's geometry between two observations labelled as a phase of learning.

Li et al. (NeurIPS 2025, arXiv:2509.23024) follow RankMe (``effective_rank``) and alpha-ReQ (``power_law_alpha``)
through a warm-up collapse, an entropy-seeking and a compression-seeking phase. `classify` judges a change against its
paired jackknife error with the verdicts' Student's t rule (`tgo.report.verdicts.student_factor`, held equal by a test
so this module stays free of the report). The rule: ``docs/observables.md``, "8. Training phases".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from tgo.spectral.jackknife import jackknife_stderr

__all__ = [
    "COLLAPSE",
    "COMPRESSION",
    "DEFAULT_COLLAPSE_DROP",
    "DEFAULT_PHASE_Z",
    "ENTROPY",
    "LABELS",
    "PHASE_CODES",
    "UNDEFINED",
    "UNRESOLVED",
    "Change",
    "Phase",
    "PhaseLabel",
    "PhaseRule",
    "Trajectory",
    "classify",
    "label_trajectory",
    "merge_phases",
    "paired_change",
]

COLLAPSE = "collapse"
COMPRESSION = "compression-seeking"
UNRESOLVED = "unresolved"
ENTROPY = "entropy-seeking"
UNDEFINED = "undefined"
LABELS: tuple[str, ...] = (COLLAPSE, COMPRESSION, UNRESOLVED, ENTROPY, UNDEFINED)
"""Every label, from the most to the least compressing (then ``undefined``): the order of legends and colour maps."""
PHASE_CODES: dict[str, float] = {COLLAPSE: -2.0, COMPRESSION: -1.0, UNRESOLVED: 0.0, ENTROPY: 1.0, UNDEFINED: math.nan}
"""The recorded ``phase_code`` of each label, signed by the direction of the spread."""

DEFAULT_PHASE_Z = 3.0
"""The default normal quantile (the verdict rule's ``z``, `tgo.report.verdicts.DEFAULT_Z`)."""
DEFAULT_COLLAPSE_DROP = 0.5
"""The default smallest relative loss of effective rank between two observations that is a collapse."""


@dataclass(frozen=True)
class PhaseRule:
    """The significance level ``z`` (widened to Student's t for ``G - 1`` dof) and the collapse threshold: the least
    relative loss of effective rank that is a collapse, in ``(0, 1)``."""

    z: float = DEFAULT_PHASE_Z
    collapse_drop: float = DEFAULT_COLLAPSE_DROP

    def __post_init__(self) -> None:
        if not (isinstance(self.z, (int, float)) and math.isfinite(self.z) and self.z > 0):
            raise ValueError(f"z must be a finite number > 0, got {self.z!r}")
        if not (isinstance(self.collapse_drop, (int, float)) and 0 < self.collapse_drop < 1):
            raise ValueError(f"collapse_drop must be in (0, 1), got {self.collapse_drop!r}")

    def critical(self, dof: float) -> float:
        """``|z|`` a change must exceed at ``dof`` (``inf`` below 1 dof; ``z`` for infinite ``dof``)."""
        return _critical(float(self.z), float(dof))


@functools.lru_cache(maxsize=256)
def _critical(z: float, dof: float) -> float:
    """`PhaseRule.critical` (cached: a run's pairs share one ``G``, and scipy's t quantile is ~0.1 ms)."""
    if not math.isfinite(dof):
        return z
    if dof < 1:
        return math.inf
    return max(z, float(stats.t.isf(stats.norm.sf(z), dof)))


@dataclass(frozen=True)
class Change:
    """One paired change ``after - before`` of a value measured twice on the same jackknife groups."""

    before: float
    after: float
    stderr: float
    dof: float

    @property
    def difference(self) -> float:
        """``after - before``."""
        return self.after - self.before

    @property
    def z(self) -> float:
        """``difference / stderr`` as `tgo.report.verdicts.Uncertainty.z` does it."""
        d, se = self.difference, self.stderr
        if not (math.isfinite(d) and math.isfinite(se)):
            return math.nan
        if se == 0:
            return 0.0 if d == 0 else math.copysign(math.inf, d)
        return d / se

    @property
    def relative(self) -> float:
        """``difference / |before|`` (NaN where ``before`` is 0 or undefined)."""
        return self.difference / abs(self.before) if math.isfinite(self.before) and self.before != 0 else math.nan

    def direction(self, rule: PhaseRule) -> int:
        """``+1`` / ``-1`` when the change is significant upwards / downwards under ``rule``, else 0."""
        z = self.z
        if math.isnan(z) or abs(z) <= rule.critical(self.dof):
            return 0
        return 1 if z > 0 else -1


def paired_change(
    before: float, after: float, before_replicates: ArrayLike | None, after_replicates: ArrayLike | None
) -> Change:
    """The change and its paired jackknife standard error from both observations' ``[G]`` leave-one-group-out values;
    NaN stderr (``dof`` 0) without usable, equally long, finite replicates."""
    if before_replicates is None or after_replicates is None:
        return Change(float(before), float(after), math.nan, 0.0)
    a = np.asarray(before_replicates, dtype=np.float64).ravel()
    b = np.asarray(after_replicates, dtype=np.float64).ravel()
    if a.size != b.size or a.size < 2 or not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return Change(float(before), float(after), math.nan, 0.0)
    return Change(float(before), float(after), jackknife_stderr(b - a), float(a.size - 1))


@dataclass(frozen=True)
class PhaseLabel:
    """The label of one change, the rank and alpha changes, and one line saying why."""

    label: str
    rank: Change
    alpha: Change
    reason: str

    @property
    def code(self) -> float:
        """The recorded ``phase_code`` (`PHASE_CODES`)."""
        return PHASE_CODES[self.label]


def _describe(name: str, change: Change, rule: PhaseRule) -> str:
    word = {1: "rises", -1: "falls", 0: "inside the noise"}[change.direction(rule)]
    return f"{name} {word} (z = {change.z:+.1f})"


def classify(rank: Change, alpha: Change, rule: PhaseRule | None = None) -> PhaseLabel:
    """The phase label of the paired changes of ``effective_rank`` and ``power_law_alpha``."""
    rule = rule or PhaseRule()
    values = (rank.before, rank.after, alpha.before, alpha.after)
    if not all(math.isfinite(v) for v in values):
        return PhaseLabel(UNDEFINED, rank, alpha, "a value is undefined (NaN)")
    if math.isnan(rank.z) or math.isnan(alpha.z):
        return PhaseLabel(UNDEFINED, rank, alpha, "no paired standard error (no jackknife replicates)")
    s_rank, s_alpha = rank.direction(rule), alpha.direction(rule)
    words = f"{_describe('rank', rank, rule)}, {_describe('alpha', alpha, rule)}"
    if s_rank < 0 and rank.relative <= -rule.collapse_drop:
        return PhaseLabel(
            COLLAPSE,
            rank,
            alpha,
            f"rank falls by {-rank.relative:.0%} (z = {rank.z:+.1f}), at least {rule.collapse_drop:.0%}; "
            f"{_describe('alpha', alpha, rule)}",
        )
    spreading = s_rank > 0 or s_alpha < 0
    compressing = s_rank < 0 or s_alpha > 0
    if spreading and compressing:
        return PhaseLabel(UNRESOLVED, rank, alpha, f"contradictory: {words}")
    if spreading:
        return PhaseLabel(ENTROPY, rank, alpha, words)
    if compressing:
        return PhaseLabel(COMPRESSION, rank, alpha, words)
    return PhaseLabel(UNRESOLVED, rank, alpha, f"inside the noise: {words}")


@dataclass(frozen=True)
class Trajectory:
    """One point's recorded series of both measures and their ``[E, G]`` replicates (``None``: not recorded)."""

    epochs: np.ndarray
    rank: np.ndarray
    alpha: np.ndarray
    rank_replicates: np.ndarray | None = None
    alpha_replicates: np.ndarray | None = None
    steps: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = np.asarray(self.epochs).size
        for name in ("rank", "alpha"):
            if np.asarray(getattr(self, name)).shape != (n,):
                raise ValueError(
                    f"Trajectory: {name} must have shape ({n},), got {np.asarray(getattr(self, name)).shape}"
                )
        for name in ("rank_replicates", "alpha_replicates"):
            reps = getattr(self, name)
            if reps is not None and (np.ndim(reps) != 2 or np.shape(reps)[0] != n):
                raise ValueError(f"Trajectory: {name} must have shape ({n}, G), got {np.shape(reps)}")

    def change(self, i: int, j: int) -> tuple[Change, Change]:
        """The paired changes of rank and alpha from observation ``i`` to observation ``j``."""
        rank, alpha = (
            paired_change(v[i], v[j], *(None if r is None else np.asarray(r[k], dtype=np.float64) for k in (i, j)))
            for v, r in ((self.rank, self.rank_replicates), (self.alpha, self.alpha_replicates))
        )
        return rank, alpha


def label_trajectory(trajectory: Trajectory, rule: PhaseRule | None = None) -> list[PhaseLabel]:
    """The label of every consecutive pair of observations (``E - 1`` labels; pair ``i`` is ``i -> i + 1``)."""
    return [classify(*trajectory.change(i, i + 1), rule) for i in range(np.asarray(trajectory.epochs).size - 1)]


@dataclass(frozen=True)
class Phase:
    """A run of consecutive pairs with one label, and the change over the whole run (its ``evidence``, whose label may
    differ: an unresolved run whose small moves add up)."""

    label: str
    start: int
    stop: int
    start_epoch: int
    end_epoch: int
    evidence: PhaseLabel

    @property
    def pairs(self) -> int:
        """Consecutive pairs in the run."""
        return self.stop - self.start


def merge_phases(
    trajectory: Trajectory, labels: Sequence[PhaseLabel] | Sequence[str], rule: PhaseRule | None = None
) -> list[Phase]:
    """Runs of equal consecutive labels of the pairs of ``trajectory`` as `Phase` s (pair ``i`` joins ``i`` and ``i +
    1``); ``rule`` labels each phase's whole change."""
    names = [lab.label if isinstance(lab, PhaseLabel) else str(lab) for lab in labels]
    epochs = np.asarray(trajectory.epochs)
    if len(names) != max(epochs.size - 1, 0):
        raise ValueError(
            f"merge_phases: {len(names)} labels for {epochs.size} observations (expected {epochs.size - 1})"
        )
    phases: list[Phase] = []
    start = 0
    for i in range(1, len(names) + 1):
        if i == len(names) or names[i] != names[start]:
            evidence = classify(*trajectory.change(start, i), rule)
            phases.append(Phase(names[start], start, i, int(epochs[start]), int(epochs[i]), evidence))
            start = i
    return phases
