"""Rank 0: the views of every point and the hypothesis-probe metrics, from the reduced sums and per-image vectors.

A *view* is one covariance derived from what a point streamed (``tgo.observatory.results``). With the probes on,
each point gets, where its rows allow:

* ``all``: every row the point selects (the paper's covariance);
* ``cls``: the CLS token of each image (one row per image; the covariance of the per-image CLS vectors);
* ``prefix``: every prefix token of each image (class, register and distillation tokens; ``prefix`` rows per
  image), only at points of a model with more than one prefix token, or with registers and no class token (with
  the class token alone it is ``cls``);
* ``patch``: the patch tokens, ``all`` minus every prefix row (the CLS rows, or the ``prefix`` rows where there are
  more; `tgo.spectral.jackknife.remove`; the same as ``all`` where the point has no prefix token);
* ``between_image`` / ``within_image``: the law of total covariance over images. With ``N`` rows, ``n`` images of
  ``T`` rows each, image means ``m_i`` and the pooled mean ``m``::

      (N - 1)/N C_all = C_between + C_within
      C_between = 1/n sum_i (m_i - m)(m_i - m)^T          (token-weighted covariance of the image means)
      C_within  = 1/N sum_i sum_t (x_it - m_i)(x_it - m_i)^T  (the average per-image token covariance)

  recorded with ``n_rows`` = degrees of freedom + 1 (``n`` and ``N - n + 1``), which is what their structural rank
  and their noise baselines need.

Every view is summarised by the catalogue, and every view's jackknife replicates come from the same image groups,
so every view's observables, ``between_image_fraction`` and the class-conditional geometry have standard errors; the
decoding accuracies have the delete-a-fold jackknife of their cross-validation. Subspace drift and massive
activations have none (a maximum over rows and an eigenbasis of an earlier observation have no group replicates).
The functions with a standard error also return its leave-one-out values (``G`` of them, in group or fold order),
which the records keep so that a report can take paired jackknife standard errors of differences
(`tgo.records.load_jackknife`).
Probe metrics (catalogue entries of scope ``probe``) are added to the view they describe:
``between_image_fraction``, massive activations and subspace drift on ``all``; the class-conditional geometry
and decoding probes on ``cls`` (CLS vectors) and ``patch`` (each image's mean patch token).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tgo.spectral import jackknife_groups, jackknife_stderr
from tgo.spectral.jackknife import Moments, leave_one_group_out, remove, row_moments
from tgo.spectral.probes import (
    class_geometry,
    cross_validated_accuracy,
    massive_activations,
    ncc_accuracy,
    ridge_accuracy,
    subspace_overlap,
    top_eigenvectors,
)

from .images import ImageVectors

__all__ = [
    "VIEWS",
    "Replicates",
    "SubspaceHistory",
    "ViewMoments",
    "between_image_fraction",
    "class_metrics",
    "drift_metrics",
    "leave_one_fold_out",
    "massive_metrics",
    "point_views",
]

VIEWS: tuple[str, ...] = ("all", "cls", "prefix", "patch", "between_image", "within_image")
"""Every view a point can have, in record order (``prefix`` only with more than one prefix token)."""


@dataclass
class ViewMoments:
    """One view's moments: all images, and each leave-one-group-out subset (empty without jackknife)."""

    total: Moments
    leave_out: list[Moments] = field(default_factory=list)
    alias_of: str | None = None
    """The view whose covariance this one is (its spectrum and observables are reused, not recomputed)."""


@dataclass(frozen=True)
class SubspaceHistory:
    """Per point, ``(leading eigenvectors [D, K], components_90)`` of the ``all`` view at the first and at the
    previous observation (as `drift_metrics` kept them)."""

    init: Mapping[str, tuple[np.ndarray, int]] = field(default_factory=dict)
    prev: Mapping[str, tuple[np.ndarray, int]] = field(default_factory=dict)


def _grouped(x: np.ndarray, image_groups: np.ndarray | None, groups: int) -> tuple[Moments, list[Moments]]:
    """Moments of the rows of ``x`` and of each group's rows (none without jackknife)."""
    total = row_moments(x)
    if image_groups is None or groups < 2:
        return total, []
    return total, [row_moments(x[image_groups == g]) for g in range(groups)]


def _population(m: Moments) -> np.ndarray:
    """``M2 / n`` from unbiased moments (NaN below 2 rows)."""
    cov, _, n, _ = m
    return cov * (n - 1) / n if n >= 2 else np.full_like(cov, np.nan)


def _law_of_total_covariance(all_rows: Moments, image_means: Moments, rows_per_image: int) -> tuple[Moments, Moments]:
    """``(between, within)`` moments of a set of images from its pooled-row and image-mean moments."""
    cov_all, mean, n_rows, nonfinite = all_rows
    n_images = image_means[2]
    between = _population(image_means)
    total = cov_all * (n_rows - 1) / n_rows if n_rows >= 2 else np.full_like(cov_all, np.nan)
    within = total - between
    within = (within + within.T) / 2
    return (between, mean, n_images, 0), (within, mean, n_rows - n_images + 1, nonfinite)


def point_views(
    all_total: Moments,
    all_groups: Sequence[Moments],
    vectors: ImageVectors | None,
    *,
    image_groups: np.ndarray | None,
) -> dict[str, ViewMoments]:
    """The moments of every view a point has (only ``all`` without per-image vectors).

    Args:
        all_total: Moments of every row of the point.
        all_groups: Moments of each jackknife group's rows (empty without jackknife).
        vectors: The point's gathered per-image vectors, or ``None`` (probes off).
        image_groups: Jackknife group of every analysis image (``None`` without jackknife).
    """
    groups = len(all_groups)
    views = {"all": ViewMoments(all_total, leave_one_group_out(all_total, all_groups) if groups else [])}
    if vectors is None:
        return views
    layout, per_image = vectors.layout, vectors.tokens_per_image
    if layout.tokens == "cls":  # the point's rows are the CLS vectors: the same covariance, not recomputed
        views["cls"] = ViewMoments(all_total, views["all"].leave_out, alias_of="all")
    elif per_image > layout.prefix:
        if "cls" in vectors.values:
            cls_total, cls_groups = _grouped(_numpy(vectors.values["cls"]), image_groups, groups)
            views["cls"] = ViewMoments(cls_total, leave_one_group_out(cls_total, cls_groups) if groups else [])
            if layout.prefix == 1:
                patch_total = remove(all_total, cls_total)
                patch_groups = [remove(a, c) for a, c in zip(all_groups, cls_groups, strict=True)]
                views["patch"] = ViewMoments(
                    patch_total, leave_one_group_out(patch_total, patch_groups) if groups else []
                )
        if "prefix" in vectors.values:  # registers / a distillation token: every prefix row leaves the patch view
            rows = _numpy(vectors.values["prefix"])  # [n_images, prefix, D]
            per_row = None if image_groups is None else np.repeat(np.asarray(image_groups), rows.shape[1])
            prefix_total, prefix_groups = _grouped(rows.reshape(-1, rows.shape[-1]), per_row, groups)
            views["prefix"] = ViewMoments(
                prefix_total, leave_one_group_out(prefix_total, prefix_groups) if groups else []
            )
            patch_total = remove(all_total, prefix_total)
            patch_groups = [remove(a, p) for a, p in zip(all_groups, prefix_groups, strict=True)]
            views["patch"] = ViewMoments(patch_total, leave_one_group_out(patch_total, patch_groups) if groups else [])
    if "patch" not in views and (layout.tokens in ("patch", "mean") or (layout.tokens == "all" and not layout.prefix)):
        views["patch"] = ViewMoments(all_total, views["all"].leave_out, alias_of="all")
    if "mean" in vectors.values and per_image > 1:
        means_total, means_groups = _grouped(_numpy(vectors.values["mean"]), image_groups, groups)
        between, within = _law_of_total_covariance(all_total, means_total, per_image)
        views["between_image"], views["within_image"] = ViewMoments(between), ViewMoments(within)
        if groups:
            means_out = leave_one_group_out(means_total, means_groups)
            for a, m in zip(views["all"].leave_out, means_out, strict=True):
                b, w = _law_of_total_covariance(a, m, per_image)
                views["between_image"].leave_out.append(b)
                views["within_image"].leave_out.append(w)
    return {v: views[v] for v in VIEWS if v in views}


def _numpy(t: object) -> np.ndarray:
    return np.asarray(t.detach().cpu().numpy() if hasattr(t, "detach") else t, dtype=np.float64)


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


def _jackknifed(
    compute: Callable[[np.ndarray], dict[str, float]], image_groups: np.ndarray | None, groups: int, n_images: int
) -> tuple[dict[str, float], dict[str, float], Replicates]:
    """Values on every image, delete-a-group standard errors and leave-one-out values of a function of an image
    subset (a mask)."""
    values = compute(np.ones(n_images, dtype=bool))
    if image_groups is None or groups < 2:
        return values, dict.fromkeys(values, math.nan), {}
    subsets = [compute(image_groups != g) for g in range(groups)]
    replicates = {k: np.array([r[k] for r in subsets], dtype=np.float64) for k in values}
    return values, {k: jackknife_stderr(replicates[k]) for k in values}, replicates


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

    def geometry(mask: np.ndarray) -> dict[str, float]:
        g = class_geometry(x[mask], labels[mask])
        return dict(zip(names, (g.fisher_ratio, g.nc1, g.between_effective_rank, g.within_effective_rank), strict=True))

    values, stderr, replicates = _jackknifed(geometry, image_groups, groups, x.shape[0])
    fold_of = jackknife_groups(labels, folds)
    sizes = np.bincount(fold_of, minlength=folds)[np.unique(fold_of)]
    for name, per_fold in (
        ("ncc_accuracy", ncc_accuracy(x, labels, fold_of)),
        ("ridge_accuracy", ridge_accuracy(x, labels, fold_of, ridge_alpha)),
    ):
        values[name], stderr[name] = cross_validated_accuracy(per_fold, sizes)
        if np.size(per_fold) >= 2:  # cross_validated_accuracy's stderr is NaN below two folds
            replicates[name] = leave_one_fold_out(per_fold, sizes)
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
    vectors = top_eigenvectors(covariance, needed)
    out = dict(nan)
    if "init" not in earlier or earlier["init"] is None:
        out["subspace_overlap_init"] = 1.0 if k <= rank else math.nan
        out["subspace_overlap_init_k90"] = 1.0 if 0 < k90 <= rank else math.nan
    for label, (earlier_vectors, earlier_k90) in usable.items():
        if earlier_vectors.shape[1] >= k and k <= rank:
            out[f"subspace_overlap_{label}"] = subspace_overlap(earlier_vectors, vectors, k)
        if 0 < earlier_k90 <= min(earlier_vectors.shape[1], rank):
            out[f"subspace_overlap_{label}_k90"] = subspace_overlap(earlier_vectors, vectors, earlier_k90)
    return out, np.ascontiguousarray(vectors[:, : max(k, k90)]), k90
