"""The intrinsic-dimension family: TwoNN against scikit-dimension and the closed form, the class metrics against
scikit-learn, the jackknife by recomputation, and the family exact on 1, 2 and 3 simulated ranks."""

from __future__ import annotations

import inspect
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from scipy.spatial.distance import cdist
from sklearn.decomposition import PCA
from sklearn.neighbors import NearestNeighbors
from sklearn.preprocessing import StandardScaler
from torch.utils.data import TensorDataset

from tgo.observatory import ObservationSettings, ObservationSettingsError
from tgo.observatory.families import INTRINSIC_DIMENSION
from tgo.observatory.families.intrinsic_dimension import IntrinsicDimensionSettings, intrinsic_dimension_metrics
from tgo.observatory.families.testing import check_family
from tgo.spectral import jackknife_stderr
from tgo.spectral.intrinsic_dimension import neighbour_distances, pca_rank, twonn

skdim = pytest.importorskip("skdim")


def _cloud(n: int, d: int, ambient: int, seed: int) -> np.ndarray:
    """``n`` Gaussian points of a ``d``-dimensional subspace, rotated into ``ambient`` dimensions."""
    rng = np.random.default_rng(seed)
    rotation = np.linalg.qr(rng.standard_normal((ambient, ambient)))[0]
    return np.hstack([rng.standard_normal((n, d)), np.zeros((n, ambient - d))]) @ rotation


def _skdim(x: np.ndarray, **options: object) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(skdim.id.TwoNN(**options).fit(x).dimension_)


@pytest.mark.parametrize("fit", ["linear", "mle"])
@pytest.mark.parametrize(("d", "ambient"), [(3, 12), (6, 48)])  # scikit-dimension's two neighbour searches
def test_twonn_equals_scikit_dimension(fit: str, d: int, ambient: int) -> None:
    if fit == "mle" and "method" not in inspect.signature(skdim.id.TwoNN).parameters:
        pytest.skip("scikit-dimension before 0.5 has the linear fit only")
    x = _cloud(600, d, ambient, seed=d)
    got = twonn(x, fit=fit, discard_fraction=0.1)[0]
    want = _skdim(x, **({"method": fit} if fit == "mle" else {}), discard_fraction=0.1)
    assert got.duplicates == 0 and got.ratios == 540
    assert got.dimension == pytest.approx(want, rel=1e-10)


def test_duplicates_are_left_out_and_counted_against_exact_distances() -> None:
    """scikit-dimension's own search returns ~1e-8 for a duplicate, so its fit of exact (r1, r2) is the reference."""
    x = _cloud(300, 4, 30, seed=1)
    x = np.vstack([x, x[:4]])  # 4 pairs: 8 images at distance 0 from their nearest
    exact = np.sort(cdist(x, x), axis=1)[:, 1:3]
    r1, r2 = neighbour_distances(x)[0]
    np.testing.assert_allclose(np.column_stack([r1, r2]), exact, rtol=1e-12, atol=0)
    got = twonn(x)[0]
    assert got.duplicates == 8 and got.ratios == int(296 * 0.9)
    assert got.dimension == pytest.approx(_skdim(exact, dist=True), rel=1e-10)


@pytest.mark.parametrize("d", [2, 4])
def test_twonn_of_a_uniform_cube_and_sphere_recovers_d(d: int) -> None:
    """Closed form: uniform on [0, 1]^d and on S^d (within 10 % at N = 2,000; the cube's faces bias it low as d
    grows, about -12 % at d = 8, the sphere has no boundary)."""
    rng = np.random.default_rng(7)
    cube = rng.uniform(size=(2000, d))
    sphere = rng.standard_normal((2000, d + 1))
    sphere /= np.linalg.norm(sphere, axis=1, keepdims=True)
    for x in (cube, sphere):
        assert twonn(x)[0].dimension == pytest.approx(d, rel=0.1)


def _tgo_ii_reference(x: np.ndarray) -> float:
    """The TGO-II/-III definition with scikit-learn: standardised, exact neighbours, central 10-90 % with intercept."""
    z = StandardScaler().fit_transform(x)
    dist = NearestNeighbors(n_neighbors=3, algorithm="brute").fit(z).kneighbors(z)[0]
    r1, r2 = dist[:, 1], dist[:, 2]
    mu = np.sort(r2[(r1 > 1e-12) & (r2 > r1)] / r1[(r1 > 1e-12) & (r2 > r1)])
    n = mu.size
    lo, hi = int(0.1 * n), max(int(0.1 * n) + 5, int(0.9 * n))
    y = -np.log(1 - np.arange(1, n + 1) / (n + 1.0))
    return float(np.linalg.lstsq(np.column_stack([np.log(mu), np.ones(n)])[lo:hi], y[lo:hi], rcond=None)[0][0])


def test_the_tgo_ii_estimator_equals_its_definition() -> None:
    x = _cloud(400, 5, 30, seed=3) * np.linspace(0.5, 3.0, 30)  # unequal feature scales: standardising matters
    assert twonn(x, fit="tgo_ii")[0].dimension == pytest.approx(_tgo_ii_reference(x), rel=1e-9)


def test_every_metric_and_replicate_is_recomputed_on_the_images_left() -> None:
    rng = np.random.default_rng(5)
    n, groups = 90, 3
    x = _cloud(n, 4, 16, seed=5) + rng.standard_normal((n, 16)) * 0.01
    labels = np.arange(n) % 3
    image_groups = (np.arange(n) // 3) % groups  # each group holds 10 images of each class
    settings = IntrinsicDimensionSettings(enabled=True, min_class_images=5)
    got = {name: (v, se, r) for name, v, se, r in intrinsic_dimension_metrics(x, labels, image_groups, 3, settings)}

    def per_class(data: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        ids = [_skdim(data[y == c]) for c in range(3)]
        ranks = []
        for c in range(3):
            ratio = np.cumsum(PCA().fit(data[y == c]).explained_variance_ratio_)
            ranks.append(int(np.argmax(ratio >= 0.95 - 1e-12)) + 1)
        return float(np.mean(ids)), float(np.mean(ranks))

    subsets = [np.ones(n, dtype=bool), *(image_groups != g for g in range(groups))]
    want = {"intrinsic_dimension": [], "class_intrinsic_dimension": [], "class_pca_rank": []}
    for keep in subsets:
        want["intrinsic_dimension"].append(_skdim(x[keep]))
        class_id, class_rank = per_class(x[keep], labels[keep])
        want["class_intrinsic_dimension"].append(class_id)
        want["class_pca_rank"].append(class_rank)
    for name, values in want.items():
        value, stderr, replicates = got[name]
        assert value == pytest.approx(values[0], rel=1e-10), name
        np.testing.assert_allclose(replicates, values[1:], rtol=1e-10, err_msg=name)
        assert stderr == jackknife_stderr(replicates) and math.isfinite(stderr)
    assert got["intrinsic_dimension_duplicates"][0] == 0 and got["intrinsic_dimension_classes"][0] == 3
    # a class enters only with min_class_images in every subset (10 per class here, 20 in a subset)
    strict = IntrinsicDimensionSettings(enabled=True, min_class_images=21)
    none = {name: v for name, v, _, _ in intrinsic_dimension_metrics(x, labels, image_groups, 3, strict)}
    assert none["intrinsic_dimension_classes"] == 0 and math.isnan(none["class_pca_rank"])
    # images without a label (-1) enter no class
    unlabelled = {name: v for name, v, _, _ in intrinsic_dimension_metrics(x, -np.ones(n), image_groups, 3, settings)}
    assert unlabelled["intrinsic_dimension_classes"] == 0 and math.isnan(unlabelled["class_intrinsic_dimension"])
    assert unlabelled["intrinsic_dimension"] == got["intrinsic_dimension"][0]


def test_pca_rank_counts_the_components_of_the_variance() -> None:
    x = np.diag([3.0, 2.0, 1.0, 0.1])  # variances 9, 4, 1, 0.01: 64 %, 93 %, 99.93 %, 100 %
    x = x[[0, 1, 2, 3, 0, 1, 2, 3]] * np.repeat([1, -1], 4)[:, None]
    assert pca_rank(x, 0.95) == 3 and pca_rank(x, 0.9995) == 4 and pca_rank(x, 0.5) == 1
    assert math.isnan(pca_rank(np.ones((5, 3))))


def test_settings_refuse_bad_values() -> None:
    on = ObservationSettings.from_config({"intrinsic_dimension": {"enabled": True, "fit": "tgo_ii"}})
    assert on.intrinsic_dimension.fit == "tgo_ii" and not ObservationSettings().intrinsic_dimension.enabled
    for bad in ({"fit": "pca"}, {"discard_fraction": 1.0}, {"min_class_images": 2}, {"class_variance": 0}):
        with pytest.raises(ObservationSettingsError, match=r"observation\.intrinsic_dimension\."):
            ObservationSettings.from_config({"intrinsic_dimension": bad})


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_family_passes_the_family_tester_on_a_tiny_vit(tmp_path, world_size: int) -> None:
    torch.manual_seed(0)
    net = timm.create_model(
        "vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=2
    ).eval()
    images = torch.randn(22, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    data = TensorDataset(images, torch.arange(22) % 2)
    off = {"enabled": False}
    settings = {
        "groups": 2,
        "probes": off,
        "attention": off,
        "weights": off,
        "phases": off,
        "intrinsic_dimension": {"enabled": True, "min_class_images": 3},
    }
    check = check_family(INTRINSIC_DIMENSION, net, data, tmp_path, settings=settings, world_size=world_size)
    assert {view for _, view, _ in check.metrics} == {"cls", "patch"}
    # the recorded value is TwoNN of the class tokens a forward gives (block 2's output), in float64
    out = {}
    net.blocks[1].register_forward_hook(lambda m, i, o: out.setdefault("x", o))
    with torch.no_grad():
        net(images)
    cls = out["x"][:, 0].double().numpy()
    block = check.single[0][("block_02", "cls")]
    assert block.observables["intrinsic_dimension"] == pytest.approx(_skdim(cls), rel=1e-9)
    assert block.observables["intrinsic_dimension_classes"] == 2
    assert math.isfinite(block.stderr["class_pca_rank"])
    # before the first block every image has the same class token: all duplicates, no dimension
    pos = check.single[0][("pos_embed", "cls")]
    assert pos.observables["intrinsic_dimension_duplicates"] == 22
    assert math.isnan(pos.observables["intrinsic_dimension"])


def test_its_panels_on_views_of_its_own_reach_the_report_and_an_undefined_one_is_left_out(tmp_path):
    """The report's depth section draws a family's page panels on a view no section of its own draws (the seam:
    no report code names the family); a metric recorded but NaN everywhere draws no empty figure."""
    from tgo.report.aggregate import single_aggregate
    from tgo.report.context import own_view_panels
    from tgo.report.figures import depth_profile_figures

    own = {(p.view, p.metric) for p in own_view_panels()}
    assert {("cls", "intrinsic_dimension"), ("patch", "intrinsic_dimension"), ("cls", "class_pca_rank")} <= own
    assert not {view for view, _ in own} & {"all", "attention", "network"}
    epochs = np.array([0.0, 1.0])
    agg = single_aggregate(
        {
            "intrinsic_dimension": {"block_01": (epochs, np.array([3.0, 4.0])), "cls": (epochs, np.array([5.0, 6.0]))},
            "class_pca_rank": {"block_01": (epochs, np.full(2, np.nan)), "cls": (epochs, np.full(2, np.nan))},
        }
    )
    refs = depth_profile_figures(agg, tmp_path, metrics=["intrinsic_dimension", "class_pca_rank"], view="cls")
    assert [Path(r.path).name for r in refs] == ["depth_cls_intrinsic_dimension.png"]
    assert refs[0].caption.startswith("intrinsic_dimension (view cls) against depth")
