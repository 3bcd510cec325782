"""Measurement families: the seam through which every measurement beside the covariances enters an observation.

The protocol is `base` (`MeasurementFamily`, `FamilyState`, `HookSpec`, `BatchInfo`, `FamilyContext`,
`PointSummary`, `Metric`, `Array`, the registry). The built-in families are `image_vectors` (the per-image vectors:
views, class geometry, decoding, massive activations, subspace drift) and `attention` (attention geometry recomputed
from every block's q and k, view ``attention``). `testing.check_family` checks any family for
multi-rank exactness, its collective count, records and resume. Recipe: ``docs/extending.md`` (e) "Add a measurement
family".
"""

from .attention import ATTENTION
from .base import (
    NETWORK_VIEW,
    Array,
    BatchInfo,
    Contribution,
    FamilyContext,
    FamilyRun,
    FamilyState,
    HistorySummary,
    HookSpec,
    MeasurementFamily,
    Metric,
    PointSummary,
    SummedTensors,
    TrainingInfo,
    ViewMoments,
    enabled_families,
    family_metric,
    jackknife_ratio,
    register_family,
    registered_families,
    unregister_family,
)
from .image_vectors import IMAGE_VECTORS

# The built-in families, in record order; their catalogue entries are declared in tgo.spectral.catalogue.
register_family(IMAGE_VECTORS)
register_family(ATTENTION)

__all__ = [
    "ATTENTION",
    "IMAGE_VECTORS",
    "NETWORK_VIEW",
    "Array",
    "BatchInfo",
    "Contribution",
    "FamilyContext",
    "FamilyRun",
    "FamilyState",
    "HistorySummary",
    "HookSpec",
    "MeasurementFamily",
    "Metric",
    "PointSummary",
    "SummedTensors",
    "TrainingInfo",
    "ViewMoments",
    "enabled_families",
    "family_metric",
    "jackknife_ratio",
    "register_family",
    "registered_families",
    "unregister_family",
]
