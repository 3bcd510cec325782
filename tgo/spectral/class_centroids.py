"""Class-centroid geometry of per-image vectors: how far apart the class means are, and how far relative to the
spread of each class about its own mean (TGO-III's centroid distance matrix, made scale-free).

For classes ``c = 1..C`` with images ``I_c`` and means ``mu_c = |I_c|^-1 sum_{i in I_c} x_i``:

* ``D_ab = ||mu_a - mu_b||``, the ``C x C`` matrix of Euclidean distances;
* ``centroid_distance = mean_{a < b} D_ab`` and ``centroid_distance_min = min_{a < b} D_ab``;
* ``centroid_distance_ratio = centroid_distance / mean_c (mean_{i in I_c} ||x_i - mu_c||)``: the denominator is the
  mean over classes (each class once, as each pair is once in the numerator) of the mean distance of a class's
  images to its own mean. A common scale of the representation (the residual stream's norm grows with depth and
  training) cancels.

Distances are scipy's ``pdist`` of the class means (differences first, then norms: no Gram identity, in which a
residual stream's large common offset would cancel in ``||a||^2 + ||b||^2 - 2 a.b`` and leave the closest pair the
least accurate), in float64. Class sums are one ``np.add.reduceat`` over the images sorted by class, per subset.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.spatial.distance import pdist, squareform

__all__ = ["CentroidGeometry", "centroid_geometry"]


@dataclass(frozen=True)
class CentroidGeometry:
    """The centroid geometry of one set of images.

    Attributes:
        distances: float64 ``[C, C]`` Euclidean distances between the class means (zero diagonal).
        within: float64 ``[C]`` mean distance of each class's images to its own mean.
    """

    distances: np.ndarray
    within: np.ndarray

    @property
    def pairs(self) -> np.ndarray:
        """``D_ab`` for ``a < b`` (the condensed form)."""
        return squareform(self.distances, checks=False)

    @property
    def mean(self) -> float:
        return float(self.pairs.mean()) if self.distances.shape[0] > 1 else math.nan

    @property
    def min(self) -> float:
        return float(self.pairs.min()) if self.distances.shape[0] > 1 else math.nan

    @property
    def ratio(self) -> float:
        within = float(self.within.mean()) if self.within.size else math.nan
        return self.mean / within if within > 0 else math.nan


def centroid_geometry(x: np.ndarray, classes: np.ndarray, subsets: Sequence[np.ndarray]) -> list[CentroidGeometry]:
    """The centroid geometry of each subset of the images (the leave-one-group-out jackknife recomputes each).

    Args:
        x: float64 ``[N, D]`` per-image vectors.
        classes: ``[N]`` class index of each image in ``0..C-1`` (every class holds an image of every subset).
        subsets: Boolean ``[N]`` masks.
    """
    c = int(classes.max()) + 1 if classes.size else 0
    order = np.argsort(classes, kind="stable")
    xs, cs = x[order], classes[order]
    out = []
    for keep in subsets:
        kept = keep[order]
        xk, counts = xs[kept], np.bincount(cs[kept], minlength=c)
        if counts.min(initial=1) < 1:
            raise ValueError("centroid_geometry: every class needs an image in every subset")
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        means = np.add.reduceat(xk, starts, axis=0) / counts[:, None].astype(np.float64)
        spread = np.linalg.norm(xk - np.repeat(means, counts, axis=0), axis=1)
        within = np.add.reduceat(spread, starts) / counts
        out.append(CentroidGeometry(squareform(pdist(means)), within))
    return out
