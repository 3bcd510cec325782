"""The curvature family (``curvature``): the loss Hessian's top eigenvalues, its trace and the preconditioned sharpness.

No tensor of the observation pass is read. ``start`` (on the training thread, with the weights of this moment) takes
a fixed **curvature batch** of the analysis subset (`tgo.optimisation.curvature.curvature_batch_indices`: the first
``observation.curvature.images`` images of a class-stratified, seeded order; the same on every rank and every
observation) and computes, through Hessian-vector products of the training loss (`TrainingInfo.loss`: the module's
``tgo_loss`` by the loss protocol, `tgo.optimisation.curvature.training_loss`; plain cross-entropy offline) on a
float64 (or float32) eval-mode, attention-unfused copy of the network (`HessianOperator`; the network itself, its
modes and its ``.grad`` are not touched and no DDP hook fires):

* ``lambda_1 .. lambda_k`` of ``H`` by Lanczos (`lanczos`, seed ``seed``),
* ``tr H`` by Hutchinson with ``trace_probes`` Rademacher probes and its standard error,
* for Adam/AdamW (`TrainingInfo.optimizer`) ``lambda_1(P^-1 H)`` by Lanczos on ``P^-1/2 H P^-1/2`` (seed
  ``seed + 1``) against ``(2 + 2 beta_1) / ((1 - beta_1) eta)``; for plain SGD ``lambda_1(H)`` against ``2 / eta``;
  otherwise (and offline) NaN, with the reason said once in the log.

**Ranks.** The work is dealt, not repeated: the two Lanczos runs and the probes are tasks, each given to the least
loaded rank in a fixed order (`deal_tasks`: one rank does everything on one process). Each rank writes its tasks'
results into its slots of a `SummedTensors` and zeros elsewhere; the observation's second collective sums them, and
``x + 0 = x`` exactly, so every rank holds the same bits, equal to one process's, with no collective of its own
(given the same bits from every rank's Hessian-vector products: the same device type, batch and thread count).

**When.** Every ``every_n_observations``-th observation: the observation of epoch ``e`` counts as the
``ceil(e / every_n_epochs)``-th (`TrainingInfo.epoch` and ``observation.every_n_epochs``; epoch 0 is the 0th, so
it is always measured). Offline (``training`` None) every observation is measured.

Records, on view ``network`` of `FamilyContext.network_point`: ``hessian_top_eigenvalue`` (``lambda_1``),
``hessian_trace`` (standard error: Hutchinson's ``std / sqrt(m)``, not a jackknife over image groups),
``preconditioned_sharpness``, ``edge_of_stability_threshold``, ``sharpness_over_threshold``, and the arrays
``hessian_top_eigenvalues`` ``[k]``, ``hessian_top_residuals`` ``[k]`` (``||H y - theta y||`` of the products as
computed: each eigenvalue's Lanczos error, not the float32 error of the products), ``hessian_trace_samples`` ``[m]``
(``z_i^T H z_i``), ``preconditioned_residual`` ``[1]``, ``curvature_lanczos_steps`` ``[2]`` (steps of the plain and
the preconditioned run; 0 where not run) and ``curvature_loss`` (the loss measured, as ASCII codes:
`tgo.optimisation.curvature.read_loss_label`). Formulas, sources and cost: ``docs/observables.md``, "Curvature".
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tgo.optimisation.curvature import (
    LOSS_ARRAY,
    HessianOperator,
    Preconditioner,
    adam_preconditioner,
    curvature_batch_indices,
    hutchinson_samples,
    lanczos,
    load_batch,
    loss_label,
    offline_loss,
    say_undeclared,
    trace_estimate,
)
from tgo.panels import Panel

from ..settings import (
    COMPUTE_DTYPES,
    PREFIX,
    ObservationSettings,
    ObservationSettingsError,
    check_flags,
    compute_dtype,
    is_int,
    one_of,
    positive_int,
)
from .base import (
    NETWORK_VIEW,
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
    "CURVATURE",
    "CURVATURE_METRICS",
    "CurvatureFamily",
    "CurvatureSettings",
    "CurvatureState",
    "curvature_due",
    "deal_tasks",
]

_DOC = "docs/observables.md#11-curvature"

CURVATURE_METRICS: tuple[str, ...] = (
    "hessian_top_eigenvalue",
    "hessian_trace",
    "preconditioned_sharpness",
    "edge_of_stability_threshold",
    "sharpness_over_threshold",
)
"""The family's metrics on view ``network``, in record order."""
_THRESHOLD = "edge_of_stability_threshold"

_FORMULAS = {
    "hessian_top_eigenvalue": "lambda_1(H) of the loss on the curvature batch (Lanczos)",
    "hessian_trace": "tr H = E[z^T H z], Rademacher z (Hutchinson; stderr std / sqrt(m))",
    "preconditioned_sharpness": "lambda_1(P^-1 H): Adam's P = (1 - b1^t) diag(sqrt(v / (1 - b2^t)) + eps); SGD: P = I",
    "edge_of_stability_threshold": "(2 + 2 b1) / ((1 - b1) eta): 38 / eta at b1 = 0.9; SGD 2 / eta",
    "sharpness_over_threshold": "preconditioned_sharpness / edge_of_stability_threshold",
}

_KINDS = {"none": 0.0, "adam": 1.0, "sgd": 2.0}
_WARNED: set[str] = set()


@dataclass(frozen=True)
class Task:
    """One unit of curvature work: ``lanczos``, ``preconditioned`` or ``probe`` (with its index)."""

    kind: str
    index: int = 0


def deal_tasks(world_size: int, iterations: int, probes: int, preconditioned: bool) -> list[list[Task]]:
    """The tasks of each rank: the plain Lanczos run, the preconditioned one (when there is one) and the probes, in
    that order, each onto the least-loaded rank (the lowest on ties; a Lanczos run weighs ``iterations`` products, a
    probe one). A function of its arguments alone, so every rank deals the same."""
    tasks = [Task("lanczos")] + ([Task("preconditioned")] if preconditioned else [])
    tasks += [Task("probe", i) for i in range(probes)]
    loads, out = [0] * world_size, [[] for _ in range(world_size)]  # type: list[int], list[list[Task]]
    for task in tasks:
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        out[rank].append(task)
        loads[rank] += iterations if task.kind != "probe" else 1
    return out


def curvature_due(settings: ObservationSettings, epoch: int | None) -> bool:
    """Whether the observation of ``epoch`` measures curvature: its count ``ceil(epoch / every_n_epochs)`` is a
    multiple of ``curvature.every_n_observations``; always offline (``epoch`` None)."""
    if epoch is None:
        return True
    count = -(-int(epoch) // settings.every_n_epochs)
    return count % settings.curvature.every_n_observations == 0


def _warn_once(context: FamilyContext, reason: str) -> None:
    if context.rank == 0 and reason not in _WARNED:
        _WARNED.add(reason)
        warnings.warn(f"[tgo] observation.curvature: preconditioned sharpness is NaN: {reason}", RuntimeWarning, 3)


def _preconditioned(op: HessianOperator, scale: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """``v -> P^-1/2 H P^-1/2 v`` with ``scale = P^-1/2`` (symmetric; the spectrum of ``P^-1 H``)."""
    return lambda v: scale * op.matvec(scale * v)


class CurvatureState(FamilyState):
    """This rank's share of one observation's curvature (computed in the constructor, on the training thread)."""

    def __init__(self, context: FamilyContext) -> None:
        self.point = context.network_point.name
        self.sums: SummedTensors | None = None
        training = context.training
        s = context.settings.curvature
        loss = offline_loss() if training is None else training.loss
        if context.rank == 0:  # a module without tgo_loss: said once, where the curvature is measured
            say_undeclared(loss)
        self.loss_label = loss_label(loss)
        if not curvature_due(context.settings, training.epoch if training is not None else None):
            return
        if context.dataset is None or len(context.dataset) == 0:
            _warn_once(context, "no analysis subset to draw the curvature batch from")
            return
        net = context.net
        params = [p for p in net.parameters() if p.requires_grad]
        optimizer = training.optimizer if training is not None else None
        lr = training.learning_rate if training is not None else math.nan
        pre = adam_preconditioner(optimizer, params, lr)
        if pre.reason:
            _warn_once(context, pre.reason)
        mine = deal_tasks(context.world_size, s.lanczos_iterations, s.trace_probes, pre.kind == "adam")[context.rank]
        k, m = s.top_k, s.trace_probes
        self.sums = SummedTensors.zeros(
            {"top": (k,), "residuals": (k,), "trace": (m,), "pre": (2,), "steps": (2,), "reference": (2,)},
            context.device,
        )
        if not mine:
            return
        from tgo.data.subsets import dataset_labels

        indices = curvature_batch_indices(dataset_labels(context.dataset), s.images, s.seed)
        images, labels = load_batch(context.dataset, indices)
        op = HessianOperator(
            net,
            images,
            labels,
            loss,
            dtype=s.torch_dtype(context.device),
            batch_size=s.batch_size,
            device=context.device,
        )
        self._run(op, pre, mine, context)

    def _run(self, op: HessianOperator, pre: Preconditioner, mine: Sequence[Task], context: FamilyContext) -> None:
        s = context.settings.curvature
        assert self.sums is not None
        out = {name: np.zeros(tuple(t.shape)) for name, t in self.sums.tensors.items()}
        probes = [t.index for t in mine if t.kind == "probe"]
        for task in mine:
            if task.kind == "lanczos":
                result = lanczos(
                    op.matvec, op.dim, k=s.top_k, iterations=s.lanczos_iterations, tol=s.lanczos_tol, seed=s.seed
                )
                out["top"][:], out["residuals"][:] = result.eigenvalues, result.residuals
                out["steps"][0] = result.steps
                out["reference"][:] = (pre.threshold, _KINDS[pre.kind])
            elif task.kind == "preconditioned":
                assert pre.diagonal is not None
                result = lanczos(
                    _preconditioned(op, 1.0 / np.sqrt(pre.diagonal)),
                    op.dim,
                    k=1,
                    iterations=s.lanczos_iterations,
                    tol=s.lanczos_tol,
                    seed=s.seed + 1,
                )
                out["pre"][:] = (result.eigenvalues[0], result.residuals[0])
                out["steps"][1] = result.steps
        if probes:
            out["trace"][probes] = hutchinson_samples(op.matvec, op.dim, probes, s.seed)
        if pre.kind != "adam" and any(t.kind == "lanczos" for t in mine):
            out["pre"][:] = math.nan  # no preconditioned run on any rank: NaN + 0 from the others stays NaN
        for name, values in out.items():
            self.sums.tensors[name].copy_(torch.from_numpy(values))

    def update(self, key: str, x: torch.Tensor, batch: Any) -> None:  # pragma: no cover - no hooks
        raise AssertionError("the curvature family reads no tensors in the pass")

    def summables(self) -> Sequence[Any]:
        return [self.sums] if self.sums is not None else []

    def summarize_point(self, summary: PointSummary) -> Contribution:
        if self.sums is None or summary.point.name != self.point:
            return ()
        values = {name: t.detach().cpu().numpy().astype(np.float64) for name, t in self.sums.tensors.items()}
        top, trace = values["top"], values["trace"]
        threshold, kind = float(values["reference"][0]), float(values["reference"][1])
        sharpness = (
            float(values["pre"][0]) if kind == _KINDS["adam"] else float(top[0]) if kind == _KINDS["sgd"] else math.nan
        )
        ratio = sharpness / threshold if math.isfinite(threshold) and threshold > 0 else math.nan
        trace_value, trace_se = trace_estimate(trace)
        return [
            Metric(NETWORK_VIEW, "hessian_top_eigenvalue", float(top[0])),
            Metric(NETWORK_VIEW, "hessian_trace", trace_value, trace_se),
            Metric(NETWORK_VIEW, "preconditioned_sharpness", sharpness),
            Metric(NETWORK_VIEW, "edge_of_stability_threshold", threshold),
            Metric(NETWORK_VIEW, "sharpness_over_threshold", ratio),
            Array(NETWORK_VIEW, "hessian_top_eigenvalues", top),
            Array(NETWORK_VIEW, "hessian_top_residuals", values["residuals"]),
            Array(NETWORK_VIEW, "hessian_trace_samples", trace),
            Array(NETWORK_VIEW, "preconditioned_residual", values["pre"][1:].copy()),
            Array(NETWORK_VIEW, "curvature_lanczos_steps", values["steps"]),
            Array(NETWORK_VIEW, LOSS_ARRAY, self.loss_label.copy()),
        ]


@dataclass(frozen=True)
class CurvatureSettings:
    """The curvature family (``tgo.observatory.families.curvature``): the loss Hessian on a fixed batch.

    Attributes:
        enabled: Record the Hessian's top eigenvalues (Lanczos), its trace (Hutchinson, with its standard error) and
            the optimizer's preconditioned sharpness against its edge-of-stability threshold (view ``network``;
            ``docs/observables.md``, "Curvature"). Off by default: each measurement costs
            ``lanczos_iterations * 2 + trace_probes`` Hessian-vector products at most, ~10x a forward each.
        every_n_observations: Measure at every N-th observation (epoch ``e`` counts as ``ceil(e / every_n_epochs)``;
            epoch 0 always; every observation offline).
        images: The curvature batch: the first N images of the analysis subset in a class-stratified, seeded order.
        batch_size: Images per forward of a Hessian-vector product (memory; the result is the same).
        top_k: Top eigenvalues of ``H`` recorded.
        trace_probes: Rademacher probes of the Hutchinson trace (at least 2, for its standard error).
        lanczos_iterations: At most this many Lanczos steps per run.
        lanczos_tol: Stop once every top-k residual ``||H y - theta y||`` is ``<= tol * |theta_1|``.
        seed: Seed of the batch order, the Lanczos start vectors and the probes.
        dtype: Precision of the Hessian-vector products: ``float64``, ``float32`` (~2e-6 relative to float64 on
            vit_small, 2.5x cheaper on a CPU), or ``auto``: float64 on a GPU, float32 on a CPU.
    """

    enabled: bool = False
    every_n_observations: int = 1
    images: int = 64
    batch_size: int = 32
    top_k: int = 5
    trace_probes: int = 16
    lanczos_iterations: int = 30
    lanczos_tol: float = 1e-3
    seed: int = 0
    dtype: str = "auto"

    def __post_init__(self) -> None:
        check_flags("curvature", self, "enabled")
        for key in ("every_n_observations", "images", "batch_size", "top_k", "lanczos_iterations"):
            positive_int(f"curvature.{key}", getattr(self, key))
        if not is_int(self.trace_probes) or self.trace_probes < 2:
            raise ObservationSettingsError(
                f"{PREFIX}.curvature.trace_probes: expected an integer >= 2, got {self.trace_probes!r}"
            )
        tol = self.lanczos_tol
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < float(tol) < 1:
            raise ObservationSettingsError(f"{PREFIX}.curvature.lanczos_tol: expected a number in (0, 1), got {tol!r}")
        object.__setattr__(self, "lanczos_tol", float(tol))
        if not is_int(self.seed) or self.seed < 0:
            raise ObservationSettingsError(f"{PREFIX}.curvature.seed: expected an integer >= 0, got {self.seed!r}")
        one_of("curvature.dtype", self.dtype, COMPUTE_DTYPES)

    def torch_dtype(self, device: torch.device | str | None) -> torch.dtype:
        """The Hessian-vector products' dtype on ``device`` (``auto``: float64 on CUDA and other accelerators, whose
        float64 peak is the float32 one on an H200; float32 on a CPU, where float64 costs 2.5x)."""
        return compute_dtype(self.dtype, device)


class CurvatureFamily(MeasurementFamily):
    """The loss Hessian's curvature on a fixed batch (``observation.curvature``)."""

    name = "curvature"
    reads_parameters = True  # sharded parameters are refused (tgo.observatory.sharded)
    order = 50
    settings = CurvatureSettings
    series = ("epoch",)  # measured between epoch observations: not in the step series
    observables = tuple(
        family_metric(
            name,
            _FORMULAS[name],
            (NETWORK_VIEW,),
            charted=True,
            doc=_DOC,
            stderr="probes",  # Hutchinson's trace
        )
        for name in CURVATURE_METRICS
    )
    panels = (  # against epoch on the last point's network view (the page draws the threshold over the sharpness)
        Panel(
            "grid",
            "curvature",
            switch="optimisation",
            columns=3,
            cells=tuple(
                Panel(
                    "bands",
                    m,
                    NETWORK_VIEW,
                    switch="optimisation",
                    page=m != _THRESHOLD,
                    rows="recorded",
                    overlay=_THRESHOLD if m == "preconditioned_sharpness" else None,
                    scale="log" if m in ("preconditioned_sharpness", "sharpness_over_threshold") else None,
                    line=1.0 if m == "sharpness_over_threshold" else None,
                )
                for m in CURVATURE_METRICS
            ),
            caption="the Hessian's top eigenvalue and trace on the fixed curvature batch (+-1 standard error where "
            "the estimator has one), and the preconditioned sharpness against the edge-of-stability threshold for "
            "the current learning rate (dashed; Cohen et al. 2022), against epoch (the last point's network view).",
        ),
        Panel("table", view=NETWORK_VIEW, card=False, metrics=CURVATURE_METRICS),
    )

    def start(self, context: FamilyContext) -> CurvatureState:
        return CurvatureState(context)


CURVATURE = register_family(CurvatureFamily())
"""The one instance, registered here (imported by `tgo.observatory.families`)."""
