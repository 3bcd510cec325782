"""Measurement families: the seam through which every measurement beside the covariances enters an observation.

The protocol is `base` (`MeasurementFamily`, `FamilyState`, `HookSpec`, `BatchInfo`, `FamilyContext`,
`PointSummary`, `Metric`, `Array`, the registry); `testing.check_family` checks any family for multi-rank exactness,
its collective count, records and resume. Recipe: ``docs/extending.md`` (e) "Add a measurement family".
"""

from .base import (
    Array,
    BatchInfo,
    Contribution,
    FamilyContext,
    FamilyState,
    HookSpec,
    MeasurementFamily,
    Metric,
    PointSummary,
    SummedTensors,
    ViewMoments,
    enabled_families,
    jackknife_ratio,
    register_family,
    registered_families,
    unregister_family,
)

__all__ = [
    "Array",
    "BatchInfo",
    "Contribution",
    "FamilyContext",
    "FamilyState",
    "HookSpec",
    "MeasurementFamily",
    "Metric",
    "PointSummary",
    "SummedTensors",
    "ViewMoments",
    "enabled_families",
    "jackknife_ratio",
    "register_family",
    "registered_families",
    "unregister_family",
]
