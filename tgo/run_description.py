"""``run_description.json``: what a run is, written by the entry points that have no ``config.yaml`` to say it.

A user's own Lightning training (`SpectralGeometryCallback`) and ``tgo.observe_model`` hold the network, the trainer's
schedule and the logged validation metrics but no Hydra config, so without this file their report's header reads "not
recorded". One writer, one file beside the records, rewritten atomically whenever a fact changes (fit start, each
validation, fit end); `read_description` checks it field by field, since a run directory is untrusted input.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from tgo.errors import UserInputError
from tgo.records import atomic_write

__all__ = [
    "DESCRIPTION_FILE",
    "OFFLINE_OBSERVATION",
    "TRAINING_RUN",
    "RunDescriptionError",
    "describe_dataset",
    "describe_network",
    "description_path",
    "description_problem",
    "observation_description",
    "read_description",
    "record_training",
    "training_description",
    "validation_metrics",
    "write_description",
]

DESCRIPTION_FILE = "run_description.json"
TRAINING_RUN = "training run"
OFFLINE_OBSERVATION = "offline observation"
_MARK = "run description"  # the value of "tgo" in every file TGO writes here: a file without it is not TGO's
_VERSION = 1
_MAX_BYTES = 1 << 20  # far above any description TGO writes; a larger file is not one
_VERSIONED = ("torch", "lightning", "timm", "tgo")

_INT, _NUMBER, _TEXT = "an integer", "a number", "a string"
_FIELDS: dict[tuple[str, str], str] = {
    ("model", "name"): _TEXT,
    ("model", "class"): _TEXT,
    ("model", "depth"): _INT,
    ("model", "width"): _INT,
    ("model", "heads"): _INT,
    ("model", "patch"): _INT,
    ("model", "image_size"): _INT,
    ("model", "parameters"): _INT,
    ("data", "training_source"): _TEXT,
    ("data", "training_images"): _INT,
    ("data", "validation_images"): _INT,
    ("data", "analysis_source"): _TEXT,
    ("data", "analysis_images"): _INT,
    ("schedule", "planned_epochs"): _INT,
    ("schedule", "planned_steps"): _INT,
    ("schedule", "completed_epochs"): _INT,
    ("schedule", "global_step"): _INT,
    ("schedule", "observed_epoch"): _INT,
    ("validation", "epoch"): _INT,
    ("validation", "step"): _INT,
}
"""Every leaf `read_description` checks: (section, key) -> the type it must have when present (``null``: not known)."""
_SECTIONS = ("model", "data", "schedule", "validation", "versions")


class RunDescriptionError(UserInputError):
    """A ``run_description.json`` TGO did not write, or one whose fields are not what TGO writes (one line)."""


def description_path(root: str | os.PathLike[str]) -> Path:
    """``<run>/run_description.json``: beside ``analysis_subset.json``, outside ``geometry/`` (the records proper)."""
    return Path(root) / DESCRIPTION_FILE


# ----------------------------------------------------------------------------------------------------- describing
def _int(value: Any) -> int | None:
    if isinstance(value, (tuple, list)) and value and all(v == value[0] for v in value):
        value = value[0]  # timm's (16, 16): square
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def describe_network(network: Any) -> dict[str, Any]:
    """The network as it is: timm's name (``pretrained_cfg``), class, depth, width, heads, patch, image size and
    parameters.

    Read from the module itself, so a ViT built with overrides is described as built, not by its name."""
    cfg = getattr(network, "pretrained_cfg", None) or getattr(network, "default_cfg", None) or {}
    blocks = getattr(network, "blocks", None)
    first = blocks[0] if blocks is not None and len(blocks) else None
    patch_embed = getattr(network, "patch_embed", None)
    return {
        "name": str(cfg.get("architecture")) if isinstance(cfg, Mapping) and cfg.get("architecture") else None,
        "class": f"{type(network).__module__}.{type(network).__qualname__}",
        "depth": len(blocks) if blocks is not None else None,
        "width": _int(getattr(network, "embed_dim", None)),
        "heads": _int(getattr(getattr(first, "attn", None), "num_heads", None)),
        "patch": _int(getattr(patch_embed, "patch_size", None)),
        "image_size": _int(getattr(patch_embed, "img_size", None)),
        # a DeepSpeed ZeRO-3 parameter is empty between forwards; ds_numel is its size (as Lightning's summary reads it)
        "parameters": sum(int(getattr(p, "ds_numel", p.numel())) for p in network.parameters()),
    }


def describe_dataset(dataset: Any) -> str | None:
    """A dataset's source as far as it says: its class (inside TGO's and torch's wrappers), and its ``root`` if any."""
    for _ in range(8):  # LabelledDataset -> Subset -> the dataset
        inner = getattr(dataset, "dataset", None)
        if inner is None or inner is dataset:
            break
        dataset = inner
    if dataset is None:
        return None
    root = getattr(dataset, "root", None)
    name = type(dataset).__name__
    return f"{name} at {root}" if isinstance(root, (str, os.PathLike)) and str(root) else name


def _length(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:  # an iterable dataset
        return None


def _image_size(analysis: Any) -> int | None:
    """The side of the analysis set's first (square) image, for a network that does not say its own; read with the
    random generators forked, so that describing a run never changes what training draws."""
    import torch

    try:
        with torch.random.fork_rng(devices=[]):
            shape = tuple(analysis[0][0].shape)
    except Exception:  # an item that is not (tensor, label): unknown
        return None
    return int(shape[-1]) if len(shape) >= 2 and shape[-1] == shape[-2] else None


def _data(analysis: Any) -> dict[str, Any]:
    return {"analysis_source": describe_dataset(analysis), "analysis_images": _length(analysis) if analysis else None}


_VALIDATION = re.compile(r"(^|[^a-z])e?val(id|idation)?([^a-z]|$)", re.IGNORECASE)


def validation_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The scalar validation metrics among ``metrics`` (``val/...``, ``val_...``, ``validation_...``, ``eval_...``), as
    floats; training metrics (``train_loss``, ``interval``...) are left out."""
    found = {}
    for key, value in metrics.items():
        if not _VALIDATION.search(str(key)):
            continue
        try:
            number = float(value.item() if hasattr(value, "item") else value)
        except (TypeError, ValueError, RuntimeError):  # not a scalar
            continue
        found[str(key)] = number
    return dict(sorted(found.items()))


def _versions() -> dict[str, str]:
    found = {}
    for dist in _VERSIONED:
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return found


def _seed() -> int | None:
    """Lightning's ``seed_everything`` seed (it sets ``PL_GLOBAL_SEED``); ``None`` when the run was not seeded so."""
    try:
        return int(os.environ["PL_GLOBAL_SEED"])
    except (KeyError, ValueError):
        return None


def _common(kind: str, entry: str, network: Any, analysis: Any) -> dict[str, Any]:
    model = describe_network(network)
    model["image_size"] = model["image_size"] or _image_size(analysis)
    return {
        "tgo": _MARK,
        "version": _VERSION,
        "kind": kind,
        "entry": entry,
        "updated": datetime.now().astimezone().isoformat(timespec="seconds"),
        "model": model,
        "data": _data(analysis),
        "seed": _seed(),
        "versions": _versions(),
    }


def training_description(trainer: Any, network: Any, analysis: Any) -> dict[str, Any]:
    """A Lightning training's description: the trainer's schedule and data, the last validation metrics it holds."""
    description = _common(TRAINING_RUN, "tgo.callbacks.SpectralGeometryCallback", network, analysis)
    train_loader = getattr(trainer, "train_dataloader", None)
    val_loaders = getattr(trainer, "val_dataloaders", None)
    if isinstance(val_loaders, (list, tuple)):
        val_loaders = val_loaders[0] if val_loaders else None
    train_set = getattr(train_loader, "dataset", None)
    val_set = getattr(val_loaders, "dataset", None)
    description["data"].update(
        training_source=describe_dataset(train_set),
        training_images=_length(train_set) if train_set is not None else None,
        validation_images=_length(val_set) if val_set is not None else None,
    )
    max_epochs, max_steps = getattr(trainer, "max_epochs", None), getattr(trainer, "max_steps", None)
    description["schedule"] = {
        "planned_epochs": max_epochs if isinstance(max_epochs, int) and max_epochs >= 0 else None,
        "planned_steps": max_steps if isinstance(max_steps, int) and max_steps >= 0 else None,
        "completed_epochs": int(trainer.current_epoch),
        "global_step": int(trainer.global_step),
    }
    metrics = validation_metrics(getattr(trainer, "callback_metrics", {}) or {})
    description["validation"] = {"metrics": metrics} if metrics else {}
    return description


def observation_description(
    network: Any, analysis: Any, *, epoch: int, step: int, entry: str = "tgo.observe_model"
) -> dict[str, Any]:
    """An offline observation's description (``tgo.observe_model``, ``tgo.observe``): the weights at ``epoch``, no
    schedule (the loop that trained them is not TGO's to see)."""
    description = _common(OFFLINE_OBSERVATION, entry, network, analysis)
    description["schedule"] = {"observed_epoch": int(epoch), "global_step": int(step)}
    return description


# ----------------------------------------------------------------------------------------------------- writing
def write_description(root: str | os.PathLike[str], description: Mapping[str, Any]) -> Path:
    """Writes (atomically) the description, refusing to replace a file there that TGO did not write."""
    path = description_path(root)
    problem = description_problem(root)
    if problem:
        raise RunDescriptionError(problem)
    return atomic_write(path, json.dumps(dict(description), indent=1, allow_nan=True) + "\n")


def record_training(
    root: str | os.PathLike[str], trainer: Any, network: Any, analysis: Any, *, validated: bool = False
) -> None:
    """The callback's refresh: rank 0 rewrites the description of the fit (never during the sanity check).

    ``validated``: called at a validation's end, whose metrics are dated ``current_epoch + 1`` (the epochs trained
    before it); otherwise the previous file's validation, still the latest, keeps its date."""
    if not trainer.is_global_zero or getattr(trainer, "sanity_checking", False):
        return
    description = training_description(trainer, network, analysis)
    fresh = description["validation"]
    if validated:
        fresh.update(epoch=int(trainer.current_epoch) + 1, step=int(trainer.global_step))
    else:
        try:
            previous = (read_description(root) or {}).get("validation") or {}
        except RunDescriptionError:
            previous = {}  # write_description refuses it below, in one line
        if previous.get("metrics") and fresh.get("metrics") in (None, previous["metrics"]):
            description["validation"] = previous
    write_description(root, description)


# ----------------------------------------------------------------------------------------------------- reading
def description_problem(root: str | os.PathLike[str]) -> str | None:
    """Why TGO may not (re)write ``run_description.json`` in ``root`` (a link, not a file, not TGO's), or ``None``."""
    path = description_path(root)
    if path.is_symlink():
        return f"{path}: is a symbolic link (to {os.readlink(path)}); TGO never writes through a link: remove it"
    if not path.exists():
        return None
    try:
        read_description(root)
    except RunDescriptionError as err:
        return f"{err}; TGO never overwrites a file it did not create: move it away, or choose another directory"
    return None


def _refuse(path: Path, what: str) -> RunDescriptionError:
    return RunDescriptionError(f'{path}: {what}; expected the JSON object TGO writes there ({{"tgo": "{_MARK}"}})')


def read_description(root: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The checked description of the run at ``root`` (``None``: it has none); anything malformed is refused in one
    line naming the file and the field. Unknown keys are ignored (a newer TGO may write more)."""
    path = description_path(root)
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_symlink() or not path.is_file():
        raise _refuse(path, "is not a regular file")
    try:
        with path.open("rb") as fh:
            raw = fh.read(_MAX_BYTES + 1)
    except OSError as err:
        raise _refuse(path, f"unreadable ({err.strerror or err})") from err
    if len(raw) > _MAX_BYTES:
        raise _refuse(path, f"is larger than {_MAX_BYTES} bytes")
    try:
        loaded = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise _refuse(path, f"is not JSON ({str(err).splitlines()[0]})") from err
    if not isinstance(loaded, dict) or loaded.get("tgo") != _MARK:
        raise _refuse(path, "is not a run description")
    if loaded.get("kind") not in (TRAINING_RUN, OFFLINE_OBSERVATION):
        raise _refuse(path, f"kind is {loaded.get('kind')!r}, not {TRAINING_RUN!r} or {OFFLINE_OBSERVATION!r}")
    for section in _SECTIONS:
        if not isinstance(loaded.setdefault(section, {}), dict):
            raise _refuse(path, f"{section} is {type(loaded[section]).__name__}, not an object")
    for (section, key), expected in _FIELDS.items():
        value = loaded[section].get(key)
        if value is not None and not _is(value, expected):
            raise _refuse(path, f"{section}.{key} is {value!r}, not {expected}")
    if loaded.get("seed") is not None and not _is(loaded["seed"], _INT):
        raise _refuse(path, f"seed is {loaded['seed']!r}, not {_INT}")
    if loaded.get("entry") is not None and not _is(loaded["entry"], _TEXT):
        raise _refuse(path, f"entry is {loaded['entry']!r}, not {_TEXT}")
    metrics = loaded["validation"].setdefault("metrics", {})
    if not isinstance(metrics, dict) or not all(_is(v, _NUMBER) for v in metrics.values()):
        raise _refuse(path, "validation.metrics is not an object of numbers")
    if not all(isinstance(v, str) for v in loaded["versions"].values()):
        raise _refuse(path, "versions is not an object of strings")
    return loaded


def _is(value: Any, expected: str) -> bool:
    if isinstance(value, bool):
        return False
    if expected == _INT:
        return isinstance(value, int)
    if expected == _NUMBER:
        return isinstance(value, (int, float))  # NaN and infinities included: a module may log them
    return isinstance(value, str)
