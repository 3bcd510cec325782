"""Bundled digits and procedural synthetic data: shapes, determinism, learnability; argument validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tgo.data import DataConfigError, TGODataModule
from tgo.data.sources import load_digits_split
from tgo.data.synthetic import SyntheticSpec, render_synthetic


def test_digits_split_is_stratified_disjoint_and_deterministic() -> None:
    train, val = load_digits_split(0, "RGB")
    assert len(train) + len(val) == 1797 and len(val) == 359
    assert not set(train.keys) & set(val.keys)
    assert np.all(np.abs(np.bincount(val.labels) / np.bincount(train.labels) - 0.25) < 0.02)  # 20/80 per class
    again = load_digits_split(0, "RGB")[1]
    assert again.keys == val.keys and load_digits_split(1, "RGB")[1].keys != val.keys


@pytest.mark.parametrize("channels", [3, 1])
def test_digits_datamodule_shapes(channels: int) -> None:
    dm = TGODataModule(
        source="digits", image_size=24, batch_size=16, train_transform="digits", channels=channels, analysis_size=200
    )
    dm.setup("fit")
    assert dm.num_classes == 10 and dm.in_chans == channels and dm.class_names[3] == "3"
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, channels, 24, 24) and y.dtype == torch.int64
    a, label = dm.analysis_dataset[0]
    assert a.shape == (channels, 24, 24) and label == 0 and len(dm.analysis_dataset) == 200
    if channels == 3:  # grey replicated to RGB
        assert torch.allclose((a[0] * 0.229 + 0.485), (a[1] * 0.224 + 0.456), atol=1e-5)
    manifest = dm.manifest()
    assert all(isinstance(item["key"], int) and len(item["sha256"]) == 64 for item in manifest["items"])


def test_setup_is_idempotent() -> None:
    dm = TGODataModule(source="digits", image_size=16, analysis_size=100)
    dm.setup("fit")
    train, analysis = dm.train_dataset, dm.analysis_dataset
    dm.setup("validate")
    dm.validate()
    assert dm.train_dataset is train and dm.analysis_dataset is analysis


def test_synthetic_is_deterministic_and_any_size() -> None:
    spec = SyntheticSpec(num_classes=13, image_size=20, seed=3)
    first = render_synthetic(spec, 1, 42)
    assert first.shape == (20, 20, 3) and first.dtype == np.uint8
    assert np.array_equal(first, render_synthetic(spec, 1, 42))
    assert not np.array_equal(first, render_synthetic(spec, 0, 42))  # train and val never share images
    assert render_synthetic(SyntheticSpec(1000, 7, seed=0), 0, 999).shape == (7, 7, 3)
    dm = TGODataModule(
        source="synthetic",
        num_classes=13,
        image_size=20,
        batch_size=5,
        train_size=30,
        val_size=26,
        seed=3,
        analysis_per_class=2,
        analysis_size=None,
    )
    x, y = dm.val_dataset[42 % 26]
    assert x.shape == (3, 20, 20) and y == (42 % 26) % 13
    assert dm.num_classes == 13 and len(dm.analysis_dataset) == 26


def test_synthetic_is_learnable_by_nearest_class_mean() -> None:
    """Class means differ, and a nearest-mean classifier fit on train beats chance by far on val."""
    spec = SyntheticSpec(num_classes=8, image_size=16, seed=0)
    train = np.stack([render_synthetic(spec, 0, i) for i in range(8 * 20)]).reshape(160, -1) / 255.0
    val = np.stack([render_synthetic(spec, 1, i) for i in range(8 * 10)]).reshape(80, -1) / 255.0
    means = np.stack([train[c::8].mean(0) for c in range(8)])
    gaps = np.linalg.norm(means[:, None] - means[None], axis=-1)[~np.eye(8, dtype=bool)]
    assert gaps.min() > 1.0
    predicted = np.argmin(((val[:, None] - means[None]) ** 2).sum(-1), axis=1)
    assert (predicted == np.arange(80) % 8).mean() > 0.6


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": -4}, "batch_size"),
        ({"image_size": 0}, "image_size"),
        ({"eval_batch_size": 0}, "eval_batch_size"),
        ({"analysis_batch_size": -1}, "analysis_batch_size"),
        ({"analysis_size": 0}, "analysis_size"),
        ({"analysis_per_class": -2}, "analysis_per_class"),
        ({"train_size": 0}, "train_size"),
        ({"val_size": 0}, "val_size"),
        ({"num_classes": 0}, "num_classes"),
        ({"num_workers": -1}, "num_workers"),
        ({"crop_scale_min": 0.0}, "crop_scale_min"),
        ({"resize_size": 4}, "resize_size"),
        ({"channels": 2}, "channels"),
        ({"mean": [0.5]}, "mean"),
        ({"train_transform": "fancy"}, "train_transform"),
        ({"source": "mnist"}, "source"),
        ({"analysis_size": None, "analysis_per_class": None}, "analysis_size"),
    ],
)
def test_bad_arguments_fail_in_constructor(kwargs: dict, key: str) -> None:
    base = {"source": "synthetic", "num_classes": 4, "image_size": 8}
    config_key = key.replace("analysis_", "analysis.").replace(".", r"\.")  # as the config spells it
    with pytest.raises(DataConfigError, match=rf"data\.{config_key}"):
        TGODataModule(**{**base, **kwargs})


def test_synthetic_requires_num_classes() -> None:
    with pytest.raises(DataConfigError, match=r"data\.num_classes is required for source=synthetic"):
        TGODataModule(source="synthetic")


def test_digits_subset_too_large_names_class() -> None:
    with pytest.raises(DataConfigError, match=r"data\.analysis\.per_class=100 needs 100 .* has 3[5-7]"):
        TGODataModule(source="digits", image_size=8, analysis_size=1000).validate()


def test_the_eval_resize_follows_the_image_size_and_a_crop_that_discards_most_of_the_image_warns() -> None:
    """``resize_size: 256`` with ``image_size: 32`` would measure the central eighth of each image (issue 21 item 4)."""
    import warnings

    from tgo.data.datamodule import warn_if_the_crop_discards_most_of_the_image

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_if_the_crop_discards_most_of_the_image(224, None) == pytest.approx((224 / 256) ** 2)
        assert warn_if_the_crop_discards_most_of_the_image(32, None) == pytest.approx((32 / 37) ** 2)
        assert warn_if_the_crop_discards_most_of_the_image(224, 256) == pytest.approx((224 / 256) ** 2)
    with pytest.warns(UserWarning, match=r"data.resize_size=256 with data.image_size=32: .* keeps 1.6% .* = 37"):
        TGODataModule(source="synthetic", num_classes=4, image_size=32, resize_size=256)
