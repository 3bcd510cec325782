"""The attention family: every block's attention geometry, exact, in the same pass as the covariances.

timm's fused attention (``scaled_dot_product_attention``) never materialises the attention weights. The family hooks
the outputs of every block's ``attn.q_norm`` and ``attn.k_norm`` (identities when ``qk_norm`` is off, but their
hooks still fire), which are ``q`` and ``k`` (``[B, H, N, d_h]``) exactly as the kernel multiplies them, and
`tgo.spectral.attention.AttentionAccumulator` recomputes ``softmax(q k^T / sqrt(d_h))`` batch by batch (float64 by
default on a GPU, float32 on a CPU: ``observation.attention.dtype``) and keeps only per-group float64 sums. Those sums
travel in the observation's second collective (`FamilyState.summables`), so the family adds no collective, and every
metric is a ratio of sums with a delete-a-group jackknife over the same image groups as the covariances.

**Which blocks.** At every observation point whose module has an ``attn`` that is timm's standard ``Attention``
(`attention_refusal`: the class, ``qkv`` / ``q_norm`` / ``k_norm``, the default scale ``d_h^-1/2``, a fixed patch
grid), one accumulator. Anything else (EVA's rotary attention, which rotates ``q`` and ``k`` after ``q_norm`` /
``k_norm``; a dynamic image size) is skipped with one warning line naming the blocks and why; the rest of the
observation is unaffected. The observation pass calls the model without an attention mask (timm's ViT forward passes
none), so the softmax has no bias. After the reduction every measured block must have seen every analysis image
(`AttentionState.check`, on every rank): a block whose hooks did not fire is an error in one line.

**Records.** Each block's metrics go to its view ``attention`` (`ATTENTION_VIEW`): the head
means of `tgo.spectral.attention.ATTENTION_METRICS` with their standard errors and leave-one-group-out replicates,
the two noise references (``attention_entropy_noise = ln N``, ``mean_attention_distance_noise``), and the arrays
``heads_<metric>`` (float64 ``[H]``, per head) and ``similarity`` (``[H, H]``) in the spectra file. Formulas and
conventions (the CLS column, the prefix keys, the distance's renormalisation): ``docs/observables.md`` section 7.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from tgo.panels import Panel, array_table
from tgo.spectral import Observable
from tgo.spectral.attention import (
    ATTENTION_METRICS,
    HEAD_METRICS,
    AttentionAccumulator,
    AttentionSummary,
    LogitMaxima,
    Workspace,
    max_logit_summary,
    qk_spectral_norms,
)
from tgo.spectral.jackknife import jackknife_stderr

from ..settings import COMPUTE_DTYPES, check_flags, compute_dtype, one_of
from .base import (
    Array,
    BatchInfo,
    Contribution,
    FamilyContext,
    FamilyState,
    HookSpec,
    MeasurementFamily,
    Metric,
    PointSummary,
    family_metric,
    register_family,
)

__all__ = [
    "ATTENTION",
    "ATTENTION_CHARTED",
    "ATTENTION_RECORDED",
    "ATTENTION_VIEW",
    "LOGIT_METRICS",
    "AttentionBlock",
    "AttentionFamily",
    "AttentionSettings",
    "AttentionState",
    "attention_plan",
    "attention_refusal",
    "head_tables",
]

ATTENTION_VIEW = "attention"
"""The view of a block point that carries its attention geometry."""


def _metric(name: str, formula: str, **options: Any) -> Observable:
    return family_metric(name, formula, (ATTENTION_VIEW,), doc="docs/observables.md#7-attention-geometry", **options)


# Head means (the per-head values are kept in the spectra file); "spread" = attention spread over more keys or heads.
_OBSERVABLES = (  # in record order
    _metric("attention_entropy", "mean over patch queries of -sum_j A_ij ln A_ij (nats), head mean", spread="rises"),
    _metric("attention_entropy_normalized", "attention_entropy / ln N (N keys)", spread="rises", charted=False),
    _metric("cls_attention_entropy", "-sum_j A_0j ln A_0j of the CLS query (nats), head mean", spread="rises"),
    _metric("cls_attention_entropy_normalized", "cls_attention_entropy / ln N", spread="rises", charted=False),
    _metric("cls_mass", "mean over patch queries of A_i,CLS (the attention sink), head mean"),
    _metric("register_mass", "mean over patch queries of sum_{j register} A_ij, head mean", charted=False),
    _metric("self_mass", "mean over patch queries of A_ii, head mean"),
    _metric("max_weight", "mean over patch queries of max_j A_ij, head mean", spread="falls"),
    _metric(
        "mean_attention_distance",
        "mean over patch queries of sum_{j patch} A_ij d_ij / sum_{j patch} A_ij (pixels; prefix keys excluded), "
        "head mean",
        spread="rises",
    ),
    _metric(
        "effective_heads", "(tr S)^2 / tr S^2, S the cosine similarity of the heads' attention maps", spread="rises"
    ),
    _metric("mean_head_similarity", "mean_{h != h'} S_hh'", spread="falls", charted=False),
    _metric("attention_entropy_noise", "ln N: the entropy of uniform attention over the N keys", charted=False),
    _metric(
        "mean_attention_distance_noise",
        "mean pairwise patch-centre distance: the distance of uniform attention (pixels)",
        charted=False,
    ),
    _metric("max_attention_logit", "max over images, heads, queries and keys of q_i . k_j / sqrt(d_h)"),
    _metric("qk_spectral_norm", "max over heads of ||W_Q,h^T W_K,h||_2 / sqrt(d_h) (the weights, no images)"),
)

LOGIT_METRICS: tuple[str, ...] = ("max_attention_logit", "qk_spectral_norm")
"""Per block and per head (``heads_<name>``): the largest logit over the images, the bound the weights put on it."""

ATTENTION_RECORDED: tuple[str, ...] = (
    *ATTENTION_METRICS,
    "attention_entropy_noise",
    "mean_attention_distance_noise",
    *LOGIT_METRICS,
)
"""Every metric the family records on a block's ``attention`` view, in record order."""

ATTENTION_CHARTED: tuple[str, ...] = tuple(o.name for o in _OBSERVABLES if o.charted)
"""The charted ones (TensorBoard's scalars chart and the report's depth profiles): the catalogue's ``charted``."""

_NOISE = {"attention_entropy_noise": "attention_entropy", "mean_attention_distance_noise": "mean_attention_distance"}


@dataclass(frozen=True)
class AttentionBlock:
    """One measured block: the point it is recorded under and its attention's geometry.

    Attributes:
        point: The observation point (its ``attention`` view holds the metrics).
        module: Dotted path of the block's ``attn`` module.
        num_heads: ``H``.
        num_tokens: ``N`` (prefix + patches).
        num_prefix_tokens: Class, register and distillation tokens.
        class_token: Whether token 0 is a class token.
        grid: ``(h, w)`` patches.
        patch_size: ``(height, width)`` of a patch in pixels.
    """

    point: str
    module: str
    num_heads: int
    num_tokens: int
    num_prefix_tokens: int
    class_token: bool
    grid: tuple[int, int]
    patch_size: tuple[int, int]


def _pair(value: Any) -> tuple[int, int] | None:
    if isinstance(value, int):
        return value, value
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return int(value[0]), int(value[1])
    return None


def attention_refusal(attn: Any) -> str | None:
    """Why ``attn`` is not timm's standard ``Attention`` whose ``q_norm`` / ``k_norm`` outputs enter the softmax as
    they are, or ``None`` when it is.

    Checked: it is ``timm.layers.Attention`` (or a subclass keeping its ``forward``), it has ``qkv``, ``q_norm``,
    ``k_norm`` modules and integer ``num_heads`` / ``head_dim``, and its scale is the default ``head_dim ** -0.5``
    (the fused kernel ignores any other). EVA's attention (rotary position embeddings rotate q and k after the
    norms), BEiT's (a relative position bias is added to the logits), attention pooling and custom classes fail the
    first check.
    """
    from timm.layers import Attention

    cls = type(attn)
    name = f"{cls.__module__}.{cls.__qualname__}"
    if not isinstance(attn, Attention) or cls.forward is not Attention.forward:
        return f"{name} is not timm's standard Attention (its q and k may be changed after q_norm/k_norm)"
    for attribute in ("qkv", "q_norm", "k_norm"):
        if not isinstance(getattr(attn, attribute, None), nn.Module):
            return f"{name} has no {attribute} module"
    heads, head_dim = getattr(attn, "num_heads", None), getattr(attn, "head_dim", None)
    if not isinstance(heads, int) or not isinstance(head_dim, int) or heads < 1 or head_dim < 1:
        return f"{name} has no integer num_heads / head_dim"
    scale = getattr(attn, "scale", None)
    if not isinstance(scale, float) or not math.isclose(scale, head_dim**-0.5, rel_tol=1e-12):
        return f"{name} has scale {scale!r}, not head_dim ** -0.5 = {head_dim**-0.5!r}"
    return None


def _grid_of(net: nn.Module) -> tuple[tuple[int, int], tuple[int, int]] | str:
    """``(grid, patch_size)`` of the model's patch embedding, or why there is none."""
    embed = getattr(net, "patch_embed", None)
    if not isinstance(embed, nn.Module):
        return "the model has no patch_embed"
    if getattr(embed, "dynamic_img_size", False):
        return "the patch embedding has dynamic_img_size (the grid changes with the image)"
    grid, patch = _pair(getattr(embed, "grid_size", None)), _pair(getattr(embed, "patch_size", None))
    if grid is None or patch is None:
        return "the patch embedding has no fixed grid_size and patch_size"
    return grid, patch


def attention_plan(context: FamilyContext) -> tuple[list[AttentionBlock], list[str]]:
    """The blocks the family measures and, for the others with an ``attn``, one line each on why not.

    A point is measured when its module has an ``attn`` passing `attention_refusal` and the model has a fixed patch
    grid; several points on one block module share the first one's measurement. Depends on the model alone, so it is
    the same on every rank.

    Returns:
        ``(blocks, refusals)``: the measured blocks in point order, and ``"<point>: <why>"`` lines.
    """
    blocks: list[AttentionBlock] = []
    refusals: list[str] = []
    grid = _grid_of(context.net)
    class_token = getattr(context.net, "cls_token", None) is not None
    prefix = int(context.num_prefix_tokens)
    seen: set[str] = set()
    names = {id(m): n for n, m in context.net.named_modules()}
    for point in context.points:
        module = context.modules.get(point.name)
        attn = getattr(module, "attn", None)
        if not isinstance(attn, nn.Module) or point.module in seen:
            continue
        seen.add(point.module)
        why = attention_refusal(attn) or (grid if isinstance(grid, str) else None)
        if why is not None:
            refusals.append(f"{point.name}: {why}")
            continue
        assert not isinstance(grid, str)
        (h, w), patch = grid
        blocks.append(
            AttentionBlock(
                point=point.name,
                module=names.get(id(attn), f"{point.module}.attn"),
                num_heads=int(getattr(attn, "num_heads")),  # noqa: B009 (checked by attention_refusal)
                num_tokens=prefix + h * w,
                num_prefix_tokens=prefix,
                class_token=class_token and prefix >= 1,
                grid=(h, w),
                patch_size=patch,
            )
        )
    return blocks, refusals


def _refusal_line(refusals: Sequence[str]) -> str:
    """One line for every skipped block: identical reasons are named once with their blocks."""
    by_reason: dict[str, list[str]] = {}
    for line in refusals:
        point, _, why = line.partition(": ")
        by_reason.setdefault(why, []).append(point)
    parts = [f"{', '.join(points)} ({why})" for why, points in by_reason.items()]
    return "[tgo] observation.attention: not measured at " + "; ".join(parts)


class AttentionState(FamilyState):
    """One rank's attention accumulators during one observation (one per measured block, in point order)."""

    def __init__(self, context: FamilyContext, blocks: Sequence[AttentionBlock]) -> None:
        self.n_images = int(context.n_images)
        self.groups = int(context.groups)
        dtype = context.settings.attention.torch_dtype(context.device)
        self.blocks = {b.point: b for b in blocks}
        self.accumulators = {
            b.point: AttentionAccumulator(
                b.num_heads,
                b.num_tokens,
                b.num_prefix_tokens,
                b.grid,
                b.patch_size,
                self.groups,
                class_token=b.class_token,
                compute_dtype=dtype,
                device=context.device,
            )
            for b in blocks
        }
        self.workspace = Workspace()  # the blocks update one after another: one set of buffers serves them all
        for acc in self.accumulators.values():
            acc.workspace = self.workspace
        self._q: dict[str, torch.Tensor] = {}
        self.maxima = LogitMaxima(list(self.accumulators.values()), context.rank, context.world_size)
        # the weights are the same on every rank, so each computes the same bits
        self.qk_norms: dict[str, np.ndarray] = {}
        for b in blocks:
            attn: Any = context.modules[b.point].attn  # timm's Attention (attention_refusal)
            self.qk_norms[b.point] = qk_spectral_norms(attn.qkv.weight, b.num_heads, float(attn.scale))

    def update(self, key: str, x: torch.Tensor, batch: BatchInfo) -> None:
        point, _, which = key.rpartition(".")
        if which == "q":
            self._q[point] = x
            return
        q = self._q.pop(point, None)
        if q is None:
            raise RuntimeError(f"[tgo] attention at {point}: k_norm fired without q_norm before it in the same forward")
        acc = self.accumulators[point]
        try:
            acc.update(q, x, batch.groups if self.groups else None)
        except ValueError as err:
            raise ValueError(f"[tgo] attention at {point}: {err}") from None

    def summables(self) -> Sequence[Any]:
        return [*self.accumulators.values(), self.maxima]

    def check(self) -> None:
        self.workspace.clear()  # after the pass: the summary, perhaps on a background thread, needs only the sums
        missing = {
            point: acc.n_images + acc.n_nonfinite
            for point, acc in self.accumulators.items()
            if acc.n_images + acc.n_nonfinite != self.n_images
        }
        if missing:
            seen = ", ".join(f"{point} {n}" for point, n in missing.items())
            raise RuntimeError(
                f"[tgo] observation.attention: the q_norm/k_norm hooks saw {seen} of {self.n_images} images (a "
                "forward that bypasses them, e.g. a custom Attention.forward); set observation.attention.enabled=false"
            )

    def summarize_point(self, summary: PointSummary) -> Contribution:
        acc = self.accumulators.get(summary.point.name)
        if acc is None:
            return ()
        summary_ = acc.summary()
        return [
            *attention_contribution(summary_),
            *logit_contribution(acc.logit_max.cpu().numpy(), self.qk_norms[summary.point.name], summary_.n_nonfinite),
        ]


def logit_contribution(group_max: np.ndarray, qk_norms: np.ndarray, n_nonfinite: int) -> list[Metric | Array]:
    """The largest logit (per head, and over heads with its delete-a-group replicates) and the query-key norms."""
    per_head, top, replicates = max_logit_summary(group_max)
    if n_nonfinite > 0:  # as the other metrics: the values would describe only the finite images
        per_head, top, replicates = np.full_like(per_head, np.nan), math.nan, np.full_like(replicates, np.nan)
    stderr = jackknife_stderr(replicates)
    return [
        Metric(ATTENTION_VIEW, "max_attention_logit", top, stderr, replicates if replicates.size >= 2 else None),
        Metric(ATTENTION_VIEW, "qk_spectral_norm", float(np.max(qk_norms))),
        Array(ATTENTION_VIEW, "heads_max_attention_logit", per_head),
        Array(ATTENTION_VIEW, "heads_qk_spectral_norm", np.asarray(qk_norms, dtype=np.float64)),
    ]


def attention_contribution(s: AttentionSummary) -> list[Metric | Array]:
    """The `Metric` and `Array` records of one block's `AttentionSummary` (view ``attention``).

    A block that saw a non-finite ``q`` / ``k`` (dropped images, ``n_nonfinite > 0``) records NaN metrics, as a point
    with non-finite activations does: the values would describe only the finite part.
    """
    nonfinite = s.n_nonfinite > 0
    out: list[Metric | Array] = []
    for name in ATTENTION_METRICS:
        replicates = s.replicates[name] if s.groups >= 2 and not nonfinite else None
        value = math.nan if nonfinite else s.values[name]
        stderr = math.nan if nonfinite else s.stderr[name]
        out.append(Metric(ATTENTION_VIEW, name, value, stderr, replicates))
    out += [Metric(ATTENTION_VIEW, name, s.reference[base]) for name, base in _NOISE.items()]
    for name in HEAD_METRICS:
        heads = np.full_like(s.per_head[name], np.nan) if nonfinite else s.per_head[name]
        out.append(Array(ATTENTION_VIEW, f"heads_{name}", np.asarray(heads, dtype=np.float64)))
    out.append(Array(ATTENTION_VIEW, "similarity", np.asarray(s.similarity, dtype=np.float64)))
    return out


@dataclass(frozen=True)
class AttentionSettings:
    """The attention-geometry family (``tgo.observatory.families.attention``), measured in the same pass.

    Attributes:
        enabled: Recompute every block's attention weights from its ``q`` and ``k`` and record entropy, sink and self
            mass, peak weight, mean attention distance and head diversity per block (view ``attention`` of each
            ``block_NN``; ``docs/observables.md``, "Attention geometry").
        dtype: Precision of the recomputed logits and weights (sums are float64 either way): ``float64`` (exact to
            ~1e-15), ``float32`` (tested within 1e-6 of float64 on every metric, measured <= 4e-8, 1.4e-5 px on the
            distance), or ``auto``: float64 on a GPU, float32 on a CPU, where torch's float64 ``exp`` makes the
            recomputation ~1.7x dearer (``docs/observables.md``, "Precision and cost").
    """

    enabled: bool = True
    dtype: str = "auto"

    def __post_init__(self) -> None:
        check_flags("attention", self, "enabled")
        one_of("attention.dtype", self.dtype, COMPUTE_DTYPES)

    def torch_dtype(self, device: torch.device | str | None) -> torch.dtype:
        """The compute dtype on ``device`` (``auto``: float64 on CUDA and other accelerators, float32 on CPU)."""
        return compute_dtype(self.dtype, device)


class AttentionFamily(MeasurementFamily):
    """Attention geometry of every standard timm ``Attention`` block (``observation.attention``)."""

    name = "attention"
    order = 20
    settings = AttentionSettings
    figure_switch = True  # observation.figures.attention: ~15 cards, ~2.4 s of rendering per observation
    observables = _OBSERVABLES
    panels = (  # on the page, in the Hypotheses section's attention subsection
        *(
            Panel(
                "depth",
                m,
                ATTENTION_VIEW,
                f"{m} ({'max over heads' if m in LOGIT_METRICS else 'head mean'})",
                "attention",
                rows="recorded",
                section="hypotheses",
                overlay=f"{m}_noise" if f"{m}_noise" in ATTENTION_RECORDED else None,
            )
            for m in ATTENTION_CHARTED
        ),
        *(  # the page: the six raw per-head maps, the largest logit and the query-key norm
            Panel(
                "heads",
                m,
                ATTENTION_VIEW,
                switch="attention",
                rows="recorded",
                section="hypotheses",
                page="normalized" not in m and m != "register_mass",
            )
            for m in (*HEAD_METRICS, *LOGIT_METRICS)
        ),
    )

    def hooks(self, context: FamilyContext) -> Sequence[HookSpec]:
        blocks, _ = attention_plan(context)
        specs: list[HookSpec] = []
        for b in blocks:
            specs.append(HookSpec(f"{b.point}.q", f"{b.module}.q_norm", "output", "heads"))
            specs.append(HookSpec(f"{b.point}.k", f"{b.module}.k_norm", "output", "heads"))
        return specs

    def start(self, context: FamilyContext) -> AttentionState:
        blocks, refusals = attention_plan(context)
        if refusals and context.rank == 0:
            warnings.warn(_refusal_line(refusals), RuntimeWarning, stacklevel=2)
        return AttentionState(context, blocks)


ATTENTION = register_family(AttentionFamily())
"""The one instance, registered here (imported by `tgo.observatory.families`)."""


# ----------------------------------------------------------------------------------------------- figures' inputs
def head_tables(
    heads: Mapping[str, Mapping[str, np.ndarray]],
    blocks: Sequence[str],
    metrics: Sequence[str] = (*HEAD_METRICS, *LOGIT_METRICS),
) -> dict[str, np.ndarray]:
    """``{metric: [len(blocks), H_max]}`` per-head tables (NaN padded; `tgo.panels.array_table`) of ``heads`` (point
    -> ``heads_<metric>`` arrays, as one epoch of `tgo.records.load_spectra` gives them); metrics recorded nowhere are
    left out."""
    tables = {m: array_table(heads, blocks, f"heads_{m}") for m in metrics}
    return {m: t for m, t in tables.items() if t is not None}
