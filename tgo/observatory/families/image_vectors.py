"""The image-vector family: one vector per analysis image and point, and everything measured from them.

Behind the views ``cls``, ``prefix``, ``patch``, ``between_image`` and ``within_image`` of every point
(`tgo.observatory.views`) and the hypothesis-probe metrics (``docs/hypotheses.md``): ``between_image_fraction``,
class-conditional geometry and decoding (``fisher_ratio``, ``nc1``, ``*_class_effective_rank``, ``ncc_accuracy``,
``ridge_accuracy``), massive activations and subspace drift. Enabled by ``observation.probes.enabled``; its settings
are ``observation.probes.*`` (`ProbeSettings`).

**State (rank-local, summed exactly).** `ImageTable` holds, per point, float64 ``[n_images, D]`` matrices of the
mean of the point's tokens (for the law of total covariance over images), its CLS token and the mean of its patch
tokens (class-conditional geometry, decoding) in which every rank writes only the rows of its own images, at their
index in the analysis subset, and leaves zeros elsewhere. Summing the tables of all ranks (the second of the
observation's two collectives, packed with the covariance states) therefore *gathers* them exactly: adding zeros is
exact. The same trick gives the per-dimension ``max |x|`` of every rank (row = rank) for the massive-activation
probe, and a per-image visit count that proves every image was seen exactly once (`ImageVectorState.check`).

Memory: ``n_images x D x 8`` bytes per vector kind and point (1,000 images x 384 x 8 = 3 MB; about 120 MB for the
15 points of ViT-S, which has three kinds at 13 points), once on every rank and once in the reduction buffer. A
model with more than one prefix token (registers, a distillation token) also keeps every prefix token of every
image at its sequence points (``prefix`` tokens more vectors per image: 5 with 4 registers, ~15 MB more per point at
1,000 images and D = 384), which the ``patch`` and ``prefix`` views need.

**Summary (rank 0).** Every view's jackknife replicates come from the same image groups, so every view's
observables, ``between_image_fraction`` and the class-conditional geometry have standard errors; the decoding
accuracies have the delete-a-fold jackknife of their cross-validation. Subspace drift and massive activations have
none (a maximum over rows and an eigenbasis of an earlier observation have no group replicates). The functions with a
standard error also return their leave-one-out values (``G`` of them, in group or fold order), which the records keep
so that a report can take paired jackknife standard errors of differences (`tgo.records.load_jackknife`). The
metrics go to the view they describe: ``between_image_fraction``, massive activations and subspace drift on ``all``;
the class-conditional geometry and decoding probes on ``cls`` (CLS vectors) and ``patch`` (each image's mean patch
token). Subspace drift compares with the first and the previous observation *as recorded* (`read_history`), so a
resumed run or a later ``tgo.observe`` compares against what the records hold.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from tgo.panels import Panel
from tgo.records import RunPath, load_subspace_history
from tgo.spectral import Observable, jackknife_groups, jackknife_stderr
from tgo.spectral.jackknife import Moments
from tgo.spectral.probes import (
    ClassLayout,
    FoldLayout,
    class_geometries,
    class_layout,
    cross_validated_accuracy,
    fold_layout,
    massive_activations,
    ncc_accuracy,
    one_thread_blas,
    ridge_accuracy,
    subspace_overlap,
    top_eigenvectors,
)

from ..hooks import num_prefix_tokens_of, point_rows, point_spec, prefix_tokens_of_point
from ..points import ObservationPoint, unwrap_model
from ..settings import PREFIX, ObservationSettingsError, check_flags, is_int, positive_int
from ..views import ViewMoments, point_views
from .base import (
    Array,
    BatchInfo,
    Contribution,
    FamilyContext,
    FamilyState,
    HistorySummary,
    HookSpec,
    MeasurementFamily,
    Metric,
    PointSummary,
    family_metric,
    register_family,
)

__all__ = [
    "IMAGE_VECTORS",
    "ImageTable",
    "ImageVectorFamily",
    "ImageVectorState",
    "ImageVectors",
    "PerImageState",
    "ProbeSettings",
    "Replicates",
    "SubspaceHistory",
    "TokenLayout",
    "VectorLayout",
    "between_image_fraction",
    "class_metrics",
    "drift_metrics",
    "leave_one_fold_out",
    "massive_metrics",
    "token_layouts",
    "vector_layouts",
]


# ----------------------------------------------------------------------------------------------------- state
@dataclass(frozen=True)
class TokenLayout:
    """What the rows a point hands to its accumulator are, per image.

    Attributes:
        tokens: The point's token selection (``all``, ``cls``, ``patch``, ``mean``).
        prefix: Class + register tokens at the start of each image's rows (0 for the patch embedding and for
            selections without prefix tokens).
        class_token: Whether the first prefix token is a class token (a model without one may still have register
            tokens: those are ``prefix`` tokens, never ``cls``).
    """

    tokens: str
    prefix: int = 0
    class_token: bool = True

    @property
    def kinds(self) -> tuple[str, ...]:
        """The per-image vectors this point provides.

        ``mean``: the mean of the image's rows (selections with several rows per image); ``cls``: the class token;
        ``patch``: the mean of the patch tokens; ``prefix``: every prefix token (``[prefix, D]`` per image), only where
        there is more than a class token (registers, a distillation token), so that the ``patch`` view can remove
        all of them and the ``prefix`` view hold them. A selection without prefix tokens (``patch``, or ``all`` at the
        patch embedding) has ``patch`` equal to ``mean``, stored once as ``mean``.
        """
        kinds: list[str] = []
        if self.tokens in ("all", "patch"):
            kinds.append("mean")
        if self.tokens == "cls" or (self.tokens == "all" and self.prefix >= 1 and self.class_token):
            kinds.append("cls")
        if self.tokens == "mean" or (self.tokens == "all" and self.prefix >= 1):
            kinds.append("patch")
        if self.tokens == "all" and (self.prefix > 1 or (self.prefix == 1 and not self.class_token)):
            kinds.append("prefix")
        return tuple(kinds)

    def shape_of(self, kind: str, dim: int) -> tuple[int, ...]:
        """The shape of one image's entry of a kind: ``(prefix, D)`` for ``prefix``, ``(D,)`` otherwise."""
        return (self.prefix, dim) if kind == "prefix" else (dim,)


class ImageVectors:
    """The per-image vectors, per-rank ``max |x|`` and rows-per-image of one point on one rank.

    Args:
        n_images: Size of the analysis subset (rows of every matrix).
        dim: Feature dimension.
        layout: What the point's rows are.
        rank: This rank (its row of ``max_abs`` and ``rows_per_image``).
        world_size: Number of ranks.
        device: Where the matrices live (the accumulators' device, so the collective stays there).
    """

    def __init__(
        self,
        n_images: int,
        dim: int,
        layout: TokenLayout,
        *,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | str | None = None,
    ) -> None:
        self.n_images, self.dim, self.layout = int(n_images), int(dim), layout
        self.rank, self.world_size = int(rank), int(world_size)
        device = torch.device(device) if device is not None else torch.device("cpu")
        with torch.inference_mode(False):
            self.values = {
                k: torch.zeros(self.n_images, *layout.shape_of(k, self.dim), dtype=torch.float64, device=device)
                for k in layout.kinds
            }
            self.max_abs = torch.zeros(self.world_size, self.dim, dtype=torch.float64, device=device)
            self.rows_per_image = torch.zeros(self.world_size, dtype=torch.float64, device=device)
        self.batch_index: torch.Tensor | None = None

    @property
    def packed_size(self) -> int:
        """Length of the flat state: rows per image ``[W]``, ``max |x|`` ``[W, D]``, each kind ``[n_images, D]`` (or
        ``[n_images, prefix, D]``)."""
        return self.world_size * (1 + self.dim) + sum(t.numel() for t in self.values.values())

    def update(self, x: torch.Tensor) -> None:
        """Writes the vectors of the images of one batch at their subset indices (``batch_index``)."""
        index = self.batch_index
        if index is None or index.shape[0] != x.shape[0]:
            raise RuntimeError(
                f"ImageVectors.update: batch_index must hold the subset index of each image of the batch "
                f"({x.shape[0]}); got {None if index is None else tuple(index.shape)}"
            )
        rows = x.detach().flatten(1, -2) if x.dim() > 2 else x.detach()[:, None, :]
        index = index.to(device=self.max_abs.device, dtype=torch.long)
        with torch.inference_mode(False):
            self.rows_per_image[self.rank] = float(rows.shape[1])
            peak = rows.abs().amax(dim=(0, 1)).to(device=self.max_abs.device, dtype=torch.float64)
            self.max_abs[self.rank] = torch.maximum(self.max_abs[self.rank], peak)
            prefix = self.layout.prefix if self.layout.tokens == "all" else 0
            for kind, table in self.values.items():
                if kind == "mean":
                    vec = rows.mean(dim=1, dtype=torch.float64)
                elif kind == "prefix":  # [B, prefix, D]: every prefix token of each image
                    vec = rows[:, :prefix].to(torch.float64)
                elif kind == "cls" or self.layout.tokens == "mean":
                    vec = rows[:, 0].to(torch.float64)
                else:  # patch tokens of a sequence with prefix tokens
                    vec = rows[:, prefix:].mean(dim=1, dtype=torch.float64)
                table.index_copy_(0, index, vec.to(table.device))

    def pack_into(self, out: torch.Tensor) -> None:
        """Writes the flat state into ``out`` (a float64 slice of the observation's reduction buffer)."""
        w, d = self.world_size, self.dim
        out[:w].copy_(self.rows_per_image)
        out[w : w + w * d].view(w, d).copy_(self.max_abs)
        offset = w + w * d
        for table in self.values.values():
            out[offset : offset + table.numel()].view(table.shape).copy_(table)
            offset += table.numel()

    def unpack_(self, flat: torch.Tensor) -> None:
        """Takes the summed state (views of ``flat``, which the reduction owns)."""
        w, d = self.world_size, self.dim
        self.rows_per_image = flat[:w]
        self.max_abs = flat[w : w + w * d].view(w, d)
        offset = w + w * d
        for kind, table in self.values.items():
            self.values[kind] = flat[offset : offset + table.numel()].view(table.shape)
            offset += table.numel()

    # ------------------------------------------------------------------ after the reduction (rank 0)
    @property
    def tokens_per_image(self) -> int:
        """Rows each image contributed (the same on every rank that saw images)."""
        return int(self.rows_per_image.max().item()) if self.rows_per_image.numel() else 0

    def peak_abs(self) -> torch.Tensor:
        """Per-dimension ``max |x|`` over every rank, float64 ``[D]``."""
        return self.max_abs.amax(dim=0)


class ImageTable:
    """Every point's `ImageVectors` plus, per image, its label and how many times a rank streamed it.

    After the reduction ``visits`` must be 1 for every image: 0 means an image was never observed, 2 that two ranks
    (or one, twice) counted it; either would silently bias every observable, so `check_visits` refuses it.
    """

    def __init__(
        self, n_images: int, *, rank: int = 0, world_size: int = 1, device: torch.device | str | None = None
    ) -> None:
        self.n_images, self.rank, self.world_size = int(n_images), int(rank), int(world_size)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        with torch.inference_mode(False):
            self.visits = torch.zeros(self.n_images, dtype=torch.float64, device=self.device)
            self.labels = torch.zeros(self.n_images, dtype=torch.float64, device=self.device)
        self.points: dict[str, ImageVectors] = {}
        self.batch_index: torch.Tensor | None = None
        """Subset indices of the batch being streamed (set by the streaming loop before each forward)."""
        self.order: list[str] = []
        """Point names in the order every rank packs them (the observation's point order)."""

    def add_point(self, name: str, dim: int, layout: TokenLayout) -> ImageVectors:
        """Creates (or returns) the point's vectors."""
        if name not in self.points:
            self.points[name] = ImageVectors(
                self.n_images, dim, layout, rank=self.rank, world_size=self.world_size, device=self.device
            )
        return self.points[name]

    def record_batch(self, index: torch.Tensor, labels: torch.Tensor) -> None:
        """Counts one visit of each image of the batch and stores its label."""
        index = index.to(device=self.device, dtype=torch.long)
        with torch.inference_mode(False):
            self.visits.index_add_(0, index, torch.ones(index.shape[0], dtype=torch.float64, device=self.device))
            self.labels.index_copy_(0, index, labels.to(device=self.device, dtype=torch.float64))

    def _packed_points(self) -> list[ImageVectors]:
        # Hooks fire in forward order and a rank without images creates its vectors afterwards, so the packing order
        # is the explicit point order, identical on every rank.
        missing = [n for n in self.order if n not in self.points]
        if missing or len(self.order) != len(self.points):
            raise RuntimeError(f"ImageTable: points {sorted(self.points)} do not match the point order {self.order}")
        return [self.points[n] for n in self.order]

    @property
    def packed_size(self) -> int:
        return 2 * self.n_images + sum(v.packed_size for v in self._packed_points())

    def pack_into(self, out: torch.Tensor) -> None:
        n = self.n_images
        out[:n].copy_(self.visits)
        out[n : 2 * n].copy_(self.labels)
        offset = 2 * n
        for vectors in self._packed_points():
            vectors.pack_into(out[offset : offset + vectors.packed_size])
            offset += vectors.packed_size

    def unpack_(self, flat: torch.Tensor, *, copy: bool = False) -> None:
        n = self.n_images
        self.visits, self.labels = flat[:n], flat[n : 2 * n]
        offset = 2 * n
        for vectors in self._packed_points():
            vectors.unpack_(flat[offset : offset + vectors.packed_size])
            offset += vectors.packed_size

    def check_visits(self) -> None:
        """Raises unless every image of the subset was streamed exactly once over all ranks."""
        visits = self.visits.detach().cpu()
        wrong = torch.nonzero(visits != 1).reshape(-1)
        if wrong.numel():
            first = [(int(i), int(visits[i].item())) for i in wrong[:5]]
            raise RuntimeError(
                f"observation: {wrong.numel()} of {self.n_images} analysis images were not streamed exactly once "
                f"(index, times): {first}; every image must be observed once over all ranks"
            )


def token_layouts(model: nn.Module, points: Sequence[ObservationPoint]) -> dict[str, TokenLayout]:
    """What each point's rows are per image (prefix tokens, class token), known before any forward: the per-image
    vectors follow it, and so do the views a point will have (a ``prefix`` view only where
    ``"prefix" in layout.kinds``)."""
    net = unwrap_model(model)
    prefix = num_prefix_tokens_of(net)
    class_token = getattr(net, "cls_token", None) is not None
    return {p.name: TokenLayout(p.tokens, _prefix_of(net, p, prefix), class_token) for p in points}


def _prefix_of(net: nn.Module, point: ObservationPoint, prefix: int) -> int:
    """Prefix tokens at the start of the rows the point selects (only ``tokens="all"`` keeps them)."""
    return prefix_tokens_of_point(net, point, prefix) if point.tokens == "all" else 0


# ----------------------------------------------------------------------------------------------------- metrics
@dataclass(frozen=True)
class SubspaceHistory:
    """Per point, ``(leading eigenvectors [D, K], components_90)`` of the ``all`` view at the first and at the
    previous observation (as `drift_metrics` kept them)."""

    init: Mapping[str, tuple[np.ndarray, int]] = field(default_factory=dict)
    prev: Mapping[str, tuple[np.ndarray, int]] = field(default_factory=dict)


Replicates = dict[str, np.ndarray]
"""``{metric: float64 [G] leave-one-out values}``, in group (or fold) order; ``jackknife_stderr`` of each is the
metric's standard error. Only metrics with ``G >= 2`` values have an entry."""


def between_image_fraction(views: Mapping[str, ViewMoments]) -> tuple[float, float, np.ndarray]:
    """``tr(C_between) / (tr(C_between) + tr(C_within))``, its jackknife standard error and leave-one-out values.

    Returns:
        ``(value, stderr, replicates)``: the replicates float64 ``[G]`` (empty without jackknife).
    """
    if "between_image" not in views:
        return math.nan, math.nan, np.empty(0)

    def fraction(b: Moments, w: Moments) -> float:
        tb, tw = float(np.trace(b[0])), float(np.trace(w[0]))
        return tb / (tb + tw) if tb + tw > 0 else math.nan

    b, w = views["between_image"], views["within_image"]
    value = fraction(b.total, w.total)
    replicates = np.array([fraction(x, y) for x, y in zip(b.leave_out, w.leave_out, strict=True)], dtype=np.float64)
    return value, jackknife_stderr(replicates) if replicates.size else math.nan, replicates


def leave_one_fold_out(per_fold: np.ndarray, fold_sizes: np.ndarray) -> np.ndarray:
    """The delete-a-fold values of a pooled cross-validated accuracy (float64 ``[folds]``, fold order).

    The same arithmetic as `tgo.spectral.probes.cross_validated_accuracy`, so ``jackknife_stderr`` of these values is
    its standard error bit for bit: the fraction correct on the images outside fold ``f``,
    ``(sum_h n_h a_h - n_f a_f) / (sum_h n_h - n_f)``.
    """
    acc = np.asarray(per_fold, dtype=np.float64)
    sizes = np.asarray(fold_sizes, dtype=np.float64)
    correct = acc * sizes
    return np.asarray((correct.sum() - correct) / (sizes.sum() - sizes), dtype=np.float64)


@dataclass(frozen=True)
class _ClassPlan:
    """The integer structure `class_metrics` needs for one set of labels, image groups and folds.

    Every point and view of an observation has the same labels and groups, so the summary builds it once
    (`_class_plan`, cached) instead of once per (point, view): the class layout of all images and of each
    leave-one-group-out subset, and the fold layout with its fold sizes.
    """

    layouts: tuple[ClassLayout, ...]  # all images, then each group's leave-out subset in group order
    folds: FoldLayout
    fold_of: np.ndarray
    sizes: np.ndarray


@functools.lru_cache(maxsize=4)
def _cached_plan(labels: bytes, groups_of: bytes | None, groups: int, folds: int) -> _ClassPlan:
    y = np.frombuffer(labels, dtype=np.int64)
    subsets = [None]
    if groups_of is not None:
        image_groups = np.frombuffer(groups_of, dtype=np.int64)
        subsets += [image_groups != g for g in range(groups)]
    fold_of = jackknife_groups(y, folds)
    fold_of.setflags(write=False)
    sizes = np.bincount(fold_of, minlength=folds)[np.unique(fold_of)]
    sizes.setflags(write=False)
    return _ClassPlan(tuple(class_layout(y, rows) for rows in subsets), fold_layout(y, fold_of), fold_of, sizes)


def _class_plan(labels: np.ndarray, image_groups: np.ndarray | None, groups: int, folds: int) -> _ClassPlan:
    """`_ClassPlan` of int64 ``labels`` (leave-one-group-out subsets only with ``image_groups`` and ``groups >= 2``)."""
    jackknifed = image_groups is not None and groups >= 2
    groups_of = np.ascontiguousarray(image_groups, dtype=np.int64).tobytes() if jackknifed else None
    return _cached_plan(np.ascontiguousarray(labels, dtype=np.int64).tobytes(), groups_of, int(groups), int(folds))


def class_metrics(
    x: np.ndarray,
    labels: np.ndarray,
    *,
    image_groups: np.ndarray | None,
    groups: int,
    folds: int,
    ridge_alpha: float,
) -> tuple[dict[str, float], dict[str, float], Replicates]:
    """Class-conditional geometry and held-out decoding of per-image vectors, with standard errors.

    The ``1 + G`` class geometries (all images and each leave-one-group-out subset) are computed together
    (`tgo.spectral.probes.class_geometries`, bit for bit `class_geometry` of each subset) and the decoding probes
    take every fold at once from per-fold sums (`tgo.spectral.probes.ncc_accuracy`, ``ridge_accuracy``); the
    integer structure of the labels, groups and folds is built once per observation (`_class_plan`).

    Returns:
        ``({metric: value}, {metric: stderr}, {metric: leave-one-out values})`` for ``fisher_ratio``, ``nc1``,
        ``between_class_effective_rank``, ``within_class_effective_rank`` (delete-a-group jackknife over the
        observation's ``groups`` image groups) and ``ncc_accuracy``, ``ridge_accuracy`` (``folds``-fold
        class-stratified cross-validation; the standard error is the delete-a-fold jackknife of the pooled accuracy,
        so their leave-one-out values are one per non-empty fold, `leave_one_fold_out`). A metric without a
        jackknife (one group, one fold, or nothing to decode) has no leave-one-out values.
    """
    labels = np.asarray(labels).astype(np.int64)
    names = ("fisher_ratio", "nc1", "between_class_effective_rank", "within_class_effective_rank")
    decoding = ("ncc_accuracy", "ridge_accuracy")
    # Without two classes, or with every image's vector the same (the CLS token before the first block: no image
    # information yet), nothing can be decoded; a tie-broken "accuracy" would read as chance, so it is NaN.
    if np.unique(labels).size < 2 or not np.all(np.isfinite(x)) or not np.any(x != x[:1]):
        nan = dict.fromkeys(names + decoding, math.nan)
        return nan, dict(nan), {}
    x = np.asarray(x, dtype=np.float64)
    plan = _class_plan(labels, image_groups, groups, folds)
    geometries = [
        dict(zip(names, (g.fisher_ratio, g.nc1, g.between_effective_rank, g.within_effective_rank), strict=True))
        for g in class_geometries(x, plan.layouts)
    ]
    values = geometries[0]
    if len(geometries) > 1:
        replicates = {k: np.array([r[k] for r in geometries[1:]], dtype=np.float64) for k in values}
        stderr = {k: jackknife_stderr(replicates[k]) for k in values}
    else:
        replicates, stderr = {}, dict.fromkeys(values, math.nan)
    for name, per_fold in (
        ("ncc_accuracy", ncc_accuracy(x, labels, plan.fold_of, layout=plan.folds)),
        ("ridge_accuracy", ridge_accuracy(x, labels, plan.fold_of, ridge_alpha, layout=plan.folds)),
    ):
        values[name], stderr[name] = cross_validated_accuracy(per_fold, plan.sizes)
        if np.size(per_fold) >= 2:  # cross_validated_accuracy's stderr is NaN below two folds
            replicates[name] = leave_one_fold_out(per_fold, plan.sizes)
    return values, stderr, replicates


def massive_metrics(vectors: ImageVectors | None, covariance: np.ndarray) -> tuple[dict[str, float], np.ndarray]:
    """``massive_activation_ratio``, ``massive_activation_dim``, ``massive_dim_variance_share`` and ``max |x|``."""
    if vectors is None:
        return {}, np.empty(0)
    peak = _numpy(vectors.peak_abs())
    m = massive_activations(peak, np.diag(covariance))
    return {
        "massive_activation_ratio": m.ratio,
        "massive_activation_dim": float(m.dimension) if m.dimension >= 0 else math.nan,
        "massive_dim_variance_share": m.variance_share,
    }, peak


_DRIFT = ("subspace_overlap_prev", "subspace_overlap_init", "subspace_overlap_prev_k90", "subspace_overlap_init_k90")


def drift_metrics(
    point: str,
    covariance: np.ndarray,
    components_90: float,
    history: SubspaceHistory | None,
    k: int,
    n_rows: int | None = None,
) -> tuple[dict[str, float], np.ndarray, int]:
    """Subspace overlaps with the previous and the first observation, and what to keep for the next ones.

    ``subspace_overlap_prev`` / ``_init`` compare the leading ``k`` eigenvectors; the ``_k90`` forms compare the
    leading ``components_90`` of the earlier observation (as many as it needed for 90% of its variance), taking as
    many of this observation's. Kept: the leading ``max(k, components_90)`` eigenvectors of this observation
    (float64 ``[D, K]``) and its ``components_90``.

    The first observation of a point (no earlier record) has ``subspace_overlap_init = 1`` (it *is* the initial
    subspace) and NaN ``_prev``. A comparison of more directions than either covariance has (``k`` above its rank
    ``n_rows - 1``) would compare arbitrary eigenvectors of a zero eigenvalue, so it is NaN. No standard error: a
    leave-one-group-out eigenvector basis of the earlier observation is not recorded.

    Returns:
        ``({metric: value}, eigenvectors to keep, components_90)``.
    """
    nan = dict.fromkeys(_DRIFT, math.nan)
    if not np.all(np.isfinite(covariance)) or not math.isfinite(components_90):
        return nan, np.empty((covariance.shape[0], 0)), 0
    k90 = int(components_90)
    rank = covariance.shape[0] if n_rows is None else min(covariance.shape[0], max(int(n_rows) - 1, 0))
    earlier = {
        "prev": (history.prev if history else {}).get(point),
        "init": (history.init if history else {}).get(point),
    }
    usable = {label: e for label, e in earlier.items() if e is not None and e[0].shape[0] == covariance.shape[0]}
    needed = max([k, k90] + [e[1] for e in usable.values()])
    out = dict(nan)
    if "init" not in earlier or earlier["init"] is None:
        out["subspace_overlap_init"] = 1.0 if k <= rank else math.nan
        out["subspace_overlap_init_k90"] = 1.0 if 0 < k90 <= rank else math.nan
    # Rank 0 runs this after the summary's pool, where numpy's BLAS has its own threads again: on one thread, as in
    # the pool (the same bits; a [D, D] eigh or a [k, D] x [D, k] product is far slower on contended threads).
    with one_thread_blas():
        vectors = top_eigenvectors(covariance, needed)
        for label, (earlier_vectors, earlier_k90) in usable.items():
            if earlier_vectors.shape[1] >= k and k <= rank:
                out[f"subspace_overlap_{label}"] = subspace_overlap(earlier_vectors, vectors, k)
            if 0 < earlier_k90 <= min(earlier_vectors.shape[1], rank):
                out[f"subspace_overlap_{label}_k90"] = subspace_overlap(earlier_vectors, vectors, earlier_k90)
    return out, np.ascontiguousarray(vectors[:, : max(k, k90)]), k90


def _numpy(t: object) -> np.ndarray:
    return np.asarray(t.detach().cpu().numpy() if hasattr(t, "detach") else t, dtype=np.float64)


@dataclass(frozen=True)
class VectorLayout(TokenLayout):
    """A `TokenLayout` keeping only the vectors behind the ``cls`` and ``patch`` views (the families that read one
    vector per image and point but no within-image statistics: intrinsic dimension, SVCCA, class centroids)."""

    @property
    def kinds(self) -> tuple[str, ...]:
        kinds = super().kinds
        return tuple(k for k in kinds if k in ("cls", "patch") or (k == "mean" and "patch" not in kinds))


def vector_layouts(context: FamilyContext) -> dict[str, VectorLayout]:
    """`VectorLayout` of every point of the observation."""
    return {
        name: VectorLayout(layout.tokens, layout.prefix, layout.class_token)
        for name, layout in token_layouts(context.net, context.points).items()
    }


# ----------------------------------------------------------------------------------------------------- the family
class PerImageState(FamilyState):
    """One rank's `ImageTable` during one observation (every point's per-image vectors, labels, visits): the stream
    half of a family that reads one vector per image and point (this family; `intrinsic_dimension`, with its own
    ``layouts``)."""

    def __init__(self, context: FamilyContext, layouts: Mapping[str, Any] | None = None) -> None:
        self.points = {p.name: p for p in context.points}
        self.layouts = token_layouts(context.net, context.points) if layouts is None else dict(layouts)
        self.prefix = {p.name: context.prefix_of(p) for p in context.points}
        self.table = ImageTable(
            context.n_images, rank=context.rank, world_size=context.world_size, device=context.device
        )
        self.table.order = [p.name for p in context.points]

    def begin_batch(self, batch: BatchInfo) -> None:
        self.table.record_batch(batch.index, batch.labels)
        self.table.batch_index = batch.index

    def update(self, key: str, x: torch.Tensor, batch: BatchInfo) -> None:
        rows = point_rows(x, self.points[key], self.prefix[key])
        vectors = self.table.add_point(key, int(rows.shape[-1]), self.layouts[key])
        vectors.batch_index = batch.index
        vectors.update(rows)

    def end_stream(self, dims: Mapping[str, int]) -> None:
        for name in self.table.order:  # a rank without images creates its (zero) vectors now, in point order
            self.table.add_point(name, int(dims[name]), self.layouts[name])

    def summables(self) -> Sequence[Any]:
        return [self.table]

    def check(self) -> None:
        self.table.check_visits()


class ImageVectorState(PerImageState):
    """`PerImageState` with the views and probes of the image-vector family."""

    def __init__(self, context: FamilyContext) -> None:
        super().__init__(context)
        self.probes = context.settings.probes

    def views(
        self,
        point: ObservationPoint,
        all_view: ViewMoments,
        group_moments: Sequence[Moments],
        image_groups: np.ndarray | None,
    ) -> Mapping[str, ViewMoments]:
        views = point_views(all_view, group_moments, self.table.points.get(point.name), image_groups=image_groups)
        return {view: moments for view, moments in views.items() if view != "all"}

    def summarize_point(self, summary: PointSummary) -> Contribution:
        vectors = self.table.points[summary.point.name]
        whole = summary.results["all"]
        out: list[Metric | Array] = []
        fraction, fraction_se, fraction_replicates = between_image_fraction(summary.views)
        out.append(
            Metric(
                "all",
                "between_image_fraction",
                fraction,
                fraction_se,
                fraction_replicates if fraction_replicates.size >= 2 else None,
            )
        )
        massive, peak = massive_metrics(vectors, whole.covariance)
        out += [Metric("all", metric, value) for metric, value in massive.items()]
        out.append(Array("all", "max_abs", peak))
        labels = self.table.labels.detach().cpu().numpy().astype(np.int64)
        for view, kind in (("cls", "cls"), ("patch", "patch" if "patch" in vectors.values else "mean")):
            if view not in summary.results or kind not in vectors.values:
                continue
            x = vectors.values[kind].detach().cpu().numpy().astype(np.float64, copy=False)
            values, stderr, replicates = class_metrics(
                x,
                labels,
                image_groups=summary.image_groups if summary.groups else None,
                groups=summary.groups,
                folds=self.probes.folds,
                ridge_alpha=self.probes.ridge_alpha,
            )
            out += [Metric(view, m, v, stderr[m], replicates.get(m)) for m, v in values.items()]
            out += [Array(view, "vectors", x.astype(np.float32), kept=True), Array(view, "labels", labels, kept=True)]
        return out

    def relate_history(self, summary: HistorySummary) -> Contribution:
        """Subspace drift against the first and the previous recorded observation (`drift_metrics`), on rank 0."""
        whole = summary.results["all"]
        drift, kept, k90 = drift_metrics(
            summary.point.name,
            whole.covariance,
            whole.observables.get("components_90", math.nan),
            summary.history,
            self.probes.subspace_k,
            whole.n_rows,
        )
        out: list[Metric | Array] = [Metric("all", metric, value) for metric, value in drift.items()]
        out += [Array("all", "eigenvectors", kept), Array("all", "components_90", np.asarray(k90, dtype=np.int64))]
        return out


_CLASS_VIEWS = ("cls", "patch")


def _probe(name: str, formula: str, views: tuple[str, ...] = ("all",), **options: Any) -> Observable:
    return family_metric(name, formula, views, doc="docs/hypotheses.md", **options)


@dataclass(frozen=True)
class ProbeSettings:
    """The hypothesis probes (``docs/hypotheses.md``), measured in the same pass as the spectra.

    Attributes:
        enabled: Record the views ``cls``, ``patch``, ``between_image`` and ``within_image`` of every point, the
            class-conditional geometry and decoding probes, subspace drift and massive activations, and keep the
            per-image vectors at the epochs that keep covariances. ``false`` records the ``all`` view only.
        subspace_k: Leading eigenvectors compared by ``subspace_overlap_prev`` / ``_init`` (the ``_k90`` forms use
            the earlier observation's ``components_90``).
        ridge_alpha: Strength of the ridge probe, in units of the mean per-dimension scatter of the training fold.
        folds: Class-stratified cross-validation folds of the nearest-class-centre and ridge probes (at least 2).
    """

    enabled: bool = True
    subspace_k: int = 10
    ridge_alpha: float = 1.0
    folds: int = 10

    def __post_init__(self) -> None:
        check_flags("probes", self, "enabled")
        positive_int("probes.subspace_k", self.subspace_k)
        alpha = self.ridge_alpha
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
            raise ObservationSettingsError(f"{PREFIX}.probes.ridge_alpha: expected a number > 0, got {alpha!r}")
        object.__setattr__(self, "ridge_alpha", float(alpha))
        if not is_int(self.folds) or self.folds < 2:
            raise ObservationSettingsError(f"{PREFIX}.probes.folds: expected an integer >= 2, got {self.folds!r}")


class ImageVectorFamily(MeasurementFamily):
    """The per-image vectors of every point: views, class geometry, decoding, massive activations, subspace drift."""

    name = "image_vectors"
    order = 10
    settings = ProbeSettings
    section = "probes"
    observables = (  # in record order
        _probe("between_image_fraction", "tr C_between / (tr C_between + tr C_within) (law of total covariance)"),
        _probe("fisher_ratio", "tr S_B / tr S_W of the per-image vectors", _CLASS_VIEWS, scale="log"),
        _probe("nc1", "tr(Sigma_W Sigma_B^+) / C (Papyan et al. 2020)", _CLASS_VIEWS, scale="log"),
        _probe("between_class_effective_rank", "effective rank of S_B (at most C - 1)", _CLASS_VIEWS, spread="rises"),
        _probe("within_class_effective_rank", "effective rank of S_W", _CLASS_VIEWS, spread="rises"),
        _probe("ncc_accuracy", "held-out nearest-class-centre accuracy (class-stratified folds)", _CLASS_VIEWS),
        _probe("ridge_accuracy", "held-out closed-form ridge probe accuracy (class-stratified folds)", _CLASS_VIEWS),
        _probe("subspace_overlap_prev", "mean cos^2 of principal angles, top-k eigenspaces, previous observation"),
        _probe("subspace_overlap_init", "mean cos^2 of principal angles, top-k eigenspaces, first observation"),
        _probe(
            "subspace_overlap_prev_k90",
            "as subspace_overlap_prev with k = components_90 of the previous",
            charted=False,
        ),
        _probe(
            "subspace_overlap_init_k90", "as subspace_overlap_init with k = components_90 of the first", charted=False
        ),
        _probe("massive_activation_ratio", "max_d M_d / median_d M_d, M_d = max |x_d| over every row", scale="log"),
        _probe("massive_activation_dim", "argmax_d M_d (the dimension of that ratio)", charted=False),
        _probe("massive_dim_variance_share", "C_dd / tr C for that dimension", charted=False),
    )
    panels = (  # TensorBoard's depth profiles of the probes
        Panel("depth", "between_image_fraction", switch="depth_profiles", page=False),
        *(
            Panel("depth", m, "cls", title=f"{m} (cls)", switch="depth_profiles", page=False)
            for m in ("ncc_accuracy", "ridge_accuracy", "fisher_ratio", "nc1")
        ),
    )

    def hooks(self, context: FamilyContext) -> Sequence[HookSpec]:
        return [point_spec(p) for p in context.points]

    def start(self, context: FamilyContext) -> ImageVectorState:
        return ImageVectorState(context)

    def read_history(self, run_dir: RunPath, epoch: int) -> SubspaceHistory:
        init, prev = load_subspace_history(run_dir, epoch)
        return SubspaceHistory(init=init, prev=prev)


IMAGE_VECTORS = register_family(ImageVectorFamily())
"""The one instance, registered here (imported by `tgo.observatory.families`)."""
