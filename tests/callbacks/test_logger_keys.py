"""What loggers other than TensorBoard get of one observation (`callbacks.logger_keys`): the default view's effective
rank and power-law alpha per point, under ``geometry/<metric>/<point>``, and the observation's epoch."""

from __future__ import annotations

import dataclasses
import math

from tgo.callbacks.logger_keys import EPOCH_KEY, HEADLINE_METRICS, headline_scalars, observation_keys
from tgo.observatory.results import ObservationKey, PointResult, Results


def _result(**observables: float) -> PointResult:
    return dataclasses.replace(PointResult.metrics_only(), observables=dict(observables))


def test_headline_pair_per_point_of_the_default_view_only():
    results = Results(
        {
            ObservationKey("patch_embed"): _result(effective_rank=3.5, power_law_alpha=1.25, stable_rank=2.0),
            ObservationKey("patch_embed", "cls"): _result(effective_rank=9.0, power_law_alpha=9.0),
            ObservationKey("block_01"): _result(effective_rank=math.nan, power_law_alpha=2.5),
            ObservationKey("block_01", "weights_fc1"): _result(weight_alpha=4.0),
            ObservationKey("cls"): _result(stable_rank=1.0),  # a point without the pair logs nothing
        }
    )
    logged = headline_scalars(results)
    assert HEADLINE_METRICS == ("effective_rank", "power_law_alpha")
    assert list(logged) == [
        "geometry/effective_rank/patch_embed",
        "geometry/power_law_alpha/patch_embed",
        "geometry/effective_rank/block_01",
        "geometry/power_law_alpha/block_01",
    ]
    assert logged["geometry/effective_rank/patch_embed"] == 3.5 and logged["geometry/power_law_alpha/block_01"] == 2.5
    assert math.isnan(logged["geometry/effective_rank/block_01"]), "NaN says the point could not be measured"
    assert next(iter(headline_scalars(results, prefix="steps_"))) == "steps_geometry/effective_rank/patch_embed"


def test_an_epoch_observation_names_its_epoch_and_a_step_observation_nothing_more():
    assert observation_keys("epoch", 5) == {EPOCH_KEY: 5} and EPOCH_KEY == "geometry/epoch"
    assert observation_keys("step", 32) == {}
