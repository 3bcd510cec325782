"""The published TGO-I measurements, mapped onto TGO's point names, for overlay and comparison.

The shipped file ``tgo/resources/tgo1_paper_epoch_summaries.jsonl`` has one JSON line per epoch (1..100):
``{"epoch": E, "layers": {"Layer_00_PatchEmbed": {<observable>: value, ...}, ...}}`` for 15 layers and six
observables. Names map as follows:

=========================  ==============
paper layer                TGO point
=========================  ==============
``Layer_00_PatchEmbed``    ``patch_embed``
``Layer_00_PosEmbed``      ``pos_embed``
``Layer_NN_BlockNN``       ``block_NN``
``Layer_13_CLS_Final``     ``cls``
=========================  ==============

The six observables already carry TGO's names and conventions (``effective_rank``, ``stable_rank``,
``participation_ratio``, ``spectral_entropy`` in nats, not normalised, ``spectral_flatness`` with the 1e-12 floor,
``spectral_anisotropy`` = lambda_1 / trace), so no conversion is applied. The paper has no epoch 0.
"""

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

from tgo.report.runs import ReportInputError

__all__ = [
    "PAPER_POINTS",
    "REFERENCE_OBSERVABLES",
    "ReferenceRow",
    "compare_with_reference",
    "is_tgo1_like",
    "load_reference",
    "paper_point_name",
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
"""The observables the published file holds, in comparison-table order: a fact about that file, not a second
catalogue. Each is a `tgo.spectral.catalogue.CATALOGUE` name with the same convention (tested), which is what lets
the paper's series overlay ours and be judged by the same claims."""
PAPER_POINTS: tuple[str, ...] = ("patch_embed", "pos_embed", *(f"block_{i:02d}" for i in range(1, 13)), "cls")
"""The 15 points of a TGO-I run (ViT-S/16), in depth order."""

_BLOCK = re.compile(r"^Layer_\d+_Block(\d+)$")


def reference_path() -> Path:
    """Where the packaged copy of the published measurements lives."""
    return Path(str(resources.files("tgo").joinpath("resources").joinpath(REFERENCE_RESOURCE)))


def paper_point_name(layer: str) -> str:
    """Maps a paper layer key to a TGO point name (see the module docstring).

    Raises:
        ValueError: a key of none of the four forms.
    """
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
    """The published measurements as series: metric -> point -> (epochs, values), epochs ascending.

    Args:
        path: A jsonl file of the same schema (default: the packaged copy).

    Returns:
        Series in `PAPER_POINTS` order for every observable the file holds.

    Raises:
        ReportInputError: unreadable file or schema.
    """
    path = Path(path) if path is not None else reference_path()
    collected: dict[str, dict[str, dict[int, float]]] = {}
    try:
        with open(path) as fh:
            for _line_no, line in enumerate(fh, 1):
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
    """One point and observable: the run's last value beside the paper's.

    Attributes:
        point: TGO point name.
        metric: Observable.
        epoch: The run's last epoch.
        value: The run's value there.
        paper_epoch: The paper epoch compared with (the same epoch if the paper has it, else its last).
        paper_value: The paper's value there.
        ratio: ``value / paper_value`` (NaN if the paper's value is 0).
    """

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
    """The run's last-epoch values against the paper's, per point and shared observable.

    Args:
        series: The run's (or the runs' mean) metric -> point -> (epochs, values).
        reference: `load_reference` output.
        points: Points in depth order; points the paper lacks are skipped.

    Returns:
        Rows in observable order, then point order.
    """
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
