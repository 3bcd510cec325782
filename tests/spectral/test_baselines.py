"""Finite-sample baselines: the noise expectation matches a direct simulation, the diagonal baseline its definition."""

from __future__ import annotations

import numpy as np
import pytest

from tgo.spectral import CATALOGUE, eigendecompose, summarize
from tgo.spectral.baselines import noise_participation_ratio, noise_spectra, noise_spectrum
from tgo.spectral.catalogue import BASELINED, noise_expectation


def _direct(n_rows: int, dim: int, draws: int, seed: int) -> list[np.ndarray]:
    """Spectra of np.cov of i.i.d. N(0, I) rows: the definition the bidiagonal sampler must reproduce."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(draws):
        eigs = np.linalg.eigvalsh(np.cov(rng.standard_normal((n_rows, dim)), rowvar=False))[::-1]
        out.append(np.clip(eigs, 0.0, None))
    return out


@pytest.mark.parametrize(("n_rows", "dim"), [(1000, 64), (300, 64), (200, 16), (48, 64)])
def test_noise_expectations_agree_with_a_direct_simulation_within_one_percent(n_rows: int, dim: int):
    direct = _direct(n_rows, dim, draws=200, seed=n_rows + dim)
    for name, f in BASELINED.items():
        want = float(np.mean([f(s) for s in direct]))
        assert noise_expectation(name, n_rows, dim) == pytest.approx(want, rel=0.01), (name, n_rows, dim)


@pytest.mark.parametrize(("n_rows", "dim"), [(1000, 384), (197_000, 384), (300, 64), (30, 64)])
def test_participation_ratio_sampler_matches_the_exact_wishart_moments(n_rows: int, dim: int):
    sampled = noise_expectation("participation_ratio", n_rows, dim)
    assert sampled == pytest.approx(noise_participation_ratio(n_rows, dim), rel=0.005)


def test_the_ceilings_quoted_in_the_docs():
    """D = 384: pure noise reads ~316 / ~277 effective rank / participation ratio at 1,000 rows, ~384 at 197,000."""
    assert noise_expectation("effective_rank", 1000, 384) == pytest.approx(316, abs=1.5)
    assert noise_expectation("participation_ratio", 1000, 384) == pytest.approx(277, abs=1.5)
    assert noise_expectation("participation_ratio", 197_000, 384) == pytest.approx(383.3, abs=0.3)


def test_noise_spectra_are_seeded_sorted_and_have_n_minus_one_non_zero_values_when_n_is_small():
    a, b = noise_spectrum(50, 8, draw=3), noise_spectrum(50, 8, draw=3)
    assert np.array_equal(a, b) and np.all(np.diff(a) <= 0)
    assert not np.array_equal(noise_spectrum(50, 8, draw=4), a)
    small = noise_spectrum(5, 8)
    assert np.count_nonzero(small) == 4  # a centred covariance of 5 rows has rank 4
    assert noise_spectra(50, 8).shape == (2048, 8) and noise_spectra(50, 8, 32).shape == (32, 8)
    assert not noise_spectra(50, 8).flags.writeable


def test_diagonal_baseline_and_normalised_form():
    rng = np.random.default_rng(0)
    mix = rng.normal(size=(8, 8))
    rows = rng.normal(size=(5000, 8)) @ mix  # strongly correlated channels
    cov = np.cov(rows, rowvar=False)
    out = summarize(cov, eigendecompose(cov, len(rows)))
    variances = np.sort(np.diag(cov))[::-1]
    for name, f in BASELINED.items():
        assert out[f"{name}_diagonal"] == pytest.approx(f(variances), rel=1e-12)
        assert out[f"{name}_vs_noise"] == pytest.approx(out[name] / out[f"{name}_noise"], rel=1e-12)
        assert CATALOGUE[f"{name}_vs_noise"].spread == CATALOGUE[name].spread
    assert out["effective_rank"] < out["effective_rank_diagonal"], "correlations concentrate variance here"
    diagonal = np.diag(np.linspace(3.0, 1.0, 8))
    same = summarize(diagonal, eigendecompose(diagonal, 100))
    assert same["participation_ratio_diagonal"] == pytest.approx(same["participation_ratio"], rel=1e-12)
