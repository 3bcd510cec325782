"""The simple gradient noise scale ``B_simple = tr(Sigma) / |G|^2`` from gradient norms at two batch sizes.

McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch Training", Appendix A. Two squared norms
of the same step, ``S = |G|^2 + a tr(Sigma)`` at a small batch and ``L = |G|^2 + c tr(Sigma)`` at a big one (``a``,
``c`` the inverse-batch coefficients, which also cover unequal micro-batches and ranks), solve for both unknowns
without bias: ``|G|^2_est = (a L - c S) / (a - c)``, ``tr(Sigma)_est = (S - L) / (a - c)``.

Per-step estimates are very noisy and their ratio badly biased, so ``B_simple`` is the ratio of the averages over
the steps between two observations, and its standard error a delete-a-block jackknife over blocks of consecutive
(correlated) steps; coverage is checked on synthetic i.i.d. and AR(1) sequences
(``tests/optimisation/test_noise_scale.py``). The formulas are in docs/observables.md section 10.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tgo.spectral.jackknife import jackknife_stderrs

__all__ = ["NoiseScaleEstimate", "block_jackknife_ratio", "noise_scale_estimate", "step_estimates"]


def step_estimates(
    small_sq: np.ndarray, big_sq: np.ndarray, inv_small: np.ndarray, inv_big: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each step's unbiased ``(|G|^2_est, tr(Sigma)_est)`` from its two squared norms.

    Args:
        small_sq: ``[T]`` or ``[T, K]``: ``|G_s|^2`` (an unbiased estimate of ``E |G_{B_s}|^2``, e.g. the mean of
            the ranks' local squared norms), per step (and per parameter group ``K``).
        big_sq: Same shape: ``|G_b|^2`` of the big batch on the same step.
        inv_small: ``[T]``: the coefficient ``a`` of ``tr(Sigma)`` in ``E small_sq`` (``1 / B_s``).
        inv_big: ``[T]``: the coefficient ``c`` in ``E big_sq`` (``1 / B_b``); ``c < a`` on every step.

    Returns:
        ``(gradient_norm_sq, trace_covariance)``, each of ``small_sq``'s shape.
    """
    small, big = np.asarray(small_sq, dtype=np.float64), np.asarray(big_sq, dtype=np.float64)
    a, c = np.asarray(inv_small, dtype=np.float64), np.asarray(inv_big, dtype=np.float64)
    if small.ndim == 2:
        a, c = a[:, None], c[:, None]
    gap = a - c
    return (a * big - c * small) / gap, (small - big) / gap


def _blocks(steps: int, blocks: int) -> list[np.ndarray]:
    """Consecutive blocks of step indices, as equal as possible (``min(blocks, steps)`` of them)."""
    if steps == 0:
        return []
    return [b for b in np.array_split(np.arange(steps), min(blocks, steps)) if b.size]


def block_jackknife_ratio(
    numerator: np.ndarray, denominator: np.ndarray, blocks: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``sum(num) / sum(den)`` over steps, per column, with its delete-a-block jackknife over consecutive steps.

    Args:
        numerator: ``[T, K]`` per-step values.
        denominator: ``[T, K]`` per-step values.
        blocks: Blocks of consecutive steps (fewer steps: one step per block).

    Returns:
        ``(value [K], stderr [K], replicates [K, n_blocks])``; NaN standard errors below two blocks. A ratio whose
        denominator sums to <= 0 is NaN: the denominator estimates a positive quantity (``|G|^2``), and averaged to
        <= 0 it has resolved none, so the ratio is undefined rather than negative or huge.
    """
    num, den = np.asarray(numerator, dtype=np.float64), np.asarray(denominator, dtype=np.float64)
    steps, columns = num.shape
    with np.errstate(invalid="ignore", divide="ignore"):
        total = den.sum(axis=0)
        value = np.where(total > 0, num.sum(axis=0) / total, math.nan) if steps else np.full(columns, math.nan)
        parts = _blocks(steps, blocks)
        if len(parts) < 2:
            return value, np.full(columns, math.nan), np.full((columns, len(parts)), math.nan)
        block_num = np.stack([num[p].sum(axis=0) for p in parts], axis=1)  # [K, n_blocks]
        block_den = np.stack([den[p].sum(axis=0) for p in parts], axis=1)
        left = block_den.sum(axis=1, keepdims=True) - block_den
        replicates = np.where(left > 0, (block_num.sum(axis=1, keepdims=True) - block_num) / left, math.nan)
    return value, jackknife_stderrs(replicates), replicates


@dataclass(frozen=True)
class NoiseScaleEstimate:
    """``B_simple`` and its parts over the steps between two observations, per column (network, then blocks).

    Attributes:
        noise_scale: ``[K]`` ``B_simple = mean tr(Sigma)_est / mean |G|^2_est`` (in examples); NaN where the mean
            ``|G|^2_est`` is <= 0 (no gradient signal resolved: ``gradient_norm_sq`` says so).
        noise_scale_stderr: ``[K]`` its delete-a-block jackknife standard error.
        noise_scale_replicates: ``[K, n_blocks]`` the leave-one-block-out values.
        gradient_norm_sq: ``[K]`` mean ``|G|^2_est`` over the steps.
        gradient_norm_sq_stderr: ``[K]``.
        trace_covariance: ``[K]`` mean ``tr(Sigma)_est`` over the steps.
        trace_covariance_stderr: ``[K]``.
        steps: Steps averaged (finite ones).
        excluded: Steps left out: a norm not finite (e.g. AMP's skipped steps), or one batch size only
            (``inv_small <= inv_big``, e.g. an accumulation step of one micro-batch).
    """

    noise_scale: np.ndarray
    noise_scale_stderr: np.ndarray
    noise_scale_replicates: np.ndarray
    gradient_norm_sq: np.ndarray
    gradient_norm_sq_stderr: np.ndarray
    trace_covariance: np.ndarray
    trace_covariance_stderr: np.ndarray
    steps: int
    excluded: int


def noise_scale_estimate(
    small_sq: np.ndarray, big_sq: np.ndarray, inv_small: np.ndarray, inv_big: np.ndarray, *, blocks: int = 10
) -> NoiseScaleEstimate:
    """`NoiseScaleEstimate` of ``T`` steps: a step with a non-finite norm in any column, or with one batch size only
    (``inv_small <= inv_big``: nothing separates ``|G|^2`` from ``tr(Sigma)``), is excluded (and counted).

    Args:
        small_sq: ``[T, K]`` (or ``[T]``) small-batch squared norms (`step_estimates`).
        big_sq: Same shape: big-batch squared norms.
        inv_small: ``[T]`` coefficient ``a`` of ``tr(Sigma)`` in ``E small_sq``.
        inv_big: ``[T]`` coefficient ``c`` in ``E big_sq``.
        blocks: Jackknife blocks of consecutive steps.
    """
    small, big = np.asarray(small_sq, dtype=np.float64), np.asarray(big_sq, dtype=np.float64)
    if small.ndim == 1:
        small, big = small[:, None], big[:, None]
    a, c = np.asarray(inv_small, dtype=np.float64), np.asarray(inv_big, dtype=np.float64)
    finite = np.all(np.isfinite(small), axis=1) & np.all(np.isfinite(big), axis=1) & np.isfinite(a) & np.isfinite(c)
    finite &= a > c
    small, big, a, c = small[finite], big[finite], a[finite], c[finite]
    g2, trace = step_estimates(small, big, a, c)
    value, stderr, replicates = block_jackknife_ratio(trace, g2, blocks)  # NaN where |G|^2 is not resolved
    ones = np.ones_like(g2)
    g2_mean, g2_se, _ = block_jackknife_ratio(g2, ones, blocks)
    tr_mean, tr_se, _ = block_jackknife_ratio(trace, ones, blocks)
    return NoiseScaleEstimate(
        noise_scale=value,
        noise_scale_stderr=stderr,
        noise_scale_replicates=replicates,
        gradient_norm_sq=g2_mean,
        gradient_norm_sq_stderr=g2_se,
        trace_covariance=tr_mean,
        trace_covariance_stderr=tr_se,
        steps=int(finite.sum()),
        excluded=int((~finite).sum()),
    )
