"""The on-disk record of geometry observations: the contract `tgo.report` and users' own analysis read.

Layout inside a run directory::

    geometry/metrics.csv                 epoch,step,point,metric,value   (one row per observable per point)
    geometry/spectra/epoch_EEEE.npz      <point>/eigenvalues  float64 [D], descending
                                         <point>/n_rows       int64 scalar (rows that entered the covariance)
                                         <point>/n_nonfinite  int64 scalar (rows dropped for NaN/Inf)
                                         <point>/mean         float64 [D]
                                         <point>/covariance   float64 [D, D]  (only on epochs asked for)

Writes are atomic (temporary file in the same directory, fsync, ``os.replace``), so a crash mid-write leaves the
previous records intact. The spectra file of an epoch is written before the metrics; ``metrics.csv`` is rewritten
whole with that epoch's old rows dropped, so re-observing an epoch after a resume replaces it rather than adding
duplicate rows. An epoch counts as observed (`RecordWriter.observed_epochs`) once both files hold it.

Values are written with ``repr(float)`` (shortest round-trip representation, NaN as ``nan``), so reading back gives
the exact float64 that was computed. Only rank 0 writes.
"""
from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from tgo.errors import UserInputError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "METRICS_COLUMNS",
    "RecordWriter",
    "RecordsError",
    "RunRecords",
    "is_run_dir",
    "load_metrics",
    "load_run",
    "load_spectra",
    "metrics_path",
    "spectra_dir",
    "spectra_path",
]

METRICS_COLUMNS: tuple[str, ...] = ("epoch", "step", "point", "metric", "value")
GEOMETRY_DIR = "geometry"
_SPECTRA_RE = re.compile(r"^epoch_(\d{4,})\.npz$")


class RecordsError(UserInputError):
    """A directory is not a run with geometry records, or its records are malformed (a ``ValueError``)."""


def metrics_path(run_dir: str | os.PathLike) -> Path:
    """``<run_dir>/geometry/metrics.csv``."""
    return Path(run_dir) / GEOMETRY_DIR / "metrics.csv"


def spectra_dir(run_dir: str | os.PathLike) -> Path:
    """``<run_dir>/geometry/spectra``."""
    return Path(run_dir) / GEOMETRY_DIR / "spectra"


def spectra_path(run_dir: str | os.PathLike, epoch: int) -> Path:
    """``<run_dir>/geometry/spectra/epoch_EEEE.npz`` (epoch zero-padded to 4 digits)."""
    return spectra_dir(run_dir) / f"epoch_{int(epoch):04d}.npz"


def _fsync_dir(path: Path) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write(path: Path, write: Callable[[io.BufferedWriter], None]) -> None:
    """Write a file through ``write(fileobj)`` so that readers see either the old or the complete new file.

    The temporary file lives in the target directory (``os.replace`` is only atomic within a filesystem) and starts
    with a dot so that readers globbing ``epoch_*.npz`` never pick it up. It is removed if anything fails.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _format_value(value: Any) -> str:
    v = float(value)
    return "nan" if math.isnan(v) else repr(v)


def _read_metric_rows(path: Path) -> list[dict[str, str]]:
    """Existing metrics rows as strings (no parsing, so rewriting keeps other epochs byte-identical)."""
    if not path.exists():
        return []
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        if tuple(reader.fieldnames or ()) != METRICS_COLUMNS:
            raise RecordsError(f"{path}: header {reader.fieldnames} is not {list(METRICS_COLUMNS)}")
        return [dict(row) for row in reader]


def _epochs_in_metrics(path: Path) -> set[int]:
    return {int(row["epoch"]) for row in _read_metric_rows(path)}


def _epochs_in_spectra(run_dir: Path) -> dict[int, Path]:
    d = spectra_dir(run_dir)
    if not d.is_dir():
        return {}
    out = {}
    for p in d.iterdir():
        m = _SPECTRA_RE.match(p.name)
        if m and p.is_file():
            out[int(m.group(1))] = p
    return dict(sorted(out.items()))


class RecordWriter:
    """Writes observations of one run; safe to recreate on resume (it reads what is already on disk).

    Args:
        run_dir: The run directory; ``geometry/`` is created inside it on the first write.

    Example:
        >>> writer = RecordWriter(run_dir)
        >>> writer.write_observation(epoch=3, step=1200, results=results, with_covariance=False)
    """

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = Path(run_dir)

    @property
    def metrics_path(self) -> Path:
        """``geometry/metrics.csv`` of this run."""
        return metrics_path(self.run_dir)

    def spectra_path(self, epoch: int) -> Path:
        """``geometry/spectra/epoch_EEEE.npz`` of this run."""
        return spectra_path(self.run_dir, epoch)

    def metric_rows(self) -> list[dict[str, str]]:
        """The rows already in ``metrics.csv`` as dicts of strings (empty if none); no pandas needed."""
        return _read_metric_rows(self.metrics_path)

    def observed_epochs(self) -> list[int]:
        """Epochs whose observation is completely on disk (metrics rows and spectra file), ascending.

        The metrics file is written last, so an epoch interrupted between the two writes is not counted and will be
        observed again (its spectra file then replaced).
        """
        return sorted(_epochs_in_metrics(self.metrics_path) & set(_epochs_in_spectra(self.run_dir)))

    def write_observation(
        self, epoch: int, step: int, results: Mapping[str, Any], *, with_covariance: bool
    ) -> None:
        """Record one observation: spectra npz first, then the metrics rows (each atomically).

        Args:
            epoch: Completed training epochs at observation time (0 = initialisation).
            step: Global optimizer step at observation time.
            results: ``{point: PointResult}`` in point order (anything with ``spectrum.eigenvalues``,
                ``spectrum.n_rows``, ``mean``, ``covariance`` and an ``observables`` mapping).
            with_covariance: Also store each point's full covariance (D x D floats per point: large, so only on
                chosen epochs).

        Raises:
            ValueError: negative epoch/step, or a point name unusable as an npz key.
        """
        epoch, step = int(epoch), int(step)
        if epoch < 0 or step < 0:
            raise ValueError(f"write_observation: epoch and step must be >= 0; got epoch={epoch}, step={step}")
        arrays: dict[str, np.ndarray] = {}
        rows: list[dict[str, str]] = []
        for point, res in results.items():
            if not point or "/" in point:
                raise ValueError(f"write_observation: point name {point!r} cannot be an npz key prefix")
            spectrum = res.spectrum
            arrays[f"{point}/eigenvalues"] = np.asarray(spectrum.eigenvalues, dtype=np.float64)
            arrays[f"{point}/n_rows"] = np.asarray(int(spectrum.n_rows), dtype=np.int64)
            arrays[f"{point}/n_nonfinite"] = np.asarray(int(getattr(spectrum, "n_nonfinite", 0)), dtype=np.int64)
            arrays[f"{point}/mean"] = np.asarray(res.mean, dtype=np.float64)
            if with_covariance:
                arrays[f"{point}/covariance"] = np.asarray(res.covariance, dtype=np.float64)
            for metric, value in res.observables.items():
                rows.append({"epoch": str(epoch), "step": str(step), "point": point, "metric": str(metric),
                             "value": _format_value(value)})

        _atomic_write(self.spectra_path(epoch), lambda fh: np.savez(fh, **arrays))

        kept = [r for r in _read_metric_rows(self.metrics_path) if int(r["epoch"]) != epoch]
        merged = sorted(kept + rows, key=lambda r: int(r["epoch"]))  # stable: within an epoch, written order

        def write_csv(fh: io.BufferedWriter) -> None:
            text = io.StringIO(newline="")
            writer = csv.DictWriter(text, fieldnames=METRICS_COLUMNS, lineterminator="\n")
            writer.writeheader()
            writer.writerows(merged)
            fh.write(text.getvalue().encode("utf-8"))

        _atomic_write(self.metrics_path, write_csv)


# ----------------------------------------------------------------------------------------------------------- readers
def is_run_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds geometry records (a metrics file or at least one spectra file)."""
    p = Path(path)
    return metrics_path(p).is_file() or bool(_epochs_in_spectra(p))


def _require_run_dir(path: str | os.PathLike) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise RecordsError(f"{p}: not a directory (expected a run directory holding geometry/metrics.csv)")
    if not is_run_dir(p):
        raise RecordsError(
            f"{p}: no geometry records (neither {GEOMETRY_DIR}/metrics.csv nor {GEOMETRY_DIR}/spectra/epoch_*.npz); "
            f"is this a run directory, and has an observation been made yet?"
        )
    return p


def load_metrics(run_dir: str | os.PathLike) -> "pd.DataFrame":
    """The metrics of a run as a tidy DataFrame with columns ``epoch, step, point, metric, value``.

    Args:
        run_dir: A run directory.

    Returns:
        DataFrame (epoch/step int64, point/metric str, value float64; NaN kept), in file order.

    Raises:
        RecordsError: not a run directory, no metrics file, or a malformed one.
        ImportError: pandas is not installed (``pip install 'tgo[report]'``).
    """
    try:
        import pandas as pd
    except ImportError as err:  # pragma: no cover - pandas ships with the test/report extras
        raise ImportError("tgo.records.load_metrics needs pandas: pip install 'tgo[report]' (or use load_spectra, "
                          "which needs only numpy)") from err
    p = _require_run_dir(run_dir)
    path = metrics_path(p)
    if not path.is_file():
        raise RecordsError(f"{p}: spectra exist but {path.relative_to(p)} is missing")
    rows = _read_metric_rows(path)
    try:
        frame = pd.DataFrame(
            {
                "epoch": pd.array([int(r["epoch"]) for r in rows], dtype="int64"),
                "step": pd.array([int(r["step"]) for r in rows], dtype="int64"),
                "point": pd.array([r["point"] for r in rows], dtype=object),
                "metric": pd.array([r["metric"] for r in rows], dtype=object),
                "value": np.array([float(r["value"]) for r in rows], dtype=np.float64),
            },
            columns=list(METRICS_COLUMNS),
        )
    except (TypeError, ValueError) as err:
        raise RecordsError(f"{path}: malformed row ({err})") from err
    return frame


def _load_npz(path: Path) -> dict[str, dict[str, np.ndarray]]:
    points: dict[str, dict[str, np.ndarray]] = {}
    try:
        with np.load(path, allow_pickle=False) as data:
            for key in data.files:
                point, sep, name = key.rpartition("/")
                if not sep:
                    continue  # not a per-point array; tolerated for forward compatibility
                points.setdefault(point, {})[name] = data[key]
    except (OSError, ValueError) as err:  # truncated or not a zip: never produced by RecordWriter, but be clear
        raise RecordsError(f"{path}: unreadable spectra file ({err})") from err
    return points


def _iter_spectra(run_dir: Path, epochs: Iterable[int] | None) -> Iterator[tuple[int, Path]]:
    files = _epochs_in_spectra(run_dir)
    wanted = files.keys() if epochs is None else epochs
    for e in wanted:
        if int(e) not in files:
            raise RecordsError(f"{run_dir}: no spectra for epoch {e}; available {sorted(files)}")
        yield int(e), files[int(e)]


def load_spectra(
    run_dir: str | os.PathLike, epochs: Iterable[int] | None = None
) -> dict[int, dict[str, dict[str, np.ndarray]]]:
    """The spectra of a run: ``{epoch: {point: {"eigenvalues", "n_rows", "n_nonfinite", "mean", ["covariance"]}}}``.

    Args:
        run_dir: A run directory.
        epochs: Optional iterable of epochs to load (all by default); covariances make files large.

    Returns:
        Nested dict, epochs ascending, points in written order; ``n_rows``/``n_nonfinite`` are 0-d int64 arrays.

    Raises:
        RecordsError: not a run directory, a requested epoch missing, or an unreadable file.
    """
    p = _require_run_dir(run_dir)
    return {e: _load_npz(path) for e, path in _iter_spectra(p, epochs)}


@dataclass
class RunRecords:
    """A run's records in memory.

    Attributes:
        run_dir: Where they were read from.
        metrics: Tidy DataFrame (`load_metrics`).
        spectra: Nested arrays (`load_spectra`).
    """

    run_dir: Path
    metrics: "pd.DataFrame"
    spectra: dict[int, dict[str, dict[str, np.ndarray]]]

    @property
    def epochs(self) -> list[int]:
        """Epochs present in both metrics and spectra, ascending."""
        return sorted(set(int(e) for e in self.metrics["epoch"].unique()) & set(self.spectra))

    @property
    def points(self) -> list[str]:
        """Point names in recorded order."""
        return list(dict.fromkeys(self.metrics["point"]))


def load_run(run_dir: str | os.PathLike) -> RunRecords:
    """Load a run's metrics and spectra together.

    Raises:
        RecordsError: as `load_metrics` / `load_spectra`.
    """
    p = _require_run_dir(run_dir)
    return RunRecords(run_dir=p, metrics=load_metrics(p), spectra=load_spectra(p))
