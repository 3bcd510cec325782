"""``data.preload``: pixel sources transformed once into tensors, "digits" augmentation per batch on tensors.

The promise is that nothing measured changes: validation and analysis tensors equal the PIL path's output bit for
bit (so observations and manifests are the same), and the batched affine equals torchvision's per-image affine for
the same parameters; only the random draws of the training augmentation differ.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from tests.data.conftest import TreeFactory
from tgo.data import DataConfigError, TGODataModule
from tgo.data.datasets import PreloadedImageSplit
from tgo.data.transforms import DIGITS_DEGREES, DIGITS_SCALE, DIGITS_TRANSLATE, BatchRandomAffine


def _digits(preload: bool, **kwargs: Any) -> TGODataModule:
    dm = TGODataModule(
        source="digits", image_size=24, batch_size=32, train_transform="digits", preload=preload, **kwargs
    )
    return dm.validate()


@pytest.mark.parametrize("channels", [3, 1])
def test_preloaded_val_and_analysis_equal_the_pil_path_bit_for_bit(channels: int) -> None:
    pil, pre = _digits(False, channels=channels, analysis_size=100), _digits(True, channels=channels, analysis_size=100)
    assert isinstance(pre.val_dataset, PreloadedImageSplit)
    a = torch.stack([pil.analysis_dataset[i][0] for i in range(100)])
    b = torch.stack([pre.analysis_dataset[i][0] for i in range(100)])
    assert a.shape == (100, channels, 24, 24) and torch.equal(a, b)
    assert torch.equal(torch.cat([x for x, _ in pil.val_dataloader()]), torch.cat([x for x, _ in pre.val_dataloader()]))
    assert pil.manifest()["items"] == pre.manifest()["items"]  # same keys, labels and content hashes
    assert pil.manifest()["fingerprint"] == pre.manifest()["fingerprint"]


def test_preloaded_train_items_are_the_unaugmented_eval_tensors_and_batches_are_augmented() -> None:
    pil, pre = _digits(False, analysis_size=100), _digits(True, analysis_size=100)
    eval_view = pil.train_dataset.with_transform(pil.val_dataset.transform)
    (cached, label), (computed, expected_label) = pre.train_dataset[7], eval_view[7]
    assert isinstance(cached, torch.Tensor) and isinstance(computed, torch.Tensor)
    assert torch.equal(cached, computed) and label == expected_label
    torch.manual_seed(0)
    x, y = next(iter(pre.train_dataloader()))
    assert x.shape == (32, 3, 24, 24) and x.dtype == torch.float32 and y.dtype == torch.int64
    black = torch.tensor([-m / s for m, s in zip(pre.mean, pre.std, strict=True)]).view(1, 3, 1, 1)
    assert torch.all(x >= black - 1e-6)  # nearest sampling and black fill: no value darker than black appears
    torch.manual_seed(0)
    again, _ = next(iter(pre.train_dataloader()))
    assert torch.equal(x, again)  # the augmentation follows torch's seeded generator


def test_preload_without_augmentation_serves_the_cached_tensors() -> None:
    dm = TGODataModule(
        source="synthetic",
        num_classes=3,
        image_size=12,
        batch_size=4,
        train_size=12,
        val_size=9,
        analysis_size=6,
        preload=True,
        train_transform="none",
    )
    dm.validate()
    x, _ = next(iter(torch.utils.data.DataLoader(dm.train_dataset, batch_size=4)))
    batch, _ = next(iter(dm._loader(dm.train_dataset, 4, shuffle=False)))
    assert torch.equal(x, batch) and x.shape == (4, 3, 12, 12)


@pytest.mark.parametrize(
    ("angle", "shift", "scale"),
    [
        (0.0, (0.0, 0.0), 1.0),
        (0.0, (2.0, -1.0), 1.0),
        (8.0, (0.0, 0.0), 1.0),
        (-9.5, (-2.0, 2.0), 0.92),
        (7.0, (2.0, -1.0), 1.05),
    ],
)
def test_batch_affine_matches_torchvision_affine(angle: float, shift: tuple[float, float], scale: float) -> None:
    torch.manual_seed(1)
    images = torch.rand(2, 3, 24, 24)
    ours = BatchRandomAffine((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)).apply(
        images, torch.tensor([angle, angle]), torch.tensor([shift, shift]), torch.tensor([scale, scale])
    )
    for i in range(2):
        ref = TF.affine(
            images[i],
            angle=angle,
            translate=[int(shift[0]), int(shift[1])],
            scale=scale,
            shear=[0.0, 0.0],
            interpolation=v2.InterpolationMode.NEAREST,
        )
        assert torch.equal(ours[i], ref)


def test_batch_affine_fills_with_normalised_black_and_commutes_with_normalisation() -> None:
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    raw = torch.rand(3, 3, 16, 16)
    normalise = v2.Normalize(list(mean), list(std))
    angle, shift, scale = (
        torch.tensor([10.0, -4.0, 0.0]),
        torch.tensor([[3.0, 0.0], [-2.0, -3.0], [0.0, 0.0]]),
        torch.ones(3),
    )
    raw_warped = BatchRandomAffine((0.0,) * 3, (1.0,) * 3).apply(raw, angle, shift, scale)  # fill 0 = black pixels
    warped = BatchRandomAffine(mean, std).apply(normalise(raw), angle, shift, scale)
    torch.testing.assert_close(warped, normalise(raw_warped), rtol=0, atol=1e-6)
    assert torch.equal(warped[2], normalise(raw)[2])  # identity parameters change nothing


def test_batch_affine_draws_within_the_digits_ranges() -> None:
    torch.manual_seed(3)
    angle, shift, scale = BatchRandomAffine((0.5,), (0.5,)).sample(4096, 24, 20)
    assert angle.abs().max() <= DIGITS_DEGREES and angle.std() > DIGITS_DEGREES / 2  # uniform over the whole range
    assert torch.equal(shift, shift.round())
    assert shift[:, 0].abs().max() <= round(DIGITS_TRANSLATE[0] * 20) and shift[:, 1].abs().max() <= round(
        DIGITS_TRANSLATE[1] * 24
    )
    assert DIGITS_SCALE[0] <= scale.min() and scale.max() <= DIGITS_SCALE[1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"source": "digits", "train_transform": "standard"}, "data.preload=true supports"),
        ({"source": "synthetic", "num_classes": 2, "image_size": 224, "train_size": 20000}, "GiB"),
    ],
)
def test_preload_refuses_what_it_cannot_hold(kwargs: dict, message: str) -> None:
    with pytest.raises(DataConfigError, match=message):
        TGODataModule(preload=True, analysis_size=2, **{"train_transform": "none", **kwargs}).validate()


def test_preload_refuses_photo_sources(make_tree: TreeFactory, tmp_path: Path) -> None:
    root = make_tree(tmp_path / "tree", ["a", "b"])
    dm = TGODataModule(
        source="imagefolder", root=str(root), image_size=16, preload=True, train_transform="none", analysis_per_class=1
    )
    with pytest.raises(DataConfigError, match="not source=imagefolder"):
        dm.validate()
