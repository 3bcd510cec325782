"""The class-centroid family: the distances against scipy's ``pdist`` of numpy class means, a closed form, the
jackknife by recomputation, and the family exact on 2 and 3 simulated ranks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import timm
import torch
from scipy.spatial.distance import pdist, squareform
from torch.utils.data import TensorDataset

from tgo.observatory import ObservationSettings, ObservationSettingsError
from tgo.observatory.families.class_centroids import CLASS_CENTROIDS
from tgo.observatory.families.testing import check_family
from tgo.records import load_spectra
from tgo.spectral import jackknife_groups, jackknife_stderr
from tgo.spectral.class_centroids import centroid_geometry


def _reference(x: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, float, float, float]:
    """``(C x C, mean, min, ratio)`` by another road: numpy class means, scipy's ``pdist`` (equal to TGO-III's
    broadcast differences), a loop over classes."""
    classes = np.unique(labels)
    means = np.array([x[labels == c].mean(axis=0) for c in classes])
    pairs = pdist(means)
    np.testing.assert_allclose(squareform(pairs), np.linalg.norm(means[:, None] - means[None], axis=-1), rtol=1e-14)
    within = np.mean([np.mean(np.sqrt(((x[labels == c] - means[i]) ** 2).sum(axis=1))) for i, c in enumerate(classes)])
    return squareform(pairs), float(pairs.mean()), float(pairs.min()), float(pairs.mean() / within)


def test_distances_equal_scipy_pdist_of_numpy_class_means() -> None:
    """Unbalanced classes around a large common offset (a residual stream's), and each leave-one-group-out subset."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 7, 400)
    x = 50.0 + rng.standard_normal((7, 24))[labels] + 0.8 * rng.standard_normal((400, 24)) * np.geomspace(3, 0.1, 24)
    groups = jackknife_groups(labels, 4)
    subsets = [np.ones(400, dtype=bool), *(groups != g for g in range(4))]
    worst = 0.0
    for keep, got in zip(subsets, centroid_geometry(x, labels, subsets), strict=True):
        matrix, mean, low, ratio = _reference(x[keep], labels[keep])
        np.testing.assert_allclose(got.distances, matrix, rtol=1e-13, atol=0)
        assert (got.mean, got.min, got.ratio) == pytest.approx((mean, low, ratio), rel=1e-13)
        worst = max(worst, float(np.max(np.abs(got.distances - matrix) / np.where(matrix > 0, matrix, 1))))
    assert worst < 1e-13  # measured: 4.6e-15 (the class sums added in another order)


def test_closed_form() -> None:
    """Classes whose means sit at 0, 1 and 3 on a line (pairs 1, 2, 3), each image at distance r from its mean along
    another axis: mean 2, min 1, within r, ratio 2 / r, at every scale of the representation but the ratio's."""
    r, offsets = 0.25, np.array([0.0, 1.0, 3.0])
    x, labels = [], []
    for c, at in enumerate(offsets):
        for axis in (1, 2):
            for sign in (1.0, -1.0):
                x.append(np.eye(4)[0] * at + sign * r * np.eye(4)[axis])
                labels.append(c)
    x, labels = np.array(x) + 7.0, np.array(labels)
    for scale in (1.0, 1e3):
        (got,) = centroid_geometry(scale * x, labels, [np.ones(labels.size, dtype=bool)])
        np.testing.assert_allclose(got.distances, scale * np.abs(offsets[:, None] - offsets[None, :]), atol=1e-12)
        np.testing.assert_allclose(got.within, scale * r, rtol=1e-14)
        assert (got.mean, got.min, got.ratio) == pytest.approx((2.0 * scale, 1.0 * scale, 2.0 / r), rel=1e-14)
    # one class: no pair; every image on its class mean: no spread, no ratio
    (one,) = centroid_geometry(x[labels == 0], labels[labels == 0], [np.ones(4, dtype=bool)])
    assert math.isnan(one.mean) and math.isnan(one.min) and math.isnan(one.ratio)
    (collapsed,) = centroid_geometry(np.repeat(x[::4], 4, axis=0), labels, [np.ones(12, dtype=bool)])
    assert collapsed.min > 0 and math.isnan(collapsed.ratio)


def test_without_class_structure_the_ratio_is_its_noise_floor() -> None:
    """Isotropic noise with no class structure, ``n_c`` images a class, high dimension: ``||mu_a - mu_b||`` and
    ``||x_i - mu_c||`` concentrate at ``sigma sqrt(2 D / n_c)`` and ``sigma sqrt(D (1 - 1 / n_c))``, so the ratio
    is ``sqrt(2 / (n_c - 1))`` (0.5 at ``n_c = 9``): the floor a depth profile of the ratio starts from."""
    rng = np.random.default_rng(2)
    labels = np.repeat(np.arange(10), 9)
    (got,) = centroid_geometry(3.0 * rng.standard_normal((90, 4000)), labels, [np.ones(90, dtype=bool)])
    assert got.ratio == pytest.approx(0.5, rel=0.02)
    with pytest.raises(ValueError, match="every class"):
        centroid_geometry(np.ones((4, 2)), np.array([0, 0, 1, 1]), [np.array([True, True, False, False])])


def test_settings_refuse_bad_values() -> None:
    on = ObservationSettings.from_config({"class_centroids": {"enabled": True, "min_class_images": 3}})
    assert on.class_centroids.enabled and on.class_centroids.min_class_images == 3
    assert not ObservationSettings().class_centroids.enabled
    for bad in ({"min_class_images": 0}, {"min_class_images": 1.5}, {"enabled": "yes"}):
        with pytest.raises(ObservationSettingsError, match=r"observation\.class_centroids\."):
            ObservationSettings.from_config({"class_centroids": bad})


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_family_passes_the_family_tester_on_a_tiny_vit(tmp_path, world_size: int) -> None:
    torch.manual_seed(0)
    net = timm.create_model(
        "vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=3
    ).eval()
    images = torch.randn(23, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    labels = torch.arange(23) % 3
    off = {"enabled": False}
    settings = {"groups": 2, "probes": off, "attention": off, "weights": off, "phases": off}
    settings["class_centroids"] = {"enabled": True}
    data = TensorDataset(images, labels)
    check = check_family(CLASS_CENTROIDS, net, data, tmp_path, settings=settings, world_size=world_size)
    assert {view for _, view, _ in check.metrics} == {"cls", "patch"}
    # the recorded values are those of the class tokens a forward gives, on all images and without each group
    out: dict[str, torch.Tensor] = {}
    net.blocks[0].register_forward_hook(lambda m, i, o: out.setdefault("x", o))
    with torch.no_grad():
        net(images)
    cls, y = out["x"][:, 0].double().numpy(), labels.numpy()
    groups = jackknife_groups(y, 2)
    want = [_reference(cls[keep], y[keep]) for keep in (groups >= 0, groups != 0, groups != 1)]
    block = check.single[0][("block_01", "cls")]
    for m, name in enumerate(("centroid_distance", "centroid_distance_min", "centroid_distance_ratio"), start=1):
        assert block.observables[name] == pytest.approx(want[0][m], rel=1e-12)
        np.testing.assert_allclose(block.jackknife[name], [w[m] for w in want[1:]], rtol=1e-12)
        assert block.stderr[name] == jackknife_stderr(block.jackknife[name])
    assert block.observables["centroid_classes"] == 3
    # the C x C matrix and its classes, kept at the epochs that keep covariances: in the spectra file, equal on W ranks
    np.testing.assert_allclose(block.kept_arrays["centroid_distances"], want[0][0], rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(block.kept_arrays["centroid_class_labels"], [0, 1, 2])
    spectra = load_spectra(tmp_path / "single", [0], view="cls")[0]["block_01"]
    np.testing.assert_array_equal(spectra["centroid_distances"], block.kept_arrays["centroid_distances"])
    kept = [(key, name) for key, r in check.single[0].items() for name in r.kept_arrays if name.startswith("centroid")]
    viewed = {(k.point, k.view) for k, _ in kept}  # every (point, view) but pos_embed's class token (one vector)
    assert viewed == {("patch_embed", "patch"), ("pos_embed", "patch"), ("cls", "cls")} | {
        (f"block_0{b}", v) for b in (1, 2) for v in ("cls", "patch")
    }
    for key, name in kept:
        want_array = check.single[0][key].kept_arrays[name]
        np.testing.assert_allclose(check.ranks[key].kept_arrays[name], want_array, rtol=1e-10, atol=1e-12)
    # before the first block every image has the same class token: nothing to measure
    pos = check.single[0][("pos_embed", "cls")]
    assert all(math.isnan(pos.observables[m]) for m in ("centroid_distance", "centroid_distance_ratio"))
