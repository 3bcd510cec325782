"""What a run is, read from its directory: model, data, epochs, accuracies, seed, analysis subset, software.

``tgo.train`` and ``tgo.observe`` say it in ``config.yaml`` and ``train.log``; a user's own training and
``tgo.observe_model`` in ``run_description.json`` (`tgo.run_description`), which fills whatever those do not hold.
Whatever a run does not hold reads as ``None`` and the report says "not recorded"; `check_comparable` refuses to
aggregate runs that differ in model, data or points, naming what differs."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from tgo.panels import class_count
from tgo.records import RunDir
from tgo.report.runs import ReportInputError, RunData
from tgo.run_description import TRAINING_RUN, read_description

__all__ = [
    "NOT_RECORDED",
    "RunInfo",
    "check_comparable",
    "describe_model",
    "package_commit",
    "package_version",
    "read_run_info",
]

NOT_RECORDED = "not recorded"
TRAIN_LOG = "train.log"
_DONE = re.compile(r"\[tgo\] done: (.*?); results in")
_METRIC = re.compile(r"([\w/]+)=([-+0-9.eE]+|nan)")


@dataclass
class RunInfo:
    """The header facts of one run (``None``: the run does not record it). ``model`` describes the network
    (`describe_model`), ``name`` is the recorded model name and ``epochs`` is ``None`` for an offline observation."""

    model: str | None = None
    data: str | None = None
    data_size: int | None = None
    image_size: int | None = None
    epochs: int | None = None
    top1: float | None = None
    top5: float | None = None
    seed: int | None = None
    subset_size: int | None = None
    subset_hash: str | None = None
    kind: str = "training run"
    commit: str | None = None
    source: str | None = None
    arch: dict[str, Any] = field(default_factory=dict)
    name: str | None = None
    classes: int | None = None
    parameters: int | None = None
    validation: dict[str, float] = field(default_factory=dict)
    validation_epoch: int | None = None
    versions: dict[str, str] = field(default_factory=dict)


def _get(cfg: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(cfg, Mapping) or key not in cfg:
            return None
        cfg = cfg[key]
    return cfg


def _load_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):  # ValueError: bytes that are not UTF-8, read as not recorded too
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _final_accuracies(run: RunDir) -> tuple[float | None, float | None]:
    """The accuracies of the training's last line (``[tgo] done: val/acc_top1=..., val/acc_top5=...``)."""
    log = run.root / TRAIN_LOG
    if not log.is_file():
        return None, None
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None, None
    found = _DONE.findall(text)
    if not found:
        return None, None
    values = dict(_METRIC.findall(found[-1]))

    def number(key: str) -> float | None:
        try:
            return float(values[key]) if key in values else None
        except ValueError:
            return None

    return number("val/acc_top1"), number("val/acc_top5")


def _model_name(cfg: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    name = _get(cfg, "model", "name") or _get(cfg, "source", "timm")
    arch = {str(k): v for k, v in (_get(cfg, "model", "arch") or {}).items() if v is not None}
    if name is None:
        models = _get(cfg, "source", "models") or []
        run = _get(cfg, "source", "run")
        if run:
            run_cfg = _load_yaml(RunDir(run).config)
            name = _get(run_cfg, "model", "name")
            arch = arch or {str(k): v for k, v in (_get(run_cfg, "model", "arch") or {}).items() if v is not None}
        elif models:
            name = "checkpoint"
    return name, arch


_ARCH_WORDS: tuple[tuple[str, Any], ...] = (
    ("depth", lambda v: f"{v} block{'s' if v != 1 else ''}"),
    ("embed_dim", lambda v: f"width {v}"),
    ("num_heads", lambda v: f"{v} head{'s' if v != 1 else ''}"),
    ("patch_size", lambda v: f"patch {v}"),
)  # the architecture overrides a model description names, in this order, and how


def describe_model(
    name: str | None, arch: Mapping[str, Any], image_size: int | None = None, origin: str | None = None
) -> str | None:
    """The model as what it is: ``ViT, 12 blocks, width 96, 3 heads, patch 4, 16 px images (timm vit_tiny_patch16_224
    with overrides)``.

    A run that overrides the architecture of a timm name is another network, and the name alone would misname it (the
    quickstart's ``vit_tiny_patch16_224`` is a 12-block, width-96, patch-4 ViT); without overrides the name says it.
    ``origin``: where the words come from when not from a config's overrides (a network described as built)."""
    if name is None:
        return None
    parts = [words(arch[key]) for key, words in _ARCH_WORDS if arch.get(key) is not None]
    if not parts:
        return name
    if image_size:
        parts.append(f"{image_size} px images")
    family = "ViT" if name.startswith(("vit", "deit")) or name == "checkpoint" else "model"
    if origin is None:
        origin = f"timm {name} with overrides" if name != "checkpoint" else "checkpoint"
    elif "VisionTransformer" in origin:
        family = "ViT"
    return f"{family}, {', '.join(parts)} ({origin})"


def read_run_info(run_dir: str | Path) -> RunInfo:
    """The header facts of a run directory (missing files and keys read as ``None``)."""
    run = RunDir(run_dir)
    cfg = _load_yaml(run.config)
    info = RunInfo()
    name, arch = _model_name(cfg)
    info.arch = dict(arch)
    info.name = name
    info.data = _get(cfg, "data", "source")
    info.image_size = _get(cfg, "data", "image_size")
    info.seed = cfg.get("seed") if isinstance(cfg.get("seed"), int) else _get(cfg, "source", "seed")
    observation = "source" in cfg and "trainer" not in cfg
    if observation:
        info.kind = "offline observation"
        models = _get(cfg, "source", "models") or []
        paths = [str(m.get("path") or m.get("name") or "") for m in models if isinstance(m, Mapping)]
        info.source = ", ".join(p for p in paths if p) or _get(cfg, "source", "timm")
        source_run = _get(cfg, "source", "run")
        if source_run:
            run_seed = _load_yaml(RunDir(source_run).config).get("seed")
            info.seed = run_seed if isinstance(run_seed, int) else None
        elif not _get(cfg, "source", "timm"):
            info.seed = None
    else:
        info.epochs = _get(cfg, "trainer", "max_epochs")
    info.top1, info.top5 = _final_accuracies(run)
    commit = cfg.get("git_commit") or _get(cfg, "tgo", "git_commit")
    info.commit = str(commit) if commit else None
    if run.manifest.is_file():
        try:
            manifest = json.loads(run.manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            manifest = {}
        if isinstance(manifest, dict):
            size = manifest.get("size")
            info.subset_size = int(size) if isinstance(size, int) else len(manifest.get("items") or []) or None
            info.subset_hash = manifest.get("fingerprint")
            info.data = info.data or manifest.get("source")
            image_size = _get(manifest, "source_info", "image_size")
            info.image_size = info.image_size or image_size
    origin = _apply_description(info, read_description(run.root), observation=observation)
    image_size = info.image_size if isinstance(info.image_size, int) else None
    info.model = describe_model(info.name, info.arch, image_size, origin) if origin else None
    info.model = info.model or describe_model(name, arch, image_size)
    info.classes = class_count(run.root)
    return info


def _apply_description(info: RunInfo, described: Mapping[str, Any] | None, *, observation: bool) -> str | None:
    """Fills what ``config.yaml`` and ``train.log`` left ``None`` from ``run_description.json``; returns the origin
    words of a model described from the network itself (``None``: the config named it)."""
    if described is None:
        return None
    model, data, schedule = described["model"], described["data"], described["schedule"]
    validation = described["validation"]
    if not observation:
        info.kind = described["kind"]
    info.parameters = model.get("parameters")
    info.image_size = info.image_size or model.get("image_size")
    info.data = info.data or _data_words(data)
    info.subset_size = info.subset_size or data.get("analysis_images")
    if info.kind == TRAINING_RUN and info.epochs is None:
        info.epochs = schedule.get("planned_epochs")
    info.seed = info.seed if info.seed is not None else described.get("seed")
    info.validation = dict(validation.get("metrics") or {})
    info.validation_epoch = validation.get("epoch")
    if info.top1 is None:
        info.top1 = _accuracy(info.validation, 1)
    if info.top5 is None:
        info.top5 = _accuracy(info.validation, 5)
    info.versions = dict(described["versions"])
    label = model.get("name") or str(model.get("class") or "").rsplit(".", 1)[-1] or None
    if info.kind != TRAINING_RUN and not info.source and label:
        epoch = schedule.get("observed_epoch")
        entry = described.get("entry") or "tgo.observe_model"
        info.source = f"{label} ({entry}" + (f", weights of epoch {epoch})" if epoch is not None else ")")
    if info.name is not None or label is None:
        return None
    info.name = label
    info.arch = {
        key: model.get(field)
        for key, field in (("depth", "depth"), ("embed_dim", "width"), ("num_heads", "heads"), ("patch_size", "patch"))
        if model.get(field) is not None
    }
    cls = str(model.get("class") or "").rsplit(".", 1)[-1]
    return ", ".join(dict.fromkeys(w for w in (cls, f"timm {model['name']}" if model.get("name") else "") if w))


def _data_words(data: Mapping[str, Any]) -> str | None:
    """The data source as far as the description knows it: the training set (and its sizes), else the analysis set's."""
    if data.get("training_source"):
        sizes = [
            f"{data[key]} {what} images"
            for key, what in (("training_images", "training"), ("validation_images", "validation"))
            if data.get(key) is not None
        ]
        return data["training_source"] + (f" ({', '.join(sizes)})" if sizes else "")
    if data.get("analysis_source"):
        return f"{data['analysis_source']} (the analysis set; the training data is not known)"
    return None


_TOP_K = re.compile(r"top[-_]?(\d+)")


def _accuracy(metrics: Mapping[str, float], k: int) -> float | None:
    """The top-``k`` accuracy among a module's logged validation metrics, as far as their names say (``val/acc_top1``,
    ``val_acc``, ``val_accuracy_top5``...): a fraction in [0, 1]; an explicit ``topk`` and an epoch mean first."""
    candidates = []
    for key, value in metrics.items():
        low = key.lower()
        if "acc" not in low or not 0.0 <= value <= 1.0:
            continue
        top = _TOP_K.search(low)
        if (int(top.group(1)) if top else 1) != k:
            continue
        candidates.append((top is None, low.endswith("_step"), len(key), key, value))
    return float(min(candidates)[-1]) if candidates else None


def package_version() -> str:
    """The installed ``tgo`` distribution's version ("not recorded" when it is not installed)."""
    for dist in ("tgo", "TGO"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return NOT_RECORDED


def package_commit(where: Path | None = None) -> str | None:
    """``git rev-parse HEAD`` of the repository holding ``tgo``, with ``+dirty``; ``None`` outside a git checkout.

    By default read only where git tracks this very file: an installed package is often inside somebody else's
    repository, whose commit says nothing about TGO's code. ``--no-optional-locks``: ``git status`` would otherwise
    rewrite ``.git/index`` in a checkout the report does not own."""
    here = where if where is not None else Path(__file__).resolve().parent
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}

    def git(*args: str) -> str:
        command = ["git", "--no-optional-locks", *args]
        return subprocess.run(command, cwd=here, capture_output=True, text=True, timeout=10, check=True, env=env).stdout

    try:
        if where is None:
            git("ls-files", "--error-unmatch", "--", Path(__file__).name)  # fails unless the checkout tracks tgo
        head = git("rev-parse", "HEAD").strip()
        dirty = git("status", "--porcelain", "--untracked-files=no").strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) if head else None


def check_comparable(runs: Sequence[RunData], infos: Sequence[RunInfo]) -> None:
    """Refuses to aggregate runs that differ in model, data, image size or points, naming each field and which runs hold
    which value; a field a run does not record is not compared."""
    if len(runs) < 2:
        return
    fields = [
        {
            "model": i.model or NOT_RECORDED,
            "data": str(i.data or NOT_RECORDED),
            "image size": str(i.image_size or NOT_RECORDED),
            "points": ", ".join(r.points),
        }
        for i, r in zip(infos, runs, strict=True)
    ]
    differences = []
    for key in fields[0]:
        groups: dict[str, list[str]] = {}
        for run, f in zip(runs, fields, strict=True):
            if f[key] != NOT_RECORDED:  # a run that does not say is not counted as different
                groups.setdefault(f[key], []).append(run.name)
        if len(groups) > 1:
            described = "; ".join(f"{value!r}: {', '.join(names)}" for value, names in groups.items())
            differences.append(f"{key} differs ({described})")
    if differences:
        raise ReportInputError(
            "the runs are not replicates of one experiment, so they are not averaged: "
            + "; ".join(differences)
            + ". Report them separately (one python -m tgo.report per group)"
        )
