"""Hypothesis probes: the numerics that tell TGO-I's three explanations of spreading variance apart.

Pure float64 numpy on small matrices that rank 0 already holds after an observation (one vector per analysis image,
a few ``[D, k]`` eigenvector blocks); formulas and reasoning: ``docs/hypotheses.md``.

* class-conditional geometry of per-image vectors (semantic expansion): `class_geometry` (Fisher ratio, NC1,
  effective ranks of the between- and within-class scatter), `ncc_accuracy` and `ridge_accuracy` (held-out linear
  decodability);
* subspace drift: `subspace_overlap` (mean cos^2 of the principal angles between two eigenspaces);
* massive activations: `massive_activations` (largest per-dimension max |x| over the median one);
* representation similarity between points: `linear_cka`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tgo.spectral.observables import effective_rank

__all__ = [
    "ClassGeometry",
    "MassiveActivations",
    "class_geometry",
    "cross_validated_accuracy",
    "linear_cka",
    "massive_activations",
    "ncc_accuracy",
    "ridge_accuracy",
    "subspace_overlap",
    "top_eigenvectors",
]

_EPS = float(np.finfo(np.float64).eps)


def _as_rows(x: np.ndarray) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise ValueError(f"expected a non-empty [n_images, D] matrix, got shape {arr.shape}")
    return arr


def _psd_eigenvalues(mat: np.ndarray) -> np.ndarray:
    """Descending eigenvalues of a symmetric PSD matrix, round-off negatives clamped to 0."""
    return np.clip(np.linalg.eigvalsh((mat + mat.T) / 2)[::-1], 0.0, None)


@dataclass(frozen=True)
class ClassGeometry:
    """Class-conditional geometry of one set of per-image vectors (scatters are sums, not averages).

    Attributes:
        fisher_ratio: ``tr(S_B) / tr(S_W)`` with ``S_B = sum_c n_c (mu_c - mu)(mu_c - mu)^T`` and
            ``S_W = sum_i (x_i - mu_{y_i})(x_i - mu_{y_i})^T``; ``inf`` when every class is collapsed to its mean.
        nc1: ``tr(Sigma_W Sigma_B^+) / C`` (Papyan, Han and Donoho 2020) with ``Sigma_W = S_W / n`` and
            ``Sigma_B = (1/C) sum_c (mu_c - mu_G)(mu_c - mu_G)^T``, ``mu_G`` the mean of the class means; 0 on
            collapsed classes. The pseudo-inverse drops eigenvalues ``<= lambda_1 * max(D, C) * eps``.
        between_effective_rank: Effective rank of ``S_B`` (at most ``C - 1``).
        within_effective_rank: Effective rank of ``S_W``; NaN when ``S_W = 0``.
        n_classes: Classes present.
    """

    fisher_ratio: float
    nc1: float
    between_effective_rank: float
    within_effective_rank: float
    n_classes: int


def class_geometry(x: np.ndarray, labels: np.ndarray) -> ClassGeometry:
    """`ClassGeometry` of per-image vectors ``x`` ``[n, D]`` with integer ``labels`` ``[n]``.

    The scatters are formed from deviations (never from raw second moments), so no term cancels: the vectors of a
    ViT's residual stream have means far larger than their spread.
    """
    x = _as_rows(x)
    labels = np.asarray(labels).reshape(-1)
    if labels.size != x.shape[0]:
        raise ValueError(f"class_geometry: {x.shape[0]} vectors but {labels.size} labels")
    if not np.all(np.isfinite(x)):
        return ClassGeometry(math.nan, math.nan, math.nan, math.nan, int(np.unique(labels).size))
    classes, first, index, counts = np.unique(labels, return_index=True, return_inverse=True, return_counts=True)
    n, d = x.shape
    c = classes.size
    # Each class is shifted by its first vector and the means by the first class mean: identical vectors then give
    # deviations of exactly 0 (a plain mean of k equal floats need not equal them, which would turn a collapsed
    # class into round-off scatter with a finite Fisher ratio and a meaningless within-class effective rank).
    ref = x[first]
    dev = x - ref[index]
    onehot = np.zeros((n, c))
    onehot[np.arange(n), index] = 1.0
    offsets = (onehot.T @ dev) / counts[:, None]  # class sums as one product (exact zeros stay zeros)
    means = ref + offsets
    spread = means - means[0]
    mu = means[0] + counts @ spread / n
    dev_b = (means - mu) * np.sqrt(counts)[:, None]
    dev_w = dev - offsets[index]
    s_w = dev_w.T @ dev_w
    tr_b, tr_w = float(np.sum(dev_b**2)), float(np.trace(s_w))
    fisher = tr_b / tr_w if tr_w > 0 else (math.inf if tr_b > 0 else math.nan)
    nc1 = math.nan
    if c >= 2:
        # Sigma_B = A^T A / C with A the centred class means [C, D]: its eigenpairs come from the thin SVD of A
        # (O(C^2 D), not O(D^3)), eigenvalues s^2 / C, eigenvectors the right singular vectors.
        centred = means - (means[0] + spread.mean(axis=0))
        _, sv, vt = np.linalg.svd(centred, full_matrices=False)
        e = sv**2 / c
        keep = e > max(float(e.max()), 0.0) * max(d, c) * _EPS
        if keep.any():
            # tr(Sigma_W Sigma_B^+) = sum_k (v_k^T Sigma_W v_k) / e_k over the kept eigenpairs, Sigma_W = S_W / n.
            along = np.sum((dev_w @ vt[keep].T) ** 2, axis=0) / n
            nc1 = float(np.sum(along / e[keep]) / c)
    # The non-zero eigenvalues of S_B = B^T B are those of B B^T ([C, C]), cheaper when C < D.
    between = _psd_eigenvalues(dev_b @ dev_b.T) if c < d else _psd_eigenvalues(dev_b.T @ dev_b)
    return ClassGeometry(
        fisher_ratio=fisher,
        nc1=nc1,
        between_effective_rank=effective_rank(between) if c >= 2 else math.nan,
        within_effective_rank=effective_rank(_psd_eigenvalues(s_w)) if tr_w > 0 else math.nan,
        n_classes=int(c),
    )


def _fold_split(folds: np.ndarray, fold: int) -> tuple[np.ndarray, np.ndarray]:
    test = folds == fold
    return ~test, test


def ncc_accuracy(x: np.ndarray, labels: np.ndarray, folds: np.ndarray) -> np.ndarray:
    """Held-out nearest-class-centre accuracy of every fold: centres from the other folds, Euclidean distance.

    A class absent from the training folds cannot be predicted (its images count as errors).

    Returns:
        float64 ``[n_folds]`` accuracies, in the order of ``np.unique(folds)``.
    """
    x, labels, folds = _as_rows(x), np.asarray(labels).reshape(-1), np.asarray(folds).reshape(-1)
    out = []
    for fold in np.unique(folds):
        train, test = _fold_split(folds, fold)
        classes, index = np.unique(labels[train], return_inverse=True)
        # Centred on the training mean first: residual-stream vectors have means far above their spread, and the
        # distance expansion below would otherwise compare large nearly equal numbers.
        shift = x[train].mean(axis=0)
        onehot = np.zeros((index.size, classes.size))
        onehot[np.arange(index.size), index] = 1.0
        centres = (onehot.T @ (x[train] - shift)) / np.bincount(index)[:, None]
        # ||x - c||^2 = ||x||^2 - 2 x.c + ||c||^2; the first term is common to every class, so it is dropped.
        score = (x[test] - shift) @ centres.T * 2 - np.sum(centres**2, axis=1)
        out.append(float(np.mean(classes[np.argmax(score, axis=1)] == labels[test])))
    return np.asarray(out)


def ridge_accuracy(x: np.ndarray, labels: np.ndarray, folds: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """Held-out accuracy of a closed-form ridge probe on one-hot targets, per fold.

    On each fold the training vectors are centred and ``W = (X^T X + lam I)^-1 X^T Y`` with
    ``lam = alpha * tr(X^T X) / D`` (``alpha`` times the mean per-dimension scatter, so the strength does not depend
    on the scale of the activations); the unpenalised intercept is the training class frequencies ``y_bar``, so a
    test image ``x`` scores ``y_bar + (x - mu) W`` and is assigned the class of its largest score (the argmax of
    scikit-learn's ``RidgeClassifier(alpha=lam)``).

    Returns:
        float64 ``[n_folds]`` accuracies, in the order of ``np.unique(folds)``.
    """
    if not alpha > 0:
        raise ValueError(f"ridge_accuracy: alpha must be > 0, got {alpha!r}")
    x, labels, folds = _as_rows(x), np.asarray(labels).reshape(-1), np.asarray(folds).reshape(-1)
    out = []
    for fold in np.unique(folds):
        train, test = _fold_split(folds, fold)
        classes, index = np.unique(labels[train], return_inverse=True)
        xt = x[train]
        mu = xt.mean(axis=0)
        xc = xt - mu
        gram = xc.T @ xc
        lam = alpha * float(np.trace(gram)) / x.shape[1]
        y = np.zeros((xt.shape[0], classes.size))
        y[np.arange(xt.shape[0]), index] = 1.0
        prior = y.mean(axis=0)  # the intercept: with centred X the least-squares intercept is the mean target
        if lam <= 0:  # every training vector identical: nothing to learn beyond the class frequencies
            out.append(float(np.mean(labels[test] == classes[np.argmax(prior)])))
            continue
        w = np.linalg.solve(gram + lam * np.eye(x.shape[1]), xc.T @ (y - prior))
        score = prior + (x[test] - mu) @ w
        out.append(float(np.mean(classes[np.argmax(score, axis=1)] == labels[test])))
    return np.asarray(out)


def cross_validated_accuracy(per_fold: np.ndarray, fold_sizes: np.ndarray) -> tuple[float, float]:
    """Pooled held-out accuracy and its standard error from per-fold accuracies.

    The pooled accuracy weighs folds by size (it is the fraction of all images classified correctly); the standard
    error is the delete-a-fold jackknife of that fraction, the same rule as every other TGO standard error.
    """
    acc = np.asarray(per_fold, dtype=np.float64)
    sizes = np.asarray(fold_sizes, dtype=np.float64)
    correct = acc * sizes
    total = float(correct.sum() / sizes.sum())
    g = acc.size
    if g < 2:
        return total, math.nan
    leave_out = (correct.sum() - correct) / (sizes.sum() - sizes)
    return total, float(math.sqrt((g - 1) / g * np.sum((leave_out - leave_out.mean()) ** 2)))


def top_eigenvectors(cov: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` leading eigenvectors of a symmetric matrix as float64 ``[D, k]`` columns (largest first)."""
    mat = np.asarray(cov, dtype=np.float64)
    k = max(0, min(int(k), mat.shape[0]))
    _, vectors = np.linalg.eigh((mat + mat.T) / 2)
    return np.ascontiguousarray(vectors[:, ::-1][:, :k])


def subspace_overlap(u: np.ndarray, v: np.ndarray, k: int | None = None) -> float:
    """Mean ``cos^2`` of the principal angles between the spans of the first ``k`` columns of ``u`` and ``v``.

    With orthonormal columns the cosines of the principal angles are the singular values of ``U^T V``, so the mean
    ``cos^2`` is ``||U^T V||_F^2 / k``: 1 for the same subspace, 0 for orthogonal ones, ``k / D`` expected for a
    random pair. ``k`` defaults to the columns both have; NaN when that is 0 or either block is non-finite.
    """
    u, v = np.asarray(u, dtype=np.float64), np.asarray(v, dtype=np.float64)
    if u.ndim != 2 or v.ndim != 2 or u.shape[0] != v.shape[0]:
        raise ValueError(f"subspace_overlap: expected [D, k] blocks of one D, got {u.shape} and {v.shape}")
    k = min(u.shape[1], v.shape[1]) if k is None else int(k)
    if k < 1 or k > min(u.shape[1], v.shape[1]):
        return math.nan
    a, b = u[:, :k], v[:, :k]
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return math.nan
    return float(np.sum((a.T @ b) ** 2) / k)


@dataclass(frozen=True)
class MassiveActivations:
    """Which dimensions carry activations far above the rest.

    Attributes:
        ratio: ``max_d M_d / median_d M_d`` with ``M_d = max |x_d|`` over every row the point saw.
        dimension: The ``d`` of that maximum.
        top: The five largest ``(dimension, M_d / median)`` pairs, largest first.
        variance_share: The variance of that dimension over the total variance (how much of the covariance's trace
            one dimension holds).
    """

    ratio: float
    dimension: int
    top: tuple[tuple[int, float], ...]
    variance_share: float


def massive_activations(max_abs: np.ndarray, variances: np.ndarray, top: int = 5) -> MassiveActivations:
    """`MassiveActivations` from the per-dimension ``max |x|`` and the per-dimension variances (diagonal of C)."""
    m = np.asarray(max_abs, dtype=np.float64).reshape(-1)
    var = np.asarray(variances, dtype=np.float64).reshape(-1)
    if m.size == 0 or not np.all(np.isfinite(m)):
        return MassiveActivations(math.nan, -1, (), math.nan)
    median = float(np.median(m))
    ratios = m / median if median > 0 else np.full_like(m, math.inf if m.max() > 0 else math.nan)
    order = np.argsort(-m, kind="stable")
    dim = int(order[0])
    total = float(var.sum()) if var.size == m.size else math.nan
    share = float(var[dim] / total) if total > 0 else math.nan
    return MassiveActivations(
        ratio=float(ratios[dim]),
        dimension=dim,
        top=tuple((int(i), float(ratios[i])) for i in order[:top]),
        variance_share=share,
    )


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear centred kernel alignment between two representations of the same images (Kornblith et al. 2019).

    ``CKA = ||Y_c^T X_c||_F^2 / (||X_c^T X_c||_F ||Y_c^T Y_c||_F)`` with column-centred ``X_c`` ``[n, D1]`` and
    ``Y_c`` ``[n, D2]``: 1 for representations equal up to rotation and isotropic scaling, in ``[0, 1]``.
    """
    x, y = _as_rows(x), _as_rows(y)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"linear_cka: {x.shape[0]} and {y.shape[0]} images; both must describe the same images")
    xc, yc = x - x.mean(axis=0), y - y.mean(axis=0)
    cross = float(np.sum((yc.T @ xc) ** 2))
    norm = float(np.linalg.norm(xc.T @ xc) * np.linalg.norm(yc.T @ yc))
    return cross / norm if norm > 0 else math.nan


def cka_matrix(vectors: Sequence[np.ndarray]) -> np.ndarray:
    """Symmetric ``[P, P]`` matrix of `linear_cka` between every pair of per-image representations."""
    p = len(vectors)
    out = np.eye(p)
    for i in range(p):
        for j in range(i + 1, p):
            out[i, j] = out[j, i] = linear_cka(vectors[i], vectors[j])
    return out
