"""The streaming engine agrees with a float64 two-pass covariance + ``np.linalg.eigvalsh`` on adversarial data.

Tolerances are the specification: every observable to 1e-9 relative with the float64 Gram, 1e-6 with the float32
Gram, and the largest eigenvalues likewise. One documented exception: with a float32 Gram, spectral flatness and
total correlation of a spectrum spanning 8 decades are not reproducible to 1e-6 by any float32 product (both sum
``log λ`` over the smallest eigenvalues, whose float32 round-off is ~1e-9 of the largest); see docs/observables.md,
"float32 Gram".
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.spectral.spectral_data import (
    METRIC_KEYS,
    accumulate,
    decades_spectrum,
    make_rows,
    power_law_spectrum,
    reference_covariance,
    reference_eigenvalues,
    reference_summary,
    relative_errors,
)
from tgo.spectral import eigendecompose, summarize

TOL = {torch.float64: 1e-9, torch.float32: 1e-6}
TOP_K = 8

CASES = {
    # ViT-like: power-law spectrum, massive-activation dims (mean/std = 2e3), rows fed as [B, T, D] batches
    "massive_activations": dict(n=3000, eigenvalues=power_law_spectrum(96), massive=6, seed=1),
    # eigenvalues spanning 8 decades in a random basis, plus massive dims
    "eight_decades": dict(n=3000, eigenvalues=decades_spectrum(64, 8), massive=4, seed=2),
    # fewer rows than dimensions: rank n - 1, half the spectrum structurally zero
    "n_less_than_d": dict(n=48, eigenvalues=decades_spectrum(96, 4), massive=4, seed=3),
}
FLOAT32_ILL_CONDITIONED = {"eight_decades": {"spectral_flatness", "total_correlation"}}


def _data(case: str) -> np.ndarray:
    spec = dict(CASES[case])
    return make_rows(spec.pop("n"), spec.pop("eigenvalues"), **spec)


def test_massive_dimensions_really_are_massive():
    """The adversarial regime is real: some dims have |mean| / std >= 1e3."""
    x = _data("massive_activations").astype(np.float64)
    ratio = np.abs(x.mean(0)) / x.std(0)
    assert (ratio >= 1e3).sum() >= 4


def test_eight_decades_spectrum_spans_eight_decades():
    x = _data("eight_decades")
    eigs = reference_eigenvalues(reference_covariance(x))
    assert eigs[0] / eigs[-1] > 1e7


@pytest.mark.parametrize("gram_dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("case", list(CASES))
def test_observables_match_float64_reference(case: str, gram_dtype: torch.dtype):
    x = _data(case)
    want = reference_summary(x)
    # feed as [batch, tokens, D] chunks with a ragged last batch
    acc = accumulate(x.reshape(-1, 1, x.shape[-1]), gram_dtype=gram_dtype, batch_rows=97)
    cov = acc.covariance()
    spectrum = eigendecompose(cov, acc.n, acc.n_nonfinite)
    got = summarize(cov, spectrum)

    assert got["n_rows"] == x.shape[0] and got["n_nonfinite"] == 0
    skip = FLOAT32_ILL_CONDITIONED.get(case, set()) if gram_dtype == torch.float32 else set()
    errors = relative_errors(got, want, [k for k in METRIC_KEYS if k not in skip])
    bad = {k: f"{e:.1e}" for k, e in errors.items() if not e <= TOL[gram_dtype]}
    assert not bad, f"observables off by more than {TOL[gram_dtype]:.0e}: {bad}"

    top = reference_eigenvalues(reference_covariance(x))[:TOP_K]
    np.testing.assert_allclose(spectrum.eigenvalues[:TOP_K], top, rtol=TOL[gram_dtype], atol=0)


@pytest.mark.parametrize("case", list(CASES))
def test_float64_covariance_matches_two_pass_entrywise(case: str):
    """Relative to the covariance's scale, the streamed float64 covariance is the two-pass one to ~1e-15."""
    x = _data(case)
    want = reference_covariance(x)
    got = accumulate(x, batch_rows=500).covariance().numpy()
    assert np.abs(got - want).max() <= 1e-13 * np.abs(want).max()


def test_float32_flatness_on_eight_decades_is_only_as_good_as_its_conditioning():
    """The documented float32 exception is bounded, not arbitrary: the error stays below 1e-1 (and float64 is exact)."""
    x = _data("eight_decades")
    want = reference_summary(x)["spectral_flatness"]
    acc = accumulate(x, gram_dtype=torch.float32, batch_rows=97)
    cov = acc.covariance()
    got = summarize(cov, eigendecompose(cov, acc.n))["spectral_flatness"]
    assert abs(got - want) / want < 1e-1
