"""The memory plan of one observation: how many streaming passes keep a rank's covariance state within
``observation.state_budget_gb``.

The exact state grows as G x D^2 per point (190 MB at D = 1,536, G = 10) and the reduction holds it twice (the state
and the packed buffer it is summed in), so a wide, deep model cannot hold every point at once beside training. A pass
over a subset of the points does the same arithmetic per point as one pass over all of them, so the records do not
depend on the plan; each extra pass costs one more forward over the analysis images. The widths come from the model,
without a forward (`tgo.observatory.stream.planned_widths`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tgo.observatory.points import ObservationPoint
from tgo.observatory.settings import PREFIX, ObservationSettingsError

__all__ = ["GB", "StatePlan", "plan_passes", "point_state_bytes"]

GB = 10**9
"""``observation.state_budget_gb`` counts decimal gigabytes, as the plan's line prints them."""


def point_state_bytes(dim: int, groups: int) -> int:
    """Bytes one point holds while it streams: per accumulator (one, or one per jackknife group) the float64 sums
    ``S1`` (D) and ``S2`` (D^2), the shift (D) and the two counts, plus the same ``2 + D + D^2`` once more in the
    reduction's packed buffer (`tgo.spectral.allreduce_accumulators`): the peak of the pass."""
    accumulators = max(int(groups), 1)
    held = 2 + 2 * dim + dim * dim
    packed = 2 + dim + dim * dim
    return accumulators * (held + packed) * 8


@dataclass(frozen=True)
class StatePlan:
    """The passes of one observation (points in their given order, each pass a run of consecutive points) and why."""

    passes: tuple[tuple[ObservationPoint, ...], ...]
    point_bytes: Mapping[str, int]
    budget_bytes: int | None

    @property
    def total_bytes(self) -> int:
        """The peak of one pass over every point."""
        return sum(self.point_bytes.values())

    @property
    def pass_bytes(self) -> tuple[int, ...]:
        """The peak of each planned pass."""
        return tuple(sum(self.point_bytes[p.name] for p in points) for points in self.passes)

    def line(self) -> str:
        """What the plan chose, in one line (printed by rank 0 when it needs more than one pass)."""
        if self.budget_bytes is None:
            return "[tgo] observation state not bounded (observation.state_budget_gb=null): 1 pass"
        budget = f"budget {self.budget_bytes / GB:.3g} GB"
        if len(self.passes) <= 1:
            return f"[tgo] observation state {self.total_bytes / GB:.3g} GB <= {budget}: 1 pass"
        widest = max(len(points) for points in self.passes)
        return (
            f"[tgo] observation state {self.total_bytes / GB:.3g} GB > {budget}: {len(self.passes)} passes of <= "
            f"{widest} points (<= {max(self.pass_bytes) / GB:.3g} GB each; reduced states kept on the host between "
            f"passes)"
        )


def plan_passes(
    points: Sequence[ObservationPoint], dims: Mapping[str, int] | None, *, groups: int, budget_bytes: int | None
) -> StatePlan:
    """The fewest passes of consecutive points whose peak state each stays within ``budget_bytes`` (``None``: one pass,
    and ``dims`` may be ``None``: nothing is sized).

    Consecutive points in their given order: every rank plans the same passes from the same points and dimensions, so
    every rank makes the same collectives. A point that alone exceeds the budget is refused in one line."""
    if budget_bytes is None or dims is None:
        return StatePlan((tuple(points),), {}, None)
    sizes = {p.name: point_state_bytes(int(dims[p.name]), groups) for p in points}
    if sum(sizes.values()) <= budget_bytes:
        return StatePlan((tuple(points),), sizes, budget_bytes)
    too_big = [p for p in points if sizes[p.name] > budget_bytes]
    if too_big:
        p = too_big[0]
        raise ObservationSettingsError(
            f"{PREFIX}.state_budget_gb: point {p.name!r} (D = {dims[p.name]}, G = {max(groups, 1)}) alone needs "
            f"{sizes[p.name] / GB:.3g} GB, over the budget of {budget_bytes / GB:.3g} GB; expected a budget of at "
            f"least {sizes[p.name] / GB:.3g}, fewer jackknife groups (observation.groups) or null (no bound)"
        )
    passes: list[list[ObservationPoint]] = [[]]
    used = 0
    for p in points:
        if passes[-1] and used + sizes[p.name] > budget_bytes:
            passes.append([])
            used = 0
        passes[-1].append(p)
        used += sizes[p.name]
    return StatePlan(tuple(tuple(chunk) for chunk in passes), sizes, budget_bytes)
