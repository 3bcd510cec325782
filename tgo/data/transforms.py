"""Train and eval transforms, built from plain config values.

Photos (imagefolder, imagenet100) use the standard ImageNet recipe: RandomResizedCrop + flip for training,
resize + centre crop for evaluation. Tiny pixel sources (digits, synthetic) are only resized, because cropping a
24-pixel digit or flipping it (a flipped 2 is not a 2) destroys the label.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchvision.transforms import v2

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "TRAIN_TRANSFORMS", "build_eval_transform", "build_train_transform"]

TRAIN_TRANSFORMS = ("standard", "digits", "none")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _to_normalized_tensor(mean: Sequence[float], std: Sequence[float]) -> list[v2.Transform]:
    return [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]


def build_eval_transform(
    image_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    resize_size: int | None = None,
    photo: bool = True,
) -> v2.Compose:
    """Deterministic eval transform, also used for the analysis subset.

    Args:
        image_size: Output side length.
        mean: Per-channel normalisation mean.
        std: Per-channel normalisation std.
        resize_size: Shorter side before the centre crop (photos); ``None`` means ``round(image_size / 0.875)``,
            i.e. 256 for 224.
        photo: ``True`` for resize + centre crop; ``False`` for a plain resize to ``image_size`` (pixel sources).

    Returns:
        PIL image -> normalised float tensor ``[C, image_size, image_size]``.
    """
    if photo:
        resize = resize_size if resize_size is not None else round(image_size / 0.875)
        geometry: list[v2.Transform] = [v2.Resize(resize, antialias=True), v2.CenterCrop(image_size)]
    else:
        geometry = [v2.Resize((image_size, image_size), antialias=True)]
    return v2.Compose(geometry + _to_normalized_tensor(mean, std))


def build_train_transform(
    name: str,
    image_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    crop_scale_min: float = 0.08,
    resize_size: int | None = None,
    photo: bool = True,
) -> v2.Compose:
    """Training transform by name.

    Args:
        name: "standard" = RandomResizedCrop(image_size, scale=(crop_scale_min, 1)) + horizontal flip (photos);
            "digits" = resize + small random affine (shift/rotate/scale), no flip; "none" = the eval transform.
        image_size: Output side length.
        mean: Per-channel normalisation mean.
        std: Per-channel normalisation std.
        crop_scale_min: Lower bound of the RandomResizedCrop area fraction ("standard" only).
        resize_size: Passed to the eval transform for "none".
        photo: Passed to the eval transform for "none".

    Returns:
        PIL image -> normalised float tensor ``[C, image_size, image_size]``.
    """
    if name == "standard":
        geometry: list[v2.Transform] = [
            v2.RandomResizedCrop(image_size, scale=(crop_scale_min, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
        ]
    elif name == "digits":
        geometry = [
            v2.Resize((image_size, image_size), antialias=True),
            v2.RandomAffine(degrees=10.0, translate=(0.1, 0.1), scale=(0.9, 1.1)),
        ]
    elif name == "none":
        return build_eval_transform(image_size, mean, std, resize_size=resize_size, photo=photo)
    else:
        raise ValueError(f"unknown train transform {name!r}; expected one of {TRAIN_TRANSFORMS}")
    return v2.Compose(geometry + _to_normalized_tensor(mean, std))
