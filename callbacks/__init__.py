"""Lightning callbacks (installed as ``tgo.callbacks``).

``from tgo.callbacks import SpectralGeometryCallback`` is the geometry callback; it is imported on first use, so
importing one of the small modules here (``tgo.callbacks.random_state``) stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .spectral_geometry import SpectralGeometryCallback

__all__ = ["SpectralGeometryCallback"]


def __getattr__(name: str) -> Any:
    if name == "SpectralGeometryCallback":
        from .spectral_geometry import SpectralGeometryCallback

        return SpectralGeometryCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
