"""What the multi-process tests share: a free port for a gloo rendezvous and the small ViT each process builds.

Lightning-free, so the processes ``torch.multiprocessing.spawn`` starts import it quickly.
"""

from __future__ import annotations

import socket

import torch


def free_port() -> int:
    """A TCP port free on this machine now (``MASTER_PORT`` of one spawned group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_vit() -> torch.nn.Module:
    """The same 2-block, width-32 timm ViT at 16 px (3 classes) in every process: seed 0, eval mode."""
    import timm

    torch.manual_seed(0)
    return timm.create_model(
        "vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=3
    ).eval()
