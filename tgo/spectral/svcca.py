"""SVCCA (Raghu et al. 2017) and PWCCA (Morcos et al. 2018) of two representations of the same images, by SVD.

Each representation (float64 ``[n, D]``, one row per image) is centred and SVD-truncated to the leading ``k``
left singular vectors that hold ``variance`` of its variance (at most ``max_components``: the authors' 0.99 and 50),
an orthonormal basis ``U`` (``[n, k]``) of the directions CCA then relates. CCA is invariant to an invertible map of
either side, so the canonical correlations of the reduced representations ``U_a S_a`` and ``U_b S_b`` are the
singular values ``rho`` of ``U_a^T U_b`` (Bjorck & Golub 1973: the cosines of the principal angles between the two
column spaces), exact and without the iterations of scikit-learn's NIPALS ``CCA``.

* **SVCCA** is the mean of the ``min(k_a, k_b)`` canonical correlations.
* **PWCCA** weights each canonical correlation by how much of the representation its canonical variate
  ``h_i = U w_i`` accounts for, ``alpha_i = sum_j |<h_i, x_j>|`` over the centred neurons ``x_j`` (Morcos et al.'s
  projection weighting, on the side with fewer components; ties: the first): ``sum_i alpha_i rho_i / sum_i alpha_i``.
  Since ``h_i`` lies in the span of ``U``, ``<h_i, x_j>`` is row ``i`` of ``W^T S V^T`` (``X = U S V^T``).
* ``shared=True`` is TGO-II's variant: both bases cut to the smaller ``k`` before CCA.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg

__all__ = ["Basis", "basis", "canonical", "similarity"]


@dataclass(frozen=True)
class Basis:
    """The SVD-truncated subspace of one centred representation.

    Attributes:
        u: float64 ``[n, k]`` orthonormal left singular vectors (the leading ``k``).
        projections: float64 ``[k, D]``: ``S_k V_k^T = U^T X_c``, the neurons seen from the basis (PWCCA's weights).
    """

    u: np.ndarray
    projections: np.ndarray

    @property
    def k(self) -> int:
        return int(self.u.shape[1])


def basis(x: np.ndarray, variance: float = 0.99, max_components: int = 50) -> Basis | None:
    """The leading left singular vectors of the centred ``x`` holding ``variance`` of its variance (the smallest
    ``k`` with ``sum_{i<=k} s_i^2 >= variance * sum s_i^2``, at most ``max_components`` and the numerical rank);
    ``None`` where ``x`` has fewer than two rows, a non-finite value or no variance (beyond the rounding of its
    mean).

    The leading right singular vectors ``V`` are the top eigenvectors of ``X_c^T X_c`` (LAPACK's ``syevr`` for the
    top ``max_components`` only: a third of the cost of numpy's SVD of a ``[1000, 384]`` matrix, which computes all
    384 left vectors), and ``U`` is ``X_c V`` orthonormalised (QR), the same span.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.shape[0] < 2 or not np.all(np.isfinite(x)):
        return None
    xc = x - x.mean(axis=0)
    gram = xc.T @ xc
    total = float(np.trace(gram))
    eps = np.finfo(np.float64).eps
    if not total > 4 * x.size * (eps * float(np.abs(x).max())) ** 2:
        return None
    d = gram.shape[0]
    m = min(int(max_components), d, x.shape[0] - 1)
    lam, v = scipy.linalg.eigh(gram, subset_by_index=[d - m, d - 1], driver="evr", check_finite=False)
    lam, v = lam[::-1], v[:, ::-1]
    rank = int(np.count_nonzero(lam > lam[0] * max(x.shape) * eps))
    k = min(int(np.searchsorted(np.cumsum(lam) / total, variance)) + 1, rank)
    u = np.linalg.qr(xc @ v[:, :k])[0]
    return Basis(u, u.T @ xc)


def canonical(a: Basis, b: Basis, shared: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The ``min(k_a, k_b)`` canonical correlations ``rho`` (descending) and their projection weights ``alpha``."""
    ua, ub, pa, pb = a.u, b.u, a.projections, b.projections
    if shared:
        m = min(a.k, b.k)
        ua, ub, pa, pb = ua[:, :m], ub[:, :m], pa[:m], pb[:m]
    w, rho, zt = np.linalg.svd(ua.T @ ub, full_matrices=False)
    directions = w.T @ pa if ua.shape[1] <= ub.shape[1] else zt @ pb  # [m, D]: <h_i, x_j> for every neuron j
    return np.minimum(rho, 1.0), np.abs(directions).sum(axis=1)


def similarity(a: Basis | None, b: Basis | None, shared: bool = False) -> tuple[float, float]:
    """``(SVCCA, PWCCA)`` of two representations of the same images (NaN where either has no basis; PWCCA NaN where
    the two bases hold more components than the images less one)."""
    if a is None or b is None:
        return math.nan, math.nan
    rho, alpha = canonical(a, b, shared)
    k = 2 * min(a.k, b.k) if shared else a.k + b.k
    if k > a.u.shape[0] - 1:  # some correlations are 1 by construction: any rotation among them is canonical, and
        return float(rho.mean()), math.nan  # the L1 weights are not rotation invariant (docs/observables.md, 14)
    return float(rho.mean()), float(alpha @ rho / alpha.sum())
