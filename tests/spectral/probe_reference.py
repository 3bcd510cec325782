"""Independent float64 references for the hypothesis probes (``tgo.spectral.probes``), written as plainly as possible.

Every function here is the textbook definition spelled out with loops, ``np.cov``, ``np.linalg.pinv`` and
``np.linalg.eigvalsh``; none calls TGO. The probe tests (``tests/spectral/test_probes.py``) and the
observation tests (``tests/families/test_image_vectors.py``) compare TGO against these.
"""

from __future__ import annotations

import math

import numpy as np


def effective_rank(mat: np.ndarray) -> float:
    """``exp(-sum p log p)`` of the eigenvalues of a symmetric PSD matrix (``p = lambda / sum lambda``, 0 log 0 = 0)."""
    e = np.clip(np.linalg.eigvalsh(mat), 0.0, None)
    if e.sum() <= 0:
        return math.nan
    p = e[e > 0] / e.sum()
    return math.exp(-np.sum(p * np.log(p)))


def scatters(x: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]]:
    """``(S_B, S_W, {class: mean})``: between- and within-class scatter matrices (sums, not averages)."""
    d = x.shape[1]
    mu = x.mean(axis=0)
    class_means = {int(c): x[labels == c].mean(axis=0) for c in np.unique(labels)}
    s_b, s_w = np.zeros((d, d)), np.zeros((d, d))
    for c, mean in class_means.items():
        s_b += np.sum(labels == c) * np.outer(mean - mu, mean - mu)
    for row, c in zip(x, labels, strict=True):
        s_w += np.outer(row - class_means[int(c)], row - class_means[int(c)])
    return s_b, s_w, class_means


def class_geometry(x: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Fisher ratio, NC1 (Papyan, Han and Donoho 2020) and the effective ranks of ``S_B`` and ``S_W``.

    ``Sigma_W = S_W / n``; ``Sigma_B = 1/C sum_c (mu_c - mu_G)(mu_c - mu_G)^T`` with ``mu_G`` the mean of the class
    means; ``NC1 = tr(Sigma_W Sigma_B^+) / C``.
    """
    n = x.shape[0]
    s_b, s_w, class_means = scatters(x, labels)
    c = len(class_means)
    means = np.stack(list(class_means.values()))
    mu_g = means.mean(axis=0)
    sigma_b = sum(np.outer(m - mu_g, m - mu_g) for m in means) / c
    sigma_w = s_w / n
    return {
        "fisher_ratio": np.trace(s_b) / np.trace(s_w),
        "nc1": np.trace(sigma_w @ np.linalg.pinv(sigma_b, rcond=1e-10, hermitian=True)) / c,
        "between_class_effective_rank": effective_rank(s_b),
        "within_class_effective_rank": effective_rank(s_w),
    }


def stratified_folds(labels: np.ndarray, k: int) -> np.ndarray:
    """Class-stratified assignment: classes in ascending order, images of a class in their order, dealt ``0..k-1``."""
    out = np.empty(len(labels), dtype=np.int64)
    dealt = 0
    for c in np.unique(labels):
        for i in np.flatnonzero(labels == c):
            out[i] = dealt % k
            dealt += 1
    return out


def ncc_accuracy(x: np.ndarray, labels: np.ndarray, folds: np.ndarray) -> np.ndarray:
    """Per fold: nearest training-class centre (Euclidean distance), classes absent from training never predicted."""
    out = []
    for f in np.unique(folds):
        train = folds != f
        centres = {int(c): x[train & (labels == c)].mean(axis=0) for c in np.unique(labels[train])}
        correct = 0
        for row, label in zip(x[~train], labels[~train], strict=True):
            distances = {c: float(np.sum((row - centre) ** 2)) for c, centre in centres.items()}
            correct += min(distances, key=distances.__getitem__) == label
        out.append(correct / np.sum(~train))
    return np.asarray(out)


def ridge_accuracy(x: np.ndarray, labels: np.ndarray, folds: np.ndarray, alpha: float) -> np.ndarray:
    """Per fold: least squares on one-hot targets with an unpenalised intercept and penalty ``alpha tr(Xc^T Xc)/D``.

    The augmented normal equations ``[X 1]`` with the penalty on ``W`` only, solved as one linear system.
    """
    d = x.shape[1]
    out = []
    for f in np.unique(folds):
        train = folds != f
        classes = np.unique(labels[train])
        xt, yt = x[train], (labels[train][:, None] == classes[None, :]).astype(np.float64)
        xc = xt - xt.mean(axis=0)
        lam = alpha * np.trace(xc.T @ xc) / d
        design = np.hstack([xt, np.ones((xt.shape[0], 1))])
        penalty = lam * np.diag([1.0] * d + [0.0])
        coef = np.linalg.solve(design.T @ design + penalty, design.T @ yt)
        scores = np.hstack([x[~train], np.ones((np.sum(~train), 1))]) @ coef
        out.append(np.mean(classes[np.argmax(scores, axis=1)] == labels[~train]))
    return np.asarray(out)


def jackknife_stderr(values: np.ndarray) -> float:
    """``sqrt((G - 1)/G sum (theta_g - mean)^2)``."""
    v = np.asarray(values, dtype=np.float64)
    return math.sqrt((v.size - 1) / v.size * np.sum((v - v.mean()) ** 2))


def cross_validated(per_fold: np.ndarray, sizes: np.ndarray) -> tuple[float, float]:
    """Pooled accuracy (correct / all) and the delete-a-fold jackknife of that fraction."""
    correct = np.asarray(per_fold) * np.asarray(sizes)
    leave_out = [(correct.sum() - correct[g]) / (sizes.sum() - sizes[g]) for g in range(len(sizes))]
    return correct.sum() / sizes.sum(), jackknife_stderr(np.asarray(leave_out))


def top_eigenvectors(cov: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` leading eigenvectors (columns, largest eigenvalue first)."""
    values, vectors = np.linalg.eigh(cov)
    return vectors[:, np.argsort(values)[::-1][:k]]


def components_90(cov: np.ndarray) -> int:
    """Smallest ``k`` whose leading eigenvalues hold 90% of the trace."""
    e = np.sort(np.clip(np.linalg.eigvalsh(cov), 0.0, None))[::-1]
    return int(np.searchsorted(np.cumsum(e) / e.sum(), 0.9 - 1e-12) + 1)


def subspace_overlap(u: np.ndarray, v: np.ndarray) -> float:
    """Mean ``cos^2`` of the principal angles between ``span(u)`` and ``span(v)`` (scipy, or an SVD without it)."""
    try:
        from scipy.linalg import subspace_angles
    except ImportError:  # pragma: no cover - scipy ships with scikit-learn
        qu, qv = np.linalg.qr(u)[0], np.linalg.qr(v)[0]
        return float(np.mean(np.linalg.svd(qu.T @ qv, compute_uv=False) ** 2))
    return float(np.mean(np.cos(subspace_angles(u, v)) ** 2))


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """``HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))`` with linear kernels ``K = X X^T``, ``L = Y Y^T`` (n x n)."""
    n = x.shape[0]
    h = np.eye(n) - np.ones((n, n)) / n

    def hsic(k: np.ndarray, l_: np.ndarray) -> float:
        return float(np.trace(k @ h @ l_ @ h)) / (n - 1) ** 2

    k, l_ = x @ x.T, y @ y.T
    return hsic(k, l_) / math.sqrt(hsic(k, k) * hsic(l_, l_))
