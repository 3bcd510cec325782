"""Adversarial activation generators and the independent float64 reference the spectral engine is checked against."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from tgo.spectral import CATALOGUE, Spectrum, StreamingCovariance, summarize

METRIC_KEYS = tuple(k for k in CATALOGUE.covariance_names if k not in CATALOGUE.diagnostics)


def packed(state) -> torch.Tensor:
    """A summable state (an accumulator) as one flat float64 tensor, written by its ``pack_into`` as
    `tgo.spectral.allreduce_accumulators` packs it for the sum collective."""
    out = torch.empty(state.packed_size, dtype=torch.float64, device=state.device)
    state.pack_into(out)
    return out


def power_law_spectrum(dim: int, alpha: float = 1.5) -> np.ndarray:
    """``λ_i = i^-alpha``: the rough shape of ViT residual-stream spectra."""
    return np.arange(1, dim + 1, dtype=np.float64) ** -alpha


def decades_spectrum(dim: int, decades: float) -> np.ndarray:
    """Log-uniform eigenvalues from 1 down to ``10^-decades``."""
    return 10.0 ** (-decades * np.arange(dim) / (dim - 1))


def make_rows(
    n: int,
    eigenvalues: np.ndarray,
    *,
    massive: int = 4,
    ratio: float = 2e3,
    rotate: bool = True,
    seed: int = 0,
    dtype: type = np.float32,
) -> np.ndarray:
    """Gaussian rows with a prescribed population spectrum and ViT-like massive-activation dimensions.

    Args:
        n: Rows.
        eigenvalues: Population covariance eigenvalues (length D).
        massive: How many dimensions get a mean of ``ratio`` times their standard deviation.
        ratio: mean/std of the massive dimensions (>= 1e3 is the adversarial regime).
        rotate: Random orthogonal eigenbasis (every coordinate mixes every scale) instead of axis-aligned.
        seed: RNG seed.
        dtype: Storage dtype; activations arrive as float32, and both the engine and the reference read the same values.

    Returns:
        ``[n, D]`` array.
    """
    rng = np.random.default_rng(seed)
    dim = eigenvalues.size
    z = rng.standard_normal((n, dim)) * np.sqrt(eigenvalues)
    if rotate:
        q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
        z = z @ q.T
    pop_std = np.sqrt((q**2 @ eigenvalues) if rotate else eigenvalues)
    mu = rng.standard_normal(dim) * pop_std
    idx = rng.choice(dim, size=min(massive, dim), replace=False)
    mu[idx] = ratio * pop_std[idx] * np.where(rng.random(idx.size) < 0.5, -1.0, 1.0)
    return (z + mu).astype(dtype)


def reference_covariance(x: np.ndarray) -> np.ndarray:
    """Two-pass float64 covariance: subtract the exact mean, then ``Xc^T Xc / (n - 1)``."""
    xd = np.asarray(x, dtype=np.float64).reshape(-1, x.shape[-1])
    xc = xd - xd.mean(axis=0)
    return xc.T @ xc / (xd.shape[0] - 1)


def reference_eigenvalues(cov: np.ndarray) -> np.ndarray:
    """``np.linalg.eigvalsh`` in float64, descending, negatives clipped to 0 (nothing else)."""
    return np.clip(np.linalg.eigvalsh(cov), 0.0, None)[::-1].copy()


def reference_summary(x: np.ndarray) -> dict[str, float]:
    """Observables of the two-pass reference covariance and its plain ``eigvalsh`` spectrum."""
    cov = reference_covariance(x)
    n = x.reshape(-1, x.shape[-1]).shape[0]
    return summarize(cov, Spectrum(reference_eigenvalues(cov), n, 0, 0, 0.0))


def accumulate(
    x: np.ndarray, *, gram_dtype: torch.dtype = torch.float64, batch_rows: int | Iterable[int] = 256
) -> StreamingCovariance:
    """Stream ``x`` through a fresh accumulator in batches (a fixed size or explicit sizes)."""
    acc = StreamingCovariance(x.shape[-1], gram_dtype=gram_dtype)
    t = torch.from_numpy(np.ascontiguousarray(x))
    sizes = [batch_rows] * (-(-t.shape[0] // batch_rows)) if isinstance(batch_rows, int) else list(batch_rows)
    start = 0
    for size in sizes:
        acc.update(t[start : start + size])
        start += size
    assert start >= t.shape[0]
    return acc


def relative_errors(
    got: dict[str, float], want: dict[str, float], keys: Iterable[str] = METRIC_KEYS
) -> dict[str, float]:
    """``|got - want| / |want|`` per key (absolute when ``want == 0``); NaN must match NaN."""
    out = {}
    for k in keys:
        g, w = got[k], want[k]
        if np.isnan(w) or np.isnan(g):
            out[k] = 0.0 if (np.isnan(w) and np.isnan(g)) else np.inf
        else:
            out[k] = abs(g - w) / abs(w) if w != 0 else abs(g)
    return out
