"""The toy family's declaration (docs/extending.md, recipe (e), file 2 of 3; a real family's is
``tgo/observatory/families/<name>.py`` and ends with ``MEAN_NORM = register_family(MeanNormFamily())``). The tests
register it themselves and unregister it afterwards, so it reaches no other test.
"""

from __future__ import annotations

import torch

from tests.observatory.mean_norm import norm_sums
from tgo.observatory.families import (
    BatchInfo,
    FamilyContext,
    FamilyState,
    MeasurementFamily,
    Metric,
    PointSummary,
    SummedTensors,
    family_metric,
    jackknife_ratio,
)
from tgo.observatory.hooks import point_rows, point_spec
from tgo.panels import Panel


class MeanNormState(FamilyState):  # one per observation and rank
    def __init__(self, context: FamilyContext) -> None:  # device, rank, world size, n_images, groups, points
        self.points = {p.name: p for p in context.points}
        self.prefix = {p.name: context.prefix_of(p) for p in context.points}
        self.column = {p.name: i for i, p in enumerate(context.points)}
        self.groups = context.jackknife_groups
        shape = (self.groups, len(context.points))
        self.sums = SummedTensors.zeros({"norm": shape, "rows": shape}, context.device)

    def update(self, key: str, x: torch.Tensor, batch: BatchInfo) -> None:  # each hooked tensor, layout-checked
        rows = point_rows(x, self.points[key], self.prefix[key])
        total, count = norm_sums(rows, batch.groups.long(), self.groups)
        self.sums["norm"][:, self.column[key]] += total
        self.sums["rows"][:, self.column[key]] += count

    def summables(self):  # sums over ranks: packed into the observation's second collective
        return [self.sums]

    def summarize_point(self, summary: PointSummary):  # rank 0, after the reduction
        c = self.column[summary.point.name]
        value, stderr, replicates = jackknife_ratio(*(self.sums[k][:, c].cpu().numpy() for k in ("norm", "rows")))
        return [Metric("all", "mean_token_norm", value, stderr, replicates)]


class MeanNormFamily(MeasurementFamily):  # stateless declaration: everything the family is, in one place
    name = "mean_norm"
    order = 900  # record order among the families: built-ins 10..80, a new family 100 or more
    observables = (family_metric("mean_token_norm", "mean_rows ||x||_2"),)  # its catalogue entries
    panels = (Panel("depth", "mean_token_norm", switch="depth_profiles"),)  # a TensorBoard card and a report figure

    def hooks(self, context):  # the tensors it reads: HookSpec(key, module, read, layout)
        return [point_spec(p) for p in context.points]

    def start(self, context):
        return MeanNormState(context)
