"""The findings logic as a specification: each paper claim judged on series with known trends and known noise."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from tgo.report.findings import (
    CLAIMS,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
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
from tgo.report.reference import PAPER_POINTS, load_reference
from tgo.report.verdicts import VerdictSettings
from tgo.spectral.catalogue import CATALOGUE

EPOCHS = np.arange(0, 21)
RISING = 2.0 + 0.5 * EPOCHS  # 2 -> 12, steadily
FALLING = 1.0 - 0.04 * EPOCHS  # 1 -> 0.2
RISE_THEN_FALL = 10.0 - 0.05 * (EPOCHS - 12) ** 2  # peak at epoch 12, ends 3.2 below it

# The published TGO-I series: 100 epochs, moving 0.3-8% from one epoch to the next.
PAPER_EPOCHS = np.arange(1, 101)
PAPER_NOISE = (0.003, 0.01, 0.03, 0.08)
STILL_RISING = 10.0 + 60.0 * (1.0 - np.exp(-PAPER_EPOCHS / 10.0)) + 0.15 * PAPER_EPOCHS  # like effective rank
PLATEAU = 10.0 + 60.0 * (1.0 - np.exp(-PAPER_EPOCHS / 8.0))  # flat for the last 60 epochs
PEAK_THEN_DECLINE = 3.0 + 10.0 * (1.0 - np.exp(-PAPER_EPOCHS / 3.0)) - 0.065 * PAPER_EPOCHS  # like late stable rank
TRIALS = 200


def with_noise(curve: np.ndarray, relative: float, seed: int) -> np.ndarray:
    """The curve with independent Gaussian noise of ``relative`` times its value per epoch (seeded)."""
    return curve * (1.0 + relative * np.random.default_rng(seed).standard_normal(curve.size))


def verdict_counts(curve: np.ndarray, relative: float, direction: str = "rise") -> Counter:
    return Counter(
        assess_trend(PAPER_EPOCHS, with_noise(curve, relative, seed), direction).verdict  # type: ignore[arg-type]
        for seed in range(TRIALS)
    )


# ------------------------------------------------------------------------------------------------------ trends
def test_a_steady_rise_holds_for_a_rising_claim_and_does_not_hold_for_a_falling_one():
    rise = assess_trend(EPOCHS, RISING, "rise")
    assert rise.verdict == HOLDS
    assert rise.window == 3  # 10% of 21 observations, rounded up
    assert rise.first == pytest.approx(2.5) and rise.last == pytest.approx(11.5)  # window means
    assert rise.change == pytest.approx(9.0) and rise.relative_change == pytest.approx(3.6)
    assert rise.spearman == pytest.approx(1.0)
    assert rise.peak_window == "18-20" and rise.peak_epoch == 19 and rise.drop == 0.0
    assert assess_trend(EPOCHS, RISING, "fall").verdict == FAILS


def test_a_steady_fall_holds_for_a_falling_claim_with_its_trough_window_last():
    fall = assess_trend(EPOCHS, FALLING, "fall")
    assert fall.verdict == HOLDS
    assert fall.spearman == pytest.approx(-1.0)
    assert fall.peak_window == "18-20"
    assert assess_trend(EPOCHS, FALLING, "rise").verdict == FAILS


def test_rise_then_fall_is_holds_then_reverses_with_the_peak_window():
    trend = assess_trend(EPOCHS, RISE_THEN_FALL, "rise")
    assert trend.verdict == REVERSES
    assert trend.peak_window == "12-14" and trend.peak_epoch == 13
    assert trend.peak_value == pytest.approx(np.mean(RISE_THEN_FALL[12:15]))
    assert trend.drop == pytest.approx(trend.peak_value - trend.last)
    assert "peak window epochs 12-14" in trend.note


@pytest.mark.parametrize("relative", PAPER_NOISE)
@pytest.mark.parametrize("curve", [STILL_RISING, PLATEAU], ids=["still rising", "plateau"])
def test_a_rising_series_with_the_published_noise_is_not_called_a_reversal(curve: np.ndarray, relative: float):
    """The issue's 34 spurious reversals: a dip after a one-epoch maximum is noise, and so is a plateau's peak."""
    counts = verdict_counts(curve, relative)
    assert counts[REVERSES] / TRIALS < 0.05, counts
    assert counts[HOLDS] / TRIALS > 0.5, counts


@pytest.mark.parametrize("relative", PAPER_NOISE)
def test_a_genuine_rise_then_decline_is_a_reversal_at_every_published_noise_level(relative: float):
    """The published late blocks' stable rank: 3 -> 12 in ten epochs, then a steady decline to about 6."""
    counts = verdict_counts(PEAK_THEN_DECLINE, relative)
    assert counts[REVERSES] / TRIALS > 0.95, counts
    trend = assess_trend(PAPER_EPOCHS, with_noise(PEAK_THEN_DECLINE, relative, 0), "rise")
    assert trend.verdict == REVERSES and trend.peak_window in ("1-10", "11-20")


@pytest.mark.parametrize("direction", ["rise", "fall"])
@pytest.mark.parametrize("relative", PAPER_NOISE)
def test_a_flat_noisy_series_is_inconclusive(relative: float, direction: str):
    counts = verdict_counts(np.full(PAPER_EPOCHS.size, 5.0), relative, direction)
    assert counts[INCONCLUSIVE] / TRIALS > 0.95, counts
    assert counts[REVERSES] == 0, counts
    trend = assess_trend(PAPER_EPOCHS, with_noise(np.full(PAPER_EPOCHS.size, 5.0), relative, 0), direction)  # type: ignore[arg-type]
    assert trend.verdict == INCONCLUSIVE and "within the threshold" in trend.note


def test_recorded_standard_errors_larger_than_the_scatter_make_a_small_move_inconclusive():
    values = RISING + 0.01 * np.random.default_rng(0).standard_normal(EPOCHS.size)
    assert assess_trend(EPOCHS, values, "rise").verdict == HOLDS
    judged = assess_trend(EPOCHS, values, "rise", stderr=np.full(EPOCHS.size, 5.0))
    assert judged.verdict == INCONCLUSIVE
    assert judged.uncertainty.source == "jackknife" and not judged.uncertainty.paired  # no replicates: unpaired
    assert judged.uncertainty.jackknife == pytest.approx(5.0 * math.sqrt(2))  # each window's mean error, unpaired
    assert judged.uncertainty.total == pytest.approx(
        math.hypot(judged.uncertainty.jackknife, judged.uncertainty.training)
    )
    unknown = assess_trend(EPOCHS, values, "rise", stderr=np.full(EPOCHS.size, np.nan))  # no jackknife recorded
    assert unknown.verdict == HOLDS and unknown.uncertainty.source == "training"
    assert unknown.uncertainty.training_source == "series"


def test_too_few_observations_are_na_and_two_without_standard_errors_are_inconclusive():
    assert assess_trend([0, 1], [1.0, np.nan], "rise").verdict == NA
    alone = assess_trend([0], [2.5], "fall", scale="log")  # a ratio observed once: its level, not its log
    assert alone.verdict == NA and alone.first == alone.last == 2.5
    two = assess_trend([0, 1], [1.0, 2.0], "rise")
    assert two.verdict == INCONCLUSIVE and two.note.startswith("not judged: no image-sampling error")
    assert assess_trend([0, 1], [1.0, 2.0], "rise", stderr=[0.1, 0.1]).verdict == HOLDS
    values = RISING.copy()
    values[3] = np.nan
    assert assess_trend(EPOCHS, values, "rise").n == EPOCHS.size - 1
    with pytest.raises(ValueError, match="direction"):
        assess_trend(EPOCHS, RISING, "up")  # type: ignore[arg-type]


def test_window_and_z_are_settings():
    noisy = with_noise(STILL_RISING, 0.08, 0)
    wide = assess_trend(PAPER_EPOCHS, noisy, "rise", settings=VerdictSettings(window=0.2))
    assert wide.window == 20 and wide.first == pytest.approx(noisy[:20].mean())
    strict = assess_trend(PAPER_EPOCHS, noisy, "rise", settings=VerdictSettings(z=1000.0))
    assert strict.verdict == INCONCLUSIVE


def test_seed_to_seed_spread_counts_for_a_sweeps_mean():
    """Two seeds that disagree about the direction leave their mean's rise inconclusive."""
    agree = np.array([RISING, RISING + 0.1])
    disagree = np.array([RISING + 5.0 * np.linspace(-1, 1, EPOCHS.size), RISING - 5.0 * np.linspace(-1, 1, 21)])
    assert assess_trend(EPOCHS, agree.mean(axis=0), "rise", replicates=agree).verdict == HOLDS
    judged = assess_trend(EPOCHS, disagree.mean(axis=0), "rise", replicates=disagree)
    assert judged.verdict == INCONCLUSIVE and judged.uncertainty.source == "training"
    assert judged.uncertainty.training_source.startswith("seeds")


def test_spearman_matches_scipy_including_ties():
    scipy_stats = pytest.importorskip("scipy.stats")
    x = np.array([0, 1, 2, 3, 4, 5, 6])
    y = np.array([1.0, 3.0, 3.0, 2.0, 5.0, 5.0, 4.0])
    assert spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic)
    assert math.isnan(spearman(x, np.ones(7)))


# ------------------------------------------------------------------------------------------------------ stable
def test_stable_means_within_the_relative_tolerance_beyond_the_uncertainty():
    assert assess_stable(EPOCHS, 3.0 + 0.01 * EPOCHS).verdict == HOLDS  # +6.3% between windows, noiseless
    assert assess_stable(EPOCHS, 3.0 + 0.05 * EPOCHS).verdict == FAILS  # +32%
    noisy = assess_stable(EPOCHS, 3.0 + 0.01 * EPOCHS, stderr=np.full(EPOCHS.size, 0.1))
    assert noisy.verdict == INCONCLUSIVE  # 6% ± 3 x 4.7% reaches past the ±10% band


# ------------------------------------------------------------------------------------------------------ CLS extremes
def fifteen_points(cls_final_rank: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """15 paper points that settle by epoch 10; CLS starts highest and settles at ``cls_final_rank`` (quickstart)."""
    settle = np.minimum(EPOCHS / 10, 1.0)
    others = [p for p in PAPER_POINTS if p != "cls"]
    series = {p: (EPOCHS, 1.0 + 0.5 * i * settle) for i, p in enumerate(others)}  # settle at 1, 1.5, .. 7.5
    final = 7.5 - 0.5 * (cls_final_rank - 1) + 0.25  # between two others
    series["cls"] = (EPOCHS, 10.0 + (final - 10.0) * settle)
    return series


def test_cls_that_was_highest_at_initialisation_but_ends_seventh_does_not_hold():
    verdict, note = assess_extreme(fifteen_points(7), "cls", "rise")
    assert verdict == FAILS
    assert "cls ranks 7 of 15" in note and "epochs 18-20" in note and "block_12 (highest)" in note


def test_cls_ends_highest_when_its_final_window_leads_beyond_the_uncertainty():
    verdict, note = assess_extreme(fifteen_points(1), "cls", "rise")
    assert verdict == HOLDS and "cls ranks 1 of 15" in note and "block_12 (next)" in note
    lowest = {"block_01": (EPOCHS, FALLING + 1), "cls": (EPOCHS, FALLING)}
    assert assess_extreme(lowest, "cls", "fall")[0] == HOLDS


def test_a_cls_margin_inside_the_uncertainty_is_inconclusive():
    close = {"block_01": (EPOCHS, RISING), "cls": (EPOCHS, RISING + 0.1)}
    errors = {p: (EPOCHS, np.full(EPOCHS.size, 0.5)) for p in close}
    verdict, note = assess_extreme(close, "cls", "rise", stderr=errors)
    assert verdict == INCONCLUSIVE and "cls ranks 1 of 2" in note and "within the threshold" in note


def test_cls_is_compared_only_with_points_of_the_papers_kinds():
    series = {"block_01": (EPOCHS, RISING), "cls": (EPOCHS, RISING + 1), "block_06_attn": (EPOCHS, RISING + 50)}
    verdict, note = assess_extreme(series, "cls", "rise")
    assert verdict == HOLDS and "of 2" in note and "block_06_attn" not in note


def test_cls_claims_are_judged_again_on_noise_normalised_values_when_recorded():
    points = ["block_01", "cls"]
    series = {
        "effective_rank": {"block_01": (EPOCHS, RISING), "cls": (EPOCHS, RISING + 1)},
        "effective_rank_vs_noise": {"block_01": (EPOCHS, RISING / 10), "cls": (EPOCHS, RISING / 20)},
    }
    rows = [f for f in evaluate_findings(series, points) if f.claim == "cls_extreme"]
    assert [(f.metric, f.verdict) for f in rows] == [
        ("effective_rank", HOLDS),
        ("effective_rank_vs_noise", FAILS),
    ]
    assert rows[1].statement == "CLS ends highest in effective rank relative to isotropic noise"
    assert rows[1].extreme is not None and rows[1].extreme.rank == 2 and rows[1].extreme.of == 2
    del series["effective_rank_vs_noise"]
    assert [f.metric for f in evaluate_findings(series, points) if f.claim == "cls_extreme"] == ["effective_rank"]


# ------------------------------------------------------------------------------------------------------ the table
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
    assert verdict[("effective rank rises", "patch_embed")] == HOLDS  # +1% but noiseless: a real, tiny rise
    stable = "embeddings stay stable while blocks grow (effective rank)"
    assert verdict[(stable, "patch_embed")] == HOLDS and verdict[(stable, "pos_embed")] == HOLDS
    assert verdict[(stable, "block_01")] == HOLDS
    assert (stable, "cls") not in verdict
    assert verdict[("CLS ends highest in effective rank", "cls")] == HOLDS
    assert verdict[("CLS ends lowest in spectral anisotropy", "cls")] == FAILS  # cls has the largest offset
    assert all(f.metric in series for f in findings)  # metrics the run lacks are skipped, not failed


GENUINE_REVERSALS = {
    (metric, f"block_{b:02d}")
    for metric in ("stable_rank", "participation_ratio", "spectral_anisotropy")
    for b in (9, 10, 11, 12)
}


def test_on_the_published_data_only_the_twelve_genuine_reversals_are_found():
    """Stable rank, participation ratio and anisotropy at blocks 9-12 peak (trough) at epochs 11-20 and decline.

    Everything else still rises at the end or levels off within the scatter; the old single-epoch rule called 46
    of these 107 rows reversals, 34 of them on noise (effective rank at blocks 7-9 and 11-12 among them).
    """
    findings = evaluate_findings(load_reference())
    assert len(findings) == 107
    reversed_ = {(f.metric, f.point) for f in findings if f.verdict == REVERSES}
    assert reversed_ == GENUINE_REVERSALS
    for f in findings:
        if (f.metric, f.point) in GENUINE_REVERSALS:
            assert f.trend is not None and f.trend.peak_window == "11-20", f
    by_row = {(f.claim, f.metric, f.point): f for f in findings}
    for point in ("block_07", "block_08", "block_09", "block_11", "block_12"):
        assert by_row[("rank_rises", "effective_rank", point)].verdict == HOLDS
    assert "levels off: best window epochs 51-60" in by_row[("rank_rises", "effective_rank", "block_11")].note
    assert by_row[("entropy_rises", "spectral_entropy", "block_11")].verdict == HOLDS
    assert by_row[("spectra_flatten", "spectral_flatness", "block_12")].verdict == HOLDS
    cls = by_row[("cls_extreme", "effective_rank", "cls")]
    assert cls.verdict == HOLDS and cls.extreme is not None and (cls.extreme.rank, cls.extreme.of) == (1, 15)
    for f in findings:  # no standard errors are published: every term is the series' own training noise
        assert f.trend is None or f.trend.uncertainty.training_source == "series"
        assert f.trend is None or math.isnan(f.trend.uncertainty.jackknife)


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
    epochs = np.arange(0, 9)
    tiny = np.linspace(1.15e-10, 1.87e-10, epochs.size)
    assert assess_trend(epochs, tiny, "rise").verdict == HOLDS  # the numbers alone would pass
    series = {"spectral_flatness": {"block_01": (epochs, tiny), "block_02": (epochs, 0.1 + 0.05 * epochs)}}
    findings = {f.point: f for f in evaluate_findings(series) if f.metric == "spectral_flatness"}
    below = findings["block_01"]
    assert below.verdict == NA and below.trend is not None and below.trend.verdict == NA
    assert below.trend.first == pytest.approx(tiny[0]) and below.trend.last == pytest.approx(tiny[-1])
    assert "below the observable's noise floor" in below.note and f"({floor:g})" in below.note
    assert findings["block_02"].verdict == HOLDS and "below the observable" not in findings["block_02"].note
    one_end_above = {"spectral_flatness": {"block_01": (epochs, np.linspace(1e-10, 0.2, epochs.size))}}
    assert evaluate_findings(one_end_above)[0].verdict == HOLDS  # rising out of the floor is a result
