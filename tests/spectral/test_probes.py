"""Hypothesis probes (``tgo.spectral.probes``): each number equals its textbook definition, computed independently.

The references (``tests/spectral/probe_reference.py``) are plain float64 loops, ``np.cov``, ``np.linalg.pinv`` and
``scipy.linalg.subspace_angles``; the data are seeded random vectors with a large common offset (a ViT's residual
stream has means far larger than its spread, so a formula that cancels would show here). Agreement is to 1e-9
relative; the known answers (collapsed classes, identical and orthogonal subspaces, a planted massive dimension,
rotation invariance of CKA) pin the meaning.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.spectral import probe_reference as ref
from tgo.spectral.jackknife import leave_one_group_out, remove, row_moments
from tgo.spectral.probes import (
    cka_matrix,
    class_geometry,
    cross_validated_accuracy,
    linear_cka,
    massive_activations,
    ncc_accuracy,
    ridge_accuracy,
    subspace_overlap,
    top_eigenvectors,
)

RTOL = 1e-9
OFFSET = 50.0


def _labelled(sizes: list[int], dim: int, *, separation: float = 1.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Vectors of ``len(sizes)`` classes (``sizes[c]`` images each), class means ``separation`` apart, offset 50."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    centres = rng.normal(size=(len(sizes), dim)) * separation
    scales = np.linspace(0.3, 2.0, dim)
    return OFFSET + centres[labels] + rng.normal(size=(labels.size, dim)) * scales, labels


def _orthonormal(dim: int, k: int, seed: int) -> np.ndarray:
    return np.linalg.qr(np.random.default_rng(seed).normal(size=(dim, k)))[0]


# ------------------------------------------------------------------------------------------- class geometry
@pytest.mark.parametrize("dim", [12, 3, 64], ids=["D>C", "D<C", "n<D"])
def test_class_geometry_matches_the_textbook_definitions(dim: int):
    """Fisher ratio tr S_B / tr S_W, Papyan's NC1 and the effective ranks of S_B and S_W, on unequal classes; with
    fewer vectors (40) than features (64) S_W's eigenvalues come from the [n, n] product, checked here too."""
    x, labels = _labelled([7, 9, 6, 8, 10], dim)
    got, want = class_geometry(x, labels), ref.class_geometry(x, labels)
    assert got.n_classes == 5
    assert got.fisher_ratio == pytest.approx(want["fisher_ratio"], rel=RTOL)
    assert got.nc1 == pytest.approx(want["nc1"], rel=RTOL)
    assert got.between_effective_rank == pytest.approx(want["between_class_effective_rank"], rel=RTOL)
    assert got.within_effective_rank == pytest.approx(want["within_class_effective_rank"], rel=RTOL)
    assert got.between_effective_rank <= min(dim, 5 - 1) + 1e-9, "S_B has rank at most C - 1"


def test_class_geometry_does_not_depend_on_label_values_or_order():
    x, labels = _labelled([5, 6, 7], 4, seed=1)
    order = np.random.default_rng(2).permutation(labels.size)
    a = class_geometry(x, labels)
    b = class_geometry(x[order], np.array([30, -2, 7])[labels[order]])
    for name in ("fisher_ratio", "nc1", "between_effective_rank", "within_effective_rank"):
        assert getattr(b, name) == pytest.approx(getattr(a, name), rel=1e-12), name


@pytest.mark.parametrize("per_class", [2, 3, 7])
def test_collapsed_classes_have_nc1_zero_and_an_infinite_fisher_ratio(per_class: int):
    """Every vector equals its class mean: no within-class scatter at all, whatever the class sizes.

    Three or seven equal floats do not in general average back to themselves, so a plain mean would leave round-off
    scatter (a Fisher ratio of ~1e32 and a within-class effective rank of round-off); the definition says inf and 0.
    """
    rng = np.random.default_rng(3)
    centres = OFFSET + rng.normal(size=(4, 6)) * 3.7
    labels = np.repeat(np.arange(4), per_class)
    x = centres[labels]
    got = class_geometry(x, labels)
    assert got.fisher_ratio == math.inf
    assert got.nc1 == 0.0
    assert math.isnan(got.within_effective_rank), "S_W = 0 has no spectrum to take an effective rank of"
    assert got.between_effective_rank == pytest.approx(ref.effective_rank(ref.scatters(x, labels)[0]), rel=RTOL)


def test_identical_vectors_have_no_class_geometry():
    """The CLS token before the first block is the same vector for every image: nothing is defined."""
    x = np.tile(OFFSET + np.random.default_rng(4).normal(size=6), (15, 1))
    got = class_geometry(x, np.arange(15) % 4)
    assert math.isnan(got.fisher_ratio) and math.isnan(got.nc1)
    assert math.isnan(got.between_effective_rank) and math.isnan(got.within_effective_rank)


# ------------------------------------------------------------------------------------------- decoding probes
def test_folds_are_the_class_stratified_deal_of_the_reference():
    from tgo.spectral import jackknife_groups

    labels = np.random.default_rng(5).integers(0, 4, size=37)
    assert np.array_equal(jackknife_groups(labels, 5), ref.stratified_folds(labels, 5))


def test_ncc_accuracy_per_fold_matches_an_explicit_loop():
    """Centres from the other folds; a class with one image is absent from training when that image is tested."""
    x, labels = _labelled([12, 10, 11, 1], 8, separation=0.8, seed=6)
    folds = ref.stratified_folds(labels, 4)
    got, want = ncc_accuracy(x, labels, folds), ref.ncc_accuracy(x, labels, folds)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert 0 < got.mean() < 1, "a test that separates nothing or everything would prove little"


@pytest.mark.parametrize("alpha", [0.01, 1.0, 30.0])
def test_ridge_accuracy_per_fold_matches_an_explicit_loop(alpha: float):
    """Closed-form ridge with an unpenalised intercept, on imbalanced classes (where the intercept matters)."""
    x, labels = _labelled([30, 14, 6], 12, separation=0.7, seed=7)
    folds = ref.stratified_folds(labels, 5)
    got = ridge_accuracy(x, labels, folds, alpha)
    np.testing.assert_allclose(got, ref.ridge_accuracy(x, labels, folds, alpha), rtol=1e-12)
    assert 0 < got.mean() < 1


def test_ridge_accuracy_is_the_argmax_of_scikit_learns_ridge_classifier():
    linear_model = pytest.importorskip("sklearn.linear_model")
    x, labels = _labelled([30, 14, 6], 12, separation=0.7, seed=8)
    folds = ref.stratified_folds(labels, 3)
    want = []
    for f in range(3):
        train = folds != f
        xc = x[train] - x[train].mean(axis=0)
        lam = np.trace(xc.T @ xc) / x.shape[1]
        clf = linear_model.RidgeClassifier(alpha=lam, solver="cholesky").fit(x[train], labels[train])
        want.append(np.mean(clf.predict(x[~train]) == labels[~train]))
    np.testing.assert_allclose(ridge_accuracy(x, labels, folds, 1.0), want, rtol=1e-12)


def test_pooled_accuracy_is_the_fraction_correct_and_its_stderr_the_delete_a_fold_jackknife():
    per_fold, sizes = np.array([0.5, 0.75, 1.0, 0.6]), np.array([4, 4, 3, 5])
    total, stderr = cross_validated_accuracy(per_fold, sizes)
    want_total, want_stderr = ref.cross_validated(per_fold, sizes)
    assert total == pytest.approx(want_total, rel=1e-12) == pytest.approx((2 + 3 + 3 + 3) / 16)
    assert stderr == pytest.approx(want_stderr, rel=1e-12)
    assert math.isnan(cross_validated_accuracy(np.array([0.5]), np.array([4]))[1]), "one fold has no jackknife"


# ------------------------------------------------------------------------------------------- subspace drift
def test_subspace_overlap_is_the_mean_squared_cosine_of_the_principal_angles():
    u, v = _orthonormal(20, 6, seed=9), _orthonormal(20, 6, seed=10)
    assert subspace_overlap(u, v) == pytest.approx(ref.subspace_overlap(u, v), rel=RTOL)
    assert subspace_overlap(u, v, 3) == pytest.approx(ref.subspace_overlap(u[:, :3], v[:, :3]), rel=RTOL)
    assert subspace_overlap(u[:, :4], v) == pytest.approx(ref.subspace_overlap(u[:, :4], v[:, :4]), rel=RTOL)


def test_subspace_overlap_is_one_for_the_same_subspace_and_zero_for_orthogonal_ones():
    basis = _orthonormal(12, 12, seed=11)
    u = basis[:, :4]
    rotated = u @ _orthonormal(4, 4, seed=12)  # another orthonormal basis of the same span, signs and order mixed
    assert subspace_overlap(u, u) == pytest.approx(1.0, abs=1e-14)
    assert subspace_overlap(u, rotated) == pytest.approx(1.0, abs=1e-14)
    assert subspace_overlap(u, basis[:, 4:8]) == pytest.approx(0.0, abs=1e-14)
    half = np.hstack([basis[:, :2], basis[:, 6:8]])  # two directions shared, two orthogonal
    assert subspace_overlap(u, half) == pytest.approx(0.5, abs=1e-14)


def test_subspace_overlap_is_nan_without_directions_to_compare():
    u = _orthonormal(8, 3, seed=13)
    assert math.isnan(subspace_overlap(u, u, 0))
    assert math.isnan(subspace_overlap(u, u, 4)), "more directions than either block holds"
    assert math.isnan(subspace_overlap(u, np.full_like(u, np.nan)))
    with pytest.raises(ValueError, match="one D"):
        subspace_overlap(u, u[:5])


def test_top_eigenvectors_span_the_leading_eigenspace_in_order():
    rows = np.random.default_rng(14).normal(size=(300, 10)) * np.linspace(3.0, 0.2, 10)
    cov = np.cov(rows, rowvar=False)
    got = top_eigenvectors(cov, 4)
    assert got.shape == (10, 4)
    for j in range(4):  # the same directions one by one (up to sign), largest eigenvalue first
        assert subspace_overlap(got[:, j : j + 1], ref.top_eigenvectors(cov, 4)[:, j : j + 1]) == pytest.approx(
            1.0, abs=1e-12
        )
    np.testing.assert_allclose(got.T @ got, np.eye(4), atol=1e-12)
    assert top_eigenvectors(cov, 99).shape == (10, 10)


# ------------------------------------------------------------------------------------------- CKA
def test_linear_cka_matches_the_kernel_hsic_formula():
    rng = np.random.default_rng(15)
    x = OFFSET + rng.normal(size=(30, 8))
    y = x[:, :5] @ rng.normal(size=(5, 5)) + rng.normal(size=(30, 5))
    assert linear_cka(x, y) == pytest.approx(ref.linear_cka(x, y), rel=RTOL)
    assert linear_cka(y, x) == pytest.approx(linear_cka(x, y), rel=1e-12)
    assert 0 < linear_cka(x, y) < 1


def test_linear_cka_is_one_under_rotation_isotropic_scaling_and_translation():
    rng = np.random.default_rng(16)
    x = rng.normal(size=(25, 6))
    y = 3.7 * x @ _orthonormal(6, 6, seed=17) + 11.0
    assert linear_cka(x, y) == pytest.approx(1.0, abs=1e-12)
    anisotropic = x * np.array([1.0, 1.0, 1.0, 1.0, 1.0, 9.0])
    assert linear_cka(x, anisotropic) < 0.99, "CKA is not invariant to anisotropic scaling"


def test_cka_matrix_is_symmetric_with_a_unit_diagonal():
    rng = np.random.default_rng(18)
    reps = [rng.normal(size=(20, d)) for d in (4, 6, 3)]
    m = cka_matrix(reps)
    np.testing.assert_array_equal(m, m.T)
    np.testing.assert_array_equal(np.diag(m), 1.0)
    assert m[0, 2] == pytest.approx(ref.linear_cka(reps[0], reps[2]), rel=RTOL)
    with pytest.raises(ValueError, match="same images"):
        linear_cka(reps[0], reps[1][:10])


# ------------------------------------------------------------------------------------------- massive activations
def test_a_planted_massive_dimension_is_found():
    """A few tokens carry a huge value in one dimension (Sun et al. 2024): that dimension, its ratio, its share."""
    rng = np.random.default_rng(19)
    rows = rng.normal(size=(400, 16))
    rows[[3, 77, 250], 11] = [-90.0, 120.0, 85.0]
    max_abs = np.abs(rows).max(axis=0)
    variances = np.var(rows, axis=0, ddof=1)
    got = massive_activations(max_abs, variances)
    assert got.dimension == 11
    assert got.ratio == pytest.approx(120.0 / np.median(max_abs), rel=1e-12)
    assert got.variance_share == pytest.approx(variances[11] / variances.sum(), rel=1e-12)
    assert len(got.top) == 5 and got.top[0] == (11, got.ratio)
    want_order = np.argsort(-max_abs)[:5]
    assert [d for d, _ in got.top] == want_order.tolist()
    assert [r for _, r in got.top] == pytest.approx(max_abs[want_order] / np.median(max_abs), rel=1e-12)


def test_massive_activations_without_finite_data_are_nan():
    got = massive_activations(np.array([1.0, np.nan]), np.ones(2))
    assert math.isnan(got.ratio) and got.dimension == -1 and got.top == ()


# ------------------------------------------------------------------------------------------- jackknife helpers
def _offset_rows(n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return OFFSET + rng.normal(size=(n, dim)) @ rng.normal(size=(dim, dim))


def test_row_moments_are_np_cov_and_the_mean():
    rows = _offset_rows(40, 7, seed=20)
    cov, mean, n, nonfinite = row_moments(rows)
    np.testing.assert_allclose(cov, np.cov(rows, rowvar=False), rtol=1e-12, atol=1e-12 * np.abs(cov).max())
    np.testing.assert_allclose(mean, rows.mean(axis=0), rtol=1e-14)
    assert (n, nonfinite) == (40, 0)


@pytest.mark.parametrize("removed", [1, 9, 33], ids=["one-row-like-a-CLS-token", "a-group", "most-rows"])
def test_remove_gives_the_moments_of_the_remaining_rows(removed: int):
    rows = _offset_rows(50, 6, seed=21)
    part = np.random.default_rng(22).permutation(50)[:removed]
    rest = np.setdiff1d(np.arange(50), part)
    cov, mean, n, _ = remove(row_moments(rows), row_moments(rows[part]))
    want = np.cov(rows[rest], rowvar=False)
    np.testing.assert_allclose(cov, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
    np.testing.assert_allclose(mean, rows[rest].mean(axis=0), rtol=1e-12)
    assert n == rest.size


def test_leave_one_group_out_is_np_cov_without_each_group():
    rows = _offset_rows(45, 5, seed=23)
    group = np.arange(45) % 4
    out = leave_one_group_out(row_moments(rows), [row_moments(rows[group == g]) for g in range(4)])
    for g, (cov, mean, n, _) in enumerate(out):
        want = np.cov(rows[group != g], rowvar=False)
        np.testing.assert_allclose(cov, want, rtol=1e-12, atol=1e-12 * np.abs(want).max(), err_msg=f"group {g}")
        np.testing.assert_allclose(mean, rows[group != g].mean(axis=0), rtol=1e-12)
        assert n == np.sum(group != g)
