"""The SVCCA family: canonical correlations against scikit-learn's CCA and a whitening reference, the closed forms,
TGO-II's definition, the jackknife by recomputation, and the family exact on 1, 2 and 3 simulated ranks."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import timm
import torch
from sklearn.cross_decomposition import CCA
from sklearn.decomposition import PCA
from torch.utils.data import TensorDataset

from tgo.observatory import ObservationSettings, ObservationSettingsError
from tgo.observatory.families.svcca import SVCCA
from tgo.observatory.families.testing import check_family
from tgo.spectral import jackknife_groups, jackknife_stderr
from tgo.spectral.svcca import basis, canonical, similarity


def _pca(x: np.ndarray, variance: float = 0.99, max_components: int = 50) -> np.ndarray:
    """TGO-II's reduction: scikit-learn's PCA scores, the fewest components holding ``variance``."""
    pca = PCA(svd_solver="full").fit(x)
    k = int(np.searchsorted(np.cumsum(pca.explained_variance_ratio_), variance)) + 1
    return pca.transform(x)[:, : min(k, max_components, x.shape[1])]


def _reference(x: np.ndarray, y: np.ndarray, shared: bool = False, **options: float) -> tuple[np.ndarray, float, float]:
    """``(rho, SVCCA, PWCCA)`` by another road: scikit-learn's PCA, CCA by Cholesky whitening, and PWCCA as Morcos et
    al.'s code (the canonical variates QR-orthonormalised, weights from the raw neurons of the side with fewer
    components)."""
    a, b = _pca(x, **options), _pca(y, **options)
    if shared:
        m = min(a.shape[1], b.shape[1])
        a, b = a[:, :m], b[:, :m]
    la, lb = np.linalg.cholesky(a.T @ a), np.linalg.cholesky(b.T @ b)
    w, rho, zt = np.linalg.svd(np.linalg.solve(la, a.T @ b) @ np.linalg.inv(lb).T, full_matrices=False)
    h, raw = (a @ np.linalg.solve(la.T, w), x) if a.shape[1] <= b.shape[1] else (b @ np.linalg.solve(lb.T, zt.T), y)
    alpha = np.abs(np.linalg.qr(h)[0].T @ raw).sum(axis=1)
    return rho, float(rho.mean()), float(alpha @ rho / alpha.sum())


def _pair(n: int, dx: int, dy: int, seed: int, noise: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Two related representations with decaying spectra (so the 99 % cut keeps fewer than all components)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dx)) * np.geomspace(3.0, 0.05, dx) + 1.5
    y = (np.tanh(x @ rng.standard_normal((dx, dy))) + noise * rng.standard_normal((n, dy))) * np.geomspace(2, 0.02, dy)
    return x, y


def test_canonical_correlations_equal_scikit_learn_cca() -> None:
    """A well-conditioned case (n = 500, 4 and 5 dimensions, every component kept): scikit-learn's iterative CCA."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((500, 4)) @ np.diag([2.0, 1.5, 1.0, 0.7])
    y = np.hstack([x @ rng.standard_normal((4, 4)), np.zeros((500, 1))]) + rng.standard_normal((500, 5))
    rho, _ = canonical(basis(x, 1.0), basis(y, 1.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        u, v = CCA(n_components=4, max_iter=10_000, tol=1e-12).fit(x, y).transform(x, y)
    want = np.sort([abs(np.corrcoef(u[:, i], v[:, i])[0, 1]) for i in range(4)])[::-1]
    assert rho.shape == (4,)
    np.testing.assert_allclose(rho, want, rtol=0, atol=1e-9)  # measured: 2.6e-11 (its default tol: 2.6e-5)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize(("dx", "dy"), [(12, 30), (30, 12)])  # PWCCA weighs on either side
def test_svcca_and_pwcca_equal_the_whitening_reference(shared: bool, dx: int, dy: int) -> None:
    x, y = _pair(400, dx, dy, seed=dx)
    a, b = basis(x), basis(y)
    assert a is not None and b is not None and 1 < a.k < dx and 1 < b.k < dy and a.k != b.k
    rho_want, svcca_want, pwcca_want = _reference(x, y, shared)
    rho, _ = canonical(a, b, shared)
    np.testing.assert_allclose(rho, rho_want, rtol=0, atol=1e-10)
    assert similarity(a, b, shared) == pytest.approx((svcca_want, pwcca_want), rel=1e-10)


def test_tgo_ii_svcca_with_scikit_learn_cca() -> None:
    """TGO-II's code (PCA to 99 %, both cut to the smaller k, scikit-learn CCA, mean |corr|) = ``shared=True``."""
    x, y = _pair(600, 10, 8, seed=3, noise=0.3)
    a, b = _pca(x), _pca(y)
    m = min(a.shape[1], b.shape[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        u, v = CCA(n_components=m, max_iter=10_000, tol=1e-12).fit(a[:, :m], b[:, :m]).transform(a[:, :m], b[:, :m])
    want = float(np.mean([abs(np.corrcoef(u[:, i], v[:, i])[0, 1]) for i in range(m)]))
    assert similarity(basis(x), basis(y), shared=True)[0] == pytest.approx(want, abs=1e-9)  # measured: 1.8e-14


def test_closed_forms() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((200, 6))
    # an invertible map of the whole representation: the same column space, every correlation 1
    mapped = x @ (np.eye(6) + 0.3 * rng.standard_normal((6, 6)))
    assert similarity(basis(x, 1.0), basis(mapped, 1.0)) == pytest.approx((1.0, 1.0), abs=1e-12)
    # a rotation and scaling keeps the spectrum, so the 99 % cut keeps the same subspace
    z, _ = _pair(300, 30, 2, seed=2)
    rotated = 3.0 * z @ np.linalg.qr(rng.standard_normal((30, 30)))[0]
    assert basis(z).k < 30
    assert similarity(basis(z), basis(rotated)) == pytest.approx((1.0, 1.0), abs=1e-12)
    # independent Gaussians: E sum rho^2 = tr(P_a P_b) = k_a k_b / (n - 1) for random subspaces of the centred R^n
    n, k, draws = 300, 5, 60
    sums = [
        float(np.sum(canonical(basis(r.standard_normal((n, k)), 1.0), basis(r.standard_normal((n, k)), 1.0))[0] ** 2))
        for r in (np.random.default_rng(100 + s) for s in range(draws))
    ]
    assert np.mean(sums) == pytest.approx(k * k / (n - 1), abs=3 * np.std(sums) / math.sqrt(draws))
    # no variance, too few images or a non-finite value: no basis, NaN similarity
    assert basis(np.ones((10, 3))) is None and basis(x[:1]) is None and basis(np.full((5, 2), np.nan)) is None
    assert all(math.isnan(v) for v in similarity(None, basis(x)))


def test_pwcca_is_not_defined_where_the_components_outnumber_the_images() -> None:
    """k_a + k_b > n - 1: correlations of 1 by construction, whose directions are any rotation; PWCCA's L1 weights
    are not rotation invariant, so no value is recorded (SVCCA, a mean of the correlations, still is)."""
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((11, 8)), rng.standard_normal((11, 8))
    a, b = basis(x, 1.0), basis(y, 1.0)
    assert a.k + b.k > 10
    svcca, pwcca = similarity(a, b)
    assert math.isnan(pwcca) and math.isfinite(svcca)
    assert np.sum(canonical(a, b)[0] > 1 - 1e-12) >= a.k + b.k - 10  # the correlations forced to 1
    shared = similarity(basis(x, 1.0, 5), basis(y, 1.0, 5), shared=True)  # 2 x 5 components <= 10: defined
    assert all(math.isfinite(v) for v in shared)


def test_basis_keeps_the_components_of_the_variance_at_most_max_components() -> None:
    x, _ = _pair(300, 30, 2, seed=4)
    s2 = np.linalg.svd(x - x.mean(axis=0), compute_uv=False) ** 2
    want = int(np.argmax(np.cumsum(s2) / s2.sum() >= 0.99)) + 1
    b = basis(x)
    assert b is not None and b.k == want and _pca(x).shape[1] == want
    np.testing.assert_allclose(b.u.T @ b.u, np.eye(want), atol=1e-12)
    assert basis(x, 0.99, 3).k == 3 and basis(x, 1.0, 50).k == 30


def test_settings_refuse_bad_values() -> None:
    on = ObservationSettings.from_config({"svcca": {"enabled": True, "shared_components": True}})
    assert on.svcca.shared_components and on.svcca.variance == 0.99 and on.svcca.max_components == 50
    assert not ObservationSettings().svcca.enabled
    for bad in ({"variance": 0}, {"variance": 1.5}, {"max_components": 0}, {"shared_components": "yes"}):
        with pytest.raises(ObservationSettingsError, match=r"observation\.svcca\."):
            ObservationSettings.from_config({"svcca": bad})


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_family_passes_the_family_tester_on_a_tiny_vit(tmp_path, world_size: int) -> None:
    torch.manual_seed(0)
    net = timm.create_model(
        "vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=2
    ).eval()
    images = torch.randn(70, 3, 16, 16, generator=torch.Generator().manual_seed(1))  # subsets of 35 > 2 x 16 + 1
    labels = torch.arange(70) % 2
    off = {"enabled": False}
    settings = {"groups": 2, "probes": off, "attention": off, "weights": off, "phases": off, "svcca": {"enabled": True}}
    check = check_family(SVCCA, net, TensorDataset(images, labels), tmp_path, settings=settings, world_size=world_size)
    assert {view for _, view, _ in check.metrics} == {"cls", "patch"}
    # the recorded values are those of the class tokens a forward gives, on all images and without each group
    out: dict[int, torch.Tensor] = {}
    for i, block in enumerate(net.blocks):
        block.register_forward_hook(lambda m, inp, o, i=i: out.setdefault(i, o))
    with torch.no_grad():
        net(images)
    first, second = (out[i][:, 0].double().numpy() for i in (0, 1))
    groups = jackknife_groups(labels.numpy(), 2)
    want = [similarity(basis(first[keep]), basis(second[keep])) for keep in (groups >= 0, groups != 0, groups != 1)]
    block = check.single[0][("block_01", "cls")]
    for m, name in enumerate(("svcca_next", "pwcca_next")):
        assert block.observables[name] == pytest.approx(want[0][m], rel=1e-9)
        np.testing.assert_allclose(block.jackknife[name], [w[m] for w in want[1:]], rtol=1e-9)
        assert block.stderr[name] == jackknife_stderr(block.jackknife[name])
    assert block.observables["svcca_components"] == basis(first).k
    # the rows make a symmetric matrix with a unit diagonal; NaN where a point lacks the view
    points = list(dict.fromkeys(key.point for key in check.single[0]))
    matrix = np.array([check.single[0][(p, "cls")].arrays["heads_svcca"] for p in points[1:]])
    assert matrix.shape == (len(points) - 1, len(points)) and np.all(np.isnan(matrix[:, 0]))  # no CLS at patch_embed
    body = matrix[1:, 2:]  # from block_01 on (the position embedding's CLS is one vector: no variance)
    np.testing.assert_array_equal(body, body.T)
    np.testing.assert_allclose(np.diag(body), 1.0, atol=1e-12)
    assert matrix[1, 3] == block.observables["svcca_next"]
    assert block.observables["svcca"] == pytest.approx(np.nanmean(np.delete(matrix[1], 2)), rel=1e-12)
    assert math.isnan(check.single[0][("cls", "cls")].observables["svcca_next"])  # the last point
