"""The weights family: the geometry of every block's linear maps and of the patch embedding, at every observation.

Read from the weights, not from activations: no hooks, nothing summed over ranks (the weights are identical on every
DDP rank, so any rank that summarises a point computes the same bits from its own copy). ``start`` copies the maps'
weights to CPU on the training thread (exact copies: float32, or float64 for float64 weights), because the summary
may run later on a background thread while training keeps updating them (``observation.summary.background``).

**Which maps.** At an observation point whose module is a block with ``attn.qkv``, ``attn.proj``, ``mlp.fc1``,
``mlp.fc2`` (timm's ``Block``), each of those that is an ``nn.Linear``; at the point whose module is a patch
embedding whose ``proj`` is an ``nn.Conv2d`` (timm's ``PatchEmbed``), that convolution as the ``[out, in * kh * kw]``
matrix it applies to every flattened patch. Other points record nothing; a module observed at several points is
recorded at the first. The **bias is left out**, as WeightWatcher leaves it out: it is an offset, not part of the
linear map whose spectrum is described, and ``[W | b]`` would mix a column of another kind (and other units) into
the singular values; the relative update is of the same matrix, so the two agree on what "the weight" is.

**Records.** One view per map on its point (`WEIGHT_VIEWS`: ``weights_qkv``, ``weights_proj``, ``weights_fc1``,
``weights_fc2``, ``weights_patch``), created holding only this family's metrics (like ``attention``): `WEIGHT_METRICS`
(stable and effective rank, WeightWatcher's ``alpha`` with its standard error ``(alpha - 1) / sqrt(n_tail)`` in the
``stderr`` column, the fit's KS distance, the spectral norm, the relative update; no jackknife: nothing here is
sampled from images) and the array ``singular_values`` (float64, descending). The fit's tail size is
``((alpha - 1) / stderr)^2`` and its ``xmin`` the ``n_tail``-th largest ``singular_values ** 2``. A point whose
activations were non-finite records NaN here too (the summary's policy for every family of that point).

**Relative update** ``||W_t - W_prev||_F / ||W_prev||_F``, the step ``||W_t - W_prev||_F`` and its angle with the step
before (per map, and over the network on view ``network``; rank 0, ``relate_history``): against the weights of the
latest recorded observation before this one, kept in ``geometry/weights/`` (`weight_history`: which file, what is
kept, what happens under resume and re-observation); NaN at the first observation, when that observation's weights
were not kept. With ``observation.weights.relative_update: false`` none of the three is recorded (and nothing kept),
with ``step_angle: false`` no angle; either is said once in the log. Rank 0 writes this observation's weights at
the history step of the last point, after every point is summarised and before the records are written.

Numerics: `tgo.spectral.weights`; formulas, sources and known answers: ``docs/observables.md``, "Weight geometry".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from tgo.panels import Panel
from tgo.records import RunDir, RunPath
from tgo.spectral.weights import StepSums, relative_update, step_sums, weight_geometry, weight_matrix

from ..settings import check_flags
from .base import (
    NETWORK_VIEW,
    Array,
    BatchInfo,
    Contribution,
    FamilyContext,
    FamilyState,
    HistorySummary,
    MeasurementFamily,
    Metric,
    PointSummary,
    family_metric,
    register_family,
)
from .weight_history import WEIGHTS_DIR, WeightHistory, read_weight_history, weight_files, write_weights

__all__ = [
    "BLOCK_MAPS",
    "PATCH_MAP",
    "WEIGHTS",
    "WEIGHT_METRICS",
    "WEIGHT_VIEWS",
    "WeightMap",
    "WeightSettings",
    "WeightState",
    "WeightsFamily",
    "weight_plan",
]

BLOCK_MAPS: tuple[tuple[str, str], ...] = (
    ("qkv", "attn.qkv"),
    ("proj", "attn.proj"),
    ("fc1", "mlp.fc1"),
    ("fc2", "mlp.fc2"),
)
"""``(map, path inside the block)`` of the block maps, in record order."""

PATCH_MAP: tuple[str, str] = ("patch", "proj")
"""``(map, path inside the patch embedding)``."""

WEIGHT_VIEWS: dict[str, str] = {name: f"weights_{name}" for name in (*(m for m, _ in BLOCK_MAPS), PATCH_MAP[0])}
"""``{map: view}``: the view of a point that carries one map's metrics."""

_DOC = "docs/observables.md#9-weight-geometry"
_VIEWS = tuple(WEIGHT_VIEWS.values())
_OBSERVABLES = (
    family_metric("weight_stable_rank", "||W||_F^2 / ||W||_2^2 of the map's weight", _VIEWS, spread="rises", doc=_DOC),
    family_metric(
        "weight_effective_rank",
        "exp(H(sigma_i^2 / sum sigma^2)): Roy & Vetterli's effective rank of W^T W",
        _VIEWS,
        spread="rises",
        doc=_DOC,
    ),
    family_metric(
        "weight_alpha",
        "WeightWatcher power-law exponent of the ESD of W^T W (MLE, xmin by least KS; Martin & Mahoney 2021)",
        _VIEWS,
        doc=_DOC,
        stderr="fit",  # (alpha - 1) / sqrt(n_tail): the estimator's error on this matrix, no replicates
    ),
    family_metric("weight_alpha_ks", "Kolmogorov-Smirnov distance of that power-law fit", _VIEWS, doc=_DOC),
    family_metric("weight_spectral_norm", "sigma_1 = ||W||_2", _VIEWS, scale="log", doc=_DOC),
    family_metric(
        "weight_relative_update",
        "||W_t - W_prev||_F / ||W_prev||_F since the previous recorded observation",
        _VIEWS,
        scale="log",
        doc=_DOC,
    ),
    family_metric(
        "weight_step",
        "||W_t - W_prev||_F since the previous recorded observation (network: over every recorded map)",
        (*_VIEWS, NETWORK_VIEW),
        scale="log",
        doc=_DOC,
    ),
    family_metric(
        "weight_step_angle",
        "angle (degrees) between the step W_t - W_prev and the step before it, W_prev - W_earlier",
        (*_VIEWS, NETWORK_VIEW),
        doc=_DOC,
    ),
)

_TRAJECTORY = ("weight_step", "weight_step_angle")

WEIGHT_METRICS: tuple[str, ...] = tuple(o.name for o in _OBSERVABLES)
"""Every metric of a ``weights_<map>`` view, in record order."""


@dataclass(frozen=True)
class WeightMap:
    """One recorded linear map.

    Attributes:
        point: The observation point it is recorded under.
        name: ``qkv``, ``proj``, ``fc1``, ``fc2`` or ``patch``.
        module: Dotted path of the layer in the network.
    """

    point: str
    name: str
    module: str

    @property
    def view(self) -> str:
        """Its view (`WEIGHT_VIEWS`)."""
        return WEIGHT_VIEWS[self.name]

    @property
    def key(self) -> str:
        """``<point>/<map>``: its name in the kept weights."""
        return f"{self.point}/{self.name}"


def _child(module: nn.Module, path: str) -> nn.Module | None:
    for part in path.split("."):
        child = getattr(module, part, None)
        if not isinstance(child, nn.Module):
            return None
        module = child
    return module


def weight_plan(context: FamilyContext) -> list[WeightMap]:
    """The maps the family records, in point order (then `BLOCK_MAPS` order); depends on the model alone."""
    names = {id(m): n for n, m in context.net.named_modules()}
    seen: set[int] = set()
    plan: list[WeightMap] = []
    for point in context.points:
        module = context.modules.get(point.name)
        if module is None:
            continue
        patch = _child(module, PATCH_MAP[1])
        candidates: list[tuple[str, nn.Module]]
        if isinstance(patch, nn.Conv2d) and _child(module, "attn") is None:
            candidates = [(PATCH_MAP[0], patch)]
        else:
            found = [(name, _child(module, path)) for name, path in BLOCK_MAPS]
            candidates = [(n, m) for n, m in found if isinstance(m, nn.Linear)]
        for name, layer in candidates:
            if id(layer) in seen:
                continue
            seen.add(id(layer))
            plan.append(WeightMap(point.name, name, names.get(id(layer), f"{point.module}.{name}")))
    return plan


def _snapshot(weight: torch.Tensor) -> np.ndarray:
    """An exact CPU copy: float64 stays float64, every other float (float32, bfloat16, float16) becomes float32."""
    with torch.no_grad():
        t = weight.detach()
        if t.dtype not in (torch.float32, torch.float64):
            t = t.float()
        if t.device.type != "cpu":
            return t.cpu().numpy()  # the transfer is the copy
        # copied by torch: .numpy() of the live weight would pin its storage, which a sharded strategy frees after
        # gathering it (tgo.observatory.sharded: "Trying to resize storage that is not resizable")
        return t.clone().numpy()


class WeightState(FamilyState):
    """The maps' weights as they were when the observation started (every rank: any rank may summarise a point)."""

    def __init__(self, context: FamilyContext, plan: Sequence[WeightMap]) -> None:
        modules = dict(context.net.named_modules())
        self.plan = tuple(plan)
        self.weights = {m.key: _snapshot(modules[m.module].weight) for m in self.plan}
        # the training dtype of each map: float16 and bfloat16 weights are kept on disk at 2 bytes (`write_weights`)
        self.dtypes = {m.key: str(modules[m.module].weight.dtype).removeprefix("torch.") for m in self.plan}
        self.by_point: dict[str, list[WeightMap]] = {}
        for m in self.plan:
            self.by_point.setdefault(m.point, []).append(m)
        self.last_point = context.points[-1].name if context.points else ""
        self.keep = bool(context.settings.weights.relative_update)
        self.keep_earlier = self.keep and bool(context.settings.weights.step_angle)
        self._previous: dict[str, np.ndarray] | None = None
        self._earlier: dict[str, np.ndarray] = {}
        self._network: StepSums | None = StepSums(0.0, 0.0, 0.0)

    def update(self, key: str, x: torch.Tensor, batch: BatchInfo) -> None:  # pragma: no cover - it hooks nothing
        raise RuntimeError(f"[tgo] the weights family hooks nothing, yet received {key!r}")

    def summarize_point(self, summary: PointSummary) -> Contribution:
        out: list[Metric | Array] = []
        for m in self.by_point.get(summary.point.name, ()):
            g = weight_geometry(weight_matrix(self.weights[m.key]))
            out += [
                Metric(m.view, "weight_stable_rank", g.stable_rank),
                Metric(m.view, "weight_effective_rank", g.effective_rank),
                Metric(m.view, "weight_alpha", g.fit.alpha, g.fit.stderr),
                Metric(m.view, "weight_alpha_ks", g.fit.ks),
                Metric(m.view, "weight_spectral_norm", g.spectral_norm),
                Array(m.view, "singular_values", np.asarray(g.singular_values, dtype=np.float64)),
            ]
        return out

    def relate_history(self, summary: HistorySummary) -> Contribution:
        history = summary.history if isinstance(summary.history, WeightHistory) else None
        if self._previous is None:
            self._previous = history.load_previous(self.weights) if history is not None and self.keep else {}
            if self._previous and history is not None and self.keep_earlier:
                self._earlier = history.load_earlier(self.weights)
        out: list[Metric | Array] = []
        if not self.keep:  # observation.weights.relative_update: false: none of these is recorded (said at start)
            return out
        for m in self.by_point.get(summary.point.name, ()):
            previous = self._previous.get(m.key)
            value = relative_update(self.weights[m.key], previous) if previous is not None else math.nan
            step = step_sums(self.weights[m.key], previous, self._earlier.get(m.key)) if previous is not None else None
            self._network = self._network + step if self._network is not None and step is not None else None
            out += [
                Metric(m.view, "weight_relative_update", value),
                Metric(m.view, "weight_step", step.length if step is not None else math.nan),
            ]
            if self.keep_earlier:
                out.append(Metric(m.view, "weight_step_angle", step.angle if step is not None else math.nan))
        if summary.point.name == self.last_point:
            network = self._network if self.plan and self._network is not None else None
            out.append(Metric(NETWORK_VIEW, "weight_step", network.length if network is not None else math.nan))
            if self.keep_earlier:
                angle = network.angle if network is not None else math.nan
                out.append(Metric(NETWORK_VIEW, "weight_step_angle", angle))
            if history is not None and self.weights:
                write_weights(history, self.weights, keep_earlier=self.keep_earlier, dtypes=self.dtypes)
            self._previous, self._earlier = None, {}  # what was read is no longer needed
        return out


_SAID: set[str] = set()  # what `_say_what_is_off` has said in this process


def _say_what_is_off(settings: WeightSettings) -> None:
    """Says once per process which metrics a switched-off setting leaves out of the records (rank 0, at start)."""
    if not settings.enabled:
        return
    if not settings.relative_update:
        said = (
            "[tgo] observation.weights.relative_update: false: weight_relative_update, weight_step and "
            "weight_step_angle are not recorded and no weights are kept in geometry/weights/"
        )
    elif not settings.step_angle:
        said = (
            "[tgo] observation.weights.step_angle: false: weight_step_angle is not recorded (two kept weight files "
            "in geometry/weights/ instead of three)"
        )
    else:
        return
    if said not in _SAID:
        _SAID.add(said)
        from lightning.pytorch.utilities import rank_zero_info  # on first use: the family imports no Lightning

        rank_zero_info(said)


@dataclass(frozen=True)
class WeightSettings:
    """The weight-geometry family (``tgo.observatory.families.weights``): every block's linear maps and the patch
    embedding, read from the weights at each observation (no hooks, nothing summed over ranks).

    Attributes:
        enabled: Record the float64 singular values, stable and effective rank, spectral norm and WeightWatcher's
            power-law exponent (with its KS distance) of ``attn.qkv``, ``attn.proj``, ``mlp.fc1``, ``mlp.fc2`` of every
            block and of the patch embedding (views ``weights_<map>``; ``docs/observables.md``, "Weight geometry").
        relative_update: Also record ``||W_t - W_prev||_F / ||W_prev||_F`` and the step ``||W_t - W_prev||_F``
            against the previous recorded observation, which needs its weights: rank 0 keeps the latest two
            observations' weights in ``geometry/weights/`` (4 bytes per measured weight each, 2 for float16 or
            bfloat16 weights: 86 MB for ViT-S/16). ``false`` keeps none and records none of ``weight_relative_update``,
            ``weight_step``, ``weight_step_angle`` (said once in the log).
        step_angle: Also record the angle between the step and the step before it (the turning of the weight
            trajectory), which needs one more observation's weights: three files instead of two (with
            ``relative_update`` only). ``false`` records no ``weight_step_angle``.
    """

    enabled: bool = True
    relative_update: bool = True
    step_angle: bool = True

    def __post_init__(self) -> None:
        check_flags("weights", self, "enabled", "relative_update", "step_angle")


class WeightsFamily(MeasurementFamily):
    """Weight geometry of every block's ``qkv``, ``proj``, ``fc1``, ``fc2`` and the patch embedding
    (``observation.weights``)."""

    name = "weights"
    order = 30
    settings = WeightSettings
    folder = WEIGHTS_DIR  # the latest observations' weights (`weight_history`: two, three with the step angle)
    observables = _OBSERVABLES
    panels = (  # a depth profile per metric and block map (the patch embedding is one matrix), one figure of them
        Panel(
            "grid",
            "weights",
            switch="optimisation",
            columns=len(BLOCK_MAPS),
            cells=tuple(
                Panel(
                    "depth",
                    m,
                    WEIGHT_VIEWS[name],
                    f"{m} ({name} weights)",
                    "optimisation",
                    card=m not in ("weight_effective_rank", "weight_step_angle"),
                    rows="recorded",
                )
                for m in (
                    "weight_alpha",
                    "weight_stable_rank",
                    "weight_effective_rank",
                    "weight_relative_update",
                    "weight_step_angle",
                )
                for name, _ in BLOCK_MAPS
            ),
            caption="the blocks' weight spectra against depth, one column per linear map (attention qkv and output "
            "projection, MLP fc1 and fc2), at the first, middle and last observation. weight_alpha is WeightWatcher's "
            "power-law exponent of the eigenvalues of W^T W (band: +-1 fit standard error; lower: heavier tail, more "
            "learned correlation); stable and effective rank of W; the relative update ||W_t - W_prev||_F / "
            "||W_prev||_F since the previous observation (none at the first); the angle between that step and the one "
            "before it (none at the first two).",
        ),
        Panel(
            "grid",
            "weights_trajectory",
            switch="optimisation",
            columns=2,
            cells=tuple(Panel("bands", m, NETWORK_VIEW, switch="optimisation", rows="recorded") for m in _TRAJECTORY),
            caption="the weight trajectory over the network (every recorded map together): the step ||W_t - W_prev||_F "
            "since the previous observation, and the angle between that step and the one before it (0: training "
            "keeps its direction; 90: unrelated steps; above 90: it turns back).",
        ),
    )

    def start(self, context: FamilyContext) -> WeightState:
        if context.rank == 0:
            _say_what_is_off(context.settings.weights)
        return WeightState(context, weight_plan(context))

    def read_history(self, run_dir: RunPath, epoch: int) -> WeightHistory:
        return read_weight_history(run_dir, epoch)

    def kept_files(self, run: RunDir) -> Iterable[Path]:
        return weight_files(run, verified=True).values()


WEIGHTS = register_family(WeightsFamily())
"""The one instance, registered here (imported by `tgo.observatory.families`)."""
