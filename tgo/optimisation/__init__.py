"""Numerics of the optimisation observables (measured during training, not from one model's activations).

`noise_scale`: the simple gradient noise scale ``B_simple = tr(Sigma) / |G|^2`` (McCandlish et al. 2018) from
gradient norms at two batch sizes, with a delete-a-block jackknife over consecutive steps.
"""

from .curvature import (
    HessianOperator,
    LanczosResult,
    Preconditioner,
    adam_preconditioner,
    curvature_batch_indices,
    hutchinson_samples,
    lanczos,
    stability_threshold,
    trace_estimate,
    training_loss,
)
from .noise_scale import NoiseScaleEstimate, block_jackknife_ratio, noise_scale_estimate, step_estimates

__all__ = [
    "HessianOperator",
    "LanczosResult",
    "NoiseScaleEstimate",
    "Preconditioner",
    "adam_preconditioner",
    "block_jackknife_ratio",
    "curvature_batch_indices",
    "hutchinson_samples",
    "lanczos",
    "noise_scale_estimate",
    "stability_threshold",
    "step_estimates",
    "trace_estimate",
    "training_loss",
]
