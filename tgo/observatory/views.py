"""Rank 0: the views of every point, from the reduced sums and the per-image vectors.

A view is one covariance derived from what a point streamed: ``all``, ``cls``, ``prefix``, ``patch`` (``all`` minus
the prefix rows) and ``between_image`` / ``within_image``, the law of total covariance over images::

(N - 1)/N C_all = C_between + C_within

recorded with ``n_rows`` = degrees of freedom + 1, which their structural rank and noise baselines need. Every view's
jackknife replicates come from the same image groups. Defined in docs/hypotheses.md section 3."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tgo.records import VIEWS
from tgo.spectral.jackknife import Moments, leave_one_group_out, remove, row_moments, subset_masks

__all__ = ["VIEWS", "ViewMoments", "ViewRows", "all_view", "order_views", "point_views"]


@dataclass(frozen=True)
class ViewRows:
    """The rows a view's covariances are made of, where it has one row per image (``cls``, ``between_image``):
    ``values`` ``[n, D]``, the boolean ``subsets`` in the order of the view's moments (all images, then each
    leave-one-group-out set) and ``ddof`` (1: unbiased, 0: population). With fewer images than features the spectra
    come from the ``[n, n]`` products (`tgo.spectral.decomposition.row_subset_spectra`)."""

    values: np.ndarray
    subsets: list[np.ndarray]
    ddof: int


@dataclass
class ViewMoments:
    """One view's moments: all images, and each leave-one-group-out subset (empty without jackknife)."""

    total: Moments
    leave_out: list[Moments] = field(default_factory=list)
    alias_of: str | None = None  # the view whose covariance this one is (its summary is reused, not recomputed)
    rows: ViewRows | None = None  # its rows, when it has one per image (a cheaper route to its spectra)


def _grouped(x: np.ndarray, image_groups: np.ndarray | None, groups: int) -> tuple[Moments, list[Moments]]:
    """Moments of the rows of ``x`` and of each group's rows (none without jackknife)."""
    total = row_moments(x)
    if image_groups is None or groups < 2:
        return total, []
    return total, [row_moments(x[image_groups == g]) for g in range(groups)]


def _rows(x: np.ndarray, image_groups: np.ndarray | None, groups: int, *, ddof: int) -> ViewRows:
    """`ViewRows` of one row per image, its subsets as `_grouped` and `leave_one_group_out` order the moments."""
    image_groups = image_groups if groups >= 2 else None
    return ViewRows(x, subset_masks(image_groups, groups, x.shape[0]), ddof)


def _population(m: Moments) -> np.ndarray:
    """``M2 / n`` from unbiased moments (NaN below 2 rows)."""
    cov, _, n, _ = m
    if n < 2:
        return np.full_like(cov, np.nan)
    out = cov * (n - 1)
    out /= n
    return out


def _law_of_total_covariance(all_rows: Moments, image_means: Moments, rows_per_image: int) -> tuple[Moments, Moments]:
    """``(between, within)`` moments of a set of images from its pooled-row and image-mean moments."""
    _, mean, n_rows, nonfinite = all_rows
    n_images = image_means[2]
    between = _population(image_means)
    within = _population(all_rows)  # the pooled rows' M2 / N, less the between part, symmetrised
    within -= between
    within = within + within.T
    within /= 2
    return (between, mean, n_images, 0), (within, mean, n_rows - n_images + 1, nonfinite)


def _view(total: Moments, parts: Sequence[Moments], groups: int) -> ViewMoments:
    return ViewMoments(total, leave_one_group_out(total, parts) if groups else [])


def all_view(total: Moments, groups: Sequence[Moments]) -> ViewMoments:
    """The ``all`` view: every row, and each leave-one-group-out merge (none without jackknife)."""
    return ViewMoments(total, leave_one_group_out(total, groups) if groups else [])


def order_views(views: dict[str, ViewMoments]) -> dict[str, ViewMoments]:
    """``views`` in record order: `VIEWS` first, in its order, then any other view in the order given."""
    return {**{v: views[v] for v in VIEWS if v in views}, **{v: m for v, m in views.items() if v not in VIEWS}}


def point_views(
    all_moments: ViewMoments,
    all_groups: Sequence[Moments],
    vectors: Any,
    *,
    image_groups: np.ndarray | None,
) -> dict[str, ViewMoments]:
    """The moments of every view a point has (only ``all`` without the per-image ``vectors`` a family gathers)."""
    groups = len(all_groups)
    all_total = all_moments.total
    views = {"all": all_moments}
    if vectors is None:
        return views
    layout, per_image = vectors.layout, vectors.tokens_per_image
    if layout.tokens == "cls":  # the point's rows are the CLS vectors: the same covariance, not recomputed
        views["cls"] = ViewMoments(all_total, views["all"].leave_out, alias_of="all")
    elif per_image > layout.prefix:
        if "cls" in vectors.values:
            cls_rows = _numpy(vectors.values["cls"])
            cls_total, cls_groups = _grouped(cls_rows, image_groups, groups)
            views["cls"] = _view(cls_total, cls_groups, groups)
            views["cls"].rows = _rows(cls_rows, image_groups, groups, ddof=1)
            if layout.prefix == 1:
                patch_total = remove(all_total, cls_total)
                patch_groups = [remove(a, c) for a, c in zip(all_groups, cls_groups, strict=True)]
                views["patch"] = _view(patch_total, patch_groups, groups)
        if "prefix" in vectors.values:  # registers / a distillation token: every prefix row leaves the patch view
            rows = _numpy(vectors.values["prefix"])  # [n_images, prefix, D]
            per_row = None if image_groups is None else np.repeat(np.asarray(image_groups), rows.shape[1])
            prefix_total, prefix_groups = _grouped(rows.reshape(-1, rows.shape[-1]), per_row, groups)
            views["prefix"] = _view(prefix_total, prefix_groups, groups)
            patch_total = remove(all_total, prefix_total)
            patch_groups = [remove(a, p) for a, p in zip(all_groups, prefix_groups, strict=True)]
            views["patch"] = _view(patch_total, patch_groups, groups)
    if "patch" not in views and (layout.tokens in ("patch", "mean") or (layout.tokens == "all" and not layout.prefix)):
        views["patch"] = ViewMoments(all_total, views["all"].leave_out, alias_of="all")
    if "mean" in vectors.values and per_image > 1:
        means = _numpy(vectors.values["mean"])
        means_total, means_groups = _grouped(means, image_groups, groups)
        between, within = _law_of_total_covariance(all_total, means_total, per_image)
        views["between_image"] = ViewMoments(between, rows=_rows(means, image_groups, groups, ddof=0))
        views["within_image"] = ViewMoments(within)
        if groups:
            means_out = leave_one_group_out(means_total, means_groups)
            for a, m in zip(views["all"].leave_out, means_out, strict=True):
                b, w = _law_of_total_covariance(a, m, per_image)
                views["between_image"].leave_out.append(b)
                views["within_image"].leave_out.append(w)
    return {v: views[v] for v in VIEWS if v in views}


def _numpy(t: object) -> np.ndarray:
    return np.asarray(t.detach().cpu().numpy() if hasattr(t, "detach") else t, dtype=np.float64)
