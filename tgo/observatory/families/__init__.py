"""Measurement families: the seam through which every measurement beside the covariances enters an observation.

The protocol is `base` (`MeasurementFamily`, `FamilyState`, `HookSpec`, `BatchInfo`, `FamilyContext`,
`PointSummary`, `Metric`, `Array`, `TrainingCollector`, the registry). Each built-in family declares everything in
its own module (its settings section, catalogue entries, series, collector, folder, panels) and registers itself
there (``X = register_family(XFamily())``, timm style); this package imports every module of its own (but `base`,
`testing`, `weight_history` and private ones), so a new family is one new file, and the registry keeps the
families in their declared ``order`` (record order), whatever the import order.
`testing.check_family` checks any family for multi-rank exactness, its collective count, records and resume. Recipe:
``docs/extending.md`` (e) "Add a family with a card and a report panel".
"""

import importlib
import pkgutil
from types import ModuleType

from .base import *  # noqa: F403 (the protocol: `base.__all__`)
from .base import MeasurementFamily
from .base import __all__ as __all__

_NOT_FAMILIES = {"base", "testing", "weight_history"}
for _module in pkgutil.iter_modules(__path__):  # noqa: F405 (each family module registers its family on import)
    if _module.name not in _NOT_FAMILIES and not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")


def __getattr__(name: str) -> MeasurementFamily:
    """A family module's constant (``ATTENTION`` of `attention`), so it imports from the package as before."""
    module = globals().get(name.lower())
    if not isinstance(module, ModuleType) or not isinstance(getattr(module, name, None), MeasurementFamily):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)
