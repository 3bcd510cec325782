"""The training-noise estimate: the noise around a learning curve, not the curve's bend counted as noise."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import isotonic_regression

from tgo.report.training_noise import (
    MIN_OBSERVATIONS,
    pooled_dispersion,
    pooled_pseudo_residuals,
    prefix_isotonic,
    pseudo_residuals,
    robust_scale,
    series_noise,
    series_unit,
    shape_fit,
)


def saturating(t: np.ndarray, amplitude: float = 10.0) -> np.ndarray:
    return amplitude * (1.0 - np.exp(-t / 0.15))


# -------------------------------------------------------------------------------------------- the shape fit
def test_prefix_isotonic_gives_every_prefixs_least_squares_fit():
    rng = np.random.default_rng(5)
    y = rng.standard_normal(12).cumsum() * 0.3 + rng.standard_normal(12)
    rss, levels = prefix_isotonic(y)
    for m in range(1, 13):
        fit = isotonic_regression(y[:m], increasing=True).x
        assert rss[m] == pytest.approx(float(np.sum((y[:m] - fit) ** 2)), abs=1e-10)
        assert levels[m] == np.unique(np.round(fit, 12)).size


def test_the_shape_fit_is_the_best_unimodal_or_antimodal_fit_over_every_turning_point():
    """Independent reference: scipy's isotonic regression at every cut, both shapes, best by brute force."""
    rng = np.random.default_rng(6)
    for _ in range(20):
        y = rng.standard_normal(9) + np.sin(np.linspace(0, 3, 9)) * rng.uniform(0, 3)
        best = math.inf
        for sign in (1.0, -1.0):
            for m in range(10):
                up = isotonic_regression(sign * y[:m], increasing=True).x if m else np.zeros(0)
                down = isotonic_regression(sign * y[m:], increasing=False).x if m < 9 else np.zeros(0)
                best = min(best, float(np.sum((sign * y - np.concatenate([up, down])) ** 2)))
        fit = shape_fit(y)
        assert fit.rss == pytest.approx(best, abs=1e-10)
        assert float(np.sum((y - fit.values) ** 2)) == pytest.approx(best, abs=1e-10)
    rising = shape_fit(np.arange(7.0))
    assert rising.rss == 0 and rising.levels == 7


# -------------------------------------------------------------------------------------- the pooled estimate
@pytest.mark.parametrize("amplitude", [10.0, 30.0])
def test_the_pooled_estimate_follows_a_7_observation_saturating_run_where_pseudo_residuals_count_the_bend(
    amplitude: float,
):
    """Known truth: 15 points, 7 observations each, a saturating rise with noise of 1 (in jackknife units).

    The fit takes the bend, so the estimate is the noise (low by about a quarter: choosing the turning point
    absorbs a little of it, and the validation's rates include that), while the mean square of the pseudo-residuals
    (the earlier rule's scatter) is mostly the bend of the first epochs.
    """
    rng = np.random.default_rng(1)
    t = np.linspace(0, 1, 7)
    estimates, mean_squares = [], []
    for _ in range(100):
        series = [(t, saturating(t, amplitude) + rng.standard_normal(7), np.ones(7)) for _ in range(15)]
        noise = pooled_dispersion(series)
        if noise.estimated:
            estimates.append(noise.sigma)
        mean_squares.append(np.sqrt(np.mean(np.concatenate([pseudo_residuals(t, v) ** 2 for t, v, _ in series]))))
    assert len(estimates) >= 50
    assert 0.6 < np.median(estimates) < 1.05
    assert np.median(mean_squares) > (1.3 if amplitude == 10 else 2.5)


def test_a_smooth_run_that_the_fit_interpolates_leaves_the_training_noise_not_estimated():
    t = np.linspace(0, 1, 7)
    smooth = [(t, saturating(t, 100.0 + p), np.ones(7)) for p in range(15)]
    noise = pooled_dispersion(smooth)
    assert not noise.estimated and noise.series == 0


def test_pooling_is_in_units_of_each_observations_jackknife_error():
    rng = np.random.default_rng(2)
    t = np.arange(20.0)
    series = []
    for scale in (0.1, 1.0, 10.0):  # three points on very different scales, each noisy by twice its error
        j = np.full(20, scale)
        series.append((t, 0.2 * scale * np.sin(t / 3) + 2 * j * rng.standard_normal(20), j))
    noise = pooled_dispersion(series * 20)
    assert noise.relative and noise.series == 60 and 0.75 * 2.0 < noise.sigma < 1.05 * 2.0


def test_an_epoch_whose_jackknife_error_is_tiny_does_not_inflate_the_pooled_noise():
    """Issue 34, finding 3: where the images happen to agree, one epoch's jackknife error can be a hundredth of the
    others' (attention near uniform for every image). Known truth: noise of 1 in units of the typical error.
    Residuals divided by each observation's own error let that epoch dominate the pool (here by an order of
    magnitude); in units of the series' median error (`series_unit`) the estimate is the noise."""
    rng = np.random.default_rng(11)
    t = np.linspace(0, 1, 7)
    j = np.ones(7)
    j[3] = 0.01
    estimates, per_observation = [], []
    for _ in range(60):
        series = [(t, saturating(t, 10.0) + rng.standard_normal(7), j) for _ in range(15)]
        noise = pooled_dispersion(series)
        if not noise.estimated:
            continue
        estimates.append(noise.sigma)
        fits = [shape_fit(v) for _, v, _ in series]
        dof = sum(7 - f.levels for f in fits)
        per_observation.append(
            math.sqrt(
                sum(float(np.sum(((v - f.values) / j) ** 2)) for (_, v, _), f in zip(series, fits, strict=True)) / dof
            )
        )
    assert series_unit(j) == 1.0 and math.isnan(series_unit(np.array([1.0, math.nan])))
    assert len(estimates) >= 30
    assert 0.6 < np.median(estimates) < 1.1
    assert np.median(per_observation) > 5 * np.median(estimates)


def test_smooth_series_without_a_jackknife_error_are_judged_by_their_pooled_median_pseudo_residual():
    """Smooth series without a jackknife error (a weight matrix's stable rank falling threefold over 7 observations,
    most of it by the second observation) leave the shape fit nothing to pool. Known truth: noise of 1% of the level.
    The median absolute pseudo-residual, pooled in relative units, stays near it (the first epochs' bend is a
    minority of the pseudo-residuals; where it reaches the median the estimate is too large, never too small), where
    their root mean square is mostly the bend. Independent reference: second
    differences of evenly spaced observations, by hand."""
    rng = np.random.default_rng(12)
    t = np.arange(0.0, 31.0, 5.0)
    estimates, root_mean_squares = [], []
    for _ in range(40):
        series, by_hand = [], []
        for _ in range(12):
            level = rng.uniform(5, 30)
            v = level * (0.3 + 0.7 * np.exp(-t / 2.5)) * (1 + 0.01 * rng.standard_normal(7))
            unit = float(np.median(np.abs(v)))
            series.append((t, v, unit))
            by_hand.append(((v[1:-1] - (v[:-2] + v[2:]) / 2) / math.sqrt(1.5)) / unit)
        noise = pooled_pseudo_residuals(series)
        e = np.concatenate(by_hand)
        assert noise.sigma == pytest.approx(float(np.median(np.abs(e))) / 0.6744897501960817, rel=1e-12)
        assert noise.dof == pytest.approx(60 * (18 / 35) / 2.7218, rel=1e-3)
        assert noise.source == "pooled pseudo-residuals"
        estimates.append(noise.sigma)  # the late observations, where the noise is measured, are about the median
        root_mean_squares.append(math.sqrt(float(np.mean(e**2))))
    assert 0.008 < np.median(estimates) < 0.04  # the noise, or above it where the bend reaches the median
    assert np.median(root_mean_squares) > 3 * np.median(estimates)
    assert not pooled_pseudo_residuals(series[:3]).estimated  # 15 pseudo-residuals: under 10 degrees of freedom


def test_too_few_pooled_degrees_of_freedom_give_no_estimate():
    few = [(np.arange(5.0), np.array([0.0, 2.0, 1.0, 3.0, 2.5]), np.ones(5))] * 3  # 3 x 1 dof: fewer than 10
    noise = pooled_dispersion(few)
    assert not noise.estimated and noise.dof == 3 and noise.series == 3
    nan_errors = pooled_dispersion([(np.arange(8.0), np.arange(8.0)[::-1] % 3, np.full(8, math.nan))])
    assert not nan_errors.estimated and nan_errors.series == 0


# --------------------------------------------------------------------- a long series' own pseudo-residuals
def test_pseudo_residuals_vanish_on_a_straight_line_even_with_uneven_epochs():
    epochs = np.array([0.0, 1.0, 3.0, 4.0, 9.0, 10.0])
    assert np.allclose(pseudo_residuals(epochs, 2.0 - 0.5 * epochs), 0.0, atol=1e-12)
    with pytest.raises(ValueError, match="ascending"):
        pseudo_residuals([0, 2, 1], [1.0, 2.0, 3.0])


def test_pseudo_residuals_have_the_noises_standard_deviation():
    rng = np.random.default_rng(0)
    epochs = np.sort(rng.choice(200, 60, replace=False)).astype(float)
    e = np.concatenate([pseudo_residuals(epochs, 3.0 * rng.standard_normal(60)) for _ in range(200)])
    assert np.std(e) == pytest.approx(3.0, rel=0.03)


def test_the_median_pseudo_residual_of_a_long_saturating_series_is_its_noise():
    rng = np.random.default_rng(7)
    t = np.arange(100.0)
    estimates = [series_noise(t, saturating(t / 100, 50.0) + rng.standard_normal(100)).sigma for _ in range(200)]
    assert np.median(estimates) == pytest.approx(1.0, rel=0.1)


def test_the_degrees_of_freedom_match_the_spread_of_the_median_estimate():
    """``N (18/35) / 2.72``, against 2 / Var(sigma_hat^2) measured over seeded series of pure noise: the formula
    errs low (a wider Student-t threshold), by under a quarter."""
    rng = np.random.default_rng(3)
    n = 40
    variances = [robust_scale(pseudo_residuals(np.arange(n), rng.standard_normal(n)))[0] ** 2 for _ in range(4000)]
    _, dof = robust_scale(np.zeros(n - 2))
    measured_dof = 2.0 / np.var(variances)
    assert 0.75 * measured_dof < dof <= measured_dof


def test_a_short_series_gives_no_estimate_of_its_own():
    t = np.arange(MIN_OBSERVATIONS - 1.0)
    assert not series_noise(t, t**2).estimated
    assert not series_noise(np.arange(7.0), np.arange(7.0)).estimated  # 5 pseudo-residuals: less than one dof
    long = series_noise(np.arange(30.0), np.random.default_rng(4).standard_normal(30))
    assert long.estimated and long.source == "series" and long.dof == pytest.approx(28 * (18 / 35) / 2.7218, rel=1e-3)


def test_trigamma_inverse_solves_trigamma_as_a_root_finder_does():
    """Smyth's Newton iteration for the prior's degrees of freedom against scipy's bracketing root finder."""
    from scipy.optimize import brentq
    from scipy.special import polygamma

    from tgo.report.training_noise import _trigamma_inverse

    for x in (0.01, 0.3, 2.0, 50.0):
        y = _trigamma_inverse(x)
        reference = brentq(lambda t, x=x: float(polygamma(1, t)) - x, 1e-6, 1e6, xtol=1e-14, rtol=1e-14)
        assert y == pytest.approx(reference, rel=1e-7), x


def test_moderated_dispersions_shrink_each_series_toward_the_pool_as_smyths_formula_says():
    """Points whose training noise differs fourfold, observed 31 times: each series' factor is Smyth's (2004)
    posterior ``(d0 s0^2 + rss) / (d0 + nu)``, with ``d0`` and ``s0^2`` recomputed here from the series' own residual
    sums by the moment equations (scipy's root finder, not the module's Newton step); quiet points come out below the
    pooled factor and noisy ones above, each between its own factor and the prior."""
    from scipy.optimize import brentq
    from scipy.special import digamma, polygamma

    from tgo.report.training_noise import _series_dispersion, moderated_dispersions, pooled_dispersion

    rng = np.random.default_rng(7)
    epochs = np.arange(31, dtype=float)
    level = 10.0 * (1.0 - np.exp(-epochs / 6.0))
    scales = np.repeat([0.5, 1.0, 2.0], 5)  # three noise levels, fourfold apart
    series = [(epochs, level + scale * rng.standard_normal(31), np.full(31, 0.4)) for scale in scales]
    pooled, each = moderated_dispersions(series)
    assert pooled.sigma == pooled_dispersion(series).sigma

    own = [_series_dispersion(v, j) for _, v, j in series]
    s2 = np.array([rss / nu for rss, nu in own])
    nus = np.array([nu for _, nu in own])
    e = np.log(s2) - digamma(nus / 2) + np.log(nus / 2)
    excess = float(np.var(e, ddof=1) - np.mean(polygamma(1, nus / 2)))
    assert excess > 0, "the fourfold spread is beyond sampling"
    d0 = 2 * brentq(lambda t: float(polygamma(1, t)) - excess, 1e-8, 1e8, xtol=1e-14, rtol=1e-14)
    prior = float(np.exp(np.mean(e) + digamma(d0 / 2) - np.log(d0 / 2)))
    for noise, (rss, nu), own_s2 in zip(each, own, s2, strict=True):
        assert noise is not None and noise.estimated
        assert noise.sigma == pytest.approx(np.sqrt((d0 * prior + rss) / (d0 + nu)), rel=1e-6)
        assert min(own_s2, prior) <= noise.sigma**2 <= max(own_s2, prior)
        assert noise.dof == pytest.approx(min(d0 + nu, pooled.dof))
    quiet, noisy = [n.sigma for n in each[:5]], [n.sigma for n in each[-5:]]
    assert max(quiet) < pooled.sigma < min(noisy)


def test_short_series_keep_the_pooled_factor():
    """With fewer residual degrees of freedom than `MIN_OWN_DOF` (7 observations) a series' own scale is not used."""
    from tgo.report.training_noise import moderated_dispersions

    rng = np.random.default_rng(8)
    epochs = np.arange(7, dtype=float)
    series = [
        (epochs, np.log1p(epochs) + s * rng.standard_normal(7), np.full(7, 0.2)) for s in np.repeat([0.1, 0.8], 8)
    ]
    pooled, each = moderated_dispersions(series)
    assert pooled.estimated and all(noise is pooled for noise in each)
