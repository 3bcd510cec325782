"""eigendecompose and summarize: float64, descending, clamping reported, degenerate inputs documented."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from tgo.spectral import CATALOGUE, Spectrum, eigendecompose, summarize


def test_descending_float64_from_any_input_type():
    cov32 = torch.diag(torch.tensor([1.0, 3.0, 2.0]))
    spectrum = eigendecompose(cov32, n_rows=10)
    assert spectrum.eigenvalues.dtype == np.float64 and spectrum.eigenvalues.tolist() == [3.0, 2.0, 1.0]
    assert (spectrum.n_rows, spectrum.n_nonfinite, spectrum.n_clamped, spectrum.most_negative) == (10, 0, 0, 0.0)


def test_negative_round_off_is_clamped_and_reported():
    q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((4, 4)))
    cov = q @ np.diag([5.0, 1.0, -1e-15, -3e-14]) @ q.T
    spectrum = eigendecompose(cov, n_rows=100)
    assert spectrum.n_clamped == 2 and spectrum.most_negative == pytest.approx(-3e-14, rel=1e-3)
    assert np.all(spectrum.eigenvalues >= 0) and spectrum.eigenvalues[-2:].tolist() == [0.0, 0.0]


def test_asymmetric_round_off_is_symmetrised_first():
    cov = np.array([[2.0, 1.0 + 1e-9], [1.0 - 1e-9, 2.0]])
    np.testing.assert_allclose(eigendecompose(cov, 5).eigenvalues, [3.0, 1.0], rtol=1e-15)


def test_structural_zeros_beyond_rank_n_minus_1():
    cov = np.diag([3.0, 2.0, 1e-17, 2e-17])  # pretend 3 rows: rank <= 2, the rest is round-off
    assert eigendecompose(cov, 3).eigenvalues.tolist() == [3.0, 2.0, 0.0, 0.0]


@pytest.mark.parametrize("n_rows, bad", [(1, None), (0, None), (10, float("nan")), (10, float("inf"))])
def test_undefined_covariances_give_nan_spectra_not_exceptions(n_rows: int, bad: float | None):
    cov = np.eye(3)
    if bad is not None:
        cov[0, 1] = bad
    spectrum = eigendecompose(cov, n_rows, n_nonfinite=4)
    assert np.isnan(spectrum.eigenvalues).all() and not spectrum.is_defined
    assert (spectrum.n_rows, spectrum.n_nonfinite, spectrum.n_clamped) == (n_rows, 4, 0)
    assert math.isnan(spectrum.most_negative)
    out = summarize(cov, spectrum)
    assert out["n_nonfinite"] == 4 and all(
        math.isnan(out[k]) for k in CATALOGUE.covariance_names if k not in CATALOGUE.diagnostics
    )


def test_spectrum_is_immutable():
    spectrum = eigendecompose(np.eye(2), 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spectrum.n_rows = 5  # type: ignore[misc]
    with pytest.raises(ValueError):
        spectrum.eigenvalues[0] = 7.0
    assert isinstance(spectrum, Spectrum) and spectrum.dim == 2


def test_bad_shapes_are_clear_errors():
    with pytest.raises(ValueError, match="square"):
        eigendecompose(np.ones((2, 3)), 5)
    with pytest.raises(ValueError, match="spectrum has 3"):
        summarize(np.eye(2), eigendecompose(np.eye(3), 5))


def test_summarize_fit_range():
    eigs = np.concatenate([np.arange(1, 21, dtype=np.float64) ** -2.0, np.full(20, 1e-6)])
    cov, spectrum = np.diag(eigs), eigendecompose(np.diag(eigs), 1000)
    assert summarize(cov, spectrum, fit_range=(1, 20))["power_law_alpha"] == pytest.approx(2.0, rel=1e-12)
    assert summarize(cov, spectrum)["power_law_alpha"] == pytest.approx(2.0, rel=1e-12)  # default 1..D/2 = 1..20
    assert summarize(cov, spectrum, fit_range=(1, 40))["power_law_r2"] < 0.99
    with pytest.raises(ValueError, match="fit_range must be"):
        summarize(cov, spectrum, fit_range=(1, 5, 9))


@pytest.mark.parametrize("ddof", [1, 0])
def test_spectra_of_fewer_rows_than_features_from_the_small_product_equal_the_covariances(ddof: int):
    """`row_subset_spectra`: the ``[m, m]`` route equals `eigendecompose` of numpy's ``[D, D]`` covariance of each
    subset to round-off, its structural zeros are exact, and a subset of one row is undefined."""
    from tgo.spectral.decomposition import row_subset_spectra

    rng = np.random.default_rng(3)
    rows = 5.0 + rng.normal(size=(30, 48)) * np.linspace(4.0, 0.1, 48)
    subsets = [np.ones(30, bool), np.arange(30) % 3 != 0, np.arange(30) % 3 != 1, np.arange(30) == 4]
    got = row_subset_spectra(rows, subsets, ddof=ddof)
    for mask, spectrum in zip(subsets[:3], got, strict=False):
        m = int(mask.sum())
        want = eigendecompose(np.cov(rows[mask], rowvar=False, ddof=ddof), m)
        assert spectrum.n_rows == m and spectrum.dim == 48
        np.testing.assert_allclose(spectrum.eigenvalues, want.eigenvalues, rtol=0, atol=1e-12 * want.eigenvalues[0])
        assert np.all(spectrum.eigenvalues[m - 1 :] == 0.0) and np.all(spectrum.eigenvalues[: m - 1] > 0)
        assert not spectrum.eigenvalues.flags.writeable
    assert not got[3].is_defined and got[3].n_rows == 1
    with pytest.raises(ValueError, match="ddof must be 0 or 1"):
        row_subset_spectra(rows, subsets, ddof=2)
