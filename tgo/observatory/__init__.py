"""Where and how a model is observed: points, hooks, measurement families, the streaming pass, the pipeline, settings.

`pipeline.observe_and_record` is the one entry point of the training callback and of ``python -m tgo.observe``;
`standalone.observe_model` (also ``tgo.observe_model``, imported on first use) observes in plain PyTorch. What each
module does is in docs/architecture.md section 4. Typical use (one process)::

    settings = ObservationSettings()
    points = points_from_config(settings.points, model)
    results = observe_and_record(model, dataset, points, settings=settings, plan=ShardPlan(),
                                 record=RecordPlan(RecordWriter(run_dir), epoch=0, step=0),
                                 all_reduce_sum=lambda t: t, is_global_zero=True)
"""

from typing import Any

from .find_vit import ModelLookupError, resolve_network  # not find_vit: that name stays the module's
from .hooks import ActivationHooks, HookSpec, LayoutError, SupportsUpdate, num_prefix_tokens_of
from .pipeline import (
    NonFiniteActivationsError,
    RecordPlan,
    ShardPlan,
    ShardSampler,
    observe_and_record,
    observe_dataset,
    shard_loader,
)
from .points import (
    LAYOUTS,
    READS,
    TOKENS,
    ObservationPoint,
    PointConfigError,
    points_from_config,
    resolve_points,
    select_tokens,
    unwrap_model,
    vit_points,
)
from .results import DEFAULT_VIEW, ObservationKey, PointResult, Results, summarize_accumulators
from .settings import FigureSettings, ObservationSettings, ObservationSettingsError
from .stream import exact_inference, reduce_accumulators, stream_activations

__all__ = [
    "DEFAULT_VIEW",
    "LAYOUTS",
    "READS",
    "TOKENS",
    "ActivationHooks",
    "FigureSettings",
    "HookSpec",
    "LayoutError",
    "ModelLookupError",
    "NonFiniteActivationsError",
    "ObservationKey",
    "ObservationPoint",
    "ObservationSettings",
    "ObservationSettingsError",
    "PointConfigError",
    "PointResult",
    "RecordPlan",
    "Results",
    "ShardPlan",
    "ShardSampler",
    "SupportsUpdate",
    "exact_inference",
    "num_prefix_tokens_of",
    "observe_and_record",
    "observe_dataset",
    "observe_model",
    "points_from_config",
    "reduce_accumulators",
    "resolve_network",
    "resolve_points",
    "select_tokens",
    "shard_loader",
    "stream_activations",
    "summarize_accumulators",
    "unwrap_model",
    "vit_points",
]


def __getattr__(name: str) -> Any:
    if name == "observe_model":  # tgo.data (and so Lightning) is imported only when it is used
        from .standalone import observe_model

        return observe_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
