"""Test-only callbacks (instantiated from the config tree with `+callbacks.<name>=...`) and the quiet CPU trainer of
the tests that fit a LightningModule directly."""

from __future__ import annotations

import os
import signal
from typing import Any

import lightning as L


class SimulatedCrash(RuntimeError):
    """Stands for a node failure / preemption in the middle of training."""


class CrashAtEpochStart(L.Callback):
    """Raises when epoch index ``epoch`` starts, i.e. after ``epoch`` completed epochs were checkpointed."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == self.epoch:
            raise SimulatedCrash(f"simulated crash at the start of epoch index {self.epoch}")


class CrashAtEpochEnd(L.Callback):
    """Raises at the end of epoch index ``epoch``, after the geometry records and before the checkpoint.

    Lightning runs checkpoint callbacks after every other callback's ``on_train_epoch_end``, so this stands for a kill
    between an observation's records and the checkpoint of the same weights.
    """

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == self.epoch:
            raise SimulatedCrash(f"simulated crash at the end of epoch index {self.epoch}, before its checkpoint")


class SignalAtBatch(L.Callback):
    """Sends ``signal_name`` to this process after batch ``batch`` of epoch index ``epoch``: SLURM's preemption
    warning (``--signal=USR2@<delay>``) arriving in the middle of an epoch."""

    def __init__(self, epoch: int, batch: int, signal_name: str = "SIGUSR2") -> None:
        self.epoch, self.batch, self.signal_name = epoch, batch, signal_name

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: object) -> None:
        batch_idx = args[-1]
        if trainer.current_epoch == self.epoch and batch_idx == self.batch:
            os.kill(os.getpid(), getattr(signal, self.signal_name))


TINY_TIMM = [
    "data.image_size=16",
    "data.analysis.per_class=2",
    "model.arch.patch_size=4",
    "model.arch.depth=2",
    "model.arch.embed_dim=16",
    "model.arch.num_heads=2",
]
"""Overrides that make a timm ViT tiny enough for a test to observe in seconds (16 px, patch 4, depth 2, width 16)."""


def quiet_cpu_trainer(root: Any, callbacks: list[L.Callback], **options: Any) -> L.Trainer:
    """One quiet CPU epoch in ``root`` with ``callbacks`` (no logger, checkpoints, progress bar or model summary);
    ``options`` override any Trainer argument (accumulation, batch limits, epochs)."""
    settings: dict[str, Any] = dict(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        accelerator="cpu",
    )
    return L.Trainer(callbacks=callbacks, **{**settings, **options})
