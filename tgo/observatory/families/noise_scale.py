"""The gradient noise scale family (``noise_scale``): ``B_simple`` of the training steps since the last observation.

It takes no measurement in the observation pass: the training-time collector (`callbacks.gradient_noise`, owned by
the geometry callback, which forwards its training hooks to every enabled family's ``collector``) gathered the squared
gradient norms at two batch sizes on every step, and ``start`` takes them (`TrainingInfo.collectors`, by the family's
name) and resets the collector, on the training thread. The per-step rows
are each rank's contribution to a sum (``summables``: under DDP the W local squared norms are averaged there), so the
reduced state is identical on every rank and so is ``summarize_point``. Numerics: `tgo.optimisation.noise_scale`.

Records, on view ``network`` of `FamilyContext.network_point`: ``gradient_noise_scale`` (with its delete-a-block
jackknife over consecutive steps: standard error and replicates), ``gradient_norm_sq``, ``gradient_trace_covariance``
(with standard errors), ``gradient_noise_steps`` (steps averaged) and ``gradient_noise_excluded`` (steps left out:
non-finite gradients, e.g. AMP's skipped steps, or one batch size only, e.g. a step of one micro-batch); with
``noise_scale.per_block`` also ``gradient_noise_scale`` of each block's parameters on view ``gradient`` of its
``block_NN`` point. Where training has one batch size only (one device without gradient accumulation) nothing is
recorded: the collector said once, at fit start, what would measure it. Offline (``tgo.observe``, ``training`` None)
nothing is recorded either: no training, no gradients.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tgo.optimisation.noise_scale import noise_scale_estimate
from tgo.panels import Panel

from ..points import ObservationPoint
from ..settings import PREFIX, ObservationSettings, ObservationSettingsError, check_flags, is_int
from .base import (
    NETWORK_VIEW,
    Contribution,
    FamilyContext,
    FamilyState,
    MeasurementFamily,
    Metric,
    PointSummary,
    SummedTensors,
    TrainingCollector,
    family_metric,
    register_family,
)

__all__ = ["GRADIENT_VIEW", "NOISE_SCALE", "NoiseScaleFamily", "NoiseScaleSettings", "NoiseScaleState"]

GRADIENT_VIEW = "gradient"
_CHARTED = ("gradient_noise_scale", "gradient_norm_sq", "gradient_trace_covariance")
"""The view of a block point that carries the gradient statistics of that block's parameters."""

_DOC = "docs/observables.md#10-gradient-noise-scale"
_BLOCK_MODULE = re.compile(r"^blocks\.(\d+)$")


@dataclass(frozen=True)
class NoiseScaleSettings:
    """``observation.noise_scale``, gathered during training.

    Attributes:
        enabled: Record the simple noise scale ``B_simple = tr(Sigma) / |G|^2`` (McCandlish et al. 2018) of the
            training steps since the previous observation, from two batch sizes the training already has (the
            per-rank and the all-reduced gradient under DDP, the micro-batches and their sum with gradient
            accumulation; ``docs/observables.md``, section 10). Training only: offline nothing is
            recorded. With one device and no accumulation there is one batch size: nothing recorded, said once.
        jackknife_blocks: Blocks of consecutive steps of the delete-a-block jackknife standard error (at least 2;
            fewer steps than blocks: one step per block).
        per_block: Also record ``B_simple`` of each block's parameters (view ``gradient`` of every ``block_NN``).
    """

    enabled: bool = True
    jackknife_blocks: int = 10
    per_block: bool = True

    def __post_init__(self) -> None:
        check_flags("noise_scale", self, "enabled", "per_block")
        if not is_int(self.jackknife_blocks) or self.jackknife_blocks < 2:
            raise ObservationSettingsError(
                f"{PREFIX}.noise_scale.jackknife_blocks: expected an integer >= 2, got {self.jackknife_blocks!r}"
            )


class NoiseScaleState(FamilyState):
    """The steps of one observation: this rank's contribution, summed over ranks in the observation's collective."""

    def __init__(self, context: FamilyContext) -> None:
        self.context = context
        self.blocks = context.settings.noise_scale.jackknife_blocks
        self.per_block = context.settings.noise_scale.per_block
        collector = context.training.collectors.get(NoiseScaleFamily.name) if context.training is not None else None
        steps = collector.take() if collector is not None else None
        self.sums: SummedTensors | None = None
        if steps is None:
            return
        device = context.device
        with torch.inference_mode(False):
            self.sums = SummedTensors(
                {
                    "small": steps.small.to(device=device, dtype=torch.float64).clone(),
                    "big": steps.big.to(device=device, dtype=torch.float64).clone(),
                    "inv": steps.inv.to(device=device, dtype=torch.float64).clone(),
                }
            )

    def update(self, key: str, x: torch.Tensor, batch: Any) -> None:  # pragma: no cover - no hooks
        raise AssertionError("the noise-scale family reads no tensors in the pass")

    def summables(self) -> Sequence[Any]:
        return [self.sums] if self.sums is not None else []

    def _columns(self, point: ObservationPoint) -> list[tuple[str, int]]:
        out = []
        if point.name == self.context.network_point.name:
            out.append((NETWORK_VIEW, 0))
        match = _BLOCK_MODULE.match(point.module)
        if self.per_block and match and point.read == "output":
            out.append((GRADIENT_VIEW, 1 + int(match.group(1))))
        return out

    def summarize_point(self, summary: PointSummary) -> Contribution:
        if self.sums is None:
            return ()
        columns = [(v, c) for v, c in self._columns(summary.point) if c < self.sums["small"].shape[1]]
        if not columns:
            return ()
        small, big, inv = (self.sums[k].cpu().numpy() for k in ("small", "big", "inv"))
        estimate = noise_scale_estimate(small, big, inv[:, 0], inv[:, 1], blocks=self.blocks)
        out: list[Metric] = []
        for view, c in columns:
            replicates = estimate.noise_scale_replicates[c]
            stderr = float(estimate.noise_scale_stderr[c])
            out.append(
                Metric(
                    view,
                    "gradient_noise_scale",
                    float(estimate.noise_scale[c]),
                    stderr,
                    replicates.copy() if replicates.size >= 2 and math.isfinite(stderr) else None,
                )
            )
            if view != NETWORK_VIEW:
                continue
            out += [
                Metric(
                    view,
                    "gradient_norm_sq",
                    float(estimate.gradient_norm_sq[c]),
                    float(estimate.gradient_norm_sq_stderr[c]),
                ),
                Metric(
                    view,
                    "gradient_trace_covariance",
                    float(estimate.trace_covariance[c]),
                    float(estimate.trace_covariance_stderr[c]),
                ),
                Metric(view, "gradient_noise_steps", float(estimate.steps)),
                Metric(view, "gradient_noise_excluded", float(estimate.excluded)),
            ]
        return out


class NoiseScaleFamily(MeasurementFamily):
    """``observation.noise_scale``: the simple gradient noise scale of the training steps between observations."""

    name = "noise_scale"
    order = 40
    settings = NoiseScaleSettings
    series = ("epoch",)  # its window is the training between two epoch observations
    observables = (
        family_metric(
            "gradient_noise_scale",
            "B_simple = mean_steps tr(Sigma)_est / mean_steps |G|^2_est (examples)",
            (NETWORK_VIEW, GRADIENT_VIEW),
            scale="log",
            doc=_DOC,
            stderr="blocks",
        ),
        family_metric(
            "gradient_norm_sq",
            "mean_steps (B_b |G_b|^2 - B_s |G_s|^2) / (B_b - B_s)",
            (NETWORK_VIEW,),
            doc=_DOC,
            stderr="blocks",
        ),
        family_metric(
            "gradient_trace_covariance",
            "mean_steps (|G_s|^2 - |G_b|^2) / (1/B_s - 1/B_b)",
            (NETWORK_VIEW,),
            doc=_DOC,
            stderr="blocks",
        ),
        family_metric("gradient_noise_steps", "optimizer steps averaged", (NETWORK_VIEW,), charted=False, doc=_DOC),
        family_metric(
            "gradient_noise_excluded",
            "steps left out (non-finite gradients; one batch size only, e.g. one micro-batch)",
            (NETWORK_VIEW,),
            charted=False,
            doc=_DOC,
        ),
    )
    panels = (  # against epoch on the last point's network view, and the last observation's table
        Panel(
            "grid",
            "noise_scale",
            switch="optimisation",
            columns=3,
            cells=tuple(Panel("bands", m, NETWORK_VIEW, switch="optimisation", rows="recorded") for m in _CHARTED),
            caption="the gradient noise scale B_simple = tr(Sigma) / |G|^2 averaged over the steps since the previous "
            "observation (McCandlish et al. 2018), with |G|^2 and tr(Sigma), against epoch (the last point's network "
            "view), +-1 standard error.",
        ),
        Panel("table", view=NETWORK_VIEW, card=False, metrics=(*_CHARTED, "gradient_noise_steps")),
    )

    def start(self, context: FamilyContext) -> FamilyState:
        return NoiseScaleState(context)

    def collector(self, settings: ObservationSettings) -> TrainingCollector:
        """The squared gradient norms at two batch sizes, step by step (`tgo.callbacks.gradient_noise`)."""
        from tgo.callbacks.gradient_noise import GradientNoiseCollector  # Lightning's side, imported when training

        return GradientNoiseCollector(settings.noise_scale)


NOISE_SCALE = register_family(NoiseScaleFamily())
