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
from .curvature import CURVATURE
from .image_vectors import IMAGE_VECTORS
from .noise_scale import NOISE_SCALE
from .phases import PHASES
from .weights import WEIGHTS

# The built-in families, in record order; their catalogue entries are declared in tgo.spectral.catalogue.
register_family(IMAGE_VECTORS)
register_family(ATTENTION)
register_family(WEIGHTS)
register_family(NOISE_SCALE)
register_family(CURVATURE)
register_family(PHASES)

__all__ = [
    "ATTENTION",
    "CURVATURE",
    "IMAGE_VECTORS",
    "NETWORK_VIEW",
    "NOISE_SCALE",
    "PHASES",
    "WEIGHTS",
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
