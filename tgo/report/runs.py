"""Finding run directories and reading their records into per-metric, per-point series (numpy only, no pandas).

A report argument may be a run directory or any directory above runs (a Hydra multirun sweep): runs are found
recursively. Paths and records come from `tgo.records`, so the report follows the on-disk contract instead of restating
it. Every problem with the arguments is a one-line `ReportInputError`."""

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

REPORT_VIEW = DEFAULT_VIEW  # the view a report reads: every row a point selects


class ReportInputError(UserInputError):
    """A report argument is not a run (or a directory of runs), or runs cannot be compared."""


@dataclass
class RunData:
    """One run's scalar records as series (metric -> point -> (epochs, values), view `REPORT_VIEW`), their standard
    errors (NaN where none) and leave-one-group-out replicates (empty for old runs: unpaired errors), and where its
    spectra are."""

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
        """The run's spectra of view `REPORT_VIEW`, read once on first use."""
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
    """Run directories holding records, in argument order, then path order below each argument (subdirectories of a run
    that never hold runs skipped); a path that is missing or holds no run is refused."""
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
    """The analysis subset's fingerprint in the run's manifest (``None`` without one; an unreadable one is refused)."""
    path = RunDir(run_dir).manifest
    if not path.is_file():
        return None
    try:
        return str(json.loads(path.read_text(encoding="utf-8"))["fingerprint"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ReportInputError(f"{path}: unreadable analysis subset manifest ({err})") from err


def run_names(paths: Sequence[Path]) -> list[str]:
    """Short distinct labels: paths relative to their common parent (the directory name for a single run)."""
    if len(paths) <= 1:
        return [p.resolve().name for p in paths]
    parent = Path(os.path.commonpath([str(p.resolve()) for p in paths]))
    return [str(p.resolve().relative_to(parent)) or p.resolve().name for p in paths]


def load_run_data(path: RunPath, name: str | None = None) -> RunData:
    """A run's values, standard errors and fingerprint; ``path`` may be a `tgo.records.RunDir` of the step series, whose
    ``epochs`` are then steps. Spectra are read lazily."""
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
