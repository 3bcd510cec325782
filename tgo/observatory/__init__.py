"""Where and how a model is observed: points, hooks, measurement families, the streaming pass, the pipeline, settings.

* `points` -- which module is read, input or output, which tokens, which layout (`ObservationPoint`, `vit_points`).
* `hooks` -- forward hooks that hand a module's layout-checked tensor to a consumer (`ActivationHooks`, `HookSpec`).
* `families` -- the seam of every measurement beside the covariances (`MeasurementFamily`); built in:
  `families.image_vectors` (per-image vectors: views, class geometry, decoding, massive activations, drift).
* `views` -- view algebra: which moments make which view of a point (`point_views`).
* `stream` -- one rank's pass over its images, sums only (`stream_activations`, `reduce_accumulators`).
* `results` -- rank 0's spectra and observables per (point, view) (`summarize_accumulators`, `ObservationKey`).
* `pipeline` -- the whole observation across ranks, recorded (`observe_and_record`): the one entry point of the
  training callback and of ``python -m tgo.observe``.
* `settings` -- every knob of an observation (`ObservationSettings`, the ``observation`` config group).
* `find_vit` -- the timm ViT inside a user's module (`resolve_network`; ``find_vit.find_vit``).
* `standalone` -- one observation in plain PyTorch, recorded or not (`observe_model`, also ``tgo.observe_model``;
  imported on first use).

Typical use (one process)::

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
