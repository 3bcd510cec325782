"""The published TGO-I measurements, mapped onto TGO's point names, for overlay and comparison.

``tgo/resources/tgo1_paper_epoch_summaries.jsonl`` has one JSON line per epoch (1..100, no epoch 0): ``{"epoch": E,
"layers": {"Layer_00_PatchEmbed": {<observable>: value, ...}, ...}}``; its layers map to ``patch_embed``, ``pos_embed``,
``block_NN`` and ``cls`` (`paper_point_name`), and its six observables already carry TGO's names and conventions, so no
conversion is applied. A run whose experiment differs from `TGO1_EXPERIMENT` is overlaid with a caveat naming each
difference (`reference_caveat`), since its values cannot be expected to match."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from tgo.report.runinfo import NOT_RECORDED, RunInfo
from tgo.report.runs import ReportInputError

__all__ = [
    "PAPER_POINTS",
    "REFERENCE_OBSERVABLES",
    "TGO1_EXPERIMENT",
    "Difference",
    "Experiment",
    "ReferenceRow",
    "compare_with_reference",
    "is_tgo1_like",
    "load_reference",
    "paper_point_name",
    "reference_caveat",
    "reference_differences",
    "reference_path",
]

REFERENCE_RESOURCE = "tgo1_paper_epoch_summaries.jsonl"
REFERENCE_OBSERVABLES: tuple[str, ...] = (
    "effective_rank",
    "stable_rank",
    "participation_ratio",
    "spectral_entropy",
    "spectral_anisotropy",
    "spectral_flatness",
)
"""The observables the published file holds, in table order: a fact about that file, not a second catalogue (each a
catalogue name with the same convention, tested)."""
# The 15 points of a TGO-I run (ViT-S/16), in depth order.
PAPER_POINTS: tuple[str, ...] = ("patch_embed", "pos_embed", *(f"block_{i:02d}" for i in range(1, 13)), "cls")


@dataclass(frozen=True)
class Experiment:
    """The facts that must match before values (not just shapes) of two experiments can be compared."""

    model: str
    arch: Mapping[str, int]
    label: str
    image_size: int
    data: str
    epochs: int


# The published TGO-I experiment (conf/experiment/tgo1.yaml): the shipped file's epochs run 1..100 (tested).
TGO1_EXPERIMENT = Experiment(
    model="vit_small_patch16_224",
    arch={"patch_size": 16, "embed_dim": 384, "depth": 12, "num_heads": 6},
    label="ViT-S/16",
    image_size=224,
    data="imagenet100",
    epochs=100,
)

DATA_LABELS = {
    "imagenet100": "ImageNet-100",
    "digits": "scikit-learn digits",
    "synthetic": "synthetic data",
    "imagefolder": "an image folder",
}  # how a caveat names each data source (any other reads "<source> data")


@dataclass(frozen=True)
class Difference:
    """One respect in which runs differ from the reference (``ours`` says ``not recorded`` where a run does not)."""

    field: str
    ours: str
    reference: str


def _model_matches(info: RunInfo, reference: Experiment) -> bool:
    """The same timm model (by its recorded name, not the header's description) with no differing override."""
    name = info.name or info.model
    if name is None or not name.startswith(reference.model):
        return False
    return all(info.arch.get(key, value) == value for key, value in reference.arch.items())


def _data_label(source: str) -> str:
    return DATA_LABELS.get(source, f"{source} data")


def reference_differences(
    infos: Sequence[RunInfo],
    last_epochs: Sequence[int | None] | None = None,
    reference: Experiment = TGO1_EXPERIMENT,
) -> list[Difference]:
    """Where runs differ from the reference in model, image size, data and epochs (in that order); a fact a run does not
    record counts as different. ``last_epochs``: the epoch count of an offline observation."""
    lasts = list(last_epochs) if last_epochs is not None else [None] * len(infos)

    def joined(values: Sequence[str]) -> str:
        return " / ".join(dict.fromkeys(values))

    found = []
    if not all(_model_matches(i, reference) for i in infos):
        found.append(Difference("model", joined([i.model or f"model {NOT_RECORDED}" for i in infos]), reference.label))
    if any(i.image_size != reference.image_size for i in infos):
        sizes = [f"{i.image_size} px" if i.image_size else f"image size {NOT_RECORDED}" for i in infos]
        found.append(Difference("image size", joined(sizes), f"{reference.image_size} px"))
    if any(i.data != reference.data for i in infos):
        data = [_data_label(str(i.data)) if i.data else f"data {NOT_RECORDED}" for i in infos]
        found.append(Difference("data", joined(data), _data_label(reference.data)))
    # a training run's planned epochs; an offline observation's, the epochs its checkpoint had completed
    epochs = [i.epochs if i.kind == "training run" else last for i, last in zip(infos, lasts, strict=True)]
    if any(e != reference.epochs for e in epochs):
        text = [f"{e} epoch{'s' if e != 1 else ''}" if e is not None else f"epochs {NOT_RECORDED}" for e in epochs]
        found.append(Difference("epochs", joined(text), f"{reference.epochs} epochs"))
    return found


def reference_caveat(
    infos: Sequence[RunInfo],
    last_epochs: Sequence[int | None] | None = None,
    reference: Experiment = TGO1_EXPERIMENT,
) -> str | None:
    """The caveat beside an overlay of the published values naming each difference, or ``None`` when none: ``Caveat:
    this run differs from the TGO-I experiment in model and epochs. This run: ...; the reference: ViT-S/16, 100 epochs.
    Compare shapes, not values.``"""
    differences = reference_differences(infos, last_epochs, reference)
    if not differences:
        return None
    several = len(infos) > 1
    fields = [d.field for d in differences]
    listed = fields[0] if len(fields) == 1 else ", ".join(fields[:-1]) + " and " + fields[-1]
    return (
        f"Caveat: {'these runs differ' if several else 'this run differs'} from the TGO-I experiment in {listed}. "
        f"{'These runs' if several else 'This run'}: "
        f"{', '.join(d.ours for d in differences)}; the reference: {', '.join(d.reference for d in differences)}. "
        "Compare shapes, not values."
    )


_BLOCK = re.compile(r"^Layer_\d+_Block(\d+)$")


def reference_path() -> Path:
    """Where the packaged copy of the published measurements lives."""
    return Path(str(resources.files("tgo").joinpath("resources").joinpath(REFERENCE_RESOURCE)))


def paper_point_name(layer: str) -> str:
    """Maps a paper layer key to a TGO point name; an unknown form raises ValueError."""
    if layer == "Layer_00_PatchEmbed":
        return "patch_embed"
    if layer == "Layer_00_PosEmbed":
        return "pos_embed"
    if re.match(r"^Layer_\d+_CLS_Final$", layer):
        return "cls"
    match = _BLOCK.match(layer)
    if match:
        return f"block_{int(match.group(1)):02d}"
    raise ValueError(f"unknown TGO-I layer key {layer!r}")


def load_reference(path: str | os.PathLike | None = None) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The published measurements (or a jsonl file of the same schema) as metric -> point -> (epochs, values), in
    `PAPER_POINTS` order; an unreadable file raises `ReportInputError`."""
    path = Path(path) if path is not None else reference_path()
    collected: dict[str, dict[str, dict[int, float]]] = {}
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    continue
                record = json.loads(line)
                epoch = int(record["epoch"])
                for layer, observables in record["layers"].items():
                    point = paper_point_name(layer)
                    for metric, value in observables.items():
                        collected.setdefault(metric, {}).setdefault(point, {})[epoch] = float(value)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ReportInputError(f"{path}: not a TGO-I epoch summary file ({err})") from err
    order = {p: i for i, p in enumerate(PAPER_POINTS)}
    return {
        metric: {
            point: (np.array(sorted(v), dtype=np.int64), np.array([v[e] for e in sorted(v)], dtype=np.float64))
            for point, v in sorted(per_point.items(), key=lambda kv: order.get(kv[0], len(order)))
        }
        for metric, per_point in collected.items()
    }


def is_tgo1_like(points: Sequence[str]) -> bool:
    """Whether a run's points are exactly the paper's 15 (then the overlay is drawn by default)."""
    return set(points) == set(PAPER_POINTS)


@dataclass(frozen=True)
class ReferenceRow:
    """One point and observable: the run's last value beside the paper's (at the same epoch, else the paper's last)."""

    point: str
    metric: str
    epoch: int
    value: float
    paper_epoch: int
    paper_value: float
    ratio: float


def compare_with_reference(
    series: Mapping[str, Mapping[str, tuple[ArrayLike, ArrayLike]]],
    reference: Mapping[str, Mapping[str, tuple[np.ndarray, np.ndarray]]],
    points: Sequence[str],
) -> list[ReferenceRow]:
    """The run's last-epoch values against the paper's, in observable then point order (points it lacks skipped)."""
    rows = []
    for metric in REFERENCE_OBSERVABLES:
        ours, paper = series.get(metric, {}), reference.get(metric, {})
        for point in points:
            if point not in ours or point not in paper:
                continue
            epochs, values = (np.asarray(a) for a in ours[point])
            if epochs.size == 0:
                continue
            epoch, value = int(epochs[-1]), float(values[-1])
            paper_epochs, paper_values = paper[point]
            hit = np.flatnonzero(paper_epochs == epoch)
            index = int(hit[0]) if hit.size else paper_epochs.size - 1
            paper_value = float(paper_values[index])
            ratio = value / paper_value if paper_value != 0 else math.nan
            rows.append(ReferenceRow(point, metric, epoch, value, int(paper_epochs[index]), paper_value, ratio))
    return rows
