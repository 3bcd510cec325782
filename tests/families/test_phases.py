"""The training-phase family: the family tester, its records, and its values against a brute-force recomputation
from two recorded observations."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from tests.processes import tiny_vit
from tgo.observatory.families import PHASES
from tgo.observatory.families.phases import PHASE_METRICS
from tgo.observatory.families.testing import check_family
from tgo.observatory.pipeline import RecordPlan, ShardPlan, observe_and_record
from tgo.observatory.points import vit_points
from tgo.observatory.settings import ObservationSettings, ObservationSettingsError
from tgo.records import RecordWriter, load_jackknife, load_series
from tgo.spectral import CATALOGUE
from tgo.spectral.phases import PHASE_CODES, PhaseRule

LEAN = {"probes": {"enabled": False}, "attention": {"enabled": False}}


def _data(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 3, 16, 16, generator=g), torch.arange(n) % 3)


def test_the_phase_family_passes_the_family_tester(tmp_path):
    check = check_family(PHASES, tiny_vit(), _data(7), tmp_path, settings={"groups": 3, **LEAN})
    assert {m for _, _, m in check.metrics} == set(PHASE_METRICS)
    assert {v for _, v, _ in check.metrics} == {"all"}
    for key, result in check.single[0].items():  # the first observation has nothing to compare with
        if key.view == "all":
            assert all(math.isnan(result.observables[m]) for m in PHASE_METRICS)
    later = check.single[1][("block_02", "all")]  # the same weights again: no change at all
    assert later.observables["phase_code"] == PHASE_CODES["unresolved"]
    assert later.observables["rank_change_z"] == 0.0 and later.observables["alpha_change_z"] == 0.0
    assert all(CATALOGUE[m].scope == "family" for m in PHASE_METRICS)


def _observe(model: torch.nn.Module, run, epoch: int, settings: ObservationSettings) -> None:
    observe_and_record(
        model,
        _data(24),
        vit_points(model),
        settings=settings,
        plan=ShardPlan(0, 1, 6),
        record=RecordPlan(RecordWriter(run), epoch=epoch, step=10 * epoch),
        all_reduce_sum=lambda t: t,
        is_global_zero=True,
    )


def _jackknife_se(values: np.ndarray) -> float:
    g = values.size
    return math.sqrt((g - 1) / g * float(np.sum((values - values.mean()) ** 2)))


def test_recorded_phases_equal_a_brute_force_recomputation_from_the_records(tmp_path):
    settings = ObservationSettings.from_config({"groups": 4, **LEAN})
    model: Any = tiny_vit()
    run = tmp_path / "run"
    _observe(model, run, 0, settings)
    with torch.no_grad():  # a different network at the next observation: four patch-embedding channels dominate
        model.patch_embed.proj.weight[:4].mul_(10.0)
        for block in model.blocks:
            block.mlp.fc2.weight.mul_(3.0)
    _observe(model, run, 1, settings)
    with torch.no_grad():  # and back, two epochs later: the variance spreads again
        model.patch_embed.proj.weight[:4].div_(10.0)
    _observe(model, run, 3, settings)

    codes = load_series(run, metrics=list(PHASE_METRICS))
    values = load_series(run, metrics=["effective_rank", "power_law_alpha"])
    reps = load_jackknife(run, metrics=["effective_rank", "power_law_alpha"])
    rule = PhaseRule()
    critical = rule.critical(3)  # G - 1 = 3 degrees of freedom
    seen = set()
    for point, (epochs, code) in codes["phase_code"].items():
        assert list(epochs) == [0, 1, 3] and math.isnan(code[0])
        for j in (1, 2):
            z = {}
            for metric, name in (("effective_rank", "rank"), ("power_law_alpha", "alpha")):
                v = values[metric][point][1]
                r = reps[metric][point][1]
                diff = v[j] - v[j - 1]
                se = _jackknife_se(r[j] - r[j - 1])
                z[name] = diff / se if se > 0 else (0.0 if diff == 0 else math.copysign(math.inf, diff))
                recorded = codes[f"{name}_change_z"][point][1][j]
                assert recorded == pytest.approx(z[name], rel=1e-12, abs=1e-12), (point, j, metric)
            s_rank = 0 if abs(z["rank"]) <= critical else int(np.sign(z["rank"]))
            s_alpha = 0 if abs(z["alpha"]) <= critical else int(np.sign(z["alpha"]))
            rank = values["effective_rank"][point][1]
            if s_rank < 0 and (rank[j] - rank[j - 1]) / rank[j - 1] <= -0.5:
                want = "collapse"
            elif (s_rank > 0 or s_alpha < 0) and (s_rank < 0 or s_alpha > 0):
                want = "unresolved"
            elif s_rank > 0 or s_alpha < 0:
                want = "entropy-seeking"
            elif s_rank < 0 or s_alpha > 0:
                want = "compression-seeking"
            else:
                want = "unresolved"
            assert code[j] == PHASE_CODES[want], (point, j, z)
            seen.add(want)
    assert {"collapse", "entropy-seeking"} <= seen, seen  # the perturbations move the points far outside the noise


def test_phase_settings_are_checked():
    assert ObservationSettings().phases.enabled and ObservationSettings().phases.z == 3.0
    for bad, key in (
        ({"z": 0}, "observation.phases.z"),
        ({"z": "3"}, "observation.phases.z"),
        ({"collapse_drop": 1.0}, "observation.phases.collapse_drop"),
        ({"enabled": "yes"}, "observation.phases.enabled"),
        ({"zz": 1}, "observation.phases"),
    ):
        with pytest.raises(ObservationSettingsError, match=key):
            ObservationSettings.from_config({"phases": bad})
    assert not PHASES.enabled(ObservationSettings.from_config({"phases": {"enabled": False}}))
