"""Token-token covariance of one observation point, streamed as sums: its coupling and its spectrum.

Each token position ``t`` of a point's ``[B, T, D]`` sequence is a variable and each (image, feature channel) pair an
observation, so the covariance is ``T x T``. It is summed per jackknife group from three float64 sums of each
image's ``X_b`` (``[T, D]``) split into its per-token channel means ``m_b = X_b 1 / D`` and the rest
``Xc_b = X_b - m_b 1^T`` (no cancellation: the centred Gram does not subtract two large numbers):

* ``gram``: ``W = sum_b Xc_b Xc_b^T`` (``[T, T]``), ``means``: ``M1 = sum_b m_b`` (``[T]``), ``mean_gram``:
  ``M2 = sum_b m_b m_b^T`` (``[T, T]``), ``images``: ``n``.

Two centrings (`CENTERINGS`) are read from them: ``pooled`` (TGO's) is the covariance of the ``n D`` observations
around each token's mean over all of them, ``(W + D (M2 - M1 M1^T / n)) / (n D - 1)`` (the law of total covariance:
within-image plus between-image scatter); ``per_image`` (TGO-II's ``token_covariance_matrix``) centres each token
within each image over its channels and averages the images' covariances, ``W / (n (D - 1))`` (no ``M2`` needed).
The metrics of a covariance ``C`` (`coupling_metrics`): the off-diagonal energy fraction of its correlation, TGO-II's
coupling ratio (absolute off-diagonal mass over absolute mass) and the effective rank of its spectrum. Formulas,
costs and every departure from TGO-II: ``docs/observables.md``, "Token coupling".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tgo.spectral.decomposition import eigendecompose_many
from tgo.spectral.jackknife import jackknife_stderr
from tgo.spectral.observables import effective_rank, offdiag_energy_fraction

__all__ = [
    "CENTERINGS",
    "COUPLING_METRICS",
    "TokenCoupling",
    "TokenSums",
    "coupling_metrics",
    "coupling_ratio",
    "token_correlation",
    "token_coupling",
    "token_covariance",
]

CENTERINGS: tuple[str, ...] = ("pooled", "per_image")
"""``pooled``: one mean per token over every (image, channel) observation (TGO's default); ``per_image``: each
token centred within each image over its channels, the images' covariances averaged (TGO-II's definition)."""

COUPLING_METRICS: tuple[str, ...] = ("token_offdiag_fraction", "token_coupling_ratio", "token_effective_rank")
"""The metrics of one token covariance, in record order (`coupling_metrics`)."""

_EPS = float(np.finfo(np.float64).eps)


class TokenSums:
    """One point's per-group sums ``W``, ``M1``, ``M2`` and image counts on one rank (a summable: plain float64 sums,
    so ranks add them element-wise in the observation's second collective, exactly up to the order of the additions).

    Args:
        groups: Jackknife groups ``G`` (1 without a jackknife).
        tokens: ``T``.
        centering: One of `CENTERINGS` (``per_image`` needs no ``M2`` and keeps none).
        device: Where the sums live (the collective's device).
    """

    def __init__(self, groups: int, tokens: int, centering: str, device: torch.device | str | None = None) -> None:
        if centering not in CENTERINGS:
            raise ValueError(f"TokenSums: centering must be one of {CENTERINGS}; got {centering!r}")
        self.groups, self.tokens, self.centering = int(groups), int(tokens), centering
        shapes = {"images": (groups,), "channels": (groups,), "means": (groups, tokens)}
        shapes["gram"] = (groups, tokens, tokens)
        if centering == "pooled":
            shapes["mean_gram"] = (groups, tokens, tokens)
        with torch.inference_mode(False):
            self.sums = {k: torch.zeros(s, dtype=torch.float64, device=device) for k, s in shapes.items()}

    def update(self, x: torch.Tensor, runs: Sequence[tuple[int, int, int]] | None = None) -> None:
        """Adds the images of one batch, ``x`` ``[B, T, D]`` (any float dtype): ``runs`` are the ``(group, start,
        stop)`` runs of its images' groups (`tgo.spectral.jackknife.runs_of`; ``None``: all in group 0). One float64
        ``[T, k D] x [k D, T]`` product per run of ``k`` images."""
        if x.dim() != 3 or x.shape[1] != self.tokens:
            raise ValueError(f"expected [B, {self.tokens}, D] token rows, got shape {tuple(x.shape)}")
        runs = [(0, 0, x.shape[0])] if runs is None else runs
        device = self.sums["gram"].device
        with torch.inference_mode(False):
            x = x.detach().to(device=device, dtype=torch.float64)
            means = x.mean(dim=2)
            centred = x - means[:, :, None]
            for g, start, stop in runs:
                rows = centred[start:stop].transpose(0, 1).reshape(self.tokens, -1)  # [T, k D]
                self.sums["gram"][g].addmm_(rows, rows.T)
                self.sums["means"][g] += means[start:stop].sum(dim=0)
                if "mean_gram" in self.sums:
                    self.sums["mean_gram"][g].addmm_(means[start:stop].T, means[start:stop])
                self.sums["images"][g] += stop - start
                self.sums["channels"][g] += (stop - start) * x.shape[2]

    @property
    def packed_size(self) -> int:
        return sum(t.numel() for t in self.sums.values())

    def pack_into(self, out: torch.Tensor) -> None:
        offset = 0
        for t in self.sums.values():
            out[offset : offset + t.numel()].view(t.shape).copy_(t)
            offset += t.numel()

    def unpack_(self, flat: torch.Tensor, *, copy: bool = False) -> None:
        offset = 0
        for name, t in self.sums.items():
            part = flat[offset : offset + t.numel()].view(t.shape)
            self.sums[name] = part.clone() if copy else part
            offset += t.numel()

    @property
    def n_images(self) -> int:
        """Images summed (over every group and, after the reduction, every rank)."""
        return round(float(self.sums["images"].sum().item()))

    def numpy(self) -> dict[str, np.ndarray]:
        """The sums as float64 numpy arrays (after the reduction, on the rank that summarises the point)."""
        return {k: t.detach().cpu().numpy().astype(np.float64, copy=False) for k, t in self.sums.items()}


def token_covariance(sums: dict[str, np.ndarray], centering: str) -> tuple[np.ndarray, int]:
    """The ``T x T`` covariance of one set of images' sums (``images`` and ``channels`` scalars, ``means`` ``[T]``,
    ``gram`` and, for ``pooled``, ``mean_gram`` ``[T, T]``) and its observation count (the spectrum's rank bound).

    NaN where it is undefined (no images, or fewer than 2 observations / channels)."""
    n, total = float(sums["images"]), float(sums["channels"])
    tokens = sums["means"].shape[0]
    dim = total / n if n > 0 else 0.0
    if centering == "pooled":
        observations = round(total)
        if n < 1 or total < 2:
            return np.full((tokens, tokens), np.nan), observations
        between = sums["mean_gram"] - np.outer(sums["means"], sums["means"]) / n
        cov = (sums["gram"] + dim * between) / (total - 1)
    else:  # per_image: the images' covariances (divisor D - 1) averaged
        observations = round(n * (dim - 1)) + 1  # rank <= n (D - 1)
        if n < 1 or dim < 2:
            return np.full((tokens, tokens), np.nan), observations
        cov = sums["gram"] / (n * (dim - 1))
    return (cov + cov.T) / 2, observations


def token_correlation(cov: np.ndarray) -> np.ndarray | None:
    """The correlation of the tokens with variance (``C_tt > max_s C_ss T eps``, as
    `tgo.spectral.mean_abs_offdiag_correlation`), clipped to ``[-1, 1]``; ``None`` below two such tokens or for a
    non-finite ``C``."""
    if not np.all(np.isfinite(cov)):
        return None
    var = np.diag(cov)
    keep = var > max(float(var.max()) * var.size * _EPS, 0.0)
    if int(keep.sum()) < 2:
        return None
    std = np.sqrt(var[keep])
    return np.clip(cov[np.ix_(keep, keep)] / np.outer(std, std), -1.0, 1.0)


def coupling_ratio(cov: np.ndarray) -> float:
    """TGO-II's coupling ratio ``sum_{t != s} |C_ts| / sum_{t, s} |C_ts|``; NaN for a zero or non-finite ``C``."""
    if not np.all(np.isfinite(cov)):
        return math.nan
    absolute = np.abs(cov)
    total = float(absolute.sum())
    if total <= 0:
        return math.nan
    return float((total - float(np.trace(absolute))) / total)


def coupling_metrics(cov: np.ndarray, eigenvalues: np.ndarray) -> dict[str, float]:
    """`COUPLING_METRICS` of one token covariance and its (clamped, descending) eigenvalues."""
    corr = token_correlation(cov)
    defined = bool(np.all(np.isfinite(eigenvalues)))
    return {
        "token_offdiag_fraction": offdiag_energy_fraction(corr) if corr is not None else math.nan,
        "token_coupling_ratio": coupling_ratio(cov),
        "token_effective_rank": effective_rank(eigenvalues) if defined else math.nan,
    }


@dataclass(frozen=True)
class TokenCoupling:
    """One point's token coupling.

    Attributes:
        values: ``{metric: value}`` of all images (`COUPLING_METRICS`).
        stderr: ``{metric: jackknife standard error}`` (NaN below two groups).
        replicates: ``{metric: float64 [G] leave-one-group-out values}`` (empty below two groups).
        eigenvalues: float64 ``[T]`` spectrum of the covariance of all images, descending.
    """

    values: dict[str, float]
    stderr: dict[str, float]
    replicates: dict[str, np.ndarray]
    eigenvalues: np.ndarray


def token_coupling(sums: dict[str, np.ndarray], centering: str) -> TokenCoupling:
    """The metrics of the covariance of all images and of every leave-one-group-out subset (``sums``: per-group
    arrays, first axis the group, as `TokenSums.numpy` gives them), the leave-one-out values the group totals minus
    that group's sums; the ``G + 1`` spectra in one stacked eigensolver call."""
    total = {k: v.sum(axis=0) for k, v in sums.items()}
    groups = int(sums["images"].shape[0])
    subsets: Sequence[dict[str, np.ndarray]] = [total]
    if groups >= 2:
        subsets = [total, *({k: total[k] - sums[k][g] for k in sums} for g in range(groups))]
    covs, counts = zip(*(token_covariance(s, centering) for s in subsets), strict=True)
    spectra = eigendecompose_many(list(covs), list(counts))
    rows = [coupling_metrics(c, s.eigenvalues) for c, s in zip(covs, spectra, strict=True)]
    values = rows[0]
    if groups >= 2:
        replicates = {m: np.array([r[m] for r in rows[1:]], dtype=np.float64) for m in COUPLING_METRICS}
        stderr = {m: jackknife_stderr(replicates[m]) for m in COUPLING_METRICS}
    else:
        replicates, stderr = {}, dict.fromkeys(COUPLING_METRICS, math.nan)
    return TokenCoupling(values, stderr, replicates, np.array(spectra[0].eigenvalues, dtype=np.float64))
