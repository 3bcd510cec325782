"""Grouped (delete-a-group) jackknife: a standard error for every observable from the same single pass.

Each image's rows go to its class-stratified group's accumulator (`GroupedCovariance`, the same Gram work split);
after the all-reduce the total is the groups' exact combination and each leave-one-group-out covariance the total less
one group. Groups are whole images, since one image's tokens are dependent (``docs/observables.md``, "Uncertainty").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from tgo.spectral.accumulator import StreamingCovariance

__all__ = [
    "GroupedCovariance",
    "Moments",
    "combine",
    "jackknife_groups",
    "jackknife_stderr",
    "jackknife_stderrs",
    "leave_one_group_out",
    "moments",
    "remove",
    "row_moments",
    "subset_masks",
    "with_jackknife",
]


def jackknife_groups(labels: Sequence[int] | np.ndarray, groups: int) -> np.ndarray:
    """The jackknife group of every analysis image, dealt class by class in turn: each leave-one-out subset keeps the
    class mix, and the groups depend only on the labels (the same on every rank and run)."""
    labels = np.asarray(labels).reshape(-1)
    if groups < 1:
        raise ValueError(f"jackknife_groups: groups must be >= 1, got {groups}")
    order = np.lexsort((np.arange(labels.size), labels))  # by class, then by position in the subset
    out = np.empty(labels.size, dtype=np.int64)
    out[order] = np.arange(labels.size) % groups
    return out


def runs_of(values: list[int]) -> list[tuple[int, int, int]]:
    """``(group, start, stop)`` of each run of equal consecutive ids: one update per run on a view, no masked copy."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            runs.append((int(values[start]), start, i))
            start = i
    return runs


class GroupedCovariance:
    """``G`` `StreamingCovariance` accumulators of one point; ``update(x)`` sends each image's rows to the group the
    caller set in ``batch_groups`` (the next batch's ``[B]`` ids), one update per run of equal ids."""

    def __init__(
        self,
        groups: int,
        dim: int,
        *,
        gram_dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        if groups < 1:
            raise ValueError(f"GroupedCovariance: groups must be >= 1, got {groups}")
        self.groups = [StreamingCovariance(dim, gram_dtype=gram_dtype, device=device) for _ in range(groups)]
        self.batch_groups: torch.Tensor | None = None
        self._runs: list[tuple[int, int, int]] = []
        self._runs_of: torch.Tensor | None = None

    @property
    def dim(self) -> int:
        """Feature dimension."""
        return self.groups[0].dim

    @property
    def n(self) -> int:
        """Rows over all groups."""
        return sum(g.n for g in self.groups)

    @property
    def n_nonfinite(self) -> int:
        """Non-finite rows over all groups."""
        return sum(g.n_nonfinite for g in self.groups)

    def update(self, x: torch.Tensor) -> None:
        """Adds a batch, row blocks of each image to that image's group (``batch_groups`` set for it)."""
        ids = self.batch_groups
        if ids is None or ids.shape[0] != x.shape[0]:
            raise RuntimeError(
                f"GroupedCovariance.update: batch_groups must hold one group id per image of the batch ({x.shape[0]});"
                f" got {None if ids is None else tuple(ids.shape)}"
            )
        if ids is not self._runs_of:
            self._runs, self._runs_of = runs_of(ids.detach().cpu().tolist()), ids  # read on the CPU: no device sync
        for group, start, stop in self._runs:
            self.groups[group].update(x[start:stop])


Moments = tuple[np.ndarray, np.ndarray, int, int]
"""``(covariance [D, D], mean [D], n_rows, n_nonfinite)`` in float64 numpy."""


def moments(acc: StreamingCovariance) -> Moments:
    """float64 numpy moments of one accumulator from its shifted sums: torch's many small ops cost more than the
    eigendecompositions in the rank-0 summary. NaN covariance below 2 rows, NaN mean without rows."""
    n, nonfinite, dim = int(acc.n), int(acc.n_nonfinite), acc.dim
    if n == 0 or acc.shift is None:
        return np.full((dim, dim), np.nan), np.full(dim, np.nan), 0, nonfinite
    # The accumulator's own float64 sums, read without the copies state_dict makes (nothing here writes to them).
    s1 = _numpy64(acc._s1)
    s2 = _numpy64(acc._s2)
    mean = _numpy64(acc.shift) + s1 / n
    if n < 2:
        return np.full((dim, dim), np.nan), mean, n, nonfinite
    # (s2 - outer(s1, s1) / n) / (n - 1), then (C + C^T) / 2: the same operations, in place on one temporary
    cov = np.outer(s1, s1)
    cov /= n
    np.subtract(s2, cov, out=cov)
    cov /= n - 1
    return _symmetric(cov), mean, n, nonfinite


def _numpy64(t: torch.Tensor) -> np.ndarray:
    """A float64 numpy view (or copy, if it has to move or convert) of a tensor."""
    return t.detach().cpu().numpy().astype(np.float64, copy=False)


def _symmetric(mat: np.ndarray, divisor: float = 2) -> np.ndarray:
    """``(M + M^T) / divisor`` (a new array; ``M`` is left as it is)."""
    out = mat + mat.T
    out /= divisor
    return out


def combine(groups: Sequence[Moments]) -> Moments:
    """The moments of all rows from the groups' (Chan, Golub and LeVeque): each ``M2_g`` was accumulated near its own
    mean, so no term cancels (~1e-15 from one accumulator over all rows)."""
    dim = groups[0][1].shape[0]
    n = sum(g[2] for g in groups)
    nonfinite = sum(g[3] for g in groups)
    if n == 0:
        return np.full((dim, dim), np.nan), np.full(dim, np.nan), 0, nonfinite
    mean = sum((g[2] * g[1] for g in groups if g[2] > 0), np.zeros(dim)) / n
    m2 = np.zeros((dim, dim))
    term = np.empty((dim, dim))
    for cov, g_mean, g_n, _ in groups:
        if g_n == 0:
            continue
        if g_n >= 2:
            np.multiply(cov, g_n - 1, out=term)
            m2 += term
        d = g_mean - mean
        np.multiply.outer(d, d, out=term)
        term *= g_n
        m2 += term
    if n < 2:
        return np.full((dim, dim), np.nan), mean, n, nonfinite
    return _symmetric(m2, 2 * (n - 1)), mean, n, nonfinite


def leave_one_group_out(total: Moments, groups: Sequence[Moments]) -> list[Moments]:
    """The moments of every leave-one-group-out subset from the total's and the groups' (`remove`), O(D^2) each
    instead of a merge of G - 1 states, equal to it to ~1e-15; fewer than 2 rows give a NaN covariance."""
    if not groups:
        return []
    cov, _, n, _ = total
    m2 = cov * (n - 1) if n >= 2 else np.zeros_like(cov)  # the total's scatter, shared by every subset
    return [_remove(total, group, m2) for group in groups]


def remove(total: Moments, part: Moments) -> Moments:
    """The moments of the rows of ``total`` not in ``part`` in O(D^2), exact to round-off of the total's scatter."""
    cov, _, n, _ = total
    return _remove(total, part, cov * (n - 1) if n >= 2 else np.zeros_like(cov))


def _remove(total: Moments, part: Moments, m2: np.ndarray) -> Moments:
    """`remove` with the total's ``M2 = (n - 1) C`` given (``m2`` is not written to)."""
    cov, mean, n, nonfinite = total
    p_cov, p_mean, p_n, p_nonfinite = part
    rest = n - p_n
    if p_n == 0:
        return cov, mean, n, nonfinite - p_nonfinite
    if rest < 1:
        return np.full_like(cov, np.nan), np.full_like(mean, np.nan), rest, nonfinite - p_nonfinite
    d = p_mean - mean
    r_mean = (n * mean - p_n * p_mean) / rest
    if rest < 2:
        return np.full_like(cov, np.nan), r_mean, rest, nonfinite - p_nonfinite
    # m2 - p_m2 - (n p_n / rest) outer(d, d), in place. Every term is exactly symmetric (both scatters are, and
    # d_i d_j == d_j d_i), so the difference is too and needs no (M + M^T) / 2: dividing by rest - 1 gives the same
    # bits that (M + M^T) / (2 (rest - 1)) would, for a tenth of the leave-one-out's cost.
    r_m2 = m2 - p_cov * (p_n - 1) if p_n >= 2 else m2.copy()
    term = np.multiply.outer(d, d)
    term *= n * p_n / rest
    r_m2 -= term
    r_m2 /= rest - 1
    return r_m2, r_mean, rest, nonfinite - p_nonfinite


def row_moments(rows: np.ndarray) -> Moments:
    """float64 moments of the rows of a matrix ``[n, D]``, from deviations (no cancellation); NaN below 2 rows."""
    x = np.asarray(rows, dtype=np.float64)
    n, dim = x.shape
    if n == 0:
        return np.full((dim, dim), np.nan), np.full(dim, np.nan), 0, 0
    mean = x.mean(axis=0)
    if n < 2:
        return np.full((dim, dim), np.nan), mean, n, 0
    dev = x - mean
    cov = dev.T @ dev
    cov /= n - 1
    return _symmetric(cov), mean, n, 0


def jackknife_stderr(leave_one_out: Sequence[float] | np.ndarray) -> float:
    """Delete-a-group jackknife standard error ``sqrt((G - 1) / G * sum (theta_(g) - mean)^2)`` from the ``G``
    leave-one-out values of an observable; NaN when ``G < 2`` or any value is not finite."""
    values = np.asarray(leave_one_out, dtype=np.float64)
    g = values.size
    if g < 2 or not np.all(np.isfinite(values)):
        return math.nan
    return float(math.sqrt((g - 1) / g * float(np.sum((values - values.mean()) ** 2))))


def jackknife_stderrs(leave_one_out: np.ndarray) -> np.ndarray:
    """`jackknife_stderr` of every row of a ``[K, G]`` array, bit for bit (numpy reduces each row as a 1-D array)."""
    values = np.ascontiguousarray(leave_one_out, dtype=np.float64)
    if values.ndim != 2:
        raise ValueError(f"jackknife_stderrs: expected [K, G] leave-one-out values, got shape {values.shape}")
    k, g = values.shape
    if g < 2:
        return np.full(k, math.nan)
    with np.errstate(invalid="ignore", over="ignore"):  # rows with inf or NaN are NaN below, as jackknife_stderr's
        squares = (values - values.mean(axis=1, keepdims=True)) ** 2
        out = np.sqrt((g - 1) / g * squares.sum(axis=1))
    out[~np.all(np.isfinite(values), axis=1)] = math.nan
    return out


def subset_masks(image_groups: np.ndarray | None, groups: int, n: int) -> list[np.ndarray]:
    """Boolean masks of ``n`` images: all of them, then each leave-one-group-out set (only all without groups), for a
    statistic recomputed on every subset rather than summed (intrinsic dimension, SVCCA, class centroids)."""
    everything = np.ones(n, dtype=bool)
    if image_groups is None or groups < 2:
        return [everything]
    return [everything, *(image_groups != g for g in range(groups))]


def with_jackknife(values: Sequence[float] | np.ndarray) -> tuple[float, float, np.ndarray | None]:
    """``(value, jackknife standard error, replicates)`` of ``[whole, replicate_1, ...]`` as `subset_masks` orders
    them (no error and no replicates with fewer than two)."""
    replicates = np.array(values[1:], dtype=np.float64)
    if replicates.size < 2:
        return float(values[0]), math.nan, None
    return float(values[0]), jackknife_stderr(replicates), replicates
