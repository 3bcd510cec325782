"""Grouped jackknife: groups are stratified, the split costs nothing in exactness, and standard errors are right.

The reference for every standard error is a brute-force numpy float64 recomputation: drop a group's images,
np.cov of the rest, eigvalsh, the same observables, the textbook delete-a-group formula.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tgo.observatory import ObservationKey, summarize_accumulators
from tgo.spectral import (
    CATALOGUE,
    GroupedCovariance,
    StreamingCovariance,
    eigendecompose,
    jackknife_groups,
    jackknife_stderr,
    summarize,
)
from tgo.spectral.jackknife import combine, leave_one_group_out, moments

IMAGES, TOKENS, DIM, GROUPS = 40, 5, 6, 8


def _images(seed: int = 0) -> np.ndarray:
    """[images, tokens, dim] rows with image-level structure (tokens of an image share a mean) and an offset."""
    rng = np.random.default_rng(seed)
    image_means = rng.normal(size=(IMAGES, 1, DIM)) * np.linspace(0.5, 2.0, DIM)
    return 100.0 + image_means + rng.normal(size=(IMAGES, TOKENS, DIM)) @ np.diag(np.linspace(1.0, 0.2, DIM))


def _grouped(x: np.ndarray, group: np.ndarray, batch: int = 7) -> GroupedCovariance:
    acc = GroupedCovariance(GROUPS, DIM)
    for start in range(0, len(x), batch):
        acc.batch_groups = torch.as_tensor(group[start : start + batch])
        acc.update(torch.as_tensor(x[start : start + batch]))
    return acc


def test_groups_are_class_stratified_balanced_and_deterministic():
    labels = np.repeat(np.arange(10), 10)[np.random.default_rng(0).permutation(100)]
    group = jackknife_groups(labels, 10)
    assert np.array_equal(group, jackknife_groups(labels, 10))
    for g in range(10):
        assert np.array_equal(np.sort(labels[group == g]), np.arange(10)), "one image of every class per group"
    uneven = jackknife_groups(np.repeat(np.arange(3), [5, 4, 2]), 4)
    assert np.bincount(uneven).tolist() == [3, 3, 3, 2]  # sizes differ by at most one


def test_rows_split_into_groups_lose_nothing():
    x = _images()
    group = jackknife_groups(np.arange(IMAGES) % 4, GROUPS)
    grouped = _grouped(x, group)
    assert sum(g.n for g in grouped.groups) == IMAGES * TOKENS
    whole = StreamingCovariance(DIM)
    whole.update(torch.as_tensor(x))
    result = summarize_accumulators({"p": grouped})[ObservationKey("p")]
    np.testing.assert_allclose(result.covariance, whole.covariance().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(result.covariance, np.cov(x.reshape(-1, DIM), rowvar=False), rtol=1e-12)
    with pytest.raises(RuntimeError, match="batch_groups"):
        GroupedCovariance(2, DIM).update(torch.zeros(3, TOKENS, DIM))


def test_leave_one_group_out_moments_are_the_rest_rows_own_and_exactly_symmetric():
    x = _images(2)
    group = jackknife_groups(np.arange(IMAGES) % 5, GROUPS)
    parts = [moments(g) for g in _grouped(x, group).groups]
    for g, (cov, mean, n, _) in enumerate(leave_one_group_out(combine(parts), parts)):
        rows = x[group != g].reshape(-1, DIM)
        assert n == len(rows)
        assert np.array_equal(cov, cov.T), "the spectra's eigensolver reads one triangle: both must be the same"
        np.testing.assert_allclose(cov, np.cov(rows, rowvar=False), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(mean, rows.mean(axis=0), rtol=1e-13)


def test_standard_errors_equal_a_brute_force_leave_one_group_out_recomputation():
    x = _images(1)
    group = jackknife_groups(np.arange(IMAGES) % 5, GROUPS)
    result = summarize_accumulators({"p": _grouped(x, group)}, fit_range=(1, 4))[ObservationKey("p")]
    replicates = []
    for g in range(GROUPS):
        rows = x[group != g].reshape(-1, DIM)
        cov = np.cov(rows, rowvar=False)
        replicates.append(summarize(cov, eigendecompose(cov, len(rows)), fit_range=(1, 4)))
    checked = 0
    for metric in CATALOGUE.covariance_names:
        if metric in CATALOGUE.diagnostics:
            assert math.isnan(result.stderr[metric])
            continue
        values = np.array([r[metric] for r in replicates])
        if not np.all(np.isfinite(values)):
            continue
        want = math.sqrt((GROUPS - 1) / GROUPS * np.sum((values - values.mean()) ** 2))
        assert result.stderr[metric] == pytest.approx(want, rel=1e-9, abs=1e-12), metric
        checked += 1
    assert checked >= 25
    assert result.stderr["effective_rank"] > 0


def test_stderr_is_nan_without_groups_or_with_one():
    assert math.isnan(jackknife_stderr([1.0])) and math.isnan(jackknife_stderr([1.0, math.nan]))
    acc = StreamingCovariance(DIM)
    acc.update(torch.as_tensor(_images()))
    result = summarize_accumulators({"p": acc})[ObservationKey("p")]
    assert all(math.isnan(v) for v in result.stderr.values())


def test_jackknife_intervals_cover_the_population_value_at_their_nominal_rate():
    """200 seeded samples of a known Gaussian: the +-1.96 s.e. interval holds the population participation ratio.

    The rate is a binomial proportion: at a true 95% its standard deviation over 200 trials is 1.5%, so the bounds
    [88%, 99.5%] sit more than 4 standard deviations from the nominal level (and the trials are seeded anyway).
    Too small a standard error fails the lower bound, a grossly inflated one the upper.
    """
    population = np.array([4.0, 2.5, 1.5, 1.0, 0.6, 0.3])
    truth = float(population.sum() ** 2 / np.sum(population**2))
    rng = np.random.default_rng(2025)
    covered = 0
    trials, images, groups = 200, 400, 10
    for _ in range(trials):
        x = rng.normal(size=(images, 1, population.size)) * np.sqrt(population)
        acc = GroupedCovariance(groups, population.size)
        acc.batch_groups = torch.as_tensor(np.arange(images) % groups)
        acc.update(torch.as_tensor(x))
        result = summarize_accumulators({"p": acc})[ObservationKey("p")]
        value, se = result.observables["participation_ratio"], result.stderr["participation_ratio"]
        covered += abs(value - truth) <= 1.96 * se
    rate = covered / trials
    assert 0.88 <= rate <= 0.995, rate
