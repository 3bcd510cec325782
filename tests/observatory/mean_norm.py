"""The toy family's numerics (docs/extending.md, recipe (e), file 1 of 3; a real family's live in ``tgo/spectral/``).

The mean L2 norm of a point's token rows, kept as two sums per jackknife group: ranks add them, and a jackknife
leaves one group out of both (`tgo.observatory.families.jackknife_ratio`).
"""

from __future__ import annotations

import torch


def norm_sums(rows: torch.Tensor, groups: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per jackknife group (``groups[b]`` of image ``b``): the sum of the L2 norms of the images' rows and their
    count, float64, from ``rows`` ``[B, ..., D]``."""
    norms = rows.double().norm(dim=-1).reshape(rows.shape[0], -1)  # [B, rows per image]
    total = torch.zeros(n_groups, dtype=torch.float64, device=rows.device).index_add_(0, groups, norms.sum(dim=1))
    count = torch.zeros_like(total).index_add_(0, groups, torch.full_like(norms[:, 0], norms.shape[1]))
    return total, count
