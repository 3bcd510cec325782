"""The findings logic as a specification: each paper claim judged on series with known trends."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tgo.report.findings import (
    CLAIMS,
    FAILS,
    HOLDS,
    NA,
    REVERSES,
    Claim,
    assess_extreme,
    assess_stable,
    assess_trend,
    evaluate_findings,
    point_role,
    spearman,
)
from tgo.report.reference import load_reference
from tgo.spectral.catalogue import CATALOGUE

EPOCHS = np.arange(0, 21)
RISING = 2.0 + 0.5 * EPOCHS  # 2 -> 12, steadily
FALLING = 1.0 - 0.04 * EPOCHS  # 1 -> 0.2
RISE_THEN_FALL = 10.0 - 0.05 * (EPOCHS - 12) ** 2  # peak at epoch 12, ends 3.2 below it
NOISY_FLAT = 5.0 + 0.01 * np.random.default_rng(0).standard_normal(EPOCHS.size)


def test_a_steady_rise_holds_for_a_rising_claim_and_fails_a_falling_one():
    rise = assess_trend(EPOCHS, RISING, "rise")
    assert rise.verdict == HOLDS
    assert rise.first == 2.0 and rise.last == 12.0 and rise.change == 10.0
    assert rise.relative_change == pytest.approx(5.0)
    assert rise.spearman == pytest.approx(1.0)
    assert rise.extreme_epoch == 20
    assert assess_trend(EPOCHS, RISING, "fall").verdict == FAILS


def test_a_steady_fall_holds_for_a_falling_claim_with_its_trough_at_the_end():
    fall = assess_trend(EPOCHS, FALLING, "fall")
    assert fall.verdict == HOLDS
    assert fall.spearman == pytest.approx(-1.0)
    assert fall.extreme_epoch == 20
    assert assess_trend(EPOCHS, FALLING, "rise").verdict == FAILS


def test_rise_then_fall_is_holds_then_reverses_with_the_peak_epoch():
    trend = assess_trend(EPOCHS, RISE_THEN_FALL, "rise")
    assert trend.verdict == REVERSES
    assert trend.extreme_epoch == 12
    assert trend.extreme_value == pytest.approx(10.0)


def test_a_small_give_back_within_tolerance_still_holds():
    values = RISING.copy()
    values[-1] = values[-2] - 0.01 * values.max()  # 1% below the peak, tolerance is 2%
    assert assess_trend(EPOCHS, values, "rise").verdict == HOLDS
    assert assess_trend(EPOCHS, values, "rise", tolerance=0.001).verdict == REVERSES


def test_flat_noise_does_not_hold_either_way():
    assert assess_trend(EPOCHS, NOISY_FLAT, "rise").verdict == FAILS
    assert assess_trend(EPOCHS, NOISY_FLAT, "fall").verdict == FAILS


def test_nan_observations_are_dropped_and_too_few_give_na():
    values = RISING.copy()
    values[3] = np.nan
    assert assess_trend(EPOCHS, values, "rise").n == EPOCHS.size - 1
    assert assess_trend([0, 1], [1.0, np.nan], "rise").verdict == NA
    with pytest.raises(ValueError, match="direction"):
        assess_trend(EPOCHS, RISING, "up")  # type: ignore[arg-type]


def test_spearman_matches_scipy_including_ties():
    scipy_stats = pytest.importorskip("scipy.stats")
    x = np.array([0, 1, 2, 3, 4, 5, 6])
    y = np.array([1.0, 3.0, 3.0, 2.0, 5.0, 5.0, 4.0])
    assert spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic)
    assert math.isnan(spearman(x, np.ones(7)))


def test_stable_means_within_the_relative_tolerance():
    assert assess_stable(EPOCHS, 3.0 + 0.01 * EPOCHS).verdict == HOLDS  # +6.7%
    assert assess_stable(EPOCHS, 3.0 + 0.05 * EPOCHS).verdict == FAILS  # +33%


def test_cls_extreme_holds_reverses_or_fails():
    below = (EPOCHS, RISING - 1.0)
    assert assess_extreme({"block_01": below, "cls": (EPOCHS, RISING)}, "cls", "rise")[0] == HOLDS
    overtaken = {"block_01": (EPOCHS, 2.0 + 0.6 * EPOCHS), "cls": (EPOCHS, 3.0 + 0.5 * EPOCHS)}
    verdict, note = assess_extreme(overtaken, "cls", "rise")
    assert verdict == REVERSES and "block_01 is highest" in note
    assert assess_extreme({"block_01": (EPOCHS, RISING + 1), "cls": (EPOCHS, RISING)}, "cls", "rise")[0] == FAILS
    assert assess_extreme({"block_01": (EPOCHS, FALLING + 1), "cls": (EPOCHS, FALLING)}, "cls", "fall")[0] == HOLDS


def test_point_roles():
    assert [point_role(p) for p in ("patch_embed", "pos_embed", "block_07", "cls", "block_06_attn")] == [
        "embedding",
        "embedding",
        "block",
        "cls",
        "other",
    ]


def test_evaluate_findings_on_a_run_that_follows_the_paper():
    points = ["patch_embed", "pos_embed", "block_01", "block_02", "cls"]
    grow = {
        "patch_embed": 2.0 + 0.001 * EPOCHS,
        "pos_embed": 2.1 + 0.001 * EPOCHS,
        "block_01": RISING,
        "block_02": RISE_THEN_FALL,
        "cls": RISING + 5,
    }
    series = {
        "effective_rank": {p: (EPOCHS, v) for p, v in grow.items()},
        "spectral_anisotropy": {p: (EPOCHS, FALLING + 0.01 * i) for i, p in enumerate(points)},
    }
    findings = evaluate_findings(series, points)
    verdict = {(f.statement, f.point): f.verdict for f in findings}
    assert verdict[("effective rank rises", "block_01")] == HOLDS
    assert verdict[("effective rank rises", "block_02")] == REVERSES
    assert verdict[("effective rank rises", "patch_embed")] == FAILS
    stable = "embeddings stay stable while blocks grow (effective rank)"
    assert verdict[(stable, "patch_embed")] == HOLDS and verdict[(stable, "pos_embed")] == HOLDS
    assert verdict[(stable, "block_01")] == HOLDS
    assert (stable, "cls") not in verdict
    assert verdict[("CLS ends highest in effective rank", "cls")] == HOLDS
    assert verdict[("CLS ends lowest in spectral anisotropy", "cls")] == FAILS  # cls has the largest offset
    assert all(f.metric in series for f in findings)  # metrics the run lacks are skipped, not failed


def test_on_the_published_data_late_blocks_peak_mid_training_and_fall():
    """DESIGN.md: 'late blocks (11, 12) peak mid-training and then fall', so the rise claim reverses there."""
    paper = load_reference()
    findings = {(f.metric, f.point): f for f in evaluate_findings(paper) if f.claim == "rank_rises"}
    assert findings[("effective_rank", "block_11")].verdict == REVERSES
    assert findings[("effective_rank", "block_11")].trend.extreme_epoch == 49
    assert findings[("effective_rank", "block_12")].verdict == REVERSES
    assert findings[("effective_rank", "block_06")].verdict == HOLDS
    assert findings[("effective_rank", "cls")].verdict == HOLDS


def test_a_claims_direction_is_its_observables_spread_in_the_catalogue():
    for claim in CLAIMS:
        assert claim.direction == {"rises": "rise", "falls": "fall"}[CATALOGUE[claim.metric].spread], claim
        assert claim.observable is CATALOGUE[claim.metric]
    assert Claim("k", "s", "spectral_anisotropy").direction == "fall"
    with pytest.raises(ValueError, match="no spread"):
        Claim("k", "s", "total_variance")  # scale, not spread: no direction to claim
    with pytest.raises(ValueError, match="not in the observable catalogue"):
        Claim("k", "s", "no_such_observable")
    with pytest.raises(ValueError, match="kind"):
        Claim("k", "s", "effective_rank", "rise")  # type: ignore[arg-type]  # the old positional direction


def test_a_move_between_values_below_the_noise_floor_is_not_a_result():
    """Spectral flatness 1.15e-10 -> 1.87e-10 is +60% but both are zero to the catalogue: n/a, never 'holds'."""
    floor = CATALOGUE["spectral_flatness"].noise_floor
    assert floor > 1.87e-10
    epochs = np.arange(0, 5)
    tiny = np.linspace(1.15e-10, 1.87e-10, epochs.size)
    assert assess_trend(epochs, tiny, "rise").verdict == HOLDS  # the numbers alone would pass
    series = {"spectral_flatness": {"block_01": (epochs, tiny), "block_02": (epochs, 0.1 + 0.05 * epochs)}}
    findings = {f.point: f for f in evaluate_findings(series) if f.metric == "spectral_flatness"}
    below = findings["block_01"]
    assert below.verdict == NA and below.trend is not None and below.trend.verdict == NA
    assert below.trend.first == pytest.approx(1.15e-10) and below.trend.last == pytest.approx(1.87e-10)
    assert "below the observable's noise floor" in below.note and f"({floor:g})" in below.note
    assert findings["block_02"].verdict == HOLDS and findings["block_02"].note == ""
    one_end_above = {"spectral_flatness": {"block_01": (epochs, np.linspace(1e-10, 0.2, epochs.size))}}
    assert evaluate_findings(one_end_above)[0].verdict == HOLDS  # rising out of the floor is a result
