"""Transformer Geometry Observatory.

``tgo.observe_model(model, dataset, ...)`` observes a model in plain PyTorch (`tgo.observatory.standalone`); it is
imported on first use, so ``import tgo`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tgo.observatory.standalone import observe_model

__all__ = ["observe_model"]


def __getattr__(name: str) -> Any:
    if name == "observe_model":
        from tgo.observatory.standalone import observe_model

        return observe_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
