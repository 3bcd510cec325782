"""Procedural, deterministic, learnable images rendered on demand from ``(seed, split, index)``: per class a grating and
a colour blob, per image its own phase, jitter, contrast and noise, so single images need more than a pixel lookup."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = ["SyntheticSpec", "render_synthetic", "synthetic_class_styles"]


@dataclass(frozen=True)
class SyntheticSpec:
    """Parameters shared by the train and validation splits of one synthetic data set."""

    num_classes: int
    image_size: int
    seed: int = 0
    noise_std: float = 0.08


@lru_cache(maxsize=16)
def synthetic_class_styles(num_classes: int, seed: int) -> dict[str, np.ndarray]:
    """Per-class style parameters drawn once from ``seed`` (cached; identical in every process)."""
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
    """Render image ``index`` of ``split`` (a stream id: splits share no images) as uint8 ``[H, W, 3]``."""
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
