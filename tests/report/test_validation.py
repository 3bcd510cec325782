"""The verdict rule validated against known truth: required rates on seeded synthetic runs (tgo.report.validation).

Each cell draws 300 series (20 runs of 15 points, one noise regime, one shape, one run length), judges them as the
report judges a run, and compares the verdicts with the shape they were drawn from. The rates are deterministic
(seeded); docs/findings.md shows the whole table (``python -m tgo.report.validation``).

Where the rule falls short of issue 19's targets, the test pins what it reaches and says so:
* with 4 observations the pooled training noise has too few degrees of freedom (`MIN_POOLED_DOF`), so a verdict is
  about this run on these images: a flat series is called flat at about the target rate (5.3% directional) only
  when the jackknife dominates the noise;
* with 7 observations and noise dominated by training, 6% of flat series get a direction (target 5%) and monotone
  moves of 10 standard errors are found in 92-99% (target 95%);
* a reversal with 11 observations (windows of 2, the peak among 6) is found in 87-96% (target 90%) when training noise
  differs fourfold between points, and in 98-100% when they share it (issue 34); from 12 observations in at least 90%
  (the schedules' tests below say why 11 is short and what was tried);
* (met since the per-series noise of issue 34, `moderated_dispersions`: a plateau under a slow wander as large as
  the epoch noise, observed 31 times, read *holds then reverses* in 6.7% with one pooled factor; now 3.7%, held-out
  seed 2.7%.)

Seed 0 (the default) is the seed the rule was developed on; seed 1 was held out (docs/findings.md gives its rates).
"""

from __future__ import annotations

import numpy as np
import pytest

from tgo.report import validation
from tgo.report.findings import REVERSES
from tgo.report.validation import LENGTHS, REGIMES, REVERSAL_LENGTHS, SHAPES, WANDER_REGIMES, rates, simulate

TRIALS = 300
FLAT, MONOTONE, REVERSAL = SHAPES[0], SHAPES[1:5], SHAPES[5]


def _cells(shapes, lengths):
    return [
        pytest.param(shape, n, regime, id=f"{regime.name}-{shape.name.split(' (')[0]}-n{n}")
        for regime in REGIMES
        for shape in shapes
        for n in lengths
    ]


@pytest.mark.parametrize(("shape", "n", "regime"), _cells([FLAT], LENGTHS))
def test_a_flat_series_gets_a_directional_verdict_in_at_most_5_percent(shape, n, regime):
    r = rates(shape, n, regime, trials=TRIALS)
    if n < 6 and regime.name != "jackknife-dominated":
        pytest.skip("4 observations: training noise cannot be estimated; the verdict is about this run (documented)")
    assert r["directional"] <= {4: 0.055, 7: 0.06}.get(n, 0.05), r


@pytest.mark.parametrize(("shape", "n", "regime"), _cells(MONOTONE, [n for n in LENGTHS if n >= 7]))
def test_a_monotone_move_of_10_standard_errors_gets_the_right_directional_verdict(shape, n, regime):
    """``holds`` for the rises, ``does not hold`` for the fall (the claim's opposite: a contradiction)."""
    r = rates(shape, n, regime, trials=TRIALS)
    target = 0.92 if n == 7 else 0.95
    assert r["right"] >= target, r


@pytest.mark.parametrize(("shape", "n", "regime"), _cells([REVERSAL], [n for n in LENGTHS if n >= 11]))
def test_a_genuine_reversal_of_5_standard_errors_is_found(shape, n, regime):
    """Issue 34's target is 90% from 11 observations. With training noise differing fourfold between points it is
    met where the jackknife dominates (96%); where training noise is as large as the jackknife or larger, 87-90% at
    11 observations: the misses are the quietest points, whose noise the pooled estimate overstates (the next test
    shows the rate where the points share their noise, the pooling's assumption). Two causes, both measured
    (docs/findings.md): windows of 2 tiled from the first observation split the peak's plateau (t = 0.3 and 0.4 fall
    in different windows), so the drop the rule can see is 4.64 se, not 5; and 11 observations of a reversal leave
    its unimodal fit about 1.5 residual degrees of freedom per series, too few to give the quietest points a noise of
    their own (shrunk toward the pool with honest degrees of freedom: 78-96%). Windows tiled from the last observation
    find more at this peak position (88-98%) and fewer at others: over peak positions t = 0.25-0.6 both tilings find
    the same share (92.6-93.9%), 75-85% in some regime for a late peak; the peak among both tilings, with or without a
    correction for the choice, and the drop of the unimodal fit itself fare no better (docs/findings.md, items 5-7)."""
    r = rates(shape, n, regime, trials=TRIALS)
    assert r["right"] >= (0.87 if n == 11 else 0.95), r


# ------------------------------------------------------ issue 34: reversals only beyond training noise
SATURATING, PLATEAU = SHAPES[1], SHAPES[2]


def _reversal_cells(shapes, lengths):
    return [
        pytest.param(shape, n, regime, id=f"{regime.name}-{shape.name.split(' (')[0]}-n{n}")
        for regime in REGIMES + WANDER_REGIMES
        for shape in shapes
        for n in lengths
    ]


@pytest.mark.parametrize(("shape", "n", "regime"), _reversal_cells([SATURATING, PLATEAU], REVERSAL_LENGTHS))
def test_a_monotone_or_saturating_curve_reads_holds_then_reverses_in_at_most_5_percent(shape, n, regime):
    """Epoch-to-epoch wander makes dips; a reversal needs the training-noise term (never the jackknife alone), so at
    4 observations (training noise never estimated) none is called. The steady and two-phase rises never read
    reversed (docs/findings.md). From 31 observations each series' noise is its own, shrunk toward the pool
    (`tgo.report.training_noise.moderated_dispersions`): a plateau under strong wander read reversed in 6.7% with one
    pooled factor for every point, 3.7% now."""
    r = rates(shape, n, regime, trials=TRIALS)
    bound = 0.0 if n == 4 else 0.05
    assert r["holds then reverses"] <= bound, r


@pytest.mark.parametrize(("n", "regime"), [(n, regime) for regime in REGIMES + WANDER_REGIMES for n in (11, 31)])
def test_where_the_points_share_their_noise_a_genuine_reversal_is_found_in_90_percent_from_11_observations(n, regime):
    r = rates(REVERSAL, n, regime, trials=TRIALS, spread=1.0)
    assert r["right"] >= 0.90, r


@pytest.mark.parametrize(
    ("shape", "n"), [(shape, n) for shape in (FLAT, SATURATING, SHAPES[4], REVERSAL) for n in (7, 31)]
)
def test_series_without_a_jackknife_error_are_judged_on_their_pooled_relative_noise(shape, n):
    """Weight spectra and other network-level values (issue 34, finding 1): the series carry no standard error and
    are judged on training noise pooled over the points in relative units (balanced regime: the image-sampling
    term becomes more training noise). Flat: at most 5% directional; a 10 se move found in at least 95%; a reversal
    found at 31 observations (at 7 the windows are single observations and it is seldom estimated: 26%)."""
    r = rates(shape, n, REGIMES[1], trials=TRIALS, jackknife=False)
    if shape is FLAT:
        assert r["directional"] <= 0.05, r
    elif shape is REVERSAL:
        assert r["right"] >= (0.95 if n == 31 else 0.0) and r[REVERSES] >= (0.95 if n == 31 else 0.0), r
    else:
        assert r["right"] >= 0.95, r


# ------------------------------------------------------ issue 34: schedules of a short run
ALL_REGIMES = REGIMES + WANDER_REGIMES


@pytest.mark.parametrize(("n", "regime"), [(n, regime) for regime in ALL_REGIMES for n in (12, 13)])
def test_from_12_observations_genuine_reversals_are_found_in_90_percent_and_false_ones_stay_within_5(n, regime):
    """Issue 34's two targets together, where the points' noise differs fourfold: one or two observations more than
    11 put the peak's plateau in one window (the tiled windows see 4.97 and 5.00 se of the drop, not 4.64) and give
    the pool more residuals. Seed 0 here (93-99% found, at most 4.7% false); held-out seeds 1 and 5: 91-98%, at most
    4.7%."""
    found = rates(REVERSAL, n, regime, trials=TRIALS)["right"]
    false = max(rates(shape, n, regime, trials=TRIALS)[REVERSES] for shape in validation.MONOTONE)
    assert found >= 0.90 and false <= 0.05, (found, false)


def test_end_probes_are_observations_at_the_consecutive_epochs_before_the_last():
    epochs = simulate(FLAT, 11, REGIMES[1], np.random.default_rng(0), probes=4)[0]
    assert epochs.tolist() == [0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 46, 47, 48, 49, 50]
    with pytest.raises(ValueError, match="probes"):
        simulate(FLAT, 11, REGIMES[1], np.random.default_rng(0), probes=5)


@pytest.mark.parametrize("regime", ALL_REGIMES)
def test_four_end_probes_find_the_reversals_of_11_observations_but_not_the_slow_wander(regime):
    """Issue 34's alternative: 4 observations at the epochs before the last (the cost of 4 more observations) give
    the pool 4 more residuals per series, and the reversals of 11 observations are found in 92-95% (seed 0; held out:
    91-97%). But closely spaced observations see the epoch noise and not the slow wander between distant epochs, so
    the pooled noise shrinks below what a dip of the wander needs: false reversals reach 5.0% here and 5.3-6.0% on
    held-out seeds 1 and 5 (issue 34's bound: 5%), where 12 evenly spaced observations (the test above) stay within
    it. The pin is what the probes reach; the schedule is not recommended (docs/findings.md)."""
    found = rates(REVERSAL, 11, regime, trials=TRIALS, probes=4)["right"]
    false = max(rates(shape, 11, regime, trials=TRIALS, probes=4)[REVERSES] for shape in validation.MONOTONE)
    assert found >= 0.92 and false <= 0.06, (found, false)
