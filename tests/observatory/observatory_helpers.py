"""Helpers for the observatory tests: a small timm ViT (random init, 32 px, patch 8 -> 16 patches, width 48)."""

from __future__ import annotations

from typing import Any

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

IMG, PATCH, WIDTH, DEPTH = 32, 8, 48, 4
N_PATCHES = (IMG // PATCH) ** 2  # 16


def make_vit(**overrides: Any) -> VisionTransformer:
    """The test ViT; keyword overrides go straight to timm's VisionTransformer."""
    torch.manual_seed(0)
    kwargs: dict[str, Any] = dict(
        img_size=IMG, patch_size=PATCH, embed_dim=WIDTH, depth=DEPTH, num_heads=3, num_classes=10
    )
    kwargs.update(overrides)
    return VisionTransformer(**kwargs)


def images(batch: int, seed: int = 0, size: int = IMG) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, size, size, generator=g)


def hook_count(model: nn.Module) -> int:
    """Every forward/pre/backward hook on every module (the probe must leave this unchanged)."""
    total = 0
    for m in model.modules():
        total += len(m._forward_hooks) + len(m._forward_pre_hooks)
        total += len(m._backward_hooks) + len(getattr(m, "_backward_pre_hooks", {}))
    return total


class Recorder:
    """Stand-in accumulator that keeps what it is given (tests only; the real one never stores)."""

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def update(self, x: torch.Tensor) -> None:
        self.seen.append(x.clone())
