"""What one observation returns prints as what it holds, never its arrays (one ``observe_model`` result's default repr
ran to 269,093 characters)."""

from __future__ import annotations

import pprint

import torch
from torch.utils.data import TensorDataset

import tgo
from tests.observatory.observatory_helpers import WIDTH, images, make_vit


def test_an_observation_and_each_result_print_in_one_short_line_naming_points_views_and_counts() -> None:
    results = tgo.observe_model(make_vit(), TensorDataset(images(12), torch.arange(12) % 3), groups=2)
    points, views = (list(dict.fromkeys(getattr(key, part) for key in results)) for part in ("point", "view"))
    text = repr(results)
    assert len(text) < 500 and "\n" not in text and pprint.pformat(results) == text
    counts = f"{len(points)} points, {len(views)} views, {len(results)} (point, view) results"
    assert text.startswith(f"Results({counts}; points: ")
    assert f"{points[0]}, {points[1]}, {points[2]}, ..., {points[-2]}, {points[-1]}; " in text
    assert f"views (points): all ({len(points)}), patch ({len(points) - 1}), " in text
    assert repr(results["cls"]) == (
        f"PointResult(D={WIDTH}, n_rows=12, {len(results['cls'].observables)} observables, "
        "arrays=[max_abs, eigenvectors, components_90])"
    )
    assert repr(results[("cls", "cls")]).endswith("observables, alias_of='all', kept_arrays=[vectors, labels])")
    weights = repr(results[("block_01", "weights_qkv")])
    assert weights.startswith("PointResult(metrics only, ") and weights.endswith("arrays=[singular_values])")
