"""The statistics of the verdict rule: windows, the scatter estimate, and the uncertainty of a window difference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tgo.report.verdicts import (
    Uncertainty,
    VerdictSettings,
    Window,
    difference,
    measured,
    scatter,
    scatter_dof,
    student_factor,
    tile_windows,
    window_width,
)


@pytest.mark.parametrize(("n", "width"), [(100, 10), (101, 11), (31, 4), (11, 2), (7, 2), (4, 2), (3, 1), (2, 1)])
def test_a_window_is_ten_percent_of_the_observations_at_least_two_and_at_most_half(n: int, width: int):
    assert window_width(n) == width


def test_window_settings_change_the_width():
    assert window_width(100, VerdictSettings(window=0.2)) == 20
    assert window_width(10, VerdictSettings(min_window=4)) == 4
    assert window_width(10, VerdictSettings(min_window=8)) == 5  # never more than half: first and last stay apart


def test_windows_tile_the_series_from_the_first_and_the_last_is_always_the_last_observations():
    assert [(w.start, w.stop) for w in tile_windows(100, 10)] == [(s, s + 10) for s in range(0, 100, 10)]
    assert [w.start for w in tile_windows(31, 4)] == [0, 4, 8, 12, 16, 20, 24, 27]
    assert tile_windows(31, 4)[-1] == Window(27, 31)


def test_the_scatter_is_the_noise_around_any_smooth_curve_even_with_uneven_epochs():
    """The difference-based estimate needs no model of the curve: a steep saturating rise does not inflate it."""
    rng = np.random.default_rng(0)
    epochs = np.concatenate([np.arange(0, 50), np.arange(50, 200, 3)])  # every epoch, then every third
    curve = 80.0 * (1.0 - np.exp(-epochs / 15.0)) + 0.05 * epochs
    estimates = [scatter(epochs, curve + 0.5 * rng.standard_normal(epochs.size)) for _ in range(200)]
    assert np.mean(estimates) == pytest.approx(0.5, rel=0.03)
    assert scatter(epochs, 3.0 + 0.2 * epochs) == pytest.approx(0.0, abs=1e-12)  # a straight line has no scatter
    assert math.isnan(scatter([0, 1], [1.0, 2.0]))


def test_the_scatter_has_about_half_the_degrees_of_freedom_of_its_residuals():
    rng = np.random.default_rng(1)
    n = 40
    variances = [scatter(np.arange(n), rng.standard_normal(n)) ** 2 for _ in range(4000)]
    measured_dof = 2.0 / np.var(variances)  # a chi-square estimate of variance 1 with nu dof has variance 2 / nu
    assert measured_dof == pytest.approx(scatter_dof(n), rel=0.1)


@pytest.mark.parametrize(("dof", "exact"), [(3, 9.2187), (5, 5.5070), (9, 4.0942), (18, 3.4754), (50, 3.1571)])
def test_the_small_sample_widening_matches_students_t(dof: int, exact: float):
    """Exact one-sided t quantiles at the tail of z = 3 (scipy.stats.t.ppf(0.99865, dof))."""
    assert 3.0 * student_factor(3.0, dof) == pytest.approx(exact, rel=0.03)


def test_the_widening_vanishes_for_known_uncertainties_and_refuses_less_than_one_degree_of_freedom():
    assert student_factor(3.0, math.inf) == 1.0
    assert student_factor(3.0, 1e6) == pytest.approx(1.0, abs=1e-5)
    assert student_factor(3.0, 0.5) == math.inf


def test_the_uncertainty_is_the_largest_available_source():
    u = Uncertainty(scatter=0.1, jackknife=0.3, seed=math.nan)
    assert u.total == 0.3 and u.source == "jackknife"
    assert Uncertainty(scatter=0.2).source == "scatter"
    assert math.isnan(Uncertainty().total) and Uncertainty().source == ""
    assert u.z(0.9) == pytest.approx(3.0)
    assert Uncertainty(scatter=0.0).z(1.0) == math.inf and Uncertainty(scatter=0.0).z(0.0) == 0.0


def test_a_difference_of_disjoint_windows_has_the_scatter_over_root_window_times_root_two():
    rng = np.random.default_rng(2)
    m = measured(np.arange(100), 5.0 + rng.standard_normal(100))
    first, last = Window(0, 10), Window(90, 100)
    value, u = difference((m, last), (m, first))
    assert value == pytest.approx(m.values[90:].mean() - m.values[:10].mean())
    expected = m.sigma * math.sqrt(2 / 10) * student_factor(3.0, m.dof)
    assert u.scatter == pytest.approx(expected) and u.total == u.scatter
    assert math.isnan(u.jackknife) and math.isnan(u.seed)


def test_observations_shared_by_two_windows_cancel():
    m = measured(np.arange(20), np.random.default_rng(3).standard_normal(20))
    _, overlapping = difference((m, Window(5, 15)), (m, Window(0, 10)))
    _, disjoint = difference((m, Window(10, 15)), (m, Window(0, 5)))
    assert overlapping.scatter == pytest.approx(disjoint.scatter * 5 / 10)  # 5 unshared of 10, weights 1/10


def test_the_jackknife_term_is_each_windows_mean_standard_error_not_divided_by_its_size():
    """Every epoch is measured on the same images, so their sampling errors do not average out."""
    epochs = np.arange(20)
    stderr = np.where(epochs < 10, 0.3, 0.4)
    m = measured(epochs, 1.0 + 0.1 * epochs, stderr=stderr)
    _, u = difference((m, Window(10, 20)), (m, Window(0, 10)))
    assert u.jackknife == pytest.approx(0.5)  # sqrt(0.3^2 + 0.4^2)
    assert u.total == u.jackknife and u.source == "jackknife"


def test_nan_standard_errors_mean_no_jackknife_information():
    epochs = np.arange(20)
    values = 1.0 + 0.1 * epochs + 0.01 * np.random.default_rng(4).standard_normal(20)
    m = measured(epochs, values, stderr=np.full(20, np.nan))
    _, u = difference((m, Window(10, 20)), (m, Window(0, 10)))
    assert math.isnan(u.jackknife) and u.total == u.scatter
    partly = measured(epochs, values, stderr=(epochs[:5], np.full(5, 0.2)))  # aligned by epoch, NaN elsewhere
    _, u = difference((partly, Window(10, 20)), (partly, Window(0, 10)))
    assert u.jackknife == pytest.approx(0.2)


def test_the_seed_term_is_the_standard_error_of_the_runs_own_differences():
    epochs = np.arange(10)
    runs = np.array([1.0 + 0.1 * epochs, 2.0 + 0.3 * epochs, 0.5 + 0.2 * epochs])
    m = measured(epochs, runs.mean(axis=0), replicates=runs)
    value, u = difference((m, Window(5, 10)), (m, Window(0, 5)))
    per_run = runs[:, 5:].mean(axis=1) - runs[:, :5].mean(axis=1)  # 0.5, 1.5, 1.0: paired by run
    assert value == pytest.approx(per_run.mean())
    assert u.seed == pytest.approx(np.std(per_run, ddof=1) / math.sqrt(3))
    assert u.source == "seed"  # the mean curve is a straight line: no scatter


def test_measured_drops_non_finite_observations_and_sorts_by_epoch():
    m = measured([3, 1, 2, 0], [3.0, 1.0, np.nan, 0.0], stderr=[0.3, 0.1, 0.2, 0.0], replicates=np.ones((2, 4)))
    assert m.epochs.tolist() == [0, 1, 3] and m.values.tolist() == [0.0, 1.0, 3.0]
    assert m.stderr.tolist() == [0.0, 0.1, 0.3] and m.replicates is not None and m.replicates.shape == (2, 3)
    with pytest.raises(ValueError, match="differ in length"):
        measured([0, 1], [1.0])


@pytest.mark.parametrize(
    "kwargs", [{"window": 0.0}, {"window": 1.5}, {"min_window": 0}, {"z": 0.0}, {"stable_tolerance": -0.1}]
)
def test_bad_settings_are_refused(kwargs: dict):
    with pytest.raises(ValueError):
        VerdictSettings(**kwargs)
