"""The batched class probes give the bits of the one-subset, one-fold ones (issue 24, item 1).

``tgo.spectral.probes.class_geometries`` computes the ``1 + G`` class geometries of a view (all images and each
leave-one-group-out subset) together, and ``ncc_accuracy`` / ``ridge_accuracy`` take every fold from per-fold
sufficient statistics. The references are the previous implementations, kept verbatim in
``tests/spectral/previous_probes.py``:

* every class-geometry value (Fisher ratio, NC1, both effective ranks) equals the previous ``class_geometry`` of the
  subset bit for bit, on unequal, rank-deficient, collapsed and class-losing subsets; the one exception is the
  within-class scatter of a subset with fewer vectors than features, whose eigenvalues and trace now come from the
  ``[n, n]`` product ``dev dev^T`` instead of ``dev^T dev`` (~(n/D)^3 the work): its effective rank and the Fisher
  ratio (over its trace) equal the previous ones to round-off (``WITHIN_GRAM_RTOL``), and an independent reference to
  1e-9 (``tests/spectral/test_probes.py``);
* every per-fold accuracy equals the previous per-fold loop exactly (the scores are computed another way, so they
  agree with an independent two-pass float64 reference per fold to round-off, checked here, and an argmax can only
  differ on a tie within that round-off);
* ``class_metrics`` (values, standard errors, leave-one-out values) equals the previous composition exactly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from tests.spectral import previous_probes as previous
from tests.spectral import probe_reference as ref
from tgo.observatory.families.image_vectors import _class_plan, class_metrics, leave_one_fold_out
from tgo.spectral import jackknife_groups, jackknife_stderr
from tgo.spectral.probes import (
    ClassGeometry,
    _ncc_scores,
    _ridge_scores,
    class_geometries,
    class_geometry,
    class_layout,
    cross_validated_accuracy,
    fold_layout,
    ncc_accuracy,
    ridge_accuracy,
    top_eigenvectors,
)

OFFSET = 50.0  # residual-stream vectors have means far above their spread


def _labelled(sizes: list[int], dim: int, *, separation: float = 1.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    centres = rng.normal(size=(len(sizes), dim)) * separation
    scales = np.linspace(0.3, 2.0, dim)
    return OFFSET + centres[labels] + rng.normal(size=(labels.size, dim)) * scales, labels


WITHIN_GRAM_RTOL = 1e-12
"""The values over S_W from ``dev dev^T`` against the previous ``dev^T dev`` when n < D (7.5e-15 seen)."""
GRAM_VALUES = ("within_effective_rank", "fisher_ratio")


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _assert_same_geometry(got: ClassGeometry, want: ClassGeometry, where: object, *, gram: bool = False) -> None:
    """Bit for bit, but the values over S_W of a subset with n < D (``gram``) to `WITHIN_GRAM_RTOL`."""
    for name in ("fisher_ratio", "nc1", "between_effective_rank", "within_effective_rank", "n_classes"):
        a, b = getattr(got, name), getattr(want, name)
        if gram and name in GRAM_VALUES and not _same(a, b):
            assert a == pytest.approx(b, rel=WITHIN_GRAM_RTOL), (where, name, a, b)
            continue
        assert _same(a, b), (where, name, a, b)


def _subsets(labels: np.ndarray, groups: int) -> list[np.ndarray | None]:
    image_groups = jackknife_groups(labels, groups)
    return [None, *(image_groups != g for g in range(groups))]


def _check_geometries(x: np.ndarray, labels: np.ndarray, subsets: list[np.ndarray | None]) -> None:
    got = class_geometries(x, [class_layout(labels, rows) for rows in subsets])
    assert len(got) == len(subsets)
    for i, (g, rows) in enumerate(zip(got, subsets, strict=True)):
        mask = np.ones(labels.size, dtype=bool) if rows is None else rows
        want = previous.previous_class_geometry(x[mask], labels[mask])
        _assert_same_geometry(g, want, i, gram=int(mask.sum()) < x.shape[1])


# ------------------------------------------------------------------------------------------- class geometry
@pytest.mark.parametrize(
    ("sizes", "dim", "groups"),
    [
        ([20] * 10, 12, 10),  # the summary's shape: C = 10, G = 10, equal groups
        ([7, 9, 6, 8, 10], 12, 5),  # unequal classes and groups (two subset sizes)
        ([7, 9, 6, 8, 10], 3, 4),  # D < C
        ([5, 6, 4, 7], 40, 3),  # n < D: rank-deficient within-class scatter
        ([7, 9, 1, 8], 6, 5),  # a class of one image: the subset without it has one class fewer
    ],
)
def test_class_geometries_equal_class_geometry_of_each_subset_bit_for_bit(sizes: list[int], dim: int, groups: int):
    x, labels = _labelled(sizes, dim, seed=len(sizes) + dim)
    subsets = _subsets(labels, groups)
    layouts = [class_layout(labels, rows) for rows in subsets]
    assert any(layout.moved.size for layout in layouts), "some subset leaves out a class's reference vector"
    _check_geometries(x, labels, subsets)


def test_class_geometry_is_class_geometries_of_all_images():
    x, labels = _labelled([7, 9, 6, 8], 10, seed=3)
    _assert_same_geometry(class_geometry(x, labels), previous.previous_class_geometry(x, labels), "all")


@pytest.mark.parametrize("collapsed", [[1], [0, 2], [0, 1, 2, 3]], ids=["one", "two", "all"])
def test_collapsed_classes_keep_their_exact_zeros(collapsed: list[int]):
    """A class whose vectors are all equal has a within-class scatter of exactly 0, in every subset."""
    x, labels = _labelled([6, 7, 5, 8], 9, seed=4)
    for c in collapsed:
        x[labels == c] = x[labels == c][0]
    _check_geometries(x, labels, _subsets(labels, 4))
    if len(collapsed) == 4:
        g = class_geometries(x, [class_layout(labels)])[0]
        assert g.fisher_ratio == math.inf and g.nc1 == 0.0 and math.isnan(g.within_effective_rank)


def test_a_class_collapsed_only_without_one_group():
    """Every image of class 0 but those of group 0 is the same vector: the subsets without group 0 see it collapsed
    (its reference vector moves when group 0 holds the class's first image)."""
    x, labels = _labelled([8, 8, 8], 5, seed=5)
    image_groups = jackknife_groups(labels, 4)
    rows = np.flatnonzero((labels == 0) & (image_groups != 0))
    x[rows] = x[rows[0]]
    _check_geometries(x, labels, _subsets(labels, 4))


def test_the_within_class_products_are_exactly_symmetric():
    """`class_geometries` hands dev^T dev to eigvalsh without symmetrising it; numpy computes that product as a
    symmetric rank-k update, so it is symmetric bit for bit (and equals class_geometry's (S + S^T) / 2)."""
    rng = np.random.default_rng(6)
    for n, d in ((180, 96), (20, 64), (33, 7)):
        dev = rng.normal(size=(n, d)) + OFFSET
        out = np.empty((d, d))
        np.matmul(dev.T, dev, out=out)
        assert np.array_equal(out, out.T) and np.array_equal(out, (out + out.T) / 2), (n, d)


# ------------------------------------------------------------------------------------------- decoding probes
def _decoding_cases() -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    cases = []
    for sizes, dim, folds, separation, seed in (
        ([20] * 10, 16, 10, 0.6, 10),
        ([30, 14, 6], 12, 5, 0.7, 11),
        ([12, 10, 11, 1], 8, 4, 0.8, 12),  # a class of one image is absent from training when it is tested
        ([9, 9, 9], 40, 3, 1.5, 13),  # n < D
        ([25, 25], 4, 7, 0.3, 14),
    ):
        x, labels = _labelled(sizes, dim, separation=separation, seed=seed)
        cases.append((x, labels, jackknife_groups(labels, folds)))
    return cases


@pytest.mark.parametrize("case", range(5))
def test_ncc_accuracy_equals_the_previous_per_fold_loop(case: int):
    x, labels, folds = _decoding_cases()[case]
    got = ncc_accuracy(x, labels, folds)
    np.testing.assert_array_equal(got, previous.previous_ncc_accuracy(x, labels, folds))
    np.testing.assert_array_equal(got, ref.ncc_accuracy(x, labels, folds))


@pytest.mark.parametrize("alpha", [0.01, 1.0, 30.0])
@pytest.mark.parametrize("case", range(5))
def test_ridge_accuracy_equals_the_previous_per_fold_loop(case: int, alpha: float):
    x, labels, folds = _decoding_cases()[case]
    got = ridge_accuracy(x, labels, folds, alpha)
    np.testing.assert_array_equal(got, previous.previous_ridge_accuracy(x, labels, folds, alpha))
    np.testing.assert_allclose(got, ref.ridge_accuracy(x, labels, folds, alpha), rtol=0, atol=1e-12)


def _two_pass_scores(
    x: np.ndarray, labels: np.ndarray, folds: np.ndarray, alpha: float
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per fold, directly from the fold's vectors (two-pass means, deviations, then products): the test images'
    ridge scores over every class, and their squared distances to every training class centre."""
    classes = np.unique(labels)
    out = []
    for f in np.unique(folds):
        train, test = folds != f, folds == f
        xt = x[train]
        mu = xt.mean(axis=0)
        xc = xt - mu
        y = (labels[train][:, None] == classes[None, :]).astype(np.float64)
        prior = y.mean(axis=0)
        gram = xc.T @ xc
        lam = alpha * np.trace(gram) / x.shape[1]
        w = np.linalg.solve(gram + lam * np.eye(x.shape[1]), xc.T @ (y - prior))
        ridge = prior + (x[test] - mu) @ w
        centres = np.stack([xt[labels[train] == c].mean(axis=0) if np.any(labels[train] == c) else mu for c in classes])
        distances = (((x[test] - mu)[:, None, :] - (centres - mu)[None, :, :]) ** 2).sum(axis=2)
        out.append((ridge, distances, np.isin(classes, labels[train])))
    return out


@pytest.mark.parametrize("alpha", [0.01, 1.0])
@pytest.mark.parametrize("case", range(5))
def test_fold_statistics_give_the_two_pass_scores_to_round_off(case: int, alpha: float):
    """The sufficient statistics by subtraction (all images minus the fold) against each fold's own two-pass
    float64 computation: ridge scores and nearest-centre distances agree to 1e-12 of their scale."""
    x, labels, folds = _decoding_cases()[case]
    layout = fold_layout(labels, folds)
    ridge, ncc = _ridge_scores(x, layout, alpha), _ncc_scores(x, layout)
    shifted = np.concatenate([x - x.mean(axis=0), np.zeros((1, x.shape[1]))])[layout.rows]
    for f, (want_ridge, want_distance, present) in enumerate(_two_pass_scores(x, labels, folds, alpha)):
        rows = layout.valid[f]
        got_ridge = ridge[f][rows][:, present]
        scale = np.abs(want_ridge[:, present]).max()
        np.testing.assert_allclose(got_ridge, want_ridge[:, present], rtol=0, atol=1e-12 * scale)
        # ncc scores are 2 x.c - |c|^2 = |x|^2 - |x - c|^2 in coordinates centred on the mean of all images
        got_distance = (shifted[f][rows] ** 2).sum(axis=1)[:, None] - ncc[f][rows][:, present]
        scale = want_distance[:, present].max()
        np.testing.assert_allclose(got_distance, want_distance[:, present], rtol=0, atol=1e-12 * scale)


def test_folds_whose_training_vectors_are_identical_are_computed_on_their_own():
    """Every vector the same but those of one fold (so that fold's training set is one vector), and image 0 the
    odd one out (so its fold's training set is another vector): both folds are the previous per-fold loop's."""
    x, labels = _labelled([10, 10, 10], 6, seed=20)
    folds = jackknife_groups(labels, 5)
    odd = x.copy()
    odd[folds != 2] = x[0]
    lonely = np.tile(x[1], (labels.size, 1))
    lonely[0] = x[0]
    for data in (odd, lonely):
        np.testing.assert_array_equal(
            ncc_accuracy(data, labels, folds), previous.previous_ncc_accuracy(data, labels, folds)
        )
        for alpha in (0.1, 1.0):
            np.testing.assert_array_equal(
                ridge_accuracy(data, labels, folds, alpha), previous.previous_ridge_accuracy(data, labels, folds, alpha)
            )


# ------------------------------------------------------------------------------------------- class_metrics
def _previous_class_metrics(
    x: np.ndarray, labels: np.ndarray, image_groups: np.ndarray, groups: int, folds: int, alpha: float
) -> tuple[dict[str, float], dict[str, float], dict[str, np.ndarray]]:
    """``class_metrics`` as it was composed: one ``class_geometry`` per subset, one fold loop per decoding probe."""
    names = ("fisher_ratio", "nc1", "between_class_effective_rank", "within_class_effective_rank")

    def geometry(mask: np.ndarray) -> dict[str, float]:
        g = previous.previous_class_geometry(x[mask], labels[mask])
        return dict(zip(names, (g.fisher_ratio, g.nc1, g.between_effective_rank, g.within_effective_rank), strict=True))

    values = geometry(np.ones(labels.size, dtype=bool))
    subsets = [geometry(image_groups != g) for g in range(groups)]
    replicates = {k: np.array([r[k] for r in subsets], dtype=np.float64) for k in values}
    stderr = {k: jackknife_stderr(replicates[k]) for k in values}
    fold_of = jackknife_groups(labels, folds)
    sizes = np.bincount(fold_of, minlength=folds)[np.unique(fold_of)]
    for name, per_fold in (
        ("ncc_accuracy", previous.previous_ncc_accuracy(x, labels, fold_of)),
        ("ridge_accuracy", previous.previous_ridge_accuracy(x, labels, fold_of, alpha)),
    ):
        values[name], stderr[name] = cross_validated_accuracy(per_fold, sizes)
        replicates[name] = leave_one_fold_out(per_fold, sizes)
    return values, stderr, replicates


@pytest.mark.parametrize(("sizes", "dim"), [([20] * 10, 24), ([11, 7, 15, 9], 6), ([6, 5, 7], 30)])
def test_class_metrics_equal_the_previous_composition_bit_for_bit(sizes: list[int], dim: int):
    x, labels = _labelled(sizes, dim, separation=0.8, seed=dim)
    groups, folds = 5, 4
    image_groups = jackknife_groups(labels, groups)
    values, stderr, replicates = class_metrics(
        x, labels, image_groups=image_groups, groups=groups, folds=folds, ridge_alpha=1.0
    )
    want_values, want_stderr, want_replicates = _previous_class_metrics(x, labels, image_groups, groups, folds, 1.0)
    assert list(values) == list(want_values) and list(replicates) == list(want_replicates)
    for name in want_values:
        if name in ("within_class_effective_rank", "fisher_ratio") and labels.size < dim:  # the [n, n] route
            assert values[name] == pytest.approx(want_values[name], rel=WITHIN_GRAM_RTOL), name
            assert stderr[name] == pytest.approx(want_stderr[name], rel=1e-9), name
            np.testing.assert_allclose(replicates[name], want_replicates[name], rtol=WITHIN_GRAM_RTOL)
            continue
        assert _same(values[name], want_values[name]) and _same(stderr[name], want_stderr[name]), name
        assert np.array_equal(replicates[name], want_replicates[name], equal_nan=True), name


def test_the_class_plan_is_built_once_per_labelling():
    labels = np.repeat(np.arange(4), 6)
    image_groups = jackknife_groups(labels, 3)
    plan = _class_plan(labels, image_groups, 3, 4)
    assert _class_plan(labels.copy(), image_groups.copy(), 3, 4) is plan
    assert _class_plan(labels[::-1].copy(), image_groups, 3, 4) is not plan
    assert len(plan.layouts) == 4 and len(_class_plan(labels, None, 3, 4).layouts) == 1
    assert not plan.layouts[1].rows.flags.writeable and not plan.folds.onehot.flags.writeable


# ------------------------------------------------------------------------------------------- subspace drift
def test_top_eigenvectors_are_numpys_on_one_blas_thread():
    rng = np.random.default_rng(30)
    a = rng.normal(size=(96, 150))
    cov = a @ a.T
    before = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    got = top_eigenvectors(cov, 5)
    assert [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"] == before, "limit restored"
    _, vectors = np.linalg.eigh((cov + cov.T) / 2)
    assert np.array_equal(got, np.ascontiguousarray(vectors[:, ::-1][:, :5]))
