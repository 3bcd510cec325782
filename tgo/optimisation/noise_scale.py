"""The simple gradient noise scale ``B_simple = tr(Sigma) / |G|^2`` from gradient norms at two batch sizes.

McCandlish et al. 2018, Appendix A: two squared norms of one step, ``S = |G|^2 + a tr(Sigma)`` and ``L = |G|^2 + c
tr(Sigma)``, solve for both unknowns without bias. Per-step estimates are noisy and their ratio badly biased, so
``B_simple`` is the ratio of the averages between two observations, with a delete-a-block jackknife over blocks of
consecutive (correlated) steps (coverage: ``tests/optimisation/test_noise_scale.py``; docs/observables.md section 10).
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
    """Each step's unbiased ``(|G|^2_est, tr(Sigma)_est)`` from its two squared norms (``[T]`` or ``[T, K]``), where
    ``inv_small`` and ``inv_big`` (``[T]``) are the coefficients ``a > c`` of ``tr(Sigma)`` in their expectations."""
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
    """``sum(num) / sum(den)`` per column of ``[T, K]``, with its delete-a-block jackknife over consecutive steps:
    ``(value, stderr, replicates [K, n_blocks])``. A denominator summing to <= 0 resolved no (positive) ``|G|^2``, so
    the ratio is NaN rather than negative or huge."""
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
    """``B_simple`` and its parts over the steps between two observations, per column (network, then blocks): NaN where
    the mean ``|G|^2_est`` is <= 0; ``excluded`` counts the steps left out (`noise_scale_estimate`)."""

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
    """`NoiseScaleEstimate` of ``T`` steps; a step with a non-finite norm, or with one batch size only (nothing
    separates ``|G|^2`` from ``tr(Sigma)``), is excluded and counted."""
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
