"""Lightning checkpoints of ``tgo.model.ViTClassifier`` and plain weight files: reading, labelling, rebuilding.

Weight files are read with timm's own ``load_state_dict``; loading into a model is strict and names the missing,
unexpected and differently shaped keys. A checkpoint is labelled with the training epochs it had completed (the fit
loop's ``epoch_progress.current.processed``; ``checkpoint["epoch"] + 1`` without loop state), as the callback labels
its observation of the same weights; a mid-epoch checkpoint gets the epochs completed before it, with a warning.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from timm.models import load_state_dict as timm_load_state_dict

from tgo.errors import UserInputError
from tgo.model import build_timm_model
from tgo.records import atomic_write
from tgo.safe_load import UnsafeCheckpointError, load_weights_only, unpickling_reason, unsafe_error

__all__ = [
    "AtomicCheckpointIO",
    "CheckpointError",
    "CheckpointMismatchError",
    "EpochLabelCheckpoint",
    "ModelSource",
    "UnsafeCheckpointError",
    "check_weights_file",
    "checkpoint_epoch",
    "checkpoint_source",
    "find_checkpoints",
    "load_checkpoint_file",
    "load_state_dict_strict",
    "load_weights_file",
    "net_from_checkpoint",
    "net_from_user_checkpoint",
    "state_dict_mismatch",
    "state_dict_prefix",
    "timm_net",
]


class CheckpointError(UserInputError):
    """A checkpoint or weights file is missing, unreadable, or not what was expected."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint or weights file does not fit the model (missing, unexpected or differently shaped keys)."""


@dataclass(frozen=True)
class ModelSource:
    """One model to observe, before it is loaded: ``kind`` (``checkpoint`` or ``timm``), file, epoch label and step."""

    kind: str
    path: Path | None
    epoch: int
    step: int


# ----------------------------------------------------------------------------------------------------- checkpoints
def load_checkpoint_file(path: Path) -> dict[str, Any]:
    """Loads a checkpoint on the CPU, memory-mapped, with ``weights_only=True`` (`tgo.safe_load`)."""
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        checkpoint = load_weights_only(path)
    except UnsafeCheckpointError:
        raise
    except Exception as err:
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint ({unpickling_reason(err)})") from err
    if not isinstance(checkpoint, dict):
        raise CheckpointError(
            f"{path}: not a Lightning checkpoint (it holds a {type(checkpoint).__name__}, not a dict)"
        )
    return checkpoint


def checkpoint_epoch(checkpoint: dict[str, Any]) -> tuple[int, bool]:
    """``(epochs, at_epoch_end)`` of a loaded Lightning checkpoint (the rule: the module docstring)."""
    if "epoch" not in checkpoint:
        raise CheckpointError("not a Lightning checkpoint (no 'epoch' entry)")
    progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current")
    if not progress or "processed" not in progress:
        return int(checkpoint["epoch"]) + 1, True
    processed, started = int(progress["processed"]), int(progress.get("started", progress["processed"]))
    return processed, processed >= started


def checkpoint_source(path: Path) -> ModelSource:
    checkpoint = load_checkpoint_file(path)
    try:
        epoch, at_end = checkpoint_epoch(checkpoint)
    except CheckpointError as err:
        raise CheckpointError(f"{path}: {err}") from err
    step = int(checkpoint.get("global_step", 0))
    if not at_end:
        warnings.warn(
            f"[tgo] {path.name} was saved in the middle of an epoch (step {step}); it is labelled with the "
            f"{epoch} epochs completed before it",
            RuntimeWarning,
            stacklevel=2,
        )
    return ModelSource("checkpoint", path, epoch, step)


def find_checkpoints(directory: str | Path) -> list[ModelSource]:
    """Every ``*.ckpt`` of a directory in epoch order, the same weights (label and step) once."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory (expected a run's checkpoints/ directory)")
    files = sorted(directory.glob("*.ckpt"))
    if not files:
        raise CheckpointError(f"{directory}: no *.ckpt files")
    by_epoch: dict[int, ModelSource] = {}
    for path in files:
        source = checkpoint_source(path)
        kept = by_epoch.get(source.epoch)
        if kept is None:
            by_epoch[source.epoch] = source
        elif kept.step != source.step:
            assert kept.path is not None
            raise CheckpointError(
                f"{kept.path.name} (step {kept.step}) and {path.name} (step {source.step}) are both "
                f"labelled epoch {source.epoch}; observe one of them with --checkpoint"
            )
    return [by_epoch[e] for e in sorted(by_epoch)]


def state_dict_mismatch(own: Mapping[str, Any], state: Mapping[str, Any]) -> str | None:
    """How ``state`` does not fit a model whose state dict is ``own``, in words, or ``None``; reads shapes only."""
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"{k} {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in state and hasattr(state[k], "shape") and tuple(state[k].shape) != tuple(own[k].shape)
    ]
    if not (missing or unexpected or shapes):
        return None

    def show(keys: list[str]) -> str:
        return ", ".join(keys[:8]) + (f" ... ({len(keys)} in all)" if len(keys) > 8 else "")

    parts = [
        f"missing keys: {show(missing)}" if missing else "",
        f"unexpected keys: {show(unexpected)}" if unexpected else "",
        f"shape mismatches: {show(shapes)}" if shapes else "",
    ]
    return "; ".join(p for p in parts if p)


def load_state_dict_strict(net: torch.nn.Module, state: dict[str, torch.Tensor], *, origin: str) -> None:
    """Loads weights exactly, or fails naming the missing, unexpected and differently shaped keys."""
    problem = state_dict_mismatch(net.state_dict(), state)
    if problem:
        raise CheckpointMismatchError(f"{origin} does not fit the model ({problem})")
    net.load_state_dict(state, strict=True)


def net_from_checkpoint(path: Path) -> torch.nn.Module:
    """Rebuilds the timm network of a ViTClassifier checkpoint from its hyper-parameters and loads its weights."""
    checkpoint = load_checkpoint_file(path)
    hp = checkpoint.get("hyper_parameters") or {}
    if "name" not in hp or "img_size" not in hp or "state_dict" not in checkpoint:
        raise CheckpointError(
            f"{path}: not a tgo.model.ViTClassifier checkpoint (needs hyper_parameters with the timm "
            f"'name' and a state_dict); for a checkpoint of your own LightningModule add --timm NAME (with its "
            f"model.arch.* arguments, and --prefix where the ViT's weights live if not found by itself); for a plain "
            f"weights file use --timm NAME --weights FILE"
        )
    net = build_timm_model(
        hp["name"],
        num_classes=int(hp.get("num_classes", 1000)),
        img_size=int(hp["img_size"]),
        in_chans=int(hp.get("in_chans", 3)),
        **dict(hp.get("arch") or {}),
    )
    state = {k[len("net.") :]: v for k, v in checkpoint["state_dict"].items() if k.startswith("net.")}
    if not state:
        raise CheckpointMismatchError(
            f"{path}: its state_dict has no 'net.*' keys, so it is not a "
            f"tgo.model.ViTClassifier checkpoint (first keys: "
            f"{', '.join(list(checkpoint['state_dict'])[:5])})"
        )
    load_state_dict_strict(net, state, origin=str(path))
    return net


_WEIGHTS = "a weights file (.safetensors, or a torch file of tensors)"


def load_weights_file(path: Path) -> dict[str, torch.Tensor]:
    """A weights file as a clean state dict, read by timm (wrappers and DDP or ``torch.compile`` prefixes removed)."""
    if not path.is_file():
        raise CheckpointError(f"--weights {path}: no such file")
    try:
        state = timm_load_state_dict(str(path), use_ema=True, weights_only=True)
    except Exception as err:
        refusal = unsafe_error(path, err, label=f"--weights {path}", expected=_WEIGHTS)
        if refusal is not None:
            raise refusal from err
        raise CheckpointError(f"--weights {path}: not a readable weights file ({unpickling_reason(err)})") from err
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


def check_weights_file(path: Path) -> None:
    """Refuses a weights file that timm's loader would refuse, before any work (tensors memory-mapped, not read)."""
    if not path.is_file():
        raise CheckpointError(f"--weights {path}: no such file")
    if path.suffix == ".safetensors":
        return
    try:
        load_weights_only(path, label=f"--weights {path}", expected=_WEIGHTS, allow=[argparse.Namespace])
    except UnsafeCheckpointError:
        raise
    except Exception as err:
        raise CheckpointError(f"--weights {path}: not a readable weights file ({unpickling_reason(err)})") from err


_HEADS = ("head", "head_dist")
"""Classifier heads of the timm ViT families (``head_dist``: DeiT distilled); never observed, so not loaded."""


def _without_head(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k.split(".", 1)[0] not in _HEADS}


def timm_net(
    name: str, *, pretrained: bool, weights: Path | None, seed: int, img_size: int, in_chans: int, arch: dict[str, Any]
) -> torch.nn.Module:
    """A timm model without its classifier head (never observed), randomly initialised or with weights."""
    torch.manual_seed(seed)
    net = build_timm_model(name, num_classes=0, img_size=img_size, in_chans=in_chans, pretrained=pretrained, **arch)
    if weights is not None:
        state = _without_head(load_weights_file(weights))
        load_state_dict_strict(net, state, origin=f"--weights {weights}")
    return net


def _under(state: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The entries of ``state`` under ``prefix``, with the prefix removed and the classifier head left out."""
    return _without_head({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})


def state_dict_prefix(state: dict[str, Any], model_keys: list[str], *, origin: str, model: str) -> str:
    """The one prefix under which a state dict's keys are exactly a model's (its head aside): a user's LightningModule
    may hold the ViT under any attribute, maybe several (``self.ema``); several fits ask for ``--prefix``."""
    own = set(model_keys)
    candidates: set[str] = set()
    for key in state:
        for k in own:
            if key.endswith(k) and (len(key) == len(k) or key[-len(k) - 1] == "."):
                candidates.add(key[: -len(k)])
    exact = sorted(p for p in candidates if set(_under(state, p)) == own)
    if len(exact) == 1:
        return exact[0]
    if exact:
        named = ", ".join(repr(p) for p in exact)
        raise CheckpointError(
            f"{origin}: the weights of {model} are there under {len(exact)} prefixes ({named}); say which with "
            f"--prefix (e.g. --prefix {exact[0]!r})"
        )

    def overlap(prefix: str) -> int:
        return len(set(_under(state, prefix)) & own)

    closest = sorted(candidates, key=lambda p: (-overlap(p), p))[:3]
    if not closest:
        first = ", ".join(list(state)[:5])
        raise CheckpointMismatchError(
            f"{origin}: no key of its state dict ends with a key of {model} (first keys: {first}); check the timm name "
            f"and its model.arch.* arguments"
        )
    described = "; ".join(f"{p!r} ({_fit(_under(state, p), own)})" for p in closest)
    raise CheckpointMismatchError(
        f"{origin}: no prefix holds exactly the weights of {model}; closest: {described}; check the timm name and its "
        f"model.arch.* arguments, or give --prefix"
    )


def _fit(keys: dict[str, Any], own: set[str]) -> str:
    missing, unexpected = sorted(own - set(keys)), sorted(set(keys) - own)
    parts = [f"{len(own) - len(missing)} of {len(own)} keys"]
    if missing:
        parts.append(f"missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    if unexpected:
        parts.append(f"unexpected {', '.join(unexpected[:3])}{' ...' if len(unexpected) > 3 else ''}")
    return ", ".join(parts)


def net_from_user_checkpoint(
    path: Path,
    name: str,
    *,
    prefix: str | None,
    img_size: int,
    in_chans: int,
    arch: dict[str, Any],
) -> tuple[torch.nn.Module, str]:
    """Rebuilds a timm ViT held by a user's own LightningModule from its checkpoint, offline, without running it.

    The model is timm's ``name`` with ``arch`` at the data's size; its weights those under ``prefix`` (``None``:
    `state_dict_prefix`), loaded strictly without the head. Returns ``(net, prefix used)``.
    """
    checkpoint = load_checkpoint_file(path)
    state = checkpoint.get("state_dict", checkpoint)
    if not isinstance(state, dict) or not any(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: holds no state dict of tensors (expected a Lightning checkpoint)")
    net = timm_net(name, pretrained=False, weights=None, seed=0, img_size=img_size, in_chans=in_chans, arch=arch)
    model = f"{name}{'' if not arch else ' ' + str(arch)}"
    if prefix is None:
        prefix = state_dict_prefix(state, list(net.state_dict()), origin=str(path), model=model)
    weights = _under(state, prefix)
    if not weights:
        tops = sorted({k.split(".", 1)[0] + "." for k in state if "." in k})
        raise CheckpointError(
            f"{path}: no key of its state dict starts with --prefix {prefix!r}; its keys start with "
            f"{', '.join(repr(t) for t in tops[:8])}"
        )
    load_state_dict_strict(net, weights, origin=f"{path} (weights under {prefix!r}, {model})")
    return net, prefix


class AtomicCheckpointIO(TorchCheckpointIO):
    """Saves local checkpoints through `tgo.records.atomic_write`: Lightning's copy from ``$TMPDIR`` once left a
    truncated ``last.ckpt`` on a full disk. Remote paths keep Lightning's way."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        target = str(path)
        if "://" in target and not target.startswith("file://"):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint: storage_options are not supported for local files")
        # A full device (ENOSPC, or torch.save's bare "unexpected pos") is one line from atomic_write, naming the file,
        # the free space and whether a previous checkpoint survived (tgo.errors.RunEnvironmentError).
        atomic_write(Path(target.removeprefix("file://")), lambda fh: torch.save(checkpoint, fh))


class EpochLabelCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` whose ``filename`` may name ``{tgo_epoch}``: the completed epochs, what the
    records call those weights (Lightning's ``{epoch}`` is 0-based: the end of the 29th epoch saves ``..._028``)."""

    LABEL = "tgo_epoch"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._label_trainer: L.Trainer | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Keeps the trainer: ``format_checkpoint_name`` reads the fit loop's progress from it."""
        super().setup(trainer, pl_module, stage)
        self._label_trainer = trainer

    def format_checkpoint_name(
        self,
        metrics: dict[str, torch.Tensor],
        filename: str | None = None,
        ver: int | None = None,
        prefix: str | None = None,
    ) -> str:
        """Lightning's name, with ``{tgo_epoch}`` = the epochs completed by the weights being saved."""
        if self._label_trainer is not None and self.LABEL not in metrics:
            progress = self._label_trainer.fit_loop.epoch_progress.current  # a _ProcessedTracker at run time
            completed = int(progress.processed)  # type: ignore[attr-defined]
            metrics = {**metrics, self.LABEL: torch.tensor(completed)}
        return super().format_checkpoint_name(metrics, filename, ver, prefix)
