"""TGO inside your own Lightning training: your LightningModule, your DataLoaders, no Hydra, no TGO DataModule.

The TGO-specific lines are marked ``# TGO``: two imports, the analysis subset, the callback, and
``callbacks=[geometry]`` in the Trainer. The ViT lives under ``self.backbone`` (any name works: the callback finds the
one timm VisionTransformer in the module). Data: scikit-learn's bundled handwritten digits (no download), upsampled
to 16 px. A couple of epochs take seconds on a CPU::

    python examples/own_lightning.py runs/own_lightning
    python -m tgo.report runs/own_lightning          # figures and findings of the geometry records

Every epoch's checkpoint is kept in ``<out>/checkpoints/`` (Lightning's names; ``last.ckpt`` the latest). Resuming
from any of them, with any setting changed, is Lightning's own ``ckpt_path``; the callback sets aside the records made
after that checkpoint (to ``<out>/set_aside/<time>/``, with a ``REASON.txt``) and observes those epochs again::

    python examples/own_lightning.py runs/own_lightning --epochs 4 --batches 10 \
        --ckpt-path "runs/own_lightning/checkpoints/epoch=0-step=23.ckpt"
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import lightning as L
import timm
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from tgo.callbacks import SpectralGeometryCallback  # TGO
from tgo.data import stratified_subset  # TGO


class DigitsClassifier(L.LightningModule):
    """A plain classifier around a small timm ViT, held as ``self.backbone``."""

    def __init__(self, lr: float = 2e-3) -> None:
        super().__init__()
        self.lr = lr
        self.backbone = timm.create_model(
            "vit_tiny_patch16_224", pretrained=False, img_size=16, patch_size=4, num_classes=10,
            depth=4, embed_dim=64, num_heads=2,
        )  # fmt: skip

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(images)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        loss = F.cross_entropy(self(images), labels)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        images, labels = batch
        logits = self(images)
        self.log("val/loss", F.cross_entropy(logits, labels), prog_bar=True)
        self.log("val/acc", (logits.argmax(1) == labels).float().mean(), prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.05)


def digits(image_size: int = 16, seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's 1,797 digits as ``(3 x image_size x image_size image, label)`` tensors, split 80/20."""
    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = F.interpolate(images, size=(image_size, image_size), mode="bilinear", align_corners=False)
    images = ((images - 0.5) / 0.5).expand(-1, 3, -1, -1).contiguous()
    labels = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(labels))
    train, val = order[:cut], order[cut:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[val], labels[val])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the run directory (trainer.default_root_dir): records go to <out>/geometry/")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batches", type=int, default=None, help="at most this many batches per epoch (a quick try)")
    parser.add_argument("--ckpt-path", default=None, help="resume from this checkpoint (any of <out>/checkpoints/)")
    args = parser.parse_args(argv)

    L.seed_everything(0)
    train_set, val_set = digits()
    analysis = stratified_subset(val_set, per_class=10, seed=0)  # TGO
    # records in <out>/geometry/ beside <out>/checkpoints/ (without dirpath: the logger's version directory)
    geometry = SpectralGeometryCallback(analysis=analysis, every_n_epochs=1, dirpath=args.out)  # TGO
    checkpoints = ModelCheckpoint(  # every epoch's, and last.ckpt (a resumed fit overwrites, not versions, them)
        dirpath=f"{args.out}/checkpoints", save_top_k=-1, save_last=True, enable_version_counter=False
    )
    trainer = L.Trainer(
        max_epochs=args.epochs,
        default_root_dir=args.out,
        callbacks=[geometry, checkpoints],  # TGO
        accelerator="cpu",
        enable_progress_bar=False,
        limit_train_batches=args.batches,
        limit_val_batches=args.batches,
    )
    trainer.fit(
        DigitsClassifier(),
        DataLoader(train_set, batch_size=64, shuffle=True),
        DataLoader(val_set, batch_size=256),
        ckpt_path=args.ckpt_path,
    )


if __name__ == "__main__":
    main()
