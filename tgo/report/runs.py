"""Finding run directories and reading their records into per-metric, per-point series (numpy only, no pandas).

A report argument may be a run directory (it holds geometry records) or any directory above runs, such as a Hydra
multirun sweep directory: runs are then found recursively. Every path and file name comes from `tgo.records.RunDir`
and every record is read through `tgo.records`, so the report follows the on-disk contract instead of restating it.
Every problem with the arguments is a `ReportInputError` (a `UserInputError`), so the CLI prints one line instead
of a traceback; a `tgo.records.RecordsError` is re-raised as one with the same message.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tgo.errors import UserInputError
from tgo.records import (
    DEFAULT_VIEW,
    RecordsError,
    RunDir,
    RunPath,
    Series,
    as_run_dir,
    load_jackknife,
    load_series,
    load_spectra,
)

__all__ = [
    "REPORT_VIEW",
    "ReportInputError",
    "RunData",
    "discover_runs",
    "load_run_data",
    "read_fingerprint",
    "run_names",
]

REPORT_VIEW = DEFAULT_VIEW
"""The view a report reads: every row a point selects (other views are recorded but not reported yet)."""


class ReportInputError(UserInputError):
    """A report argument is not a run (or a directory of runs), or runs cannot be compared."""


@dataclass
class RunData:
    """One run's scalar records as series, plus where to find its spectra.

    Attributes:
        path: The run directory.
        name: A short label (the path relative to the common parent of all runs in the report).
        series: metric -> point -> (epochs int64 [E], values float64 [E]), epochs ascending (view `REPORT_VIEW`).
        points: Point names in recorded (depth) order.
        epochs: Every epoch with metrics, ascending.
        fingerprint: The analysis subset's fingerprint from the run's manifest, ``None`` if the run has none.
        stderr: The jackknife standard errors of the same series (same shape; NaN where none was recorded: old
            runs, jackknife disabled, diagnostics).
        jackknife: metric -> point -> (epochs, [E, G] leave-one-group-out values) (`tgo.records.load_jackknife`;
            empty for runs recorded before replicates were kept: their verdicts use unpaired standard errors).
    """

    path: Path
    name: str
    series: Series
    points: list[str]
    epochs: list[int]
    fingerprint: str | None = None
    stderr: Series = field(default_factory=dict)
    jackknife: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    _spectra: dict[int, dict[str, dict[str, np.ndarray]]] | None = field(default=None, repr=False)

    @property
    def run(self) -> RunDir:
        """The run directory's layout (`tgo.records.RunDir`)."""
        return RunDir(self.path)

    @property
    def metrics(self) -> list[str]:
        """Recorded observables, in recorded order."""
        return list(self.series)

    def spectra(self) -> dict[int, dict[str, dict[str, np.ndarray]]]:
        """The run's spectra of view `REPORT_VIEW` (`tgo.records.load_spectra`), read once on first use.

        Raises:
            ReportInputError: a spectra file is unreadable.
        """
        if self._spectra is None:
            try:
                self._spectra = load_spectra(self.path, view=REPORT_VIEW)
            except RecordsError as err:
                raise ReportInputError(str(err)) from err
        return self._spectra


def _metrics_file(run: RunDir) -> str:
    """``geometry/metrics.csv``: the records file named relative to its run, for messages."""
    return str(run.metrics.relative_to(run.root))


def _find_below(root: Path) -> list[Path]:
    found: list[Path] = []
    for current, dirs, _files in os.walk(root):
        # A previous report's output, Hydra's bookkeeping, TensorBoard events, checkpoints and records never hold runs.
        dirs[:] = sorted(d for d in dirs if d not in RunDir.NON_RUN_SUBDIRS)
        here = Path(current)
        if RunDir(here).has_records():
            found.append(here)
            dirs[:] = []  # a run does not contain runs
    return found


def discover_runs(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Resolves report arguments to run directories, in argument order, then path order below each argument.

    Args:
        paths: Run directories or directories containing runs (searched recursively, skipping the subdirectories
            of a run that never hold runs, `tgo.records.RunDir.NON_RUN_SUBDIRS`).

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
        run = RunDir(path)
        if run.has_records():
            found = [path]
        else:
            found = _find_below(path)
            if not found and run.looks_like_run():
                raise ReportInputError(
                    f"{path}: a run directory without geometry records ({_metrics_file(run)} is missing): was "
                    f"the spectral_geometry callback disabled, or did the run stop before its first observation?"
                )
            if not found:
                raise ReportInputError(
                    f"{path}: not a run directory and no run below it (looked for {_metrics_file(run)})"
                )
        for found_run in found:
            if found_run.resolve() not in {r.resolve() for r in runs}:
                runs.append(found_run)
    return runs


def read_fingerprint(run_dir: str | os.PathLike[str]) -> str | None:
    """The analysis subset fingerprint recorded in the run's manifest (``None`` if the run has none).

    Raises:
        ReportInputError: the manifest exists but is not readable JSON with a ``fingerprint``.
    """
    path = RunDir(run_dir).manifest
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


def load_run_data(path: RunPath, name: str | None = None) -> RunData:
    """Reads a run's values and standard errors (view `REPORT_VIEW`, `tgo.records.load_series`) and its fingerprint.

    Args:
        path: A run directory (its epoch series), or a `tgo.records.RunDir` of either series: the step series'
            `RunData` has steps where the epoch series has epochs (``epochs`` lists the steps).
        name: Label for figures and tables (default: the directory name).

    Returns:
        The `RunData` (spectra are read lazily).

    Raises:
        ReportInputError: not a run with records, no metrics file, no rows of the reported view, or malformed
            values (the `tgo.records.RecordsError` message, which names the file).
    """
    run = as_run_dir(path)
    try:
        series = load_series(run, view=REPORT_VIEW)
        stderr = load_series(run, view=REPORT_VIEW, column="stderr")
        jackknife = load_jackknife(run, view=REPORT_VIEW)
    except RecordsError as err:
        raise ReportInputError(str(err)) from err
    if not series:
        raise ReportInputError(f"{run.metrics}: no observations recorded yet (no rows of view {REPORT_VIEW!r})")
    points = list(dict.fromkeys(point for per_point in series.values() for point in per_point))
    epochs = sorted({int(e) for per_point in series.values() for epochs, _ in per_point.values() for e in epochs})
    return RunData(
        path=run.root,
        name=name or run.root.resolve().name,
        series=series,
        points=points,
        epochs=epochs,
        fingerprint=read_fingerprint(run.root),
        stderr=stderr,
        jackknife=jackknife,
    )
