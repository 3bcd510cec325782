"""The previous one-subset, one-fold implementations of the class probes (``tgo.spectral.probes`` before the class
probes were batched: issue 24, item 1), kept verbatim as the bit-for-bit reference of the batched ones
(``tests/spectral/test_probe_stacks.py``). Not TGO code: nothing imports this outside the tests.
"""

from __future__ import annotations

import math

import numpy as np

from tgo.spectral.observables import effective_rank
from tgo.spectral.probes import ClassGeometry

_EPS = float(np.finfo(np.float64).eps)


def _as_rows(x: np.ndarray) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise ValueError(f"expected a non-empty [n_images, D] matrix, got shape {arr.shape}")
    return arr


def _psd_eigenvalues(mat: np.ndarray) -> np.ndarray:
    """Descending eigenvalues of a symmetric PSD matrix, round-off negatives clamped to 0."""
    return np.clip(np.linalg.eigvalsh((mat + mat.T) / 2)[::-1], 0.0, None)


def _fold_split(folds: np.ndarray, fold: int) -> tuple[np.ndarray, np.ndarray]:
    test = folds == fold
    return ~test, test


def previous_class_geometry(x: np.ndarray, labels: np.ndarray) -> ClassGeometry:
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


def previous_ncc_accuracy(x: np.ndarray, labels: np.ndarray, folds: np.ndarray) -> np.ndarray:
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


def previous_ridge_accuracy(x: np.ndarray, labels: np.ndarray, folds: np.ndarray, alpha: float = 1.0) -> np.ndarray:
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
