"""Measurement families: the seam through which every measurement beside the covariances enters an observation.

The protocol is `base` (`MeasurementFamily`, `FamilyState`, `HookSpec`, `BatchInfo`, `FamilyContext`,
`PointSummary`, `Metric`, `Array`, `TrainingCollector`, the registry). Each built-in family declares everything in
its own module (its settings section, catalogue entries, series, collector, folder, panels) and registers itself
there (``X = register_family(XFamily())``, timm style); this package imports them in record order.
`testing.check_family` checks any family for multi-rank exactness, its collective count, records and resume. Recipe:
``docs/extending.md`` (e) "Add a family with a card and a report panel".
"""

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
    TrainingCollector,
    TrainingInfo,
    ViewMoments,
    enabled_families,
    family_metric,
    jackknife_ratio,
    register_family,
    registered_families,
    unregister_family,
)

# isort: off
# Registration order is record order (each module registers its family on import).
from .image_vectors import IMAGE_VECTORS
from .attention import ATTENTION
from .weights import WEIGHTS
from .noise_scale import NOISE_SCALE
from .curvature import CURVATURE
from .phases import PHASES
from .token_coupling import TOKEN_COUPLING
from .intrinsic_dimension import INTRINSIC_DIMENSION

# isort: on

__all__ = [
    "ATTENTION",
    "CURVATURE",
    "IMAGE_VECTORS",
    "INTRINSIC_DIMENSION",
    "NETWORK_VIEW",
    "NOISE_SCALE",
    "PHASES",
    "TOKEN_COUPLING",
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
    "TrainingCollector",
    "TrainingInfo",
    "ViewMoments",
    "enabled_families",
    "family_metric",
    "jackknife_ratio",
    "register_family",
    "registered_families",
    "unregister_family",
]
