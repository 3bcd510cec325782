"""The LightningModule that trains a timm Vision Transformer classifier.

The observatory measures this network, so it stays plain: a timm model in ``self.net`` (hooked by module path),
label-smoothed cross entropy, torchmetrics accuracy, AdamW without weight decay on biases, norms and position
embeddings, and a per-step learning-rate schedule.
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any

import lightning as L
import timm
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig
from timm.optim import param_groups_weight_decay
from torchmetrics.classification import MulticlassAccuracy

from tgo.config import SCHEDULES, image_size_problem, model_problems, problems_error
from tgo.errors import ConfigError
from tgo.vit_families import check_timm_name, check_vit

__all__ = ["SCHEDULES", "VAL_EPOCH_METRICS", "ViTClassifier", "build_timm_model", "cosine_factor", "schedule_steps"]

VAL_EPOCH_METRICS = ("val/loss", "val/acc_top1", "val/acc_top5")
"""The validation metrics logged a second time against the epoch, as ``val_epoch/<name>`` (`ViTClassifier`)."""


def build_timm_model(
    name: str,
    *,
    num_classes: int,
    img_size: int,
    in_chans: int = 3,
    pretrained: bool = False,
    pretrained_file: str | None = None,
    **overrides: Any,
) -> torch.nn.Module:
    """Creates a timm model by name, failing with a helpful message for unknown names or missing weight files; a model
    outside the supported families (`tgo.vit_families`) is refused before it is built."""
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.6)
        hint = f" Did you mean: {', '.join(close)}?" if close else " See timm.list_models() for valid names."
        raise ConfigError(f"model.name: unknown timm model '{name}'.{hint}")
    check_timm_name(name)
    kwargs: dict[str, Any] = dict(num_classes=num_classes, img_size=img_size, in_chans=in_chans, **overrides)
    if pretrained_file is not None:
        if not Path(pretrained_file).is_file():
            raise ConfigError(f"model.pretrained_file: '{pretrained_file}' is not a file; expected a weights file.")
        kwargs["pretrained_cfg_overlay"] = dict(file=str(pretrained_file))
        pretrained = True
    try:
        model = timm.create_model(name, pretrained=pretrained, **kwargs)
    except (AssertionError, TypeError) as err:  # timm's own checks of architecture arguments (asserts, bad kwargs)
        raise ConfigError(
            f"model.arch: timm cannot build '{name}' with {dict(overrides)} ({err}); expected architecture "
            f"arguments that '{name}' accepts, e.g. an embed_dim divisible by num_heads"
        ) from err
    check_vit(model)
    return model


class ViTClassifier(L.LightningModule):
    """Image classifier around a timm ViT, trained with AdamW and a per-step schedule.

    ``num_classes``, ``img_size`` and ``in_chans`` come from the DataModule (so errors name ``data.*``). A resume with a
    schedule of another length is refused (`_refuse_a_changed_schedule`); ``compile`` keeps hooks on the net.
    """

    def __init__(
        self,
        name: str = "vit_small_patch16_224",
        num_classes: int = 100,
        img_size: int = 224,
        in_chans: int = 3,
        arch: dict[str, Any] | None = None,
        pretrained: bool = False,
        pretrained_file: str | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        schedule: str = "cosine",
        warmup_epochs: float = 0.0,
        min_lr: float = 1e-6,
        label_smoothing: float = 0.1,
        compile: bool = False,
    ) -> None:
        super().__init__()
        arch = dict(arch or {})
        hparams = dict(lr=lr, weight_decay=weight_decay, min_lr=min_lr, warmup_epochs=warmup_epochs, betas=betas)
        hparams.update(label_smoothing=label_smoothing, schedule=schedule, arch=arch)
        problems = model_problems(hparams, img_size)
        for key, value in (("model.num_classes", num_classes), ("model.img_size", img_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                problems.append(f"{key}: expected a positive integer, got {value!r}")
        if problems:
            raise problems_error(problems)
        self.save_hyperparameters(
            dict(
                name=name,
                num_classes=num_classes,
                img_size=img_size,
                in_chans=in_chans,
                arch=arch,
                pretrained=pretrained,
                pretrained_file=pretrained_file,
                lr=lr,
                weight_decay=weight_decay,
                betas=tuple(betas),
                schedule=schedule,
                warmup_epochs=warmup_epochs,
                min_lr=min_lr,
                label_smoothing=label_smoothing,
                compile=compile,
            )
        )
        self.net = build_timm_model(
            name,
            num_classes=num_classes,
            img_size=img_size,
            in_chans=in_chans,
            pretrained=pretrained,
            pretrained_file=pretrained_file,
            **arch,
        )
        patch = getattr(getattr(self.net, "patch_embed", None), "patch_size", None)  # the timm model's, if not set
        message = image_size_problem(img_size, patch[0] if isinstance(patch, (tuple, list)) else patch)
        if message:
            raise ConfigError(message)
        self._resumed_schedule_steps: int | None = None
        self._forward_net = torch.compile(self.net) if compile else self.net
        top_k = min(5, num_classes)
        self.val_top1 = MulticlassAccuracy(num_classes=num_classes, top_k=1, average="micro")
        self.val_top5 = MulticlassAccuracy(num_classes=num_classes, top_k=top_k, average="micro")
        self.train_top1 = MulticlassAccuracy(num_classes=num_classes, top_k=1, average="micro")

    @property
    def _hp(self) -> Any:
        """The saved hyper-parameters with attribute access (Lightning types them as a plain mapping)."""
        return self.hparams

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self._forward_net(images)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, labels, label_smoothing=self._hp.label_smoothing)

    def tgo_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The training objective for the curvature family: the label-smoothed loss ``training_step`` minimises, so the
        Hessian measured is the optimizer's (plain cross-entropy differs by 9.6 % on ``lambda_1`` at smoothing 0.1)."""
        return self._loss(logits, labels)

    @property
    def tgo_loss_name(self) -> str:
        """What the curvature record says about `tgo_loss` (``curvature_loss``)."""
        return f"{type(self).__name__}.tgo_loss: cross_entropy(label_smoothing={self._hp.label_smoothing:g})"

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        logits = self(images)
        loss = self._loss(logits, labels)
        self.train_top1(logits, labels)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True)
        self.log("train/acc_top1", self.train_top1, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        images, labels = batch
        logits = self(images)
        self.val_top1(logits, labels)
        self.val_top5(logits, labels)
        self.log("val/loss", self._loss(logits, labels), prog_bar=True, on_epoch=True, sync_dist=True)
        self.log("val/acc_top1", self.val_top1, prog_bar=True, on_epoch=True)
        self.log("val/acc_top5", self.val_top5, on_epoch=True)

    def on_validation_end(self) -> None:
        """Logs the epoch-end validation metrics again as ``val_epoch/*`` at step ``current_epoch + 1`` (rank 0):
        Lightning's ``val/...`` are at the optimiser step, the geometry at the epoch, and the two would share no axis.
        """
        trainer = self.trainer
        if trainer.sanity_checking or trainer.state.fn != "fit" or not trainer.is_last_batch:
            return
        metrics = {
            f"val_epoch/{name.split('/', 1)[1]}": float(value)
            for name in VAL_EPOCH_METRICS
            if (value := trainer.callback_metrics.get(name)) is not None
        }
        if metrics and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.current_epoch + 1)

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        hp = self._hp
        groups = param_groups_weight_decay(
            self.net, weight_decay=hp.weight_decay, no_weight_decay_list=getattr(self.net, "no_weight_decay", set)()
        )
        optimizer = torch.optim.AdamW(groups, lr=hp.lr, betas=tuple(hp.betas))
        total = int(self.trainer.estimated_stepping_batches)
        self._refuse_a_changed_schedule(max(total, 1))
        scheduler: torch.optim.lr_scheduler.LRScheduler
        if hp.schedule == "onecycle":
            scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=hp.lr, total_steps=max(total, 1))
        else:
            steps_per_epoch = max(total // max(self.trainer.max_epochs or 1, 1), 1)
            warmup = round(hp.warmup_epochs * steps_per_epoch) if hp.schedule == "cosine" else 0
            scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lr_lambda=cosine_factor(total, warmup, hp.min_lr / hp.lr, constant=hp.schedule == "constant")
            )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Notes the checkpoint schedule's length: the one place that sees it before the new one is built."""
        schedulers = checkpoint.get("lr_schedulers") or []
        self._resumed_schedule_steps = schedule_steps(schedulers[0]) if schedulers else None

    def _refuse_a_changed_schedule(self, total: int) -> None:
        """Refuses to resume when the schedule would span another number of steps than the checkpoint's: OneCycleLR
        would fail after the old end, cosine stay at ``min_lr``, and stretching would change steps taken. A longer
        training is a new run."""
        resumed = self._resumed_schedule_steps
        if resumed is None or resumed == total:
            return
        raise ConfigError(
            f"trainer.max_epochs: the checkpoint's {self._hp.schedule} learning-rate schedule spans {resumed} "
            f"optimizer steps but this run would take {total}; expected the trainer.max_epochs (and batch size, "
            "devices, limit_train_batches) the run started with, because the schedule is fixed when training starts "
            "and cannot be extended by a resume; to train longer, start a new run with the larger max_epochs"
        )


def schedule_steps(state: dict[str, Any]) -> int | None:
    """The steps a saved scheduler state spans (``total_steps``, `_CosineFactor`'s), ``None`` if unknown."""
    if "total_steps" in state:
        return int(state["total_steps"])
    factors = state.get("lr_lambdas") or [None]
    factor = factors[0]
    if isinstance(factor, dict) and "total" in factor and not factor.get("constant", False):
        return int(factor["total"])
    return None


def cosine_factor(total_steps: int, warmup_steps: int, floor: float, *, constant: bool = False):
    """The learning-rate factor per step: linear warm-up, then cosine from 1 to ``floor``; a class so it pickles."""
    return _CosineFactor(total_steps, warmup_steps, floor, constant)


class _CosineFactor:
    def __init__(self, total_steps: int, warmup_steps: int, floor: float, constant: bool) -> None:
        self.total, self.warmup, self.floor, self.constant = max(total_steps, 1), warmup_steps, floor, constant

    def __call__(self, step: int) -> float:
        if self.constant:
            return 1.0
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min((step - self.warmup) / max(self.total - self.warmup, 1), 1.0)
        return self.floor + (1.0 - self.floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
