"""Persistent homology of a token point cloud: Vietoris-Rips diagrams, their summaries and the distances between them.

TGO-IV's "developmental topology" (``docs/observables.md``, "Topology"): the rows of one image's ``[T, D]`` tokens
at one point are a cloud of ``T`` points in ``R^D``; its Vietoris-Rips filtration over the Euclidean distances gives
one persistence diagram per homology dimension ``H0 .. H_maxdim`` (ripser: 0.04 s for ``H0-H1`` of a 197 x 384 cloud,
0.7 s with ``H2``; gudhi's Rips complex takes 1 s and 290 s, so ripser computes and gudhi checks it in the tests).
Ripser works in float32 internally: a bar's ends carry ~1e-7 relative error, the same on every rank.

Per diagram: the **total persistence** ``sum (death - birth)`` over its finite bars (H0's one infinite bar, the
cloud's single component at the end, left out, as TGO-IV does) and the **persistent Betti number**: the bars (the
infinite one included) longer than ``threshold x`` the cloud's diameter. Between two diagrams of the same image at
two points: persim's **bottleneck** distance (L-infinity ground metric) and **1-Wasserstein** distance (Euclidean
ground metric, a bar's distance to the diagonal ``(death - birth) / sqrt 2``), over the finite bars.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.spatial.distance import pdist, squareform

__all__ = [
    "MAX_DIM",
    "TOPOLOGY_METRICS",
    "CloudDiagrams",
    "betti_number",
    "cloud_diagrams",
    "diagram_distances",
    "topology_metrics",
    "total_persistence",
]

MAX_DIM = 2
"""Highest homology dimension measured (TGO-IV's ``H2``)."""

TOPOLOGY_METRICS: tuple[str, ...] = ("total_persistence", "betti", "bottleneck", "wasserstein")
"""Per homology dimension ``d``, recorded as ``topology_<metric>_h<d>`` in this order."""


@dataclass(frozen=True)
class CloudDiagrams:
    """The diagrams of one cloud.

    Attributes:
        diagrams: float64 ``[bars, 2]`` (birth, death) per dimension ``0 .. maxdim`` (H0's last death is ``inf``).
        diameter: The largest pairwise distance of the cloud.
    """

    diagrams: tuple[np.ndarray, ...]
    diameter: float


def cloud_diagrams(cloud: np.ndarray, maxdim: int) -> CloudDiagrams:
    """Vietoris-Rips diagrams ``H0 .. H_maxdim`` of a float ``[n, D]`` cloud (ripser on its float64 Euclidean
    distance matrix); NaN diagrams and diameter for a non-finite cloud or fewer than 2 points."""
    if cloud.shape[0] < 2 or not np.all(np.isfinite(cloud)):
        return CloudDiagrams(tuple(np.full((1, 2), np.nan) for _ in range(maxdim + 1)), math.nan)
    from ripser import ripser  # here: importing ripser and persim takes ~1 s, and the family is off by default

    distances = squareform(pdist(np.asarray(cloud, dtype=np.float64)))
    found = ripser(distances, maxdim=maxdim, distance_matrix=True)["dgms"]
    return CloudDiagrams(tuple(np.asarray(d, dtype=np.float64).reshape(-1, 2) for d in found), float(distances.max()))


def _finite(diagram: np.ndarray) -> np.ndarray:
    return diagram[np.isfinite(diagram[:, 1])]


def total_persistence(diagram: np.ndarray) -> float:
    """``sum (death - birth)`` over the finite bars (NaN for a NaN diagram)."""
    if np.isnan(diagram).any():
        return math.nan
    finite = _finite(diagram)
    return float(np.sum(finite[:, 1] - finite[:, 0]))


def betti_number(diagram: np.ndarray, length: float) -> float:
    """Bars (an infinite one included) longer than ``length`` (NaN for a NaN diagram or length)."""
    if np.isnan(diagram).any() or math.isnan(length):
        return math.nan
    return float(np.count_nonzero(diagram[:, 1] - diagram[:, 0] > length))


def diagram_distances(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """``(bottleneck, 1-Wasserstein)`` between the finite bars of two diagrams (persim; NaN if either is NaN)."""
    if np.isnan(a).any() or np.isnan(b).any():
        return math.nan, math.nan
    import persim

    a, b = _finite(a), _finite(b)
    if a.shape[0] == 0 and b.shape[0] == 0:
        return 0.0, 0.0
    return float(persim.bottleneck(a, b)), float(persim.wasserstein(a, b))


def _mean_and_spread(values: Sequence[float]) -> tuple[float, float]:
    """The mean over the images and their sample standard deviation (NaN below two images)."""
    x = np.asarray(values, dtype=np.float64)
    return float(x.mean()), float(x.std(ddof=1)) if x.size >= 2 else math.nan


def topology_metrics(
    here: Sequence[CloudDiagrams], after: Sequence[CloudDiagrams] | None, threshold: float
) -> list[tuple[str, float, float]]:
    """``(name, mean over the images, spread over the images)`` of one point, in record order.

    Args:
        here: Each image's diagrams at this point.
        after: The same images' diagrams at the next point (``None`` at the last point: no distances).
        threshold: A bar counts in ``betti`` when longer than this fraction of its cloud's diameter.
    """
    out = []
    for d in range(len(here[0].diagrams)):
        per_image = {
            "total_persistence": [total_persistence(c.diagrams[d]) for c in here],
            "betti": [betti_number(c.diagrams[d], threshold * c.diameter) for c in here],
        }
        if after is not None:
            pairs = [diagram_distances(a.diagrams[d], b.diagrams[d]) for a, b in zip(here, after, strict=True)]
            per_image["bottleneck"], per_image["wasserstein"] = [p[0] for p in pairs], [p[1] for p in pairs]
        out += [(f"topology_{m}_h{d}", *_mean_and_spread(per_image[m])) for m in TOPOLOGY_METRICS if m in per_image]
    return out
