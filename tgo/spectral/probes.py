"""Hypothesis probes: the float64 numerics that tell TGO-I's three explanations of spreading variance apart (class
geometry, decodability, subspace drift, massive activations, CKA; formulas: ``docs/hypotheses.md``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.linalg import lapack

__all__ = [
    "ClassGeometry",
    "ClassLayout",
    "FoldLayout",
    "MassiveActivations",
    "class_geometries",
    "class_geometry",
    "class_layout",
    "cross_validated_accuracy",
    "fold_layout",
    "linear_cka",
    "massive_activations",
    "ncc_accuracy",
    "one_thread_blas",
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


@dataclass(frozen=True)
class ClassGeometry:
    """Class-conditional geometry of one set of per-image vectors (scatters are sums, not averages).

    ``fisher_ratio = tr(S_B) / tr(S_W)`` (``inf`` when every class collapses to its mean); ``nc1 = tr(Sigma_W Sigma_B^+)
    / C`` (Papyan, Han and Donoho 2020; ``Sigma_W = S_W / n``, ``Sigma_B`` over the class means' mean, pseudo-inverse
    cut at ``lambda_1 * max(D, C) * eps``); the effective ranks of ``S_B`` (at most ``C - 1``) and ``S_W`` (NaN if 0).
    """

    fisher_ratio: float
    nc1: float
    between_effective_rank: float
    within_effective_rank: float
    n_classes: int


@dataclass(frozen=True)
class ClassLayout:
    """How one subset of the images splits into classes (integers only): ``first`` is each class's reference image, and
    outside ``moved`` every deviation from its reference is that of the whole set (``base_refs``)."""

    rows: np.ndarray
    first: np.ndarray
    refs: np.ndarray
    index: np.ndarray
    counts: np.ndarray
    onehot: np.ndarray
    base_refs: np.ndarray
    moved: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        """``(images, classes)``."""
        return int(self.rows.size), int(self.counts.size)


def class_layout(labels: np.ndarray, rows: np.ndarray | None = None) -> ClassLayout:
    """The `ClassLayout` of the images ``rows`` (a boolean mask or ascending indices; ``None``: all of them)."""
    labels = np.asarray(labels).reshape(-1)
    if rows is None:
        taken = np.arange(labels.size)
    else:
        rows = np.asarray(rows)
        taken = np.flatnonzero(rows) if rows.dtype == bool else rows.astype(np.int64).reshape(-1)
    _, first, index, counts = np.unique(labels[taken], return_index=True, return_inverse=True, return_counts=True)
    index = index.reshape(-1)
    onehot = np.zeros((taken.size, counts.size))
    onehot[np.arange(taken.size), index] = 1.0
    first = taken[first]
    refs = first[index]
    _, first_all, class_all = np.unique(labels, return_index=True, return_inverse=True)
    base_refs = first_all[class_all.reshape(-1)]
    moved = np.flatnonzero(refs != base_refs[taken])
    out = ClassLayout(taken, first, refs, index, counts, onehot, base_refs, moved)
    for array in (out.rows, out.first, out.refs, out.index, out.counts, out.onehot, out.base_refs, out.moved):
        array.setflags(write=False)  # shared between calls (and threads) once cached
    return out


def class_geometry(x: np.ndarray, labels: np.ndarray) -> ClassGeometry:
    """`ClassGeometry` of ``x`` ``[n, D]`` with integer ``labels``, from deviations, never raw second moments."""
    x = _as_rows(x)
    labels = np.asarray(labels).reshape(-1)
    if labels.size != x.shape[0]:
        raise ValueError(f"class_geometry: {x.shape[0]} vectors but {labels.size} labels")
    if not np.all(np.isfinite(x)):
        return ClassGeometry(math.nan, math.nan, math.nan, math.nan, int(np.unique(labels).size))
    return class_geometries(x, [class_layout(labels)])[0]


def class_geometries(x: np.ndarray, layouts: Sequence[ClassLayout]) -> list[ClassGeometry]:
    """`class_geometry` of several `ClassLayout` subsets of the same finite ``x``, bit for bit: the same operations on
    the same operands, ``svd`` and ``eigvalsh`` stacked per shape (``tests/spectral/test_probe_stacks.py``)."""
    x = np.asarray(x, dtype=np.float64)
    deviations: dict[bytes, np.ndarray] = {}
    out: list[ClassGeometry | None] = [None] * len(layouts)
    buckets: dict[tuple[int, int], list[int]] = {}
    for i, layout in enumerate(layouts):
        buckets.setdefault(layout.shape, []).append(i)
    for members in buckets.values():
        for i, g in zip(members, _geometry_stack(x, [layouts[i] for i in members], deviations), strict=True):
            out[i] = g
    return [g for g in out if g is not None]


def _geometry_stack(
    x: np.ndarray, layouts: Sequence[ClassLayout], deviations: dict[bytes, np.ndarray]
) -> list[ClassGeometry]:
    """`class_geometries` of subsets of one shape ``(n, C)`` (``deviations``: ``x - x[base_refs]`` by base)."""
    n, c = layouts[0].shape
    size, d = len(layouts), x.shape[1]
    means = np.empty((size, c, d))
    # S_W = dev^T dev [D, D] has the non-zero eigenvalues of dev dev^T [n, n]: with fewer vectors than features (200
    # analysis images of a 384-wide ViT) the [n, n] product is the cheaper of the two (its eigenvalues (n/D)^3 the
    # work), as for S_B below; its trace is tr(S_W) too.
    gram = n < d
    s_w = np.empty((size, n, n) if gram else (size, d, d))
    dev_w = np.empty((size, n, d))
    for s, lay in enumerate(layouts):
        # Each class is shifted by its first vector and the means by the first class mean: identical vectors then
        # give deviations of exactly 0 (a plain mean of k equal floats need not equal them, which would turn a
        # collapsed class into round-off scatter with a finite Fisher ratio and a meaningless within-class rank).
        key = lay.base_refs.tobytes()
        if key not in deviations:
            deviations[key] = x - x[lay.base_refs]
        dev = np.take(deviations[key], lay.rows, axis=0, out=dev_w[s])
        if lay.moved.size:
            dev[lay.moved] = x[lay.rows[lay.moved]] - x[lay.refs[lay.moved]]
        offsets = (lay.onehot.T @ dev) / lay.counts[:, None]  # class sums as one product (exact zeros stay zeros)
        np.add(x[lay.first], offsets, out=means[s])
        dev -= offsets[lay.index]
        if gram:
            np.matmul(dev, dev.T, out=s_w[s])
        else:
            np.matmul(dev.T, dev, out=s_w[s])
    counts = np.stack([lay.counts for lay in layouts])  # int64 [S, C]
    spread = means - means[:, :1]
    mu = means[:, 0] + (counts[:, None, :] @ spread)[:, 0] / n
    dev_b = (means - mu[:, None, :]) * np.sqrt(counts)[:, :, None]
    tr_b = np.sum(dev_b**2, axis=(1, 2))
    tr_w = [float(t) for t in np.trace(s_w, axis1=1, axis2=2)]
    nc1 = [math.nan] * size
    if c >= 2:
        # Sigma_B = A^T A / C with A the centred class means [C, D]: its eigenpairs come from the thin SVD of A
        # (O(C^2 D), not O(D^3)), eigenvalues s^2 / C, eigenvectors the right singular vectors.
        centred = means - (means[:, :1] + spread.mean(axis=1)[:, None, :])
        _, sv, vt = np.linalg.svd(centred, full_matrices=False)
        e = sv**2 / c
        # tr(Sigma_W Sigma_B^+) = sum_k (v_k^T Sigma_W v_k) / e_k over the kept eigenpairs, Sigma_W = S_W / n; the
        # subsets that keep the same eigenpairs (usually all) as one stack.
        keep = e > np.maximum(e.max(axis=1), 0.0)[:, None] * max(d, c) * _EPS
        patterns: dict[bytes, list[int]] = {}
        for s in range(size):
            if keep[s].any():
                patterns.setdefault(keep[s].tobytes(), []).append(s)
        for members in patterns.values():
            kept = keep[members[0]]
            rows = slice(None) if len(members) == size else members  # a view, not a copy, when all share it
            along = np.sum((dev_w[rows] @ vt[rows][:, kept].transpose(0, 2, 1)) ** 2, axis=1) / n
            for s, value in zip(members, np.sum(along / e[rows][:, kept], axis=1) / c, strict=True):
                nc1[s] = float(value)
    # The non-zero eigenvalues of S_B = B^T B are those of B B^T ([C, C]), cheaper when C < D.
    between = (
        _psd_eigenvalue_stack(dev_b @ dev_b.transpose(0, 2, 1))
        if c < d
        else _psd_eigenvalue_stack(dev_b.transpose(0, 2, 1) @ dev_b)
    )
    scattered = [s for s, t in enumerate(tr_w) if t > 0]
    # dev^T dev (or dev dev^T) is numpy's symmetric rank-k product (BLAS syrk, the upper triangle copied to the
    # lower), so it is exactly symmetric and class_geometry's (S + S^T) / 2 would give it back bit for bit: skipped.
    within = (
        _psd_eigenvalue_stack(s_w if len(scattered) == size else s_w[scattered], symmetric=True)
        if scattered
        else np.empty((0, s_w.shape[1]))
    )
    between_rank = _effective_ranks(between) if c >= 2 else [math.nan] * size
    within_rank = [math.nan] * size
    for s, rank in zip(scattered, _effective_ranks(within), strict=True):
        within_rank[s] = rank
    out = []
    for s in range(size):
        b, w = float(tr_b[s]), tr_w[s]
        fisher = b / w if w > 0 else (math.inf if b > 0 else math.nan)
        out.append(ClassGeometry(fisher, nc1[s], between_rank[s], within_rank[s], int(c)))
    return out


def _psd_eigenvalue_stack(mats: np.ndarray, *, symmetric: bool = False) -> np.ndarray:
    """Descending eigenvalues of a ``[S, k, k]`` stack of symmetric PSD matrices, round-off negatives clamped."""
    sym = mats if symmetric else (mats + mats.transpose(0, 2, 1)) / 2
    return np.clip(np.linalg.eigvalsh(sym)[:, ::-1], 0.0, None)


def _effective_ranks(eigs: np.ndarray) -> list[float]:
    """`effective_rank` of every row of ``[S, k]`` eigenvalues, bit for bit `EigenvalueStack.entropy`, unchecked."""
    eigs = np.ascontiguousarray(eigs, dtype=np.float64)
    out = [math.nan] * eigs.shape[0]
    if not eigs.shape[0]:
        return out
    totals = eigs.sum(axis=1)
    positive = (eigs > 0).sum(axis=1)
    for k in np.unique(positive[totals > 0]):
        rows = np.flatnonzero((positive == k) & (totals > 0))
        p = np.ascontiguousarray(eigs[rows, :k]) / totals[rows, None]
        for row, h in zip(rows, -(p * np.log(p)).sum(axis=1), strict=True):
            out[row] = math.exp(float(h))
    return out


def _fold_split(folds: np.ndarray, fold: int) -> tuple[np.ndarray, np.ndarray]:
    test = folds == fold
    return ~test, test


@dataclass(frozen=True)
class FoldLayout:
    """The folds of a cross-validation as ``[F, m]`` tables padded with ``N`` (a zero row appended to ``x``)."""

    folds: np.ndarray
    classes: np.ndarray
    rows: np.ndarray
    valid: np.ndarray
    labels: np.ndarray
    onehot: np.ndarray
    sizes: np.ndarray
    counts: np.ndarray
    fold_of: np.ndarray
    class_of: np.ndarray

    @property
    def train_counts(self) -> np.ndarray:
        """int64 ``[F, C]`` training images per fold and class (those outside the fold)."""
        return np.asarray(self.counts.sum(axis=0)[None, :] - self.counts)


def fold_layout(labels: np.ndarray, folds: np.ndarray) -> FoldLayout:
    """The `FoldLayout` of a fold assignment ``folds`` ``[N]`` of images with ``labels`` ``[N]``."""
    labels, folds = np.asarray(labels).reshape(-1), np.asarray(folds).reshape(-1)
    if labels.size != folds.size:
        raise ValueError(f"fold_layout: {labels.size} labels but {folds.size} fold ids")
    fold_ids, fold_of = np.unique(folds, return_inverse=True)
    classes, class_of = np.unique(labels, return_inverse=True)
    fold_of, class_of = fold_of.reshape(-1), class_of.reshape(-1)
    sizes = np.bincount(fold_of, minlength=fold_ids.size).astype(np.int64)
    width = int(sizes.max()) if sizes.size else 0
    rows = np.full((fold_ids.size, width), labels.size, dtype=np.int64)
    order = np.argsort(fold_of, kind="stable")  # by fold, ascending image index within a fold
    slot = np.arange(labels.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    rows[fold_of[order], slot] = order
    valid = rows < labels.size
    padded_class = np.append(class_of, 0)[rows]
    onehot = np.zeros((*rows.shape, classes.size))
    onehot[valid, padded_class[valid]] = 1.0
    counts = np.zeros((fold_ids.size, classes.size), dtype=np.int64)
    np.add.at(counts, (fold_of, class_of), 1)
    never = classes[0] - 1 if classes.size else -1
    out = FoldLayout(
        folds=fold_ids,
        classes=classes,
        rows=rows,
        valid=valid,
        labels=np.where(valid, np.append(labels, never)[rows], never),
        onehot=onehot,
        sizes=sizes,
        counts=counts,
        fold_of=fold_of,
        class_of=class_of,
    )
    for f in dataclasses.fields(out):
        getattr(out, f.name).setflags(write=False)
    return out


@dataclass
class _FoldSums:
    """Per-fold sufficient statistics of ``x - m`` (``m`` the mean of all images): sums, class sums, products."""

    shifted: np.ndarray  # [N + 1, D] x - m, with the zero padding row appended
    blocks: np.ndarray  # [F, m, D] each fold's rows of `shifted`
    sums: np.ndarray  # [F, D]
    class_sums: np.ndarray  # [F, D, C]
    train_sums: np.ndarray  # [F, D] over the other folds
    train_class_sums: np.ndarray  # [F, D, C]
    train_sizes: np.ndarray  # float64 [F]


def _fold_sums(x: np.ndarray, layout: FoldLayout) -> _FoldSums:
    shifted = x - x.mean(axis=0)
    shifted = np.concatenate([shifted, np.zeros((1, x.shape[1]))])
    blocks = shifted[layout.rows]
    sums = blocks.sum(axis=1)
    class_sums = blocks.transpose(0, 2, 1) @ layout.onehot
    return _FoldSums(
        shifted=shifted,
        blocks=blocks,
        sums=sums,
        class_sums=class_sums,
        train_sums=sums.sum(axis=0) - sums,
        train_class_sums=class_sums.sum(axis=0) - class_sums,
        train_sizes=(layout.sizes.sum() - layout.sizes).astype(np.float64),
    )


def _degenerate_folds(x: np.ndarray, layout: FoldLayout) -> list[int]:
    """The folds (positions) whose training images are all the same vector (nothing to learn from, exactly)."""
    differs = np.any(x != x[0], axis=1)
    outside = int(differs.sum()) - np.bincount(layout.fold_of, weights=differs, minlength=layout.folds.size)
    out = [int(f) for f in np.flatnonzero(outside == 0)]
    own = int(layout.fold_of[0])  # the fold of image 0: its training images may all equal another vector
    if own not in out:
        train = layout.fold_of != own
        if train.any():
            xt = x[train]
            if np.all(xt == xt[0]):
                out.append(own)
    return sorted(out)


def _fold_accuracies(scores: np.ndarray, layout: FoldLayout) -> np.ndarray:
    """Per-fold accuracy of ``[F, m, C]`` class scores, classes absent from a fold's training never predicted."""
    present = layout.train_counts > 0
    scores = np.where(present[:, None, :], scores, -np.inf)
    correct = (layout.classes[np.argmax(scores, axis=2)] == layout.labels) & layout.valid
    return np.asarray(correct.sum(axis=1) / layout.sizes, dtype=np.float64)


def ncc_accuracy(
    x: np.ndarray, labels: np.ndarray, folds: np.ndarray, *, layout: FoldLayout | None = None
) -> np.ndarray:
    """Held-out nearest-class-centre accuracy of every fold, all at once from per-fold class sums centred on the mean of
    all images (else ``||x - c||^2`` compares large nearly equal numbers); classes absent from training count as errors.
    """
    x, labels, folds = _as_rows(x), np.asarray(labels).reshape(-1), np.asarray(folds).reshape(-1)
    layout = fold_layout(labels, folds) if layout is None else layout
    out = _fold_accuracies(_ncc_scores(x, layout), layout)
    for f in _degenerate_folds(x, layout):
        out[f] = _ncc_fold(x, labels, folds, layout.folds[f])
    return out


def _ncc_scores(x: np.ndarray, layout: FoldLayout) -> np.ndarray:
    """``[F, m, C]`` scores ``2 x.c - ||c||^2`` of each fold's images against its training class centres."""
    sums = _fold_sums(x, layout)
    centres = sums.train_class_sums / np.maximum(layout.train_counts, 1)[:, None, :]  # [F, D, C]
    return np.asarray((sums.blocks @ centres) * 2 - np.sum(centres**2, axis=1)[:, None, :])


def _ncc_fold(x: np.ndarray, labels: np.ndarray, folds: np.ndarray, fold: int) -> float:
    """`ncc_accuracy` of one fold, directly from its training vectors."""
    train, test = _fold_split(folds, fold)
    classes, index = np.unique(labels[train], return_inverse=True)
    shift = x[train].mean(axis=0)
    onehot = np.zeros((index.size, classes.size))
    onehot[np.arange(index.size), index] = 1.0
    centres = (onehot.T @ (x[train] - shift)) / np.bincount(index)[:, None]
    score = (x[test] - shift) @ centres.T * 2 - np.sum(centres**2, axis=1)
    return float(np.mean(classes[np.argmax(score, axis=1)] == labels[test]))


def ridge_accuracy(
    x: np.ndarray, labels: np.ndarray, folds: np.ndarray, alpha: float = 1.0, *, layout: FoldLayout | None = None
) -> np.ndarray:
    """Held-out accuracy per fold of a closed-form ridge probe on one-hot targets: the argmax of scikit-learn's
    ``RidgeClassifier(alpha=lam)`` with ``lam = alpha * tr(X^T X) / D`` (scale-free), all folds at once from sufficient
    statistics, solved by Cholesky."""
    if not alpha > 0:
        raise ValueError(f"ridge_accuracy: alpha must be > 0, got {alpha!r}")
    x, labels, folds = _as_rows(x), np.asarray(labels).reshape(-1), np.asarray(folds).reshape(-1)
    layout = fold_layout(labels, folds) if layout is None else layout
    degenerate = _degenerate_folds(x, layout)
    out = _fold_accuracies(_ridge_scores(x, layout, alpha, skip=degenerate), layout)
    for f in degenerate:
        out[f] = _ridge_fold(x, labels, folds, layout.folds[f], alpha)
    return out


def _ridge_scores(x: np.ndarray, layout: FoldLayout, alpha: float, skip: Sequence[int] = ()) -> np.ndarray:
    """``[F, m, C]`` ridge scores ``y_bar + (x - mu) W``, in the dual form for folds below ``D`` images."""
    d = x.shape[1]
    sums = _fold_sums(x, layout)
    n_t = sums.train_sizes
    mean = sums.train_sums / n_t[:, None]  # the training mean of each fold (centred coordinates)
    prior = layout.train_counts / n_t[:, None]  # the intercept: with centred X the least-squares one is the mean target
    solved = [f for f in range(n_t.size) if f not in skip]
    primal = [f for f in solved if n_t[f] >= d]
    w = np.zeros((n_t.size, d, layout.classes.size))
    if primal:
        products = sums.blocks.transpose(0, 2, 1) @ sums.blocks  # [F, D, D] each fold's x^T x
        total = products.sum(axis=0)
        diagonal = np.arange(d)
        for f in primal:  # fold by fold: each [D, D] system stays in cache from its gram to its solve
            gram = np.subtract(total, products[f], out=products[f])
            gram -= np.outer(sums.train_sums[f], mean[f])
            lam = alpha * float(np.trace(gram)) / d
            gram[diagonal, diagonal] += lam
            target = sums.train_class_sums[f] - np.outer(sums.train_sums[f], prior[f])
            w[f] = _spd_solve(gram, target)
    for f in solved:
        if f in primal:
            continue
        train = np.flatnonzero(layout.fold_of != f)
        xc = sums.shifted[train] - mean[f]
        kernel = xc @ xc.T
        lam = alpha * float(np.trace(kernel)) / d
        kernel[np.arange(train.size), np.arange(train.size)] += lam
        targets = -np.broadcast_to(prior[f], (train.size, prior.shape[1]))
        targets[np.arange(train.size), layout.class_of[train]] += 1.0
        w[f] = xc.T @ _spd_solve(kernel, targets)
    return np.asarray(prior[:, None, :] + (sums.blocks - mean[:, None, :]) @ w)


def _spd_solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a^-1 b`` by LAPACK's Cholesky (``dposv``, half of LU's work), or LU where ``a`` is numerically not positive."""
    _, solution, info = lapack.dposv(a, b, lower=1)
    return np.asarray(solution) if info == 0 else np.linalg.solve(a, b)


def _ridge_fold(x: np.ndarray, labels: np.ndarray, folds: np.ndarray, fold: int, alpha: float) -> float:
    """`ridge_accuracy` of one fold, directly from its training vectors."""
    train, test = _fold_split(folds, fold)
    classes, index = np.unique(labels[train], return_inverse=True)
    xt = x[train]
    mu = xt.mean(axis=0)
    xc = xt - mu
    gram = xc.T @ xc
    lam = alpha * float(np.trace(gram)) / x.shape[1]
    y = np.zeros((xt.shape[0], classes.size))
    y[np.arange(xt.shape[0]), index] = 1.0
    prior = y.mean(axis=0)
    if lam <= 0:  # every training vector identical: nothing to learn beyond the class frequencies
        return float(np.mean(labels[test] == classes[np.argmax(prior)]))
    w = np.linalg.solve(gram + lam * np.eye(x.shape[1]), xc.T @ (y - prior))
    score = prior + (x[test] - mu) @ w
    return float(np.mean(classes[np.argmax(score, axis=1)] == labels[test]))


def cross_validated_accuracy(per_fold: np.ndarray, fold_sizes: np.ndarray) -> tuple[float, float]:
    """Pooled held-out accuracy (folds weighed by size) and its delete-a-fold jackknife standard error."""
    acc = np.asarray(per_fold, dtype=np.float64)
    sizes = np.asarray(fold_sizes, dtype=np.float64)
    correct = acc * sizes
    total = float(correct.sum() / sizes.sum())
    g = acc.size
    if g < 2:
        return total, math.nan
    leave_out = (correct.sum() - correct) / (sizes.sum() - sizes)
    return total, float(math.sqrt((g - 1) / g * np.sum((leave_out - leave_out.mean()) ** 2)))


@functools.lru_cache(maxsize=1)
def _blas_controller() -> Any:
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - scikit-learn, a dependency, requires threadpoolctl
        return None
    return ThreadpoolController()  # finds the loaded BLAS libraries once (~1 ms); each limit after is ~50 us


def one_thread_blas() -> contextlib.AbstractContextManager[Any]:
    """numpy's BLAS on one thread: OpenBLAS's threads make a 96 x 96 ``eigh`` 10-200x slower on few cores."""
    controller = _blas_controller()
    return contextlib.nullcontext() if controller is None else controller.limit(limits=1, user_api="blas")


def top_eigenvectors(cov: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` leading eigenvectors of a symmetric matrix, float64 ``[D, k]``, under `one_thread_blas`."""
    mat = np.asarray(cov, dtype=np.float64)
    k = max(0, min(int(k), mat.shape[0]))
    with one_thread_blas():
        _, vectors = np.linalg.eigh((mat + mat.T) / 2)
    return np.ascontiguousarray(vectors[:, ::-1][:, :k])


def subspace_overlap(u: np.ndarray, v: np.ndarray, k: int | None = None) -> float:
    """Mean ``cos^2`` of the principal angles between the first ``k`` columns of ``u`` and ``v``, ``||U^T V||_F^2 / k``:
    1 for one subspace, ``k / D`` for a random pair; NaN for ``k = 0`` or non-finite blocks."""
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
    """Which dimensions carry activations far above the rest: ``ratio = max_d M_d / median_d M_d`` with
    ``M_d = max |x_d|``, the five largest, and that dimension's share of the covariance's trace."""

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
    """Linear CKA (Kornblith et al. 2019) of two column-centred representations of the same images, in ``[0, 1]``."""
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
