"""Train and eval transforms from plain config values: photos get the ImageNet recipe, pixel sources are only resized
(cropping a 24-pixel digit or flipping it destroys the label)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.utils.data import default_collate
from torchvision.transforms import v2

__all__ = [
    "DIGITS_DEGREES",
    "DIGITS_SCALE",
    "DIGITS_TRANSLATE",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "TRAIN_TRANSFORMS",
    "AugmentingCollate",
    "BatchRandomAffine",
    "build_eval_transform",
    "build_train_transform",
]

TRAIN_TRANSFORMS = ("standard", "digits", "none")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# The "digits" augmentation: rotation (degrees), translation (fraction of the side), scale range. Shared by the PIL
# transform and the batched tensor one so the two describe the same distribution of images.
DIGITS_DEGREES = 10.0
DIGITS_TRANSLATE = (0.1, 0.1)
DIGITS_SCALE = (0.9, 1.1)


def _to_normalized_tensor(mean: Sequence[float], std: Sequence[float]) -> list[v2.Transform]:
    return [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]


def build_eval_transform(
    image_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    resize_size: int | None = None,
    photo: bool = True,
) -> v2.Compose:
    """Deterministic eval transform (also the analysis subset's) to a normalised ``[C, image_size, image_size]`` tensor:
    a photo is resized (``resize_size``, ``None``: ``round(image_size / 0.875)``) and centre-cropped."""
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
    """Training transform by name: "standard" (crop + flip), "digits" (small affine, no flip) or "none"."""
    if name == "standard":
        geometry: list[v2.Transform] = [
            v2.RandomResizedCrop(image_size, scale=(crop_scale_min, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
        ]
    elif name == "digits":
        geometry = [
            v2.Resize((image_size, image_size), antialias=True),
            v2.RandomAffine(degrees=DIGITS_DEGREES, translate=DIGITS_TRANSLATE, scale=DIGITS_SCALE),
        ]
    elif name == "none":
        return build_eval_transform(image_size, mean, std, resize_size=resize_size, photo=photo)
    else:
        raise ValueError(f"unknown train transform {name!r}; expected one of {TRAIN_TRANSFORMS}")
    return v2.Compose(geometry + _to_normalized_tensor(mean, std))


class BatchRandomAffine:
    """Per-image random affine of a whole normalised batch in one ``grid_sample``, drawn as torchvision's
    ``RandomAffine`` draws one image's (from torch's global generator), nearest pixels and black fill: raw-pixel
    augmentation, normalised."""

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        degrees: float = DIGITS_DEGREES,
        translate: tuple[float, float] = DIGITS_TRANSLATE,
        scale: tuple[float, float] = DIGITS_SCALE,
    ):
        if len(mean) != len(std) or min(std) <= 0:
            raise ValueError(f"mean {list(mean)} and std {list(std)} must have one value per channel and std > 0")
        if degrees < 0 or not all(0 <= t <= 1 for t in translate) or not 0 < scale[0] <= scale[1]:
            raise ValueError(f"invalid affine ranges: degrees={degrees}, translate={translate}, scale={scale}")
        self.black = torch.tensor([-m / s for m, s in zip(mean, std, strict=True)], dtype=torch.float32)
        self.degrees = float(degrees)
        self.translate = (float(translate[0]), float(translate[1]))
        self.scale = (float(scale[0]), float(scale[1]))

    def sample(self, batch: int, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Draw ``(angle_degrees [B], translation_pixels [B, 2] as (x, y), scale [B])`` for a batch."""
        angle = torch.empty(batch).uniform_(-self.degrees, self.degrees)
        max_shift = torch.tensor([self.translate[0] * width, self.translate[1] * height])
        shift = torch.round((torch.rand(batch, 2) * 2 - 1) * max_shift)
        scale = torch.empty(batch).uniform_(self.scale[0], self.scale[1])
        return angle, shift, scale

    def apply(
        self, images: torch.Tensor, angle: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor
    ) -> torch.Tensor:
        """Warp ``images [B, C, H, W]`` by per-image parameters: the inverse of torchvision's ``affine`` without shear,
        so the two agree pixel for pixel (up to nearest-neighbour ties at exact half pixels)."""
        b, c, h, w = images.shape
        if c != len(self.black):
            raise ValueError(f"expected {len(self.black)} channels, got images of shape {tuple(images.shape)}")
        rad = angle.to(torch.float64) * (math.pi / 180.0)
        cos, sin = torch.cos(rad) / scale, torch.sin(rad) / scale
        tx, ty = shift[:, 0].to(torch.float64), shift[:, 1].to(torch.float64)
        # M^-1 in pixel units; with y pointing down a counter-clockwise turn inverts to [[cos, sin], [-sin, cos]].
        a11, a12, a21, a22 = cos, sin, -sin, cos
        b1, b2 = -(a11 * tx + a12 * ty), -(a21 * tx + a22 * ty)
        # affine_grid works in [-1, 1] per axis: x_norm = 2 x / w, so off-diagonal terms pick up the aspect ratio.
        theta = torch.stack(
            [
                torch.stack([a11, a12 * h / w, 2 * b1 / w], dim=1),
                torch.stack([a21 * w / h, a22, 2 * b2 / h], dim=1),
            ],
            dim=1,
        ).to(images.dtype)
        grid = F.affine_grid(theta, [b, c, h, w], align_corners=False)
        # Nearest sampling copies input values exactly; pixels that read from outside the image become black (the
        # same grid applied to ones marks them), so no arithmetic touches the values that are kept.
        warped = F.grid_sample(images, grid, mode="nearest", padding_mode="zeros", align_corners=False)
        ones = torch.ones(b, 1, h, w, dtype=images.dtype, device=images.device)
        inside = F.grid_sample(ones, grid, mode="nearest", padding_mode="zeros", align_corners=False) > 0.5
        return torch.where(inside, warped, self.black.to(images).view(1, c, 1, 1))

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """Augment a batch ``[B, C, H, W]`` with freshly drawn parameters per image."""
        angle, shift, scale = self.sample(images.shape[0], images.shape[-2], images.shape[-1])
        return self.apply(images, angle, shift, scale)


class AugmentingCollate:
    """``default_collate``, then a batch transform on the images; a class, not a closure, so workers can pickle it."""

    def __init__(self, augment: BatchRandomAffine):
        self.augment = augment

    def __call__(self, items: list[tuple[torch.Tensor, int]]) -> list[torch.Tensor]:
        images, labels = default_collate(items)
        return [self.augment(images), labels]
