"""Finding run directories and reading their records into per-metric, per-point series (numpy only, no pandas).

A report argument may be a run directory (it holds ``geometry/metrics.csv``) or any directory above runs, such as a
Hydra multirun sweep directory: runs are then found recursively. Every problem with the arguments is a
`ReportInputError` (a `UserInputError`), so the CLI prints one line instead of a traceback.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tgo.errors import UserInputError
from tgo.records import GEOMETRY_DIR, RecordsError, RecordWriter, is_run_dir, load_spectra, metrics_path

__all__ = ["MANIFEST_NAME", "ReportInputError", "RunData", "discover_runs", "load_run_data", "read_fingerprint"]

MANIFEST_NAME = "analysis_subset.json"
# Directories never searched for runs: a previous report's output, Hydra's bookkeeping, TensorBoard event files.
_SKIP_DIRS = {"report", ".hydra", "tensorboard", "checkpoints", GEOMETRY_DIR}


class ReportInputError(UserInputError):
    """A report argument is not a run (or a directory of runs), or runs cannot be compared."""


@dataclass
class RunData:
    """One run's scalar records as series, plus where to find its spectra.

    Attributes:
        path: The run directory.
        name: A short label (the path relative to the common parent of all runs in the report).
        series: metric -> point -> (epochs int64 [E], values float64 [E]), epochs ascending.
        points: Point names in recorded (depth) order.
        epochs: Every epoch with metrics, ascending.
        fingerprint: The analysis subset's fingerprint from ``analysis_subset.json``, ``None`` if the run has none.
    """

    path: Path
    name: str
    series: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]
    points: list[str]
    epochs: list[int]
    fingerprint: str | None = None
    _spectra: dict[int, dict[str, dict[str, np.ndarray]]] | None = field(default=None, repr=False)

    @property
    def metrics(self) -> list[str]:
        """Recorded observables, in recorded order."""
        return list(self.series)

    def spectra(self) -> dict[int, dict[str, dict[str, np.ndarray]]]:
        """The run's spectra (`tgo.records.load_spectra`), read once on first use."""
        if self._spectra is None:
            self._spectra = load_spectra(self.path)
        return self._spectra


def _looks_like_run(path: Path) -> bool:
    return (path / "config.yaml").is_file() or (path / "checkpoints").is_dir() or (path / MANIFEST_NAME).is_file()


def _find_below(root: Path) -> list[Path]:
    found: list[Path] = []
    for current, dirs, _files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        here = Path(current)
        if is_run_dir(here):
            found.append(here)
            dirs[:] = []  # a run does not contain runs
    return found


def discover_runs(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Resolves report arguments to run directories, in argument order, then path order below each argument.

    Args:
        paths: Run directories or directories containing runs (searched recursively, skipping ``report/``,
            ``.hydra/``, ``tensorboard/`` and ``checkpoints/``).

    Returns:
        Distinct run directories holding geometry records.

    Raises:
        ReportInputError: a path does not exist, is not a directory, or holds no run with records.
    """
    runs: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise ReportInputError(f"{path}: no such directory")
        if not path.is_dir():
            raise ReportInputError(f"{path}: not a directory (expected a run directory or a directory of runs)")
        if is_run_dir(path):
            found = [path]
        else:
            found = _find_below(path)
            if not found and _looks_like_run(path):
                raise ReportInputError(
                    f"{path}: a run directory without geometry records ({GEOMETRY_DIR}/metrics.csv is missing): was "
                    f"the spectral_geometry callback disabled, or did the run stop before its first observation?")
            if not found:
                raise ReportInputError(f"{path}: not a run directory and no run below it (looked for "
                                       f"{GEOMETRY_DIR}/metrics.csv)")
        for run in found:
            if run.resolve() not in {r.resolve() for r in runs}:
                runs.append(run)
    return runs


def read_fingerprint(run_dir: str | os.PathLike) -> str | None:
    """The analysis subset fingerprint recorded in ``<run>/analysis_subset.json`` (``None`` if absent).

    Raises:
        ReportInputError: the manifest exists but is not readable JSON with a ``fingerprint``.
    """
    path = Path(run_dir) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        return str(json.loads(path.read_text())["fingerprint"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ReportInputError(f"{path}: unreadable analysis subset manifest ({err})") from err


def _common_parent(paths: Sequence[Path]) -> Path:
    resolved = [p.resolve() for p in paths]
    return Path(os.path.commonpath([str(p) for p in resolved])) if resolved else Path(".")


def run_names(paths: Sequence[Path]) -> list[str]:
    """Short distinct labels: paths relative to their common parent (the directory name for a single run)."""
    if len(paths) == 1:
        return [paths[0].resolve().name]
    parent = _common_parent(paths)
    return [str(p.resolve().relative_to(parent)) or p.resolve().name for p in paths]


def load_run_data(path: str | os.PathLike, name: str | None = None) -> RunData:
    """Reads a run's ``metrics.csv`` into series (without pandas) and its manifest fingerprint.

    Args:
        path: A run directory.
        name: Label for figures and tables (default: the directory name).

    Returns:
        The `RunData` (spectra are read lazily).

    Raises:
        ReportInputError: no metrics file, no rows, or malformed values.
    """
    path = Path(path)
    if not metrics_path(path).is_file():
        raise ReportInputError(f"{path}: spectra exist but {GEOMETRY_DIR}/metrics.csv is missing")
    try:
        rows = RecordWriter(path).metric_rows()
    except RecordsError as err:
        raise ReportInputError(str(err)) from err
    if not rows:
        raise ReportInputError(f"{metrics_path(path)}: no observations recorded yet")
    collected: dict[str, dict[str, dict[int, float]]] = {}
    points: dict[str, None] = {}
    try:
        for row in rows:
            collected.setdefault(row["metric"], {}).setdefault(row["point"], {})[int(row["epoch"])] = \
                float(row["value"])
            points[row["point"]] = None
    except (TypeError, ValueError) as err:
        raise ReportInputError(f"{metrics_path(path)}: malformed row ({err})") from err
    series = {
        metric: {point: (np.array(sorted(values), dtype=np.int64),
                         np.array([values[e] for e in sorted(values)], dtype=np.float64))
                 for point, values in per_point.items()}
        for metric, per_point in collected.items()
    }
    epochs = sorted({int(row["epoch"]) for row in rows})
    return RunData(path=path, name=name or path.resolve().name, series=series, points=list(points), epochs=epochs,
                   fingerprint=read_fingerprint(path))
