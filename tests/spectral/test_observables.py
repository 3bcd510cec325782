"""The observables as a specification: closed forms, known answers, invariances and degenerate cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.spectral.spectral_data import METRIC_KEYS, accumulate, make_rows, power_law_spectrum, relative_errors
from tgo.spectral import (
    CATALOGUE,
    FLATNESS_FLOOR,
    StreamingCovariance,
    components_for_variance,
    cumulative_explained_variance,
    decay_curve,
    default_fit_range,
    effective_rank,
    eigendecompose,
    mean_abs_offdiag_correlation,
    offdiag_energy_fraction,
    participation_ratio,
    power_law_fit,
    singular_values,
    spectral_anisotropy,
    spectral_entropy,
    spectral_flatness,
    stable_rank,
    summarize,
)

RANK_MEASURES = (effective_rank, stable_rank, participation_ratio)
RELATIVE = dict(rel=1e-12, abs=0)


# ---------------------------------------------------------------------------------------------------- closed forms
def test_closed_forms_for_a_chosen_spectrum():
    """λ = (4, 2, 1, 1): p = (1/2, 1/4, 1/8, 1/8), H = 1.75 ln 2, everything by hand."""
    eigs = np.array([1.0, 4.0, 1.0, 2.0])  # order does not matter
    assert spectral_entropy(eigs) == pytest.approx(1.75 * math.log(2), **RELATIVE)
    assert spectral_entropy(eigs, normalized=True) == pytest.approx(1.75 * math.log(2) / math.log(4), **RELATIVE)
    assert effective_rank(eigs) == pytest.approx(2**1.75, **RELATIVE)
    assert stable_rank(eigs) == pytest.approx(8 / 4, **RELATIVE)
    assert participation_ratio(eigs) == pytest.approx(64 / 22, **RELATIVE)
    assert spectral_anisotropy(eigs) == pytest.approx(4 / 8, **RELATIVE)
    assert spectral_flatness(eigs) == pytest.approx(8**0.25 / 2, **RELATIVE)
    assert [components_for_variance(eigs, f) for f in (0.5, 0.75, 0.8, 0.9, 1.0)] == [1, 2, 3, 4, 4]
    np.testing.assert_allclose(decay_curve(eigs), [1, 0.5, 0.25, 0.25])
    np.testing.assert_allclose(cumulative_explained_variance(eigs), [0.5, 0.75, 0.875, 1.0])
    np.testing.assert_allclose(singular_values(eigs, 5), [2, math.sqrt(2), 1, 1])
    np.testing.assert_allclose(singular_values(eigs, 5, convention="data"), [4, math.sqrt(8), 2, 2])


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.3])
def test_power_law_recovers_an_exact_power_law(alpha: float):
    eigs = 7.0 * np.arange(1, 101, dtype=np.float64) ** -alpha
    got_alpha, r2 = power_law_fit(eigs)
    assert got_alpha == pytest.approx(alpha, rel=1e-12) and r2 == pytest.approx(1.0, abs=1e-12)
    # a range restricted to the bend of a non-power law gives a different, honest r2 < 1
    bent = np.concatenate([eigs[:50], eigs[50:] * np.linspace(1, 1e-3, 50)])
    assert power_law_fit(bent, start=1, stop=100)[1] < 0.999
    assert power_law_fit(bent, start=1, stop=50)[0] == pytest.approx(alpha, rel=1e-12)


def test_power_law_default_range_and_validation():
    assert default_fit_range(384) == (1, 192) and default_fit_range(3) == (1, 2)
    assert power_law_fit(np.ones(10)) == (0.0, 1.0)  # flat spectrum: alpha 0, perfect fit
    assert all(math.isnan(v) for v in power_law_fit(np.array([1.0, 0.0, 0.0])))  # one usable point
    with pytest.raises(ValueError, match="start"):
        power_law_fit(np.ones(4), start=0)
    with pytest.raises(ValueError, match="stop"):
        power_law_fit(np.ones(4), start=3, stop=2)


def test_power_law_ignores_numerically_zero_eigenvalues():
    eigs = np.concatenate([np.arange(1, 11, dtype=np.float64) ** -1.0, [1e-19, 1e-20]])
    assert power_law_fit(eigs, stop=12)[0] == pytest.approx(1.0, rel=1e-12)


def test_components_tolerate_cumulative_round_off():
    assert components_for_variance(np.full(10, 0.1), 0.9) == 9
    assert components_for_variance(np.full(3, 1 / 3), 1.0) == 3
    with pytest.raises(ValueError, match="fraction"):
        components_for_variance(np.ones(3), 0.0)


def test_offdiag_measures_closed_form():
    cov = np.array([[4.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 9.0]])
    assert offdiag_energy_fraction(cov) == pytest.approx(8 / (16 + 1 + 81 + 8), **RELATIVE)
    # correlations: corr01 = 2 / (2 * 1) = 1, the others 0 -> mean over 6 off-diagonal entries = 2 / 6
    assert mean_abs_offdiag_correlation(cov) == pytest.approx(2 / 6, **RELATIVE)
    assert offdiag_energy_fraction(np.diag([1.0, 2.0])) == 0.0
    assert mean_abs_offdiag_correlation(torch.diag(torch.tensor([1.0, 2.0]))) == 0.0


def test_zero_variance_dimensions_are_excluded_from_correlation():
    cov = np.array([[1.0, 0.5, 0.0], [0.5, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert mean_abs_offdiag_correlation(cov) == pytest.approx(0.5, **RELATIVE)
    assert math.isnan(mean_abs_offdiag_correlation(np.diag([1.0, 0.0])))


def test_singular_value_conventions_match_the_centred_data_matrix():
    x = make_rows(50, power_law_spectrum(6), massive=1, seed=5).astype(np.float64)
    acc = accumulate(x)
    spectrum = eigendecompose(acc.covariance(), acc.n)
    svd = np.linalg.svd(x - x.mean(0), compute_uv=False)
    np.testing.assert_allclose(singular_values(spectrum.eigenvalues, acc.n, convention="data"), svd, rtol=1e-9)
    np.testing.assert_allclose(singular_values(spectrum.eigenvalues, acc.n), svd / math.sqrt(49), rtol=1e-9)
    with pytest.raises(ValueError, match="convention"):
        singular_values(spectrum.eigenvalues, acc.n, convention="svd")


# ---------------------------------------------------------------------------------------------------- known answers
def test_isotropic_gaussian_has_effective_rank_close_to_d():
    dim, n = 32, 20000
    x = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
    acc = accumulate(x, batch_rows=4096)
    out = summarize(acc.covariance(), eigendecompose(acc.covariance(), acc.n))
    # Sampling noise (Marchenko-Pastur, D/n = 0.0016) keeps them below D: hardly for the entropy-based effective rank,
    # more for stable rank, whose top eigenvalue is inflated by (1 + sqrt(D/n))^2 ~ 1.08.
    assert 0.995 * dim < out["effective_rank"] <= dim
    assert 0.98 * dim < out["participation_ratio"] <= dim
    assert 0.9 * dim < out["stable_rank"] <= dim
    assert out["spectral_entropy_normalized"] > 0.999 and out["spectral_flatness"] > 0.99
    assert out["components_99"] >= 0.95 * dim


def _k_orthogonal_directions(k: int, dim: int, n: int = 200, seed: int = 0) -> np.ndarray:
    """Rows whose sample covariance has exactly k equal non-zero eigenvalues (whitened scores on orthonormal axes)."""
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal((n, k))
    scores -= scores.mean(0)
    scores, _ = np.linalg.qr(scores)  # orthonormal, zero-mean columns
    axes, _ = np.linalg.qr(rng.standard_normal((dim, k)))
    return 3.0 * scores @ axes.T + rng.standard_normal(dim) * 100


@pytest.mark.parametrize("k", [1, 2, 5, 12])
def test_k_equal_variance_directions_give_rank_k_everywhere(k: int):
    dim = 16
    acc = accumulate(_k_orthogonal_directions(k, dim))
    out = summarize(acc.covariance(), eigendecompose(acc.covariance(), acc.n))
    for key in ("effective_rank", "stable_rank", "participation_ratio"):
        assert out[key] == pytest.approx(k, rel=1e-9), key
    assert out["spectral_anisotropy"] == pytest.approx(1 / k, rel=1e-9)
    assert out["spectral_entropy"] == pytest.approx(math.log(k), abs=1e-9)
    assert out["components_99"] == k and out["components_90"] == math.ceil(0.9 * k - 1e-9)


# ---------------------------------------------------------------------------------------------------- invariances
BASIS_DEPENDENT = ("offdiag_energy_fraction", "mean_abs_offdiag_correlation", "total_correlation")  # + *_diagonal
SPECTRAL_KEYS = tuple(k for k in METRIC_KEYS if k not in BASIS_DEPENDENT and not k.endswith("_diagonal"))
INVARIANT_KEYS = tuple(k for k in SPECTRAL_KEYS if k not in ("total_variance", "top_eigenvalue"))
BASE = make_rows(2000, power_law_spectrum(20, 1.2), massive=2, seed=9)


def _summary_of(x: np.ndarray) -> dict[str, float]:
    acc = accumulate(x, batch_rows=300)
    return summarize(acc.covariance(), eigendecompose(acc.covariance(), acc.n))


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_orthogonal_rotation_leaves_spectral_observables_unchanged(seed: int):
    """Everything computed from eigenvalues is basis free; the diagonality measures are not, by design."""
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((20, 20)))
    base = BASE.astype(np.float64)
    errors = relative_errors(_summary_of(base @ q.T), _summary_of(base), SPECTRAL_KEYS)
    assert max(errors.values()) <= 1e-9, errors


@settings(max_examples=10, deadline=None)
@given(scale=st.floats(1e-3, 1e3), seed=st.integers(0, 2**16))
def test_global_scaling_and_translation(scale: float, seed: int):
    """Ratios do not see a global scale (total variance scales by s^2); nothing sees a translation, even a huge one."""
    base = BASE.astype(np.float64)
    shift = np.random.default_rng(seed).standard_normal(20) * 1e4
    want = _summary_of(base)
    got = _summary_of(scale * base + shift)
    errors = relative_errors(got, want, (*INVARIANT_KEYS, "offdiag_energy_fraction", "mean_abs_offdiag_correlation"))
    assert max(errors.values()) <= 1e-9, errors
    assert got["total_variance"] == pytest.approx(scale**2 * want["total_variance"], rel=1e-9)


def test_feature_permutation_leaves_diagonality_unchanged():
    perm = np.random.default_rng(1).permutation(20)
    errors = relative_errors(_summary_of(BASE[:, perm]), _summary_of(BASE), METRIC_KEYS)
    assert max(errors.values()) <= 1e-9, errors


def test_rotation_changes_diagonality_as_documented():
    """An axis-aligned covariance is diagonal; rotating the same spectrum makes it dense."""
    aligned = make_rows(2000, power_law_spectrum(20, 1.2), massive=0, rotate=False, seed=2)
    assert _summary_of(aligned)["offdiag_energy_fraction"] < 0.05
    assert _summary_of(BASE)["offdiag_energy_fraction"] > 0.2


# ---------------------------------------------------------------------------------------------------- degenerate cases
def test_zero_total_variance_gives_nan_ratios_and_real_totals():
    acc = StreamingCovariance(5)
    acc.update(torch.full((10, 5), 3.25))  # constant rows
    out = summarize(acc.covariance(), eigendecompose(acc.covariance(), acc.n))
    assert out["total_variance"] == 0 and out["top_eigenvalue"] == 0 and out["n_rows"] == 10
    # The noise baselines depend on the shape (N, D) only, so they stay defined; everything else is a ratio.
    baselines = [k for k in METRIC_KEYS if k.endswith("_noise") and not k.endswith("_vs_noise")]
    ratios = [k for k in METRIC_KEYS if k not in ("total_variance", "top_eigenvalue", *baselines)]
    assert all(math.isnan(out[k]) for k in ratios), {k: out[k] for k in ratios}
    assert len(baselines) == 5 and all(out[k] > 0 for k in baselines)
    zeros = np.zeros(5)
    assert all(math.isnan(f(zeros)) for f in (*RANK_MEASURES, spectral_entropy, spectral_anisotropy, spectral_flatness))
    assert math.isnan(components_for_variance(zeros, 0.9)) and np.isnan(decay_curve(zeros)).all()
    assert np.isnan(cumulative_explained_variance(zeros)).all()
    assert math.isnan(offdiag_energy_fraction(np.zeros((3, 3))))


def test_single_dimension_edge_case():
    assert effective_rank([2.0]) == 1.0 and math.isnan(spectral_entropy([2.0], normalized=True))


def test_fewer_rows_than_dimensions_is_rank_deficient_and_flatness_hits_the_floor():
    dim, n = 30, 10
    acc = accumulate(make_rows(n, power_law_spectrum(dim), massive=2, seed=4))
    spectrum = eigendecompose(acc.covariance(), acc.n)
    assert np.all(spectrum.eigenvalues[n - 1 :] == 0) and np.all(spectrum.eigenvalues[: n - 1] > 0)
    out = summarize(acc.covariance(), spectrum)
    assert out["effective_rank"] <= n - 1 and out["components_99"] <= n - 1
    geometric = math.exp((np.log(spectrum.eigenvalues[: n - 1]).sum() + (dim - n + 1) * math.log(FLATNESS_FLOOR)) / dim)
    assert out["spectral_flatness"] == pytest.approx(geometric / spectrum.eigenvalues.mean(), rel=1e-12)


def test_undefined_spectra_give_nan_observables_with_real_counts():
    acc = StreamingCovariance(4)
    acc.update(torch.tensor([[1.0, 2.0, 3.0, 4.0], [float("nan"), 0, 0, 0]]))
    out = summarize(acc.covariance(), eigendecompose(acc.covariance(), acc.n, acc.n_nonfinite))
    assert (out["n_rows"], out["n_nonfinite"], out["n_clamped"]) == (1.0, 1.0, 0.0)
    assert all(math.isnan(out[k]) for k in METRIC_KEYS)
    nan_eigs = np.full(4, np.nan)
    ratio_functions = (*RANK_MEASURES, spectral_entropy, spectral_anisotropy, spectral_flatness)
    assert all(math.isnan(f(nan_eigs)) for f in ratio_functions)


def test_negative_eigenvalues_are_rejected_with_a_pointer_to_eigendecompose():
    with pytest.raises(ValueError, match="eigendecompose"):
        effective_rank(np.array([1.0, -1e-3]))
    with pytest.raises(ValueError, match="1-D"):
        stable_rank(np.ones((2, 2)))


def test_summary_keys_are_the_stable_observable_list():
    out = _summary_of(BASE)
    assert tuple(out) == CATALOGUE.covariance_names and all(isinstance(v, float) for v in out.values())


# ----------------------------------------------------------------------------------------------- total correlation
def test_total_correlation_of_an_equicorrelated_gaussian_has_its_closed_form():
    """R = (1 - rho) I + rho 11^T has det (1 - rho)^(D-1) (1 + (D-1) rho); TC = -1/2 ln det R, whatever the scales."""
    from tgo.spectral import total_correlation

    dim, rho = 12, 0.3
    corr = (1 - rho) * np.eye(dim) + rho * np.ones((dim, dim))
    scales = np.linspace(0.5, 40.0, dim)
    cov = corr * np.outer(scales, scales)
    want = -0.5 * ((dim - 1) * math.log(1 - rho) + math.log(1 + (dim - 1) * rho))
    eigs = eigendecompose(cov, 10_000).eigenvalues
    assert total_correlation(cov, eigs) == pytest.approx(want, rel=1e-12)
    identity_like = np.diag(scales**2)
    assert total_correlation(identity_like, eigendecompose(identity_like, 100).eigenvalues) == pytest.approx(
        0.0, abs=1e-12
    )


def test_total_correlation_matches_slogdet_on_sampled_data_and_is_nan_when_singular():

    rows = np.random.default_rng(3).normal(size=(500, 9)) @ np.random.default_rng(4).normal(size=(9, 9))
    cov = np.cov(rows, rowvar=False)
    want = 0.5 * (np.sum(np.log(np.diag(cov))) - np.linalg.slogdet(cov)[1])
    out = summarize(cov, eigendecompose(cov, len(rows)))
    assert out["total_correlation"] == pytest.approx(want, rel=1e-9)
    singular = np.cov(rows[:5], rowvar=False)  # 5 rows in 9 dimensions: rank 4
    assert math.isnan(summarize(singular, eigendecompose(singular, 5))["total_correlation"])
