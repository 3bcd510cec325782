"""The summary's batched paths give the one-at-a-time numbers bit for bit (issue 24: the summary near its floor).

The rank-0 summary decomposes a view's ``G + 1`` jackknife covariances in one stacked LAPACK call
(`eigendecompose_many`), computes the catalogue as array functions over the ``[S, D]`` eigenvalue stack
(`summarize_many`, `EigenvalueStack`) and the standard errors of all observables at once (`jackknife_stderrs`). None
of that may move a recorded bit: each is compared here with the plain path it replaces (one `eigendecompose` per
matrix, the catalogue's own ``compute`` per observable, `jackknife_stderr` per row) on random, rank-deficient,
tied, badly scaled and degenerate inputs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tgo.spectral import CATALOGUE, Observable, SpectralInputs, eigendecompose, jackknife_stderr, summarize
from tgo.spectral import catalogue as catalogue_module
from tgo.spectral import observables as obs
from tgo.spectral.decomposition import eigendecompose_many
from tgo.spectral.jackknife import jackknife_stderrs
from tgo.spectral.summary import summarize_many


def _same(a: object, b: object) -> bool:
    """Equal as float64 bits (NaN equals NaN), for scalars, sequences and dicts."""
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return np.asarray(a, dtype=np.float64).tobytes() == np.asarray(b, dtype=np.float64).tobytes()


def _covariances(rng: np.random.Generator, dim: int, rows: list[int], scale: float = 1.0) -> list[np.ndarray]:
    """One sample covariance per row count, ViT-like: a few dimensions far larger than the rest."""
    weights = scale * np.exp(rng.uniform(-3, 3, dim))
    weights[: max(1, dim // 20)] *= 1e3
    out = []
    for n in rows:
        x = rng.standard_normal((n, dim)) * weights
        out.append(np.cov(x, rowvar=False) if n >= 2 else np.full((dim, dim), np.nan))
    return out


def _reference(cov: np.ndarray, n_rows: int, fit_range: tuple[int, int] | None = None) -> dict[str, float]:
    """The catalogue's own path: one eigendecomposition, each entry's ``compute`` once (no shared work)."""
    spectrum = eigendecompose(cov, n_rows)
    defined = n_rows >= 2 and bool(np.all(np.isfinite(cov))) and spectrum.is_defined
    return CATALOGUE.compute(SpectralInputs(covariance=cov, spectrum=spectrum, fit_range=fit_range), geometry=defined)


CASES = {
    "full rank": (24, [400, 360, 361, 362, 359, 360, 358, 363, 360, 361, 357]),
    "rank deficient, ranks differ": (32, [20, 18, 17, 18, 19, 18, 16, 18, 18, 17, 19]),
    "fewer rows than two": (8, [30, 1, 27, 27]),
    "one replicate": (16, [50, 45]),
    "wide": (96, [300, 270, 271, 269, 270]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stacked_eigendecomposition_equals_one_call_per_matrix(case: str) -> None:
    dim, rows = CASES[case]
    covs = _covariances(np.random.default_rng(1), dim, rows)
    for one, many in zip([eigendecompose(c, n) for c, n in zip(covs, rows, strict=True)],
                         eigendecompose_many(covs, rows), strict=True):  # fmt: skip
        assert _same(one.eigenvalues, many.eigenvalues)
        assert (one.n_rows, one.n_nonfinite, one.n_clamped) == (many.n_rows, many.n_nonfinite, many.n_clamped)
        assert _same(one.most_negative, many.most_negative)


def test_stacked_eigendecomposition_takes_mixed_sizes_and_non_finite_matrices() -> None:
    rng = np.random.default_rng(2)
    covs = [*_covariances(rng, 6, [40, 30]), *_covariances(rng, 4, [20])]
    covs[1] = covs[1].copy()
    covs[1][0, 1] = np.inf
    many = eigendecompose_many(covs, [40, 30, 20], [0, 3, 1])
    assert [s.dim for s in many] == [6, 6, 4] and not many[1].is_defined and many[1].n_nonfinite == 3
    for cov, n, spectrum in zip(covs, [40, 30, 20], many, strict=True):
        assert _same(eigendecompose(cov, n).eigenvalues, spectrum.eigenvalues)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("fit_range", [None, (2, 9)])
def test_summarize_many_equals_the_catalogue_entry_by_entry(case: str, fit_range: tuple[int, int] | None) -> None:
    dim, rows = CASES[case]
    covs = _covariances(np.random.default_rng(3), dim, rows)
    spectra = eigendecompose_many(covs, rows)
    many = summarize_many(covs, spectra, fit_range=fit_range)
    for cov, n, values in zip(covs, rows, many, strict=True):
        assert _same(values, _reference(cov, n, fit_range))
        assert _same(values, summarize(cov, eigendecompose(cov, n), fit_range=fit_range))


def test_summarize_many_on_ties_zero_variance_dimensions_and_extreme_scales() -> None:
    rng = np.random.default_rng(4)
    iso = [np.eye(12) * 3.0 for _ in range(4)]  # every eigenvalue tied
    zero_dim = _covariances(rng, 10, [200, 180, 181])
    for c in zero_dim:  # a dead channel (constant feature): no correlation, no variance
        c[3, :] = c[:, 3] = 0.0
    tiny = _covariances(rng, 10, [200, 180, 181], scale=1e-150)
    huge = _covariances(rng, 10, [200, 180, 181], scale=1e140)
    zero = [np.zeros((5, 5)) for _ in range(3)]  # zero total variance: NaN ratios, one by one
    for covs, rows in ((iso, [50] * 4), (zero_dim, [200, 180, 181]), (tiny, [200, 180, 181]),
                       (huge, [200, 180, 181]), (zero, [9, 8, 8])):  # fmt: skip
        spectra = eigendecompose_many(covs, rows)
        for cov, n, values in zip(covs, rows, summarize_many(covs, spectra), strict=True):
            assert _same(values, _reference(cov, n))


def test_the_eigenvalue_stack_equals_the_one_spectrum_functions() -> None:
    rng = np.random.default_rng(5)
    for dim, rank in ((1, 1), (2, 2), (9, 9), (64, 40), (130, 130), (384, 31)):
        eigs = np.zeros((7, dim))
        for row in eigs:
            k = int(rng.integers(max(1, rank - 3), rank + 1))
            row[:k] = np.sort(np.exp(rng.uniform(-30, 5, k)))[::-1]
        stack = obs.EigenvalueStack(eigs)
        for i, e in enumerate(eigs):
            assert _same(stack.effective_rank[i], obs.effective_rank(e))
            assert _same(stack.stable_rank[i], obs.stable_rank(e))
            assert _same(stack.participation_ratio[i], obs.participation_ratio(e))
            assert _same(stack.spectral_entropy()[i], obs.spectral_entropy(e))
            assert _same(stack.spectral_entropy(normalized=True)[i], obs.spectral_entropy(e, normalized=True))
            assert _same(stack.spectral_anisotropy[i], obs.spectral_anisotropy(e))
            assert _same(stack.spectral_flatness()[i], obs.spectral_flatness(e))
            for fraction in (0.5, 0.9, 0.95, 0.99, 1.0):
                assert stack.components_for_variance(fraction)[i] == obs.components_for_variance(e, fraction)
            for fit in ((None, None), (1, 3), (2, max(2, dim)), (3, 1000)):
                if fit[0] is not None and fit[1] < fit[0]:
                    continue
                assert _same(stack.power_law_fit(*fit)[i], obs.power_law_fit(e, *fit))


def test_the_stack_refuses_what_it_cannot_take() -> None:
    assert not obs.EigenvalueStack.usable(np.array([[1.0, 2.0]]))  # ascending
    assert not obs.EigenvalueStack.usable(np.array([[0.0, 0.0]]))  # zero total
    assert not obs.EigenvalueStack.usable(np.array([[np.nan, 1.0]]))
    with pytest.raises(ValueError):
        obs.EigenvalueStack(np.array([[1.0, -1.0]]))


def test_the_matrix_stack_functions_equal_the_one_matrix_functions() -> None:
    rng = np.random.default_rng(6)
    covs = np.stack(_covariances(rng, 20, [15, 200, 190, 14]))
    covs[2, 5, :] = covs[2, :, 5] = 0.0  # another kept set than the others: the one-matrix path
    spectra = eigendecompose_many(list(covs), [15, 200, 190, 14])
    eigs = np.stack([s.eigenvalues for s in spectra])
    assert _same(obs.offdiag_energy_fractions(covs), [obs.offdiag_energy_fraction(c) for c in covs])
    assert _same(obs.mean_abs_offdiag_correlations(covs), [obs.mean_abs_offdiag_correlation(c) for c in covs])
    assert _same(obs.mean_abs_offdiag_correlations(covs[:2]), [obs.mean_abs_offdiag_correlation(c) for c in covs[:2]])
    singles = [obs.total_correlation(c, e) for c, e in zip(covs, eigs, strict=True)]
    assert _same(obs.total_correlations(covs, eigs), singles)


@pytest.mark.parametrize("groups", [1, 2, 3, 7, 8, 9, 10, 16, 17, 33])
def test_jackknife_stderrs_equal_jackknife_stderr_row_by_row(groups: int) -> None:
    rng = np.random.default_rng(groups)
    values = rng.standard_normal((40, groups)) * 10 ** rng.uniform(-9, 9, (40, 1)) + rng.uniform(-1e4, 1e4, (40, 1))
    values[3, 0] = np.nan
    values[5, -1] = np.inf
    assert _same(jackknife_stderrs(values), [jackknife_stderr(v) for v in values])


def test_entries_registered_later_or_replaced_are_computed_by_their_own_function() -> None:
    rng = np.random.default_rng(7)
    covs = _covariances(rng, 12, [100, 90, 91])
    spectra = eigendecompose_many(covs, [100, 90, 91])
    extra = CATALOGUE.register(
        Observable("test_top_two", lambda inputs: float(inputs.eigenvalues[:2].sum()), "lambda_1 + lambda_2")
    )
    original = catalogue_module.BASELINED["stable_rank"]
    catalogue_module.BASELINED["stable_rank"] = lambda e: 2.0 * original(e)
    try:
        many = summarize_many(covs, spectra)
        for cov, spectrum, values in zip(covs, spectra, many, strict=True):
            assert values["test_top_two"] == float(spectrum.eigenvalues[:2].sum())
            assert values["stable_rank_diagonal"] == 2.0 * original(np.sort(np.diag(cov))[::-1])
            assert _same(values, _reference(cov, spectrum.n_rows))
    finally:
        catalogue_module.BASELINED["stable_rank"] = original
        CATALOGUE.unregister(extra.name)
    assert "test_top_two" not in summarize_many(covs, spectra)[0]
    assert not math.isnan(summarize_many(covs, spectra)[0]["stable_rank_diagonal"])
