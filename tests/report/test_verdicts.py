"""The statistics of the verdict rule: windows, contrasts, the paired jackknife, training noise, seeds and the FDR."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from tgo.report.training_noise import TrainingNoise
from tgo.report.verdicts import (
    Measured,
    Uncertainty,
    VerdictSettings,
    Window,
    contrast,
    control_fdr,
    difference,
    margin_series,
    measured,
    significant,
    student_factor,
    tile_windows,
    window_width,
)
from tgo.spectral import jackknife_stderr


@pytest.mark.parametrize(("n", "width"), [(100, 10), (101, 11), (31, 4), (11, 2), (10, 1), (7, 1), (4, 1), (2, 1)])
def test_a_window_is_ten_percent_of_the_observations_so_a_short_run_compares_single_observations(n: int, width: int):
    assert window_width(n) == width


def test_window_settings_change_the_width():
    assert window_width(100, VerdictSettings(window=0.2)) == 20
    assert window_width(10, VerdictSettings(min_window=4)) == 4
    assert window_width(10, VerdictSettings(min_window=8)) == 5  # never more than half: first and last stay apart


def test_windows_tile_the_series_from_the_first_and_the_last_is_always_the_last_observations():
    assert [(w.start, w.stop) for w in tile_windows(100, 10)] == [(s, s + 10) for s in range(0, 100, 10)]
    assert [w.start for w in tile_windows(31, 4)] == [0, 4, 8, 12, 16, 20, 24, 27]
    assert tile_windows(31, 4)[-1] == Window(27, 31)


# ------------------------------------------------------------------------------------------- the paired jackknife
def grouped_images(rng: np.random.Generator, groups: int = 10, per_group: int = 20) -> np.ndarray:
    """``[groups * per_group]`` image effects: what makes every observation of one analysis subset err alike."""
    return rng.standard_normal(groups * per_group)


def test_the_paired_jackknife_of_a_contrast_is_the_jackknife_of_the_contrast_recomputed_without_each_group():
    """Independent reference: leave each group of images out, recompute both epochs' statistic from the images,
    take the contrast, and apply the delete-a-group formula to those contrasts directly."""
    rng = np.random.default_rng(0)
    groups, per_group = 10, 20
    image = grouped_images(rng, groups, per_group)
    group_of = np.repeat(np.arange(groups), per_group)
    epochs = np.array([0.0, 5.0, 10.0])
    # the statistic at each epoch: a mean over images of an epoch-specific response (the images are shared)
    response = np.stack([1.0 + e / 10 + (1.0 - e / 20) * image + 0.1 * rng.standard_normal(image.size) for e in epochs])
    values = response.mean(axis=1)
    leave_out = np.stack([[r[group_of != g].mean() for g in range(groups)] for r in response])  # [E, G]
    stderr = np.array([jackknife_stderr(row) for row in leave_out])
    m = measured(epochs, values, stderr=stderr, leave_out=leave_out)
    value, u = difference(m, Window(2, 3), Window(0, 1))
    brute = [response[2][group_of != g].mean() - response[0][group_of != g].mean() for g in range(groups)]
    assert value == pytest.approx(values[2] - values[0], abs=1e-15)
    assert u.paired and u.jackknife == pytest.approx(jackknife_stderr(brute), rel=1e-12)
    assert u.jackknife_dof == groups - 1
    unpaired = math.hypot(stderr[0], stderr[2])
    assert u.jackknife < 0.6 * unpaired  # what the two epochs share (the same images) cancels


def test_the_paired_jackknife_has_the_spread_of_the_contrast_over_fresh_image_draws():
    """Known truth: over many draws of the analysis images, the paired standard error matches the actual spread of
    the contrast, while the unpaired one (independent epochs) overstates it."""
    rng = np.random.default_rng(1)
    groups, per_group = 10, 20
    group_of = np.repeat(np.arange(groups), per_group)
    contrasts, paired, unpaired = [], [], []
    for _ in range(400):
        image = grouped_images(rng, groups, per_group)
        response = np.stack([image, 0.8 * image + 0.3 * rng.standard_normal(image.size)])
        leave_out = np.stack([[r[group_of != g].mean() for g in range(groups)] for r in response])
        stderr = np.array([jackknife_stderr(row) for row in leave_out])
        m = measured([0, 1], response.mean(axis=1), stderr=stderr, leave_out=leave_out)
        value, u = difference(m, Window(1, 2), Window(0, 1))
        contrasts.append(value)
        paired.append(u.jackknife)
        unpaired.append(math.hypot(*stderr))
    assert np.sqrt(np.mean(np.square(paired))) == pytest.approx(np.std(contrasts), rel=0.12)
    assert np.mean(unpaired) > 2.5 * np.std(contrasts)


def test_records_without_replicates_fall_back_to_each_windows_mean_error_unpaired():
    """Every epoch is measured on the same images, so their sampling errors do not average out within a window."""
    epochs = np.arange(20)
    stderr = np.where(epochs < 10, 0.3, 0.4)
    m = measured(epochs, 1.0 + 0.1 * epochs, stderr=stderr)
    _, u = difference(m, Window(10, 20), Window(0, 10))
    assert u.jackknife == pytest.approx(0.5) and not u.paired  # sqrt(0.3^2 + 0.4^2)
    assert "unpaired" in u.describe()


def test_nan_standard_errors_mean_no_jackknife_information():
    epochs = np.arange(20)
    values = 1.0 + 0.1 * epochs + 0.01 * np.random.default_rng(4).standard_normal(20)
    m = measured(epochs, values, stderr=np.full(20, np.nan))
    _, u = difference(m, Window(10, 20), Window(0, 10))
    assert math.isnan(u.jackknife) and u.total == pytest.approx(u.training)
    partly = measured(epochs, values, stderr=(epochs[:5], np.full(5, 0.2)))  # aligned by epoch, NaN elsewhere
    _, u = difference(partly, Window(0, 5), Window(0, 1))
    assert u.jackknife == pytest.approx(0.2 * math.sqrt(2))


# ----------------------------------------------------------------------------------------- combining the terms
def test_the_two_terms_add_in_quadrature_and_the_larger_one_is_named():
    u = Uncertainty(
        jackknife=0.3, paired=True, jackknife_dof=9, training=0.4, training_source="pooled", training_dof=30
    )
    assert u.total == pytest.approx(0.5) and u.source == "training"
    welch = 0.5**4 / (0.3**4 / 9 + 0.4**4 / 30)  # Welch-Satterthwaite
    assert u.dof == pytest.approx(welch)
    assert u.z(1.5) == pytest.approx(3.0)
    assert u.threshold(3.0) == pytest.approx(0.5 * stats.t.isf(stats.norm.sf(3.0), welch))
    assert u.p(1.5) == pytest.approx(2 * stats.t.sf(3.0, welch))
    alone = Uncertainty(jackknife=0.2, paired=True, jackknife_dof=9)
    assert alone.total == 0.2 and not alone.training_estimated and "training noise not estimated" in alone.describe()
    assert math.isnan(Uncertainty().total) and Uncertainty().source == ""
    assert Uncertainty(training=0.0, training_source="series", training_dof=5).z(1.0) == math.inf


@pytest.mark.parametrize(("dof", "exact"), [(3, 9.2187), (5, 5.5070), (9, 4.0942), (18, 3.4754), (50, 3.1571)])
def test_the_small_sample_widening_is_students_t(dof: int, exact: float):
    """One-sided t quantiles at the tail of z = 3 (tables of Student's t)."""
    assert 3.0 * student_factor(3.0, dof) == pytest.approx(exact, rel=1e-4)
    assert student_factor(3.0, math.inf) == 1.0 and student_factor(3.0, 0.5) == math.inf


def test_significance_is_one_sided_beyond_the_widened_threshold():
    u = Uncertainty(jackknife=1.0, paired=True, jackknife_dof=math.inf)
    assert significant(3.01, u, 3.0) and not significant(2.99, u, 3.0) and not significant(-5.0, u, 3.0)
    assert not significant(1.0, Uncertainty(), 3.0)


def test_the_seed_term_is_the_standard_error_of_the_runs_own_differences():
    epochs = np.arange(10)
    runs = np.array([1.0 + 0.1 * epochs, 2.0 + 0.3 * epochs, 0.5 + 0.2 * epochs])
    m = measured(epochs, runs.mean(axis=0), replicates=runs)
    value, u = difference(m, Window(5, 10), Window(0, 5))
    per_run = runs[:, 5:].mean(axis=1) - runs[:, :5].mean(axis=1)  # 0.5, 1.5, 1.0: paired by run
    assert value == pytest.approx(per_run.mean())
    # the mean curve is a straight line: its own noise is 0 with 4.3 dof, pooled with the seeds' 2 by dof
    own_dof = 8 * (18 / 35) / 2.7218
    seeds = np.std(per_run, ddof=1) / math.sqrt(3)
    assert u.training_source == "seeds+series"
    assert u.training == pytest.approx(math.sqrt(2 * seeds**2 / (2 + own_dof)), rel=1e-3)


def test_a_pooled_dispersion_scales_with_each_observations_jackknife_error():
    m = measured(np.arange(4), [0.0, 1.0, 2.0, 3.0], stderr=[0.1, 0.1, 0.2, 0.2])
    pooled = Measured(m.epochs, m.values, m.stderr, None, None, TrainingNoise(2.0, 40.0, True, 15), m.scale)
    _, u = difference(pooled, Window(3, 4), Window(0, 1))
    assert u.training == pytest.approx(2.0 * math.hypot(0.1, 0.2)) and u.training_source == "pooled"


def test_margin_series_pairs_two_points_epoch_by_epoch_and_replicate_by_replicate():
    rng = np.random.default_rng(5)
    shared = rng.standard_normal((6, 10))  # the images both points see
    x = measured(np.arange(6), 5 + shared.mean(axis=1), stderr=np.full(6, 0.3), leave_out=5 + shared)
    y = measured(np.arange(1, 6), 4 + shared[1:].mean(axis=1), stderr=np.full(5, 0.3), leave_out=4 + shared[1:])
    margin = margin_series(x, y)
    assert margin.epochs.tolist() == [1, 2, 3, 4, 5]
    np.testing.assert_allclose(margin.values, 1.0)
    value, u = contrast(margin, np.r_[0, 0, 0, 0, 1.0])
    assert value == pytest.approx(1.0) and u.paired and u.jackknife == pytest.approx(0.0, abs=1e-12)


def test_log_scale_judges_log_ratios_with_log_replicates_and_delta_method_errors():
    m = measured([0, 1], [2.0, 20.0], stderr=[0.2, 1.0], leave_out=[[2.1, 1.9], [21.0, 19.0]], scale="log")
    np.testing.assert_allclose(m.values, np.log([2.0, 20.0]))
    np.testing.assert_allclose(m.stderr, [0.1, 0.05])
    value, u = difference(m, Window(1, 2), Window(0, 1))
    assert value == pytest.approx(math.log(10.0))
    loo = np.log([21.0 / 2.1, 19.0 / 1.9])
    assert u.jackknife == pytest.approx(jackknife_stderr(loo))
    assert measured([0, 1, 2], [1.0, -1.0, 3.0], scale="log").n == 2  # a non-positive ratio has no log


def test_measured_drops_non_finite_observations_and_sorts_by_epoch():
    m = measured(
        [3, 1, 2, 0],
        [3.0, 1.0, np.nan, 0.0],
        stderr=[0.3, 0.1, 0.2, 0.0],
        replicates=np.ones((2, 4)),
        leave_out=np.arange(8.0).reshape(4, 2),
    )
    assert m.epochs.tolist() == [0, 1, 3] and m.values.tolist() == [0.0, 1.0, 3.0]
    assert m.stderr.tolist() == [0.0, 0.1, 0.3] and m.replicates is not None and m.replicates.shape == (2, 3)
    assert m.leave_out is not None and m.leave_out.tolist() == [[6.0, 7.0], [2.0, 3.0], [0.0, 1.0]]
    aligned = measured([0, 5], [1.0, 2.0], leave_out=([5, 9], [[1.0, 2.0], [3.0, 4.0]]))
    assert aligned.leave_out is not None and np.isnan(aligned.leave_out[0]).all()
    assert aligned.leave_out[1].tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="differ in length"):
        measured([0, 1], [1.0])
    with pytest.raises(ValueError, match="scale"):
        measured([0, 1], [1.0, 2.0], scale="sqrt")


# ----------------------------------------------------------------------------------------- false discoveries
def test_q_values_are_benjamini_hochberg_over_the_rows_with_a_p_value():
    p = [0.01, 0.04, np.nan, 0.03, 0.2]
    q = control_fdr(p)
    # by hand: sorted 0.01, 0.03, 0.04, 0.2 (m = 4): q = min over later ranks of p * m / rank
    expected = {0: 0.04, 3: 0.04 * 4 / 3, 1: 0.04 * 4 / 3, 4: 0.2}
    for i, value in expected.items():
        assert q[i] == pytest.approx(min(value, 1.0))
    assert math.isnan(q[2])
    assert control_fdr([]).size == 0


@pytest.mark.parametrize(
    "kwargs",
    [{"window": 0.0}, {"window": 1.5}, {"min_window": 0}, {"z": 0.0}, {"stable_tolerance": -0.1}, {"fdr": 0.0}],
)
def test_bad_settings_are_refused(kwargs: dict):
    with pytest.raises(ValueError):
        VerdictSettings(**kwargs)


def test_a_series_names_what_its_recorded_errors_are():
    """The first term of the uncertainty is named after what the catalogue says the recorded error is: the image
    jackknife, an estimator's own fit error (WeightWatcher's alpha) or a spread over a few fixed images (topology,
    block Jacobians), in ``uncertainty_source`` and the notes."""
    import dataclasses

    import tgo.observatory.families  # noqa: F401  (registers the families' catalogue entries)
    from tgo.report.findings import sampling_of

    assert sampling_of("effective_rank") == "jackknife" and sampling_of("effective_rank_noise") == "jackknife"
    assert sampling_of("weight_alpha") == "fit"
    assert sampling_of("topology_betti_h0") == "spread" and sampling_of("block_jacobian_condition") == "spread"
    assert sampling_of("not_in_the_catalogue") == "jackknife"
    series = measured([0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0], stderr=[0.1, 0.1, 0.1, 0.1])
    _, u = contrast(dataclasses.replace(series, sampling="spread"), [-1, 0, 0, 1])
    assert u.source == "spread" and u.describe().startswith("spread ")
    _, u = contrast(series, [-1, 0, 0, 1])
    assert u.source == "jackknife" and u.describe().startswith("J ")
