"""The class-centroid family: the distances between the class means of the per-image vectors, per point and view.

Issue 36 row III (TGO-III's class-centroid distance matrix over epochs), on the per-image vectors behind the ``cls``
view (each image's class token) and the ``patch`` view (each image's mean patch token; the mean of its rows where a
point has no prefix token): the `PerImageState` table of the intrinsic-dimension and SVCCA families (rows gathered
exactly by the observation's second collective; every rank summarises identical float64 inputs).

**Summary.** Per (point, view), from `tgo.spectral.class_centroids` (``docs/observables.md``, "Class centroids"):
``centroid_distance`` (mean over class pairs of the distance between their means), ``centroid_distance_min`` (the
closest pair), ``centroid_distance_ratio`` (the mean distance over the mean distance of an image to its own class
mean: scale-free) and ``centroid_classes`` (the classes entering: at least ``min_class_images`` images in every
jackknife subset); the ``C x C`` matrix ``centroid_distances`` and its classes ``centroid_class_labels`` at the epochs
that keep covariances. Standard errors: the delete-a-group jackknife, class means and distances recomputed on the
images outside the group. Cost per (point, view): ``G + 1`` times the class sums (``n x D``), the spreads about
the class means (``n x D``) and ``pdist`` of the means (``C (C - 1) / 2 x D``): 65 ms at C = 100, n = 1,000,
D = 384, G = 10 (one loaded core), 2 s per observation of 15 points x 2 views, in the background summary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tgo.panels import Panel
from tgo.spectral import Observable
from tgo.spectral.class_centroids import centroid_geometry
from tgo.spectral.jackknife import subset_masks, with_jackknife

from ..hooks import point_spec
from ..settings import PREFIX, ObservationSettingsError, check_flags, is_int
from .base import (
    Array,
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

__all__ = ["CLASS_CENTROIDS", "ClassCentroidsFamily", "ClassCentroidsSettings", "ClassCentroidsState"]

_DOC = "docs/observables.md#17-class-centroids"
_VIEWS = ("cls", "patch")


def _metric(name: str, formula: str, **options: Any) -> Observable:
    return family_metric(name, formula, _VIEWS, doc=_DOC, **options)


@dataclass(frozen=True)
class ClassCentroidsSettings:
    """``observation.class_centroids``: distances between the class means of the per-image vectors.

    Attributes:
        enabled: Record ``centroid_distance``, ``centroid_distance_min`` and ``centroid_distance_ratio`` on the
            ``cls`` and ``patch`` views of every point, and the ``C x C`` matrix at the epochs that keep covariances
            (``docs/observables.md``, "Class centroids").
        min_class_images: A class enters when every jackknife subset holds at least this many of its images.
    """

    enabled: bool = False
    min_class_images: int = 2

    def __post_init__(self) -> None:
        check_flags("class_centroids", self, "enabled")
        if not is_int(self.min_class_images) or self.min_class_images < 1:
            raise ObservationSettingsError(
                f"{PREFIX}.class_centroids.min_class_images: expected an integer >= 1, got {self.min_class_images!r}"
            )


class ClassCentroidsState(PerImageState):
    """One rank's per-image ``cls`` / ``patch`` vectors of every point (an `ImageTable`)."""

    def __init__(self, context: FamilyContext) -> None:
        super().__init__(context, vector_layouts(context))
        self.settings: ClassCentroidsSettings = context.settings.class_centroids

    def summarize_point(self, summary: PointSummary) -> Contribution:
        vectors = self.table.points[summary.point.name].values
        labels = self.table.labels.detach().cpu().numpy().astype(np.int64)
        groups = summary.image_groups if summary.groups else None
        subsets = subset_masks(groups, summary.groups, labels.size)
        enough = [  # -1: an image without a label (a dataset without classes)
            c
            for c in np.unique(labels[labels >= 0])
            if min(int(np.count_nonzero(s & (labels == c))) for s in subsets) >= self.settings.min_class_images
        ]
        member = np.isin(labels, enough)
        classes = np.searchsorted(enough, labels[member])
        out: list[Metric | Array] = []
        for view, kind in (("cls", "cls"), ("patch", "patch" if "patch" in vectors else "mean")):
            if kind not in vectors:
                continue
            x = vectors[kind].detach().cpu().numpy().astype(np.float64, copy=False)[member]
            if len(enough) < 2 or not np.all(np.isfinite(x)) or not np.any(x != x[:1]):
                fits = None  # every vector the same (the class token before the first block): nothing to measure
            else:
                fits = centroid_geometry(x, classes, [s[member] for s in subsets])
            for name in ("mean", "min", "ratio"):
                values = [getattr(f, name) for f in fits] if fits else [math.nan] * len(subsets)
                metric = "centroid_distance" if name == "mean" else f"centroid_distance_{name}"
                out.append(Metric(view, metric, *with_jackknife(values)))
            out.append(Metric(view, "centroid_classes", float(len(enough))))
            if fits:
                out.append(Array(view, "centroid_distances", fits[0].distances, kept=True))
                out.append(Array(view, "centroid_class_labels", np.asarray(enough, dtype=np.int64), kept=True))
        return out


class ClassCentroidsFamily(MeasurementFamily):
    """Distances between the class means of the per-image vectors (``observation.class_centroids``)."""

    name = "class_centroids"
    order = 130
    settings = ClassCentroidsSettings
    observables = (  # in record order
        _metric("centroid_distance", "mean over class pairs of ||mu_a - mu_b|| (TGO-III's centroid mean distance)"),
        _metric("centroid_distance_min", "min over class pairs of ||mu_a - mu_b|| (the closest pair)"),
        _metric(
            "centroid_distance_ratio",
            "centroid_distance / mean over classes of the mean ||x_i - mu_c|| of its images (scale-free)",
            scale="log",
        ),
        _metric("centroid_classes", "classes entering (min_class_images in every jackknife subset)", charted=False),
    )
    panels = tuple(
        Panel("depth", "centroid_distance_ratio", view, f"centroid_distance_ratio ({view})", "depth_profiles")
        for view in _VIEWS
    )

    def hooks(self, context: FamilyContext) -> Sequence[HookSpec]:
        return [point_spec(p) for p in context.points]

    def start(self, context: FamilyContext) -> ClassCentroidsState:
        return ClassCentroidsState(context)


CLASS_CENTROIDS = register_family(ClassCentroidsFamily())
"""The one instance, registered here (imported by `tgo.observatory.families`)."""
