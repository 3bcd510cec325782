"""Procedural, deterministic, learnable images for tests and scaling measurements.

Each class has a fixed random "style": a grating (orientation, spatial frequency, colour) and a colour blob (centre,
radius, colour). Each image draws its own grating phase, small orientation and blob jitter, contrast and pixel noise.
Class means therefore differ (colour and blob survive averaging over phase) while single images need more than a
pixel lookup to classify, which is what a sanity-check ViT should learn. Any number of classes, images and any
resolution work; images are rendered on demand from ``(seed, split, index)`` so nothing is stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = ["SyntheticSpec", "render_synthetic", "synthetic_class_styles"]


@dataclass(frozen=True)
class SyntheticSpec:
    """Parameters shared by the train and validation splits of one synthetic data set.

    Args:
        num_classes: Number of classes (labels ``0..num_classes-1``).
        image_size: Side length in pixels of the rendered square images.
        seed: Seeds the class styles and every image's random stream.
        noise_std: Standard deviation of additive pixel noise, in [0, 1] intensity units.
    """

    num_classes: int
    image_size: int
    seed: int = 0
    noise_std: float = 0.08


@lru_cache(maxsize=16)
def synthetic_class_styles(num_classes: int, seed: int) -> dict[str, np.ndarray]:
    """Per-class style parameters, drawn once from ``seed`` (cached; identical in every process): ``num_classes``
    rows of ``theta`` (radians), ``freq`` (cycles per image), ``grating_rgb`` and ``blob_rgb`` (``[C, 3]`` in
    [0, 1]), ``centre`` (``[C, 2]`` in image units), ``radius``."""
    rng = np.random.default_rng([seed, 0x5EED])
    return {
        "theta": rng.uniform(0.0, np.pi, num_classes),
        "freq": rng.uniform(1.5, 5.0, num_classes),
        "grating_rgb": rng.uniform(0.1, 0.9, (num_classes, 3)),
        "blob_rgb": rng.uniform(0.1, 0.9, (num_classes, 3)),
        "centre": rng.uniform(0.25, 0.75, (num_classes, 2)),
        "radius": rng.uniform(0.12, 0.25, num_classes),
    }


def render_synthetic(spec: SyntheticSpec, split: int, index: int) -> np.ndarray:
    """Render image ``index`` of ``split`` (label ``index % num_classes``) as uint8 ``[H, W, 3]``, identical for
    identical arguments in any process; ``split`` (0 train, 1 validation) is a stream id, so the splits never share
    images."""
    label = index % spec.num_classes
    style = synthetic_class_styles(spec.num_classes, spec.seed)
    rng = np.random.default_rng([spec.seed, split, index])
    size = spec.image_size
    coords = (np.arange(size, dtype=np.float64) + 0.5) / size
    yy, xx = np.meshgrid(coords, coords, indexing="ij")

    theta = style["theta"][label] + rng.normal(0.0, 0.08)
    phase = rng.uniform(0.0, 2.0 * np.pi)
    wave = 0.5 + 0.5 * np.sin(2.0 * np.pi * style["freq"][label] * (xx * np.cos(theta) + yy * np.sin(theta)) + phase)
    cy, cx = style["centre"][label] + rng.normal(0.0, 0.04, 2)
    blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2.0 * style["radius"][label] ** 2))
    contrast = rng.uniform(0.7, 1.0)

    grating = 0.55 * wave[..., None] * style["grating_rgb"][label]
    spot = 0.45 * blob[..., None] * style["blob_rgb"][label]
    image = contrast * (grating + spot) + rng.normal(0.0, spec.noise_std, (size, size, 3))
    return np.clip(np.rint(image * 255.0), 0, 255).astype(np.uint8)
