"""The simple gradient noise scale's estimators against known truth.

* Exact expectations give back ``|G|^2`` and ``tr(Sigma)`` (the algebra of McCandlish et al. 2018, Appendix A).
* A tiny ViT on a fixed batch of 24 images: float64 per-example gradients (``torch.func`` vmap(grad)) give the
  population's true ``|G|^2`` and ``tr(Sigma)`` (the batch as population, divisor N). Steps of 4 micro-batches of 3
  drawn with replacement (the i.i.d. sampling the estimator assumes) are estimated over 200 seeded runs of 100
  steps; the 95% t-interval (``t_{0.975, blocks - 1}`` times the jackknife standard error) covers the truth of
  ``B_simple``, ``|G|^2`` and ``tr(Sigma)`` in at least 90% of them (measured 0.97 for ``B_simple``).
* The delete-a-block jackknife's coverage on synthetic step sequences with known truth (2000 replications at once,
  one per column): i.i.d. and AR(1) (phi = 0.6) noise, 10 blocks of 40 steps: 95% intervals cover within
  [0.92, 0.975]; one step per block under AR(1) with phi = 0.9 under-covers (< 0.8): why the blocks are consecutive.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from tests.processes import tiny_vit
from tgo.optimisation.noise_scale import block_jackknife_ratio, noise_scale_estimate, step_estimates


def test_exact_expectations_give_back_the_gradient_and_the_trace():
    g2, trace, a, c = np.array([2.0, 0.5]), np.array([30.0, 7.0]), np.array([1 / 4, 1 / 8]), np.array([1 / 16, 1 / 64])
    small, big = g2 + a * trace, g2 + c * trace
    got_g2, got_trace = step_estimates(small, big, a, c)
    np.testing.assert_allclose(got_g2, g2, rtol=1e-14)
    np.testing.assert_allclose(got_trace, trace, rtol=1e-14)
    # The batch-size form of the paper: (B_b L - B_s S) / (B_b - B_s) and (S - L) / (1/B_s - 1/B_b).
    bs, bb = 1 / a, 1 / c
    np.testing.assert_allclose(got_g2, (bb * big - bs * small) / (bb - bs), rtol=1e-14)
    np.testing.assert_allclose(got_trace, (small - big) / (1 / bs - 1 / bb), rtol=1e-14)


def test_non_finite_steps_are_excluded_and_counted():
    rng = np.random.default_rng(0)
    small, big = 10 + rng.random((20, 2)), 2 + rng.random((20, 2))
    a, c = np.full(20, 0.25), np.full(20, 0.0625)
    clean = noise_scale_estimate(np.delete(small, [3, 11], 0), np.delete(big, [3, 11], 0), a[:18], c[:18], blocks=5)
    small[3, 1], big[11, 0] = np.inf, np.nan
    got = noise_scale_estimate(small, big, a, c, blocks=5)
    assert (got.steps, got.excluded) == (18, 2)
    np.testing.assert_array_equal(got.noise_scale, clean.noise_scale)
    np.testing.assert_array_equal(got.noise_scale_stderr, clean.noise_scale_stderr)


def test_steps_of_one_batch_size_are_excluded_and_counted():
    """A step whose two norms come from one batch size (``a = c``: an accumulation step of one micro-batch, as the
    collector keeps it) separates nothing: it is left out of every mean and counted in ``excluded``."""
    rng = np.random.default_rng(1)
    small, big = 10 + rng.random((12, 2)), 2 + rng.random((12, 2))
    a, c = np.full(12, 0.25), np.full(12, 0.0625)
    clean = noise_scale_estimate(small[:11], big[:11], a[:11], c[:11], blocks=5)
    big[11], c[11] = small[11], a[11]  # the last step: one micro-batch, small and big batch are one gradient
    got = noise_scale_estimate(small, big, a, c, blocks=5)
    assert (got.steps, got.excluded) == (11, 1)
    for field in ("noise_scale", "noise_scale_stderr", "gradient_norm_sq", "trace_covariance"):
        np.testing.assert_array_equal(getattr(got, field), getattr(clean, field), err_msg=field)


def _per_example(labels: torch.Tensor) -> np.ndarray:
    """float64 ``[n, P]`` per-example gradients of the cross-entropy of the tiny ViT on a fixed batch."""
    from torch.func import functional_call, grad, vmap

    n = len(labels)
    net = tiny_vit().double()
    params = {k: v.detach() for k, v in net.named_parameters()}
    x = torch.randn(n, 3, 16, 16, generator=torch.Generator().manual_seed(5), dtype=torch.float64)

    def loss(p, xi, yi):
        return torch.nn.functional.cross_entropy(functional_call(net, p, (xi[None],)), yi[None])

    per = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, labels)
    return torch.cat([per[k].reshape(n, -1) for k in params], dim=1).numpy()


def test_two_batch_sizes_recover_the_tiny_vit_population_within_the_standard_error():
    """18 of 24 labels one class: B_simple ~ 1.4, within reach of batches of 3 and 12 (with random labels at
    initialisation it is ~565, far above B_b = 12: then |G|^2_est is noise and no interval from 100 steps covers)."""
    per = _per_example(torch.tensor([0] * 18 + [1] * 3 + [2] * 3))
    gram = per @ per.T  # every squared norm below is a quadratic form of the examples' Gram matrix
    mean = per.mean(axis=0)
    true_g2 = float(mean @ mean)
    true_trace = float(((per - mean) ** 2).sum(axis=1).mean())  # tr(Sigma) of the population (divisor N)
    truth = {"noise_scale": true_trace / true_g2, "gradient_norm_sq": true_g2, "trace_covariance": true_trace}
    n, micro, k, steps, blocks, runs = len(per), 3, 4, 100, 10, 200
    t = stats.t.ppf(0.975, blocks - 1)
    covered = dict.fromkeys(truth, 0)
    for seed in range(runs):
        draws = np.random.default_rng(seed).integers(0, n, size=(steps, k, micro))
        weights = np.zeros((steps, k, n))  # each micro-batch's mean gradient = weights @ per
        np.add.at(weights, (np.arange(steps)[:, None, None], np.arange(k)[None, :, None], draws), 1 / micro)
        small = np.einsum("skn,nm,skm->sk", weights, gram, weights).mean(axis=1)
        big_weights = weights.mean(axis=1)
        big = np.einsum("sn,nm,sm->s", big_weights, gram, big_weights)
        est = noise_scale_estimate(
            small, big, np.full(steps, 1 / micro), np.full(steps, 1 / (k * micro)), blocks=blocks
        )
        for name, true in truth.items():
            value, se = float(getattr(est, name)[0]), float(getattr(est, f"{name}_stderr")[0])
            covered[name] += abs(value - true) <= t * se
    assert all(c >= 0.9 * runs for c in covered.values()), f"95% intervals covering the truth in {runs} runs: {covered}"
    # The brute force's own check: the micro-batch mean gradient of the first draw, from per-example rows directly.
    np.testing.assert_allclose(weights[0, 0] @ gram @ weights[0, 0], np.sum(per[draws[0, 0]].mean(0) ** 2), rtol=1e-12)


def _synthetic(rng: np.random.Generator, steps: int, reps: int, phi: float) -> tuple[np.ndarray, ...]:
    """Per-step small/big squared norms with known ``|G|^2 = 1``, ``tr(Sigma) = 40`` and AR(1) noise (phi)."""
    g2, trace, a, c = 1.0, 40.0, 1 / 4, 1 / 32

    def ar(scale: float) -> np.ndarray:
        shocks = rng.normal(size=(steps, reps)) * scale * np.sqrt(1 - phi**2)
        out = np.empty_like(shocks)
        out[0] = rng.normal(size=reps) * scale
        for i in range(1, steps):
            out[i] = phi * out[i - 1] + shocks[i]
        return out

    common = ar(1.0)  # both norms move together with the weights, plus their own sampling noise
    small = g2 + a * trace + 3.0 * common + ar(3.0)
    big = g2 + c * trace + 0.5 * common + ar(0.5)
    return small, big, np.full(steps, a), np.full(steps, c), np.array(trace / g2)


@pytest.mark.parametrize("phi", [0.0, 0.6])
def test_block_jackknife_covers_the_known_noise_scale(phi):
    rng = np.random.default_rng(17)
    small, big, a, c, truth = _synthetic(rng, steps=400, reps=2000, phi=phi)
    g2, trace = step_estimates(small, big, a, c)
    value, se, replicates = block_jackknife_ratio(trace, g2, blocks=10)
    assert replicates.shape == (2000, 10)
    coverage = float(np.mean(np.abs(value - truth) <= stats.t.ppf(0.975, 9) * se))
    assert 0.92 <= coverage <= 0.975, coverage


def test_one_step_blocks_under_cover_correlated_steps():
    rng = np.random.default_rng(18)
    small, big, a, c, truth = _synthetic(rng, steps=400, reps=1000, phi=0.9)
    g2, trace = step_estimates(small, big, a, c)
    value, se, _ = block_jackknife_ratio(trace, g2, blocks=400)
    coverage = float(np.mean(np.abs(value - truth) <= stats.norm.ppf(0.975) * se))
    assert coverage < 0.8, coverage


def test_no_resolved_gradient_signal_gives_no_noise_scale():
    """|G|^2_est averaged to <= 0 (one noisy step): B_simple is undefined, not negative; |G|^2 is still recorded."""
    small, big = np.array([[4.0], [4.4]]), np.array([[1.9], [2.1]])  # |G|^2_est = 2 big - small < 0 at a = 1/3, c = 1/6
    a, c = np.full(2, 1 / 3), np.full(2, 1 / 6)
    estimate = noise_scale_estimate(small, big, a, c, blocks=2)
    assert estimate.gradient_norm_sq[0] <= 0
    assert np.isnan(estimate.noise_scale[0]) and np.isnan(estimate.noise_scale_stderr[0])
    assert estimate.steps == 2
