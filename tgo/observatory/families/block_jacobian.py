"""The block-Jacobian family (``block_jacobian``): each transformer block's input-output Jacobian at fixed images.

TGO-IV's "local deformation field" (issue 36 row IV), measured as the block's true Jacobian rather than TGO-IV's
least-squares affine fit between its input and output tokens (``docs/observables.md``, "Block Jacobians"). No tensor
of the observation pass is read: ``start`` (on the training thread, with the weights of this moment) takes a fixed
**Jacobian batch** of the analysis subset (`tgo.optimisation.curvature.curvature_batch_indices`: the first
``images`` images of a class-stratified, seeded order, the same on every rank and observation), runs a float64
eval-mode copy of the network on it to catch every block's input (`tgo.optimisation.block_jacobian.BlockJacobians`)
and measures, for every point that is a block's output, per image:

* at each of ``tokens`` positions ``t`` (`token_positions`: token 0, then evenly through the sequence), the dense
  ``D x D`` Jacobian ``J_tt = dy_t / dx_t`` and its singular values: ``sigma_max``, ``sigma_min``,
  ``log |det J_tt|`` and ``sigma_max / sigma_min``;
* the norm ``||J||_2`` of the block's whole ``T D x T D`` Jacobian by Lanczos on ``J^T J``.

**Ranks.** The (block, image) tasks are dealt round robin (task ``i`` to rank ``i mod W``); each rank writes its
tasks' results into their slots of a `SummedTensors` and zeros elsewhere, the observation's second collective sums
them (``x + 0 = x``), so every rank holds one process's bits with no collective of its own.

**Records** (view ``all`` of each block's point): `BLOCK_JACOBIAN_METRICS`, each the mean over the measured
(image, token) pairs (images, for the norm), its standard error ``std / sqrt(m)`` over them: the spread over the
fixed images and tokens, not a jackknife over image groups (catalogue ``stderr="spread"``). Arrays:
``block_jacobian_singular_values`` ``[images * tokens, D]`` (kept epochs) and ``block_jacobian_lanczos``
``[images, 3]`` (``||J||_2``, the Ritz residual of ``sigma^2``, the steps).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tgo.optimisation.block_jacobian import BlockJacobians, token_positions, token_spectrum
from tgo.optimisation.curvature import curvature_batch_indices, load_batch
from tgo.panels import Panel

from ..settings import PREFIX, ObservationSettings, ObservationSettingsError, check_flags, is_int, positive_int
from .base import (
    Array,
    Contribution,
    FamilyContext,
    FamilyState,
    MeasurementFamily,
    Metric,
    PointSummary,
    SummedTensors,
    family_metric,
    register_family,
)

__all__ = [
    "BLOCK_JACOBIAN",
    "BLOCK_JACOBIAN_METRICS",
    "BlockJacobianFamily",
    "BlockJacobianSettings",
    "BlockJacobianState",
    "jacobian_due",
]

_DOC = "docs/observables.md#16-block-jacobians"

_FORMULAS = {
    "block_jacobian_sigma_max": "mean over fixed (image, token t) of sigma_max(dy_t / dx_t), the D x D token Jacobian",
    "block_jacobian_sigma_min": "mean over fixed (image, token t) of sigma_min(dy_t / dx_t)",
    "block_jacobian_log_det": "mean over fixed (image, token t) of log |det dy_t / dx_t| = sum_i log sigma_i",
    "block_jacobian_condition": "mean over fixed (image, token t) of sigma_max / sigma_min of dy_t / dx_t",
    "block_jacobian_norm": "mean over fixed images of ||dY / dX||_2, the whole sequence's Jacobian (Lanczos)",
}
BLOCK_JACOBIAN_METRICS: tuple[str, ...] = tuple(_FORMULAS)
"""The family's metrics on view ``all`` of a block's point, in record order."""


def jacobian_due(settings: ObservationSettings, epoch: int | None) -> bool:
    """Whether the observation of ``epoch`` is measured: its count ``ceil(epoch / every_n_epochs)`` is a multiple of
    ``block_jacobian.every_n_observations`` (epoch 0 always; always offline, ``epoch`` None)."""
    if epoch is None:
        return True
    count = -(-int(epoch) // settings.every_n_epochs)
    return count % settings.block_jacobian.every_n_observations == 0


def _blocks(context: FamilyContext) -> tuple[list[str], list[int]]:
    """The points that are a block's output (point order) and each block's index in ``net.blocks``."""
    index = {id(b): i for i, b in enumerate(getattr(context.net, "blocks", ()))}
    names = [p.name for p in context.points if id(context.modules.get(p.name)) in index]
    return names, [index[id(context.modules[n])] for n in names]


class BlockJacobianState(FamilyState):
    """This rank's share of one observation's block Jacobians (computed in the constructor, on the training thread)."""

    def __init__(self, context: FamilyContext) -> None:
        s = context.settings.block_jacobian
        self.sums: SummedTensors | None = None
        self.points, blocks = _blocks(context)
        training = context.training
        if not self.points or not jacobian_due(context.settings, training.epoch if training is not None else None):
            return
        if context.dataset is None or len(context.dataset) == 0:
            if context.rank == 0:
                warnings.warn("[tgo] observation.block_jacobian: no analysis subset to draw images from", stacklevel=3)
            return
        from tgo.data.subsets import dataset_labels

        images, _ = load_batch(
            context.dataset, curvature_batch_indices(dataset_labels(context.dataset), s.images, s.seed)
        )
        tasks = [(b, i) for b in range(len(blocks)) for i in range(images.shape[0])]
        mine = tasks[context.rank :: context.world_size]
        jac = BlockJacobians(context.net, images, blocks, device=context.device)
        tokens = token_positions(jac.tokens, s.tokens)
        shape = (len(blocks), images.shape[0])
        self.sums = SummedTensors.zeros(
            {"token": (*shape, len(tokens), 3), "singular": (*shape, len(tokens), jac.dim), "lanczos": (*shape, 3)},
            context.device,
        )
        for b, i in mine:
            for k, t in enumerate(tokens):
                singular, top, bottom, logdet = token_spectrum(jac.token(b, i, t, s.chunk))
                self.sums["token"][b, i, k] = torch.tensor((top, bottom, logdet), dtype=torch.float64)
                self.sums["singular"][b, i, k] = torch.from_numpy(singular)
            norm = jac.sequence(b, i, iterations=s.lanczos_iterations, tol=s.lanczos_tol, seed=s.seed)
            self.sums["lanczos"][b, i] = torch.tensor((norm.sigma, norm.residual, norm.steps), dtype=torch.float64)

    def update(self, key: str, x: torch.Tensor, batch: Any) -> None:  # pragma: no cover - no hooks
        raise AssertionError("the block-Jacobian family reads no tensors in the pass")

    def summables(self) -> Sequence[Any]:
        return [self.sums] if self.sums is not None else []

    def summarize_point(self, summary: PointSummary) -> Contribution:
        if self.sums is None or summary.point.name not in self.points:
            return ()
        b = self.points.index(summary.point.name)
        values = {name: t[b].detach().cpu().numpy().astype(np.float64) for name, t in self.sums.tensors.items()}
        token = values["token"].reshape(-1, 3)
        samples = {
            "block_jacobian_sigma_max": token[:, 0],
            "block_jacobian_sigma_min": token[:, 1],
            "block_jacobian_log_det": token[:, 2],
            "block_jacobian_condition": token[:, 0] / token[:, 1],
            "block_jacobian_norm": values["lanczos"][:, 0],
        }
        out: list[Metric | Array] = [Metric("all", m, *_mean_and_spread(samples[m])) for m in BLOCK_JACOBIAN_METRICS]
        singular = values["singular"]
        out.append(Array("all", "block_jacobian_singular_values", singular.reshape(-1, singular.shape[-1]), kept=True))
        out.append(Array("all", "block_jacobian_lanczos", values["lanczos"]))
        return out


def _mean_and_spread(x: np.ndarray) -> tuple[float, float]:
    """``(mean, std(ddof=1) / sqrt(m))`` of ``m`` fixed samples (NaN spread below two)."""
    spread = float(np.std(x, ddof=1) / math.sqrt(x.size)) if x.size >= 2 else math.nan
    return float(np.mean(x)), spread


@dataclass(frozen=True)
class BlockJacobianSettings:
    """The block-Jacobian family (``tgo.observatory.families.block_jacobian``): each block's Jacobian, fixed images.

    Attributes:
        enabled: Record each block's token-Jacobian spectrum (sigma_max, sigma_min, log-determinant, condition
            number) and whole-sequence norm on view ``all`` (``docs/observables.md``, "Block Jacobians"). Off by
            default: every (block, image, token) costs ``D`` backward passes of one sequence (3x ``D`` forwards;
            ViT-S in float64 on one CPU core: 83 s).
        every_n_observations: Measure at every N-th observation (epoch ``e`` counts as ``ceil(e / every_n_epochs)``;
            epoch 0 always; every observation offline).
        images: The fixed images: the first N of the analysis subset in a class-stratified, seeded order.
        tokens: Token positions per image (`token_positions`: token 0, then evenly through the sequence).
        chunk: Jacobian rows per backward (memory: this many sequences' activations; the result is the same).
        lanczos_iterations: At most this many Lanczos steps for ``||J||_2``.
        lanczos_tol: Stop once the residual of ``sigma^2`` is ``<= tol * sigma^2``.
        seed: Seed of the image order and the Lanczos start vector.
    """

    enabled: bool = False
    every_n_observations: int = 1
    images: int = 2
    tokens: int = 2
    chunk: int = 64
    lanczos_iterations: int = 30
    lanczos_tol: float = 1e-3
    seed: int = 0

    def __post_init__(self) -> None:
        check_flags("block_jacobian", self, "enabled")
        for key in ("every_n_observations", "images", "tokens", "chunk", "lanczos_iterations"):
            positive_int(f"block_jacobian.{key}", getattr(self, key))
        tol = self.lanczos_tol
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < float(tol) < 1:
            raise ObservationSettingsError(
                f"{PREFIX}.block_jacobian.lanczos_tol: expected a number in (0, 1), got {tol!r}"
            )
        object.__setattr__(self, "lanczos_tol", float(tol))
        if not is_int(self.seed) or self.seed < 0:
            raise ObservationSettingsError(f"{PREFIX}.block_jacobian.seed: expected an integer >= 0, got {self.seed!r}")


class BlockJacobianFamily(MeasurementFamily):
    """Each block's input-output Jacobian at fixed images (``observation.block_jacobian``)."""

    name = "block_jacobian"
    reads_parameters = True  # sharded parameters are refused (tgo.observatory.sharded)
    order = 120
    settings = BlockJacobianSettings
    series = ("epoch",)  # expensive: not in the step series
    figure_switch = True  # observation.figures.block_jacobian
    observables = tuple(
        family_metric(
            m,
            _FORMULAS[m],
            ("all",),
            doc=_DOC,
            stderr="spread",
            scale="log" if m == "block_jacobian_condition" else "linear",
        )
        for m in BLOCK_JACOBIAN_METRICS
    )
    panels = (
        Panel("depth", "block_jacobian_sigma_max", title="block_jacobian_sigma_max (token Jacobian)", switch=name),
        Panel("depth", "block_jacobian_norm", title="block_jacobian_norm (||dY/dX||_2)", switch=name),
        Panel("bands", "block_jacobian_log_det", switch=name),
        *(Panel("depth", m, switch="block_jacobian", card=False) for m in BLOCK_JACOBIAN_METRICS[1:4]),
    )

    def start(self, context: FamilyContext) -> BlockJacobianState:
        return BlockJacobianState(context)


BLOCK_JACOBIAN = register_family(BlockJacobianFamily())
"""The one instance, registered here (imported by `tgo.observatory.families`)."""
