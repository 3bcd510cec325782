"""Measurement families: the seam through which every measurement beside the covariances enters an observation.

The protocol is `base` (`MeasurementFamily`, `FamilyState`, `HookSpec`, `BatchInfo`, `FamilyContext`,
`PointSummary`, `Metric`, `Array`, the registry). The built-in family is `image_vectors` (the per-image vectors:
views, class geometry, decoding, massive activations, subspace drift); `attention` (attention geometry recomputed
from every block's q and k) is written against the same protocol. `testing.check_family` checks any family for
multi-rank exactness, its collective count, records and resume. Recipe: ``docs/extending.md`` (e) "Add a measurement
family".
"""

from .base import (
    Array,
    BatchInfo,
    Contribution,
    FamilyContext,
    FamilyRun,
    FamilyState,
    HookSpec,
    MeasurementFamily,
    Metric,
    PointSummary,
    SummedTensors,
    ViewMoments,
    enabled_families,
    family_metric,
    jackknife_ratio,
    register_family,
    registered_families,
    unregister_family,
)
from .image_vectors import IMAGE_VECTORS

# The built-in families, in record order; their catalogue entries are declared in tgo.spectral.catalogue. (The
# attention family, `families.attention.ATTENTION`, joins them here once the tests that list every view expect it.)
register_family(IMAGE_VECTORS)

__all__ = [
    "IMAGE_VECTORS",
    "Array",
    "BatchInfo",
    "Contribution",
    "FamilyContext",
    "FamilyRun",
    "FamilyState",
    "HookSpec",
    "MeasurementFamily",
    "Metric",
    "PointSummary",
    "SummedTensors",
    "ViewMoments",
    "enabled_families",
    "family_metric",
    "jackknife_ratio",
    "register_family",
    "registered_families",
    "unregister_family",
]
