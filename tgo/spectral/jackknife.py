"""Grouped (delete-a-group) jackknife: a standard error for every observable from the same single pass.

The analysis images are split into ``G`` groups; every row of an image goes to its group's `StreamingCovariance`
(`GroupedCovariance`), so the Gram work is the same as one accumulator's, only split. After the (unchanged) sum
all-reduce the total is the exact merge of all groups, and the ``g``-th leave-one-group-out accumulator the exact
merge of the others. Each yields a spectrum and the catalogue's observables; for an observable ``theta``
with leave-one-out values ``theta_(g)`` and their mean ``theta_(.)``::

    stderr = sqrt((G - 1) / G * sum_g (theta_(g) - theta_(.))^2)

(Efron and Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 11; the delete-a-group form of Kott, 2001).
Groups must be independent units: TGO groups whole images, since the tokens of one image are strongly dependent.

Why images, not tokens, and why stratified by class: the quantity of interest is the geometry of the population the
analysis subset was drawn from; resampling whole images (balanced over classes, so every leave-one-out subset keeps
the class mix) measures how much it would move with another draw of images.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from tgo.spectral.accumulator import StreamingCovariance

__all__ = ["GroupedCovariance", "jackknife_groups", "jackknife_stderr", "leave_one_group_out"]


def jackknife_groups(labels: Sequence[int] | np.ndarray, groups: int) -> np.ndarray:
    """The jackknife group of every analysis image: class-stratified, sizes differing by at most one.

    Images are taken class by class (in subset order within a class) and dealt to groups ``0, 1, ..., G-1`` in
    turn, the count continuing across classes. Every group then holds about ``1/G`` of every class (exactly, when a
    class has a multiple of ``G`` images), so each leave-one-group-out subset keeps the class mix, and the
    assignment depends only on the labels: the same subset gives the same groups on every rank and every run.

    Args:
        labels: One class label per analysis image, in subset order.
        groups: ``G >= 1``.

    Returns:
        int64 ``[len(labels)]`` group ids.
    """
    labels = np.asarray(labels).reshape(-1)
    if groups < 1:
        raise ValueError(f"jackknife_groups: groups must be >= 1, got {groups}")
    order = np.lexsort((np.arange(labels.size), labels))  # by class, then by position in the subset
    out = np.empty(labels.size, dtype=np.int64)
    out[order] = np.arange(labels.size) % groups
    return out


class GroupedCovariance:
    """``G`` `StreamingCovariance` accumulators of one observation point; each row goes to exactly one of them.

    The group of every row comes from ``batch_groups``: the caller sets it to the ``[B]`` group ids of the images
    of the batch about to run, and ``update(x)`` splits ``x`` (``[B, ..., D]``, first axis the image) by them.

    Args:
        groups: Number of groups ``G >= 1``.
        dim: Feature dimension.
        gram_dtype: Gram product precision of every group accumulator.
        device: Where the state lives.
    """

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
        """Adds a batch, row blocks of each image to that image's group.

        Raises:
            RuntimeError: ``batch_groups`` was not set or does not match the batch size.
        """
        ids = self.batch_groups
        if ids is None or ids.shape[0] != x.shape[0]:
            raise RuntimeError(
                f"GroupedCovariance.update: batch_groups must hold one group id per image of the batch ({x.shape[0]});"
                f" got {None if ids is None else tuple(ids.shape)}"
            )
        ids = ids.to(x.device)
        present = torch.unique(ids).tolist()
        if len(present) == 1:
            self.groups[int(present[0])].update(x)
            return
        for g in present:
            self.groups[int(g)].update(x[ids == g])


def _merged(parts: Sequence[StreamingCovariance]) -> StreamingCovariance:
    first = parts[0]
    total = StreamingCovariance(first.dim, gram_dtype=first.gram_dtype, device=first.device)
    for part in parts:
        total.merge(part)
    return total


def leave_one_group_out(groups: Sequence[StreamingCovariance]) -> tuple[StreamingCovariance, list[StreamingCovariance]]:
    """The total accumulator and the ``G`` leave-one-group-out accumulators, each an exact merge of group states.

    Returns:
        ``(total, [without group 0, ..., without group G-1])``; for ``G == 1`` the list is empty.
    """
    total = _merged(groups)
    if len(groups) < 2:
        return total, []
    return total, [_merged([p for j, p in enumerate(groups) if j != g]) for g in range(len(groups))]


def jackknife_stderr(leave_one_out: Sequence[float] | np.ndarray) -> float:
    """Delete-a-group jackknife standard error from the ``G`` leave-one-out values of an observable.

    Returns:
        ``sqrt((G - 1) / G * sum (theta_(g) - mean)^2)``; NaN when ``G < 2`` or any value is NaN.
    """
    values = np.asarray(leave_one_out, dtype=np.float64)
    g = values.size
    if g < 2 or not np.all(np.isfinite(values)):
        return math.nan
    return float(math.sqrt((g - 1) / g * float(np.sum((values - values.mean()) ** 2))))
