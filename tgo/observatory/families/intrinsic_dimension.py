"""The intrinsic-dimension family: TwoNN of the per-image vectors per point and view, and per class.

Issue 36 rows II (TwoNN per point) and III (TwoNN and the local PCA rank per class), measured on the per-image
vectors behind the ``cls`` view (each image's class token) and the ``patch`` view (each image's mean patch token;
the mean of its rows where a point has no prefix token), the vectors the image-vector family's class probes use.

**State.** The family keeps its own `ImageTable` of those two vectors per point (the image-vector family's table,
without its ``mean`` and ``prefix`` kinds): every rank writes its images' rows at their subset index and leaves
zeros elsewhere, so the sum over ranks in the observation's second collective gathers them exactly, and every rank
summarises identical float64 inputs (1 vs W ranks: the same bits). Memory: ``2 x n_images x D x 8`` bytes per point
(6 MB at 1,000 images, D = 384), once more in the reduction buffer.

**Summary.** Per (point, view), from `tgo.spectral.intrinsic_dimension` (numerics, estimators and references:
``docs/observables.md``, "Intrinsic dimension"): ``intrinsic_dimension`` (TwoNN; ``observation.intrinsic_dimension.
fit``), ``intrinsic_dimension_duplicates`` (images left out for a zero first-neighbour distance),
``class_intrinsic_dimension`` and ``class_pca_rank`` (means over the classes with at least ``min_class_images``
images in every jackknife subset; ``intrinsic_dimension_classes`` of them). Standard errors: the delete-a-group
jackknife, every value recomputed on the images outside the group (neighbours searched among those images), the
classes entering a class mean the same in every replicate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tgo.panels import Panel
from tgo.spectral import Observable
from tgo.spectral.intrinsic_dimension import FITS, pca_rank, twonn
from tgo.spectral.jackknife import subset_masks, with_jackknife

from ..hooks import point_spec
from ..settings import PREFIX, ObservationSettingsError, check_flags, is_int, one_of
from .base import (
    Contribution,
    FamilyContext,
    HookSpec,
    MeasurementFamily,
    Metric,
    PointSummary,
    family_metric,
    register_family,
)
from .image_vectors import PerImageState, vector_layouts

__all__ = [
    "INTRINSIC_DIMENSION",
    "IntrinsicDimensionFamily",
    "IntrinsicDimensionSettings",
    "IntrinsicDimensionState",
    "intrinsic_dimension_metrics",
]

_DOC = "docs/observables.md#13-intrinsic-dimension"
_VIEWS = ("cls", "patch")


def _metric(name: str, formula: str, **options: Any) -> Observable:
    return family_metric(name, formula, _VIEWS, doc=_DOC, **options)


@dataclass(frozen=True)
class IntrinsicDimensionSettings:
    """``observation.intrinsic_dimension``: TwoNN and the local PCA rank of the per-image vectors.

    Attributes:
        enabled: Record ``intrinsic_dimension``, ``class_intrinsic_dimension`` and ``class_pca_rank`` on the ``cls``
            and ``patch`` views of every point (``docs/observables.md``, "Intrinsic dimension").
        fit: The TwoNN estimator: ``linear`` (Facco et al. 2017: the line through the origin, largest
            ``discard_fraction`` of the ratios left out), ``mle`` (its maximum-likelihood slope) or ``tgo_ii`` (the
            TGO-II/-III authors': standardised features, a line with intercept on the central 10-90 %).
        discard_fraction: Largest ratios ``r2 / r1`` left out of the ``linear`` and ``mle`` fits (the paper's 0.1).
        min_class_images: A class enters the class means when every jackknife subset holds at least this many of
            its images (TwoNN needs 3).
        class_variance: Fraction of a class's variance its ``class_pca_rank`` components explain (TGO-III: 0.95).
    """

    enabled: bool = False
    fit: str = "linear"
    discard_fraction: float = 0.1
    min_class_images: int = 5
    class_variance: float = 0.95

    def __post_init__(self) -> None:
        key = f"{PREFIX}.intrinsic_dimension"
        check_flags("intrinsic_dimension", self, "enabled")
        one_of("intrinsic_dimension.fit", self.fit, FITS)
        for name, low_open in (("discard_fraction", False), ("class_variance", True)):
            value = getattr(self, name)
            inside = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not inside or not (0 < value <= 1 if low_open else 0 <= value < 1):
                interval = "(0, 1]" if low_open else "[0, 1)"
                raise ObservationSettingsError(f"{key}.{name}: expected a number in {interval}, got {value!r}")
            object.__setattr__(self, name, float(value))
        if not is_int(self.min_class_images) or self.min_class_images < 3:
            raise ObservationSettingsError(
                f"{key}.min_class_images: expected an integer >= 3, got {self.min_class_images!r}"
            )


def intrinsic_dimension_metrics(
    x: np.ndarray,
    labels: np.ndarray,
    image_groups: np.ndarray | None,
    groups: int,
    settings: IntrinsicDimensionSettings,
) -> list[tuple[str, float, float, np.ndarray | None]]:
    """The family's metrics of one (point, view): ``(name, value, stderr, replicates)`` in record order.

    Args:
        x: float64 ``[N, D]`` per-image vectors.
        labels: ``[N]`` class labels (``-1``: none; such images enter no class).
        image_groups: Each image's jackknife group (``None``: no jackknife).
        groups: ``G``.
        settings: The family's settings.
    """
    subsets = subset_masks(image_groups, groups, x.shape[0])
    if not np.all(np.isfinite(x)):
        fits = None
    else:
        fits = twonn(x, subsets, settings.fit, settings.discard_fraction)
    out = []
    whole = with_jackknife([f.dimension for f in fits] if fits else [math.nan] * len(subsets))
    out.append(("intrinsic_dimension", *whole))
    out.append(("intrinsic_dimension_duplicates", float(fits[0].duplicates) if fits else math.nan, math.nan, None))
    labels = np.asarray(labels).astype(np.int64)
    classes = [
        c
        for c in np.unique(labels[labels >= 0])  # -1: an image without a label (a dataset without classes)
        if min(int(np.count_nonzero(s & (labels == c))) for s in subsets) >= settings.min_class_images
    ]
    per_class_id = np.full((len(classes), len(subsets)), np.nan)
    per_class_rank = np.full((len(classes), len(subsets)), np.nan)
    if fits is not None:
        for i, c in enumerate(classes):
            members = labels == c
            inside = [s[members] for s in subsets]
            xc = x[members]
            per_class_id[i] = [f.dimension for f in twonn(xc, inside, settings.fit, settings.discard_fraction)]
            per_class_rank[i] = [pca_rank(xc[keep], settings.class_variance) for keep in inside]
    for name, table in (("class_intrinsic_dimension", per_class_id), ("class_pca_rank", per_class_rank)):
        means = table.mean(axis=0) if classes else np.full(len(subsets), np.nan)
        out.append((name, *with_jackknife(list(means))))
    out.append(("intrinsic_dimension_classes", float(len(classes)), math.nan, None))
    return out


class IntrinsicDimensionState(PerImageState):
    """One rank's per-image ``cls`` / ``patch`` vectors of every point (an `ImageTable`)."""

    def __init__(self, context: FamilyContext) -> None:
        super().__init__(context, vector_layouts(context))
        self.settings: IntrinsicDimensionSettings = context.settings.intrinsic_dimension

    def summarize_point(self, summary: PointSummary) -> Contribution:
        vectors = self.table.points[summary.point.name].values
        labels = self.table.labels.detach().cpu().numpy().astype(np.int64)
        out: list[Metric] = []
        for view, kind in (("cls", "cls"), ("patch", "patch" if "patch" in vectors else "mean")):
            if kind not in vectors:
                continue
            x = vectors[kind].detach().cpu().numpy().astype(np.float64, copy=False)
            metrics = intrinsic_dimension_metrics(
                x, labels, summary.image_groups if summary.groups else None, summary.groups, self.settings
            )
            out += [Metric(view, name, value, stderr, replicates) for name, value, stderr, replicates in metrics]
        return out


class IntrinsicDimensionFamily(MeasurementFamily):
    """TwoNN intrinsic dimension and local PCA rank of the per-image vectors (``observation.intrinsic_dimension``)."""

    name = "intrinsic_dimension"
    order = 80
    settings = IntrinsicDimensionSettings
    observables = (  # in record order
        _metric("intrinsic_dimension", "TwoNN dimension of the per-image vectors (Facco et al. 2017)", spread="rises"),
        _metric("intrinsic_dimension_duplicates", "images with a duplicate (not fitted)", charted=False),
        _metric("class_intrinsic_dimension", "mean over classes of the TwoNN dimension of each class's images"),
        _metric("class_pca_rank", "mean over classes of the components for class_variance (0.95) of its variance"),
        _metric("intrinsic_dimension_classes", "classes entering the class means", charted=False),
    )
    panels = (
        *(
            Panel("depth", "intrinsic_dimension", view, f"intrinsic_dimension ({view})", "depth_profiles")
            for view in _VIEWS
        ),
        Panel("depth", "class_intrinsic_dimension", "cls", "class_intrinsic_dimension (cls)", "depth_profiles"),
        Panel("depth", "class_pca_rank", "cls", "class_pca_rank (cls)", "depth_profiles"),
    )

    def hooks(self, context: FamilyContext) -> Sequence[HookSpec]:
        return [point_spec(p) for p in context.points]

    def start(self, context: FamilyContext) -> IntrinsicDimensionState:
        return IntrinsicDimensionState(context)


INTRINSIC_DIMENSION = register_family(IntrinsicDimensionFamily())
"""The one instance, registered here (imported by `tgo.observatory.families`)."""
