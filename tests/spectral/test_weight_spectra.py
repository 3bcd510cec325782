"""Weight-matrix geometry (`tgo.spectral.weights`) against numpy float64 brute force, closed forms and WeightWatcher.

Every metric of the ``weights`` family is checked here on random and structured matrices: singular values against
the eigenvalues of ``W^T W`` and ``np.linalg.norm``, stable and effective rank against their definitions (``k`` for
a rank-``k`` matrix of equal singular values), the relative update of ``W + dW``, the power-law fit against a literal
transcription of WeightWatcher's ``WWFit`` loop, against exact Pareto samples of known exponent (seeded: within two
standard errors at a stated rate), against a spectrum with a known break, and against the ``weightwatcher`` package
itself when it is installed.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from tgo.spectral.weights import (
    ESD_THRESHOLD,
    fit_power_law,
    relative_update,
    singular_values,
    weight_geometry,
    weight_matrix,
)

SHAPES = [(48, 32), (32, 48), (96, 32), (20, 20), (7, 30)]


def _random(shape: tuple[int, int], seed: int, heavy: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_t(2.5, size=shape) if heavy else rng.standard_normal(shape)


def _with_singular_values(sv: np.ndarray, shape: tuple[int, int], seed: int) -> np.ndarray:
    """``U diag(sv) V^T`` with random orthonormal ``U``, ``V``: a matrix of known singular values."""
    rng = np.random.default_rng(seed)
    m, n = shape
    u, _ = np.linalg.qr(rng.standard_normal((m, m)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    s = np.zeros(shape)
    s[: sv.size, : sv.size] = np.diag(sv)
    return u @ s @ v.T


# ------------------------------------------------------------------------------------------------ singular values
@pytest.mark.parametrize("shape", SHAPES)
def test_singular_values_are_the_square_roots_of_the_gram_eigenvalues(shape):
    w = _random(shape, 0)
    sv = singular_values(w)
    gram = np.linalg.eigvalsh(w.T @ w if shape[0] >= shape[1] else w @ w.T)[::-1]
    assert sv.dtype == np.float64 and sv.shape == (min(shape),)
    assert np.all(np.diff(sv) <= 0)  # descending
    np.testing.assert_allclose(sv**2, gram, rtol=1e-10, atol=1e-10 * gram[0])
    assert sv[0] == pytest.approx(np.linalg.norm(w, 2), rel=1e-13)
    assert np.sum(sv**2) == pytest.approx(np.linalg.norm(w, "fro") ** 2, rel=1e-13)


def test_singular_values_keep_the_small_ones_the_gram_matrix_loses():
    """Known singular values from 1 down to 1e-12: the SVD recovers each to ~eps * sigma_1 (the Gram route cannot go
    below ~1e-8 * sigma_1), which is why the family never squares first."""
    known = np.logspace(0, -12, 24)
    w = _with_singular_values(known, (40, 24), seed=3)
    sv = singular_values(w)
    np.testing.assert_allclose(sv, known, rtol=0, atol=1e-14)
    via_gram = np.sqrt(np.clip(np.linalg.eigvalsh(w.T @ w)[::-1], 0, None))
    assert np.abs(via_gram - known).max() > 1e-10  # the squared route loses them (why it is not used)


def test_non_finite_weights_give_nan_not_an_error():
    w = _random((10, 6), 1)
    w[2, 3] = np.nan
    assert np.isnan(singular_values(w)).all() and singular_values(w).shape == (6,)
    g = weight_geometry(w)
    assert all(math.isnan(v) for v in (g.stable_rank, g.effective_rank, g.spectral_norm, g.fit.alpha))


def test_a_convolution_is_the_matrix_it_applies_to_every_flattened_patch():
    """A patch embedding's Conv2d (stride = kernel) as ``[out, in * kh * kw]``: its output at a patch equals that
    matrix times the flattened patch (plus the bias)."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, kernel_size=4, stride=4).double()
    image = torch.randn(1, 3, 8, 8, dtype=torch.float64)
    w = weight_matrix(conv.weight.detach().numpy())
    assert w.shape == (8, 48)
    out = conv(image).detach().numpy()[0]
    assert conv.bias is not None
    bias = conv.bias.detach().numpy()
    for r in range(2):
        for c in range(2):
            patch = image[0, :, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4].numpy().reshape(-1)
            np.testing.assert_allclose(w @ patch + bias, out[:, r, c], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="dimensions"):
        weight_matrix(np.ones(3))


# --------------------------------------------------------------------------------------- ranks and spectral norm
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("heavy", [False, True])
def test_ranks_and_norm_equal_their_definitions(shape, heavy):
    w = _random(shape, 2, heavy)
    g = weight_geometry(w)
    fro2, two = np.linalg.norm(w, "fro") ** 2, np.linalg.norm(w, 2)
    assert g.stable_rank == pytest.approx(fro2 / two**2, rel=1e-12)
    assert g.spectral_norm == pytest.approx(two, rel=1e-13)
    eig = np.clip(np.linalg.eigvalsh(w.T @ w), 0, None)
    p = eig[eig > 0] / eig.sum()
    assert g.effective_rank == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-9)
    assert 1 <= g.stable_rank <= g.effective_rank * (1 + 1e-12) <= min(shape) * (1 + 1e-12)


@pytest.mark.parametrize("k", [1, 3, 10])
def test_a_rank_k_matrix_of_equal_singular_values_has_both_ranks_k(k):
    w = _with_singular_values(np.full(k, 2.5), (30, 16), seed=k)
    g = weight_geometry(w)
    assert g.stable_rank == pytest.approx(k, rel=1e-12)
    assert g.effective_rank == pytest.approx(k, rel=1e-9)
    assert g.spectral_norm == pytest.approx(2.5, rel=1e-13)
    assert np.isnan(g.fit.alpha)  # fewer than 20 non-zero eigenvalues: no power-law exponent


def test_stable_rank_of_a_rank_k_matrix_with_a_dominant_direction():
    """Singular values (3, 1, 1, 1): stable rank 1 + 3/9, effective rank exp(H(9/12, 1/12, 1/12, 1/12))."""
    w = _with_singular_values(np.array([3.0, 1.0, 1.0, 1.0]), (12, 9), seed=5)
    g = weight_geometry(w)
    p = np.array([9, 1, 1, 1]) / 12
    assert g.stable_rank == pytest.approx(12 / 9, rel=1e-12)
    assert g.effective_rank == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-10)


def test_a_zero_matrix_has_no_ranks():
    g = weight_geometry(np.zeros((5, 4)))
    assert g.spectral_norm == 0 and math.isnan(g.stable_rank) and math.isnan(g.effective_rank)


# ------------------------------------------------------------------------------------------------ relative update
@pytest.mark.parametrize("scale", [1e-6, 1e-2, 1.0])
def test_relative_update_of_w_plus_dw(scale):
    w = _random((24, 16), 7).astype(np.float32)
    dw = (scale * _random((24, 16), 8)).astype(np.float32)
    new = w + dw
    exact = np.linalg.norm(new.astype(np.float64) - w.astype(np.float64)) / np.linalg.norm(w.astype(np.float64))
    assert relative_update(new, w) == pytest.approx(exact, rel=1e-13)
    assert relative_update(new, w) == pytest.approx(np.linalg.norm(dw) / np.linalg.norm(w), rel=1e-3 + 1e-6 / scale)
    assert relative_update(w, w) == 0.0
    assert math.isnan(relative_update(w, np.zeros_like(w)))
    assert math.isnan(relative_update(w, w[:, :8]))


# ----------------------------------------------------------------------------------------------- the power-law fit
def _wwfit_reference(evals: np.ndarray) -> tuple[float, float, float, float]:
    """WeightWatcher 0.7.7's ``WWFit.fit_power_law_standard`` and its xmin choice, transcribed literally (the
    threshold of its ``fit_powerlaw`` first): ``(alpha, D, sigma, xmin)``."""
    data = np.sort(np.asarray(evals, dtype=np.float64)[evals > ESD_THRESHOLD])
    n_all = len(data)
    log_data = np.log(data)
    alphas, ds = np.zeros(n_all - 1), np.ones(n_all - 1)
    for i, xmin in enumerate(data[:-1]):
        n = float(n_all - i)
        alpha = 1 + n / (np.sum(log_data[i:]) - n * log_data[i])
        alphas[i] = alpha
        if alpha > 1:
            ds[i] = np.max(np.abs(1 - (data[i:] / xmin) ** (-alpha + 1) - np.arange(n) / n))
    sigmas = (alphas - 1) / np.sqrt(n_all - np.arange(n_all - 1))
    i = int(np.argmin(ds))
    return float(alphas[i]), float(ds[i]), float(sigmas[i]), float(data[i])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shape", [(96, 64), (200, 48), (64, 64)])
def test_the_fit_is_weightwatchers_loop(seed, shape):
    w = _random(shape, 10 + seed, heavy=seed % 2 == 1)
    evals = singular_values(w) ** 2
    fit = fit_power_law(evals)
    alpha, d, sigma, xmin = _wwfit_reference(evals)
    assert fit.xmin == xmin
    assert fit.alpha == pytest.approx(alpha, rel=1e-10)
    assert fit.ks == pytest.approx(d, rel=1e-9)
    assert fit.stderr == pytest.approx(sigma, rel=1e-10)
    assert fit.n_tail == int(np.sum(evals >= xmin)) and fit.n_fitted == min(shape)
    assert 0 <= fit.ks < 1 and fit.alpha > 1


def test_the_fit_at_its_xmin_is_the_closed_form_mle():
    """The chosen candidate's alpha is Clauset et al.'s eq. (3.1), 1 + n / sum ln(x / xmin) over the values >= xmin,
    and its standard error (alpha - 1) / sqrt(n); an exact Pareto tail above a bulk far below it is never cut into
    the bulk."""
    rng = np.random.default_rng(0)
    tail = rng.uniform(size=300) ** (-1 / 1.5)  # alpha = 2.5 above xmin = 1
    x = np.concatenate([rng.uniform(0.01, 0.02, 100), tail])
    fit = fit_power_law(x)
    chosen = x[x >= fit.xmin]
    assert fit.xmin >= tail.min() and fit.n_tail == chosen.size
    assert fit.alpha == pytest.approx(1 + chosen.size / np.log(chosen / fit.xmin).sum(), rel=1e-12)
    assert fit.stderr == pytest.approx((fit.alpha - 1) / math.sqrt(chosen.size), rel=1e-12)
    empirical = np.arange(chosen.size) / chosen.size
    fitted = 1 - (np.sort(chosen) / fit.xmin) ** (1 - fit.alpha)
    assert fit.ks == pytest.approx(np.abs(fitted - empirical).max(), rel=1e-10)


def test_exact_pareto_samples_give_their_exponent_within_the_standard_error():
    """Samples of p(x) ~ x^-2.5 above 1 (x = U^(-1/1.5)), 400 each, 100 seeds: the fitted alpha lies within two of
    its standard errors (alpha - 1) / sqrt(n_tail) in >= 88 % of the seeds (95 measured) and within one in >= 55 %
    (67 measured; nominal 95 % and 68 %), and the seeds' mean is within 0.05 of 2.5."""
    alpha = 2.5
    within_two = within_one = 0
    estimates = []
    for seed in range(100):
        x = np.random.default_rng(seed).uniform(size=400) ** (-1 / (alpha - 1))
        fit = fit_power_law(x)
        estimates.append(fit.alpha)
        within_two += abs(fit.alpha - alpha) <= 2 * fit.stderr
        within_one += abs(fit.alpha - alpha) <= fit.stderr
    assert within_two >= 88 and within_one >= 55
    assert abs(np.mean(estimates) - alpha) < 0.05


def test_the_xmin_choice_finds_a_known_break():
    """A bulk uniform on [0.05, 0.5) below an exact Pareto tail (alpha 2.5) starting at 1: the KS choice never puts
    xmin in the bulk (40 of 40 seeds), keeps at least 40 % of the tail in >= 36 of 40 (37 measured) and gives alpha
    within two standard errors in >= 34 of 40 (37 measured)."""
    never_in_bulk = most_of_tail = within = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        bulk, tail = rng.uniform(0.05, 0.5, 300), rng.uniform(size=300) ** (-1 / 1.5)
        fit = fit_power_law(rng.permutation(np.concatenate([bulk, tail])))
        never_in_bulk += fit.xmin >= tail.min()
        most_of_tail += fit.n_tail >= 0.4 * tail.size
        within += abs(fit.alpha - 2.5) <= 2 * fit.stderr
    assert never_in_bulk == 40 and most_of_tail >= 36 and within >= 34


def test_the_fit_drops_zero_eigenvalues_and_refuses_degenerate_spectra():
    rng = np.random.default_rng(4)
    e = rng.uniform(size=50) ** (-1 / 1.5)
    with_zeros = np.concatenate([e, np.zeros(30), np.full(5, ESD_THRESHOLD)])
    assert fit_power_law(with_zeros) == fit_power_law(e)  # at or below the threshold: not fitted
    assert fit_power_law(with_zeros).n_fitted == 50
    assert math.isnan(fit_power_law(e[:19]).alpha) and fit_power_law(e[:19]).n_fitted == 19  # < 20: no exponent
    assert not math.isnan(fit_power_law(e[:20]).alpha)
    assert math.isnan(fit_power_law(np.full(40, 3.0)).alpha)  # every tail of equal values: no exponent
    assert math.isnan(fit_power_law(np.append(e, np.nan)).alpha)


def test_the_fit_does_not_depend_on_order_and_scales_with_the_spectrum():
    """alpha and D are scale invariant (xmin scales), as long as nothing crosses the absolute threshold."""
    e = singular_values(_random((80, 60), 21, heavy=True)) ** 2
    fit = fit_power_law(e)
    assert fit_power_law(np.random.default_rng(0).permutation(e)) == fit
    scaled = fit_power_law(e * 7.0)
    assert scaled.alpha == pytest.approx(fit.alpha, rel=1e-10) and scaled.ks == pytest.approx(fit.ks, rel=1e-9)
    assert scaled.xmin == pytest.approx(7.0 * fit.xmin, rel=1e-14)


# ---------------------------------------------------------------------------------------- the weightwatcher package
def test_equal_to_the_weightwatcher_package_on_a_torch_model():
    """``ww.WeightWatcher(model).analyze()`` (0.7.7) on a small model of Linear layers, one with heavy-tailed weights:
    alpha, D, sigma, xmin, stable rank and lambda_max = sigma_1^2 (its ``spectral_norm``) agree to 1e-9."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ww = pytest.importorskip("weightwatcher", reason="weightwatcher is not installed (pip install weightwatcher)")
    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, 96), torch.nn.Linear(96, 48), torch.nn.Linear(48, 200)]
    model = torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1], layers[2])
    with torch.no_grad():
        layers[1].weight.copy_(torch.distributions.StudentT(2.5).sample(layers[1].weight.shape))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = ww.WeightWatcher(model=model).analyze(svd_method="accurate")
    assert len(table) == len(layers)
    for (_, row), layer in zip(table.iterrows(), layers, strict=True):
        g = weight_geometry(layer.weight.detach().double().numpy())
        assert g.fit.alpha == pytest.approx(row["alpha"], rel=1e-9)
        assert g.fit.ks == pytest.approx(row["D"], rel=1e-9)
        assert g.fit.stderr == pytest.approx(row["sigma"], rel=1e-9)
        assert g.fit.xmin == pytest.approx(row["xmin"], rel=1e-9)
        assert g.fit.n_tail == int(row["num_pl_spikes"])
        assert g.stable_rank == pytest.approx(row["stable_rank"], rel=1e-9)
        assert g.spectral_norm**2 == pytest.approx(row["spectral_norm"], rel=1e-9)
