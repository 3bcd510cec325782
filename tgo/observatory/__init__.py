"""Observation points, the probe that hooks them, and the observation pass.

Typical use (one rank)::

    points = vit_points(model)                      # the paper's 15 points for any timm ViT
    accs = run_observation(model, loader, points)   # {name: StreamingCovariance}, point order
    reduce_observation(accs, sum_fn)                # every rank, same order
    results = summarize_observation(accs, points)   # rank 0: {name: PointResult}
"""
from .observation import (
    PointResult,
    exact_inference,
    reduce_observation,
    run_observation,
    summarize_observation,
)
from .points import (
    READS,
    TOKENS,
    ObservationPoint,
    points_from_config,
    resolve_points,
    select_tokens,
    unwrap_model,
    vit_points,
)
from .probe import Probe, SupportsUpdate, num_prefix_tokens_of

__all__ = [
    "READS",
    "TOKENS",
    "ObservationPoint",
    "PointResult",
    "Probe",
    "SupportsUpdate",
    "exact_inference",
    "num_prefix_tokens_of",
    "points_from_config",
    "reduce_observation",
    "resolve_points",
    "run_observation",
    "select_tokens",
    "summarize_observation",
    "unwrap_model",
    "vit_points",
]
