"""The run directory and its geometry records: the on-disk contract users and ``tgo.report`` read.

Every other module asks `RunDir` for a path; the layout and the two series (``geometry/`` by epoch, ``geometry/steps/``
by optimizer step) are drawn in docs/architecture.md. A spectra file holds ``<point>/<array>`` (view ``all``) and
``<point>/<view>/<array>``, plus the jackknife replicates: ``jackknife_metrics`` (ASCII ``S`` [M], no pickle) and per
(point, view) ``jackknife`` float64 [M, G_max] (NaN padded) and ``jackknife_groups`` int64 [M]. Writes are atomic,
spectra before metrics, so a crash leaves the previous file; values are ``repr(float)``, read back bit for bit.
"""

from __future__ import annotations

import contextlib
import csv
import difflib
import errno
import io
import json
import math
import os
import re
import shutil
import tempfile
import uuid
import zipfile
import zlib
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from tgo.errors import RunEnvironmentError, UserInputError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "DEFAULT_VIEW",
    "JACKKNIFE_ARRAYS",
    "JACKKNIFE_METRICS",
    "METRICS_COLUMNS",
    "SERIES",
    "VIEWS",
    "RecordWriter",
    "RecordsError",
    "RunDir",
    "RunPath",
    "Series",
    "as_run_dir",
    "atomic_write",
    "atomic_write_json",
    "layer_epoch_table",
    "load_jackknife",
    "load_metrics",
    "load_series",
    "load_spectra",
    "load_subspace_history",
    "read_metric_rows",
    "recorded_epochs",
]

DEFAULT_VIEW = "all"
"""The view of every row a point selects (the only view the paper measured); what readers default to."""
VIEWS: tuple[str, ...] = ("all", "cls", "prefix", "patch", "between_image", "within_image")
"""Every view a point can have, in record order; here, torch-free, so the observatory and the report share the names."""
METRICS_COLUMNS: tuple[str, ...] = ("epoch", "step", "point", "view", "metric", "value", "stderr")
_LEGACY_COLUMNS: dict[tuple[str, ...], dict[str, str]] = {  # header -> the values its missing columns read as
    ("epoch", "step", "point", "metric", "value"): {"view": DEFAULT_VIEW, "stderr": "nan"},
    ("epoch", "step", "point", "view", "metric", "value"): {"stderr": "nan"},
}
SERIES: tuple[str, ...] = ("epoch", "step")
"""The record series of a run (`RunDir.series`), each named after its key column of ``metrics.csv``."""
_SPECTRA_RE = {series: re.compile(rf"^{series}_(\d{{4,}})\.npz$") for series in SERIES}
_KEY_DIGITS = {"epoch": 4, "step": 6}

Series = dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]
"""metric -> point -> (epochs int64 [E], values float64 [E]), epochs ascending."""

JACKKNIFE_ARRAYS: tuple[str, ...] = ("jackknife", "jackknife_groups")
"""The per-(point, view) arrays holding the jackknife replicates (`load_jackknife`; `load_spectra` skips them)."""

JACKKNIFE_METRICS = "jackknife_metrics"
"""The top-level key of a spectra file naming the metrics of the rows of every (point, view)'s ``jackknife``."""


class RecordsError(UserInputError):
    """A directory is not a run with geometry records, or its records are malformed (a ``ValueError``)."""


# ----------------------------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class RunDir:
    """The paths of one run directory (nothing is created); the ``step`` series lives in ``geometry/steps/``."""

    root: Path
    series: str = "epoch"

    CONFIG = "config.yaml"
    MANIFEST = "analysis_subset.json"
    CHECKPOINTS = "checkpoints"
    LAST_CHECKPOINT = "last.ckpt"
    TENSORBOARD = "tensorboard"
    REPORT = "report"
    GEOMETRY = "geometry"
    METRICS = "metrics.csv"
    SPECTRA = "spectra"

    STEPS = "steps"

    def __init__(self, root: str | os.PathLike[str], series: str = "epoch") -> None:
        if series not in SERIES:
            raise ValueError(f"RunDir: series must be one of {list(SERIES)}, got {series!r}")
        object.__setattr__(self, "root", Path(root))
        object.__setattr__(self, "series", series)

    @property
    def key(self) -> str:
        return self.series

    @property
    def step_series(self) -> RunDir:
        return RunDir(self.root, "step")

    @property
    def epoch_series(self) -> RunDir:
        return RunDir(self.root, "epoch")

    @property
    def config(self) -> Path:
        return self.root / self.CONFIG

    @property
    def manifest(self) -> Path:
        return self.root / self.MANIFEST

    @property
    def checkpoints(self) -> Path:
        return self.root / self.CHECKPOINTS

    @property
    def last_checkpoint(self) -> Path:
        return self.checkpoints / self.LAST_CHECKPOINT

    @property
    def tensorboard(self) -> Path:
        return self.root / self.TENSORBOARD

    @property
    def report(self) -> Path:
        return self.root / self.REPORT

    @property
    def geometry(self) -> Path:
        return self.root / self.GEOMETRY if self.series == "epoch" else self.root / self.GEOMETRY / self.STEPS

    @property
    def metrics(self) -> Path:
        return self.geometry / self.METRICS

    @property
    def spectra_dir(self) -> Path:
        return self.geometry / self.SPECTRA

    def folder(self, name: str) -> Path:
        """``geometry/<name>/``: the folder a measurement family keeps its own files in."""
        return self.geometry / name

    def spectra(self, epoch: int) -> Path:
        """``geometry/spectra/epoch_EEEE.npz`` (``geometry/steps/spectra/step_SSSSSS.npz`` for the step series)."""
        return self.spectra_dir / f"{self.series}_{int(epoch):0{_KEY_DIGITS[self.series]}d}.npz"

    def spectra_files(self) -> dict[int, Path]:
        """``{epoch: path}`` of every spectra file, epochs (steps) ascending."""
        if not self.spectra_dir.is_dir():
            return {}
        found = {}
        pattern = _SPECTRA_RE[self.series]
        for p in self.spectra_dir.iterdir():
            m = pattern.match(p.name)
            if m and p.is_file():
                found[int(m.group(1))] = p
        return dict(sorted(found.items()))

    def has_records(self) -> bool:
        """Whether geometry records exist (a metrics file or at least one spectra file)."""
        return self.metrics.is_file() or bool(self.spectra_files())

    MARKER = ".tgo-run"
    """JSON naming the run, its kind and the path it was made for: TGO writes only into a directory that is new, empty
    or marked, and a marker copied elsewhere does not count."""

    @property
    def marker(self) -> Path:
        return self.root / self.MARKER

    def read_marker(self) -> dict[str, Any] | None:
        """The marker's JSON object when it is a regular file TGO wrote (no link), else ``None``."""
        if self.marker.is_symlink() or not self.marker.is_file():
            return None
        try:
            stamp = json.loads(self.marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return stamp if isinstance(stamp, dict) and stamp.get("tgo") == "run directory" else None

    def is_marked(self) -> bool:
        """Whether TGO marked this very directory (a marker naming another path was copied, or its run moved)."""
        stamp = self.read_marker()
        return stamp is not None and stamp.get("path") == os.path.realpath(self.root)

    def mark(self, kind: str) -> None:
        """Writes the marker unless this directory already is one; ``kind`` is ``train`` or ``observe``."""
        if self.is_marked():
            return
        stamp = {
            "tgo": "run directory",
            "kind": kind,
            "run_id": uuid.uuid4().hex,
            "path": os.path.realpath(self.root),
            "created": datetime.now().astimezone().isoformat(timespec="seconds"),
        }
        atomic_write(self.marker, json.dumps(stamp) + "\n")

    def unsafe_entry(self) -> str | None:
        """What inside this run directory TGO must not write through, in words, or ``None``: a link would send writes
        outside the run, a file where a directory belongs (or the reverse) would fail mid-run. The run directory may be
        a link."""
        files = [self.marker, self.root / ".tgo-lock", self.config, self.manifest]
        dirs = [self.root / d for d in (self.GEOMETRY, self.CHECKPOINTS, self.TENSORBOARD, self.REPORT)]
        dirs += [self.geometry / d for d in (self.SPECTRA, self.STEPS, "weights")]
        dirs += [self.step_series.spectra_dir, self.checkpoints / "trajectory"]
        files += [self.metrics, self.step_series.metrics, self.last_checkpoint]
        for path in [*files, *dirs]:
            if path.is_symlink():
                return f"{path.relative_to(self.root)} is a symbolic link (to {os.readlink(path)})"
        for path in files:
            if path.exists() and not path.is_file():
                return f"{path.relative_to(self.root)} is a directory (or another non-file); expected a file of TGO's"
        for path in dirs:
            if path.exists() and not path.is_dir():
                return f"{path.relative_to(self.root)} is a file; expected a directory TGO writes into"
        for top in (self.root / self.GEOMETRY, self.checkpoints):
            for folder, subdirs, names in os.walk(top):  # never follows a link
                for name in [*subdirs, *names]:
                    path = Path(folder) / name
                    if path.is_symlink():
                        return f"{path.relative_to(self.root)} is a symbolic link (to {os.readlink(path)})"
        return None

    def looks_like_run(self) -> bool:
        """Whether this is a run directory at all: its marker, or (older runs) config, checkpoints or manifest."""
        return self.is_marked() or self.config.is_file() or self.checkpoints.is_dir() or self.manifest.is_file()

    SET_ASIDE = "set_aside"  # what a resume moved out of the way (tgo.resume): earlier attempts, never a run of its own
    NON_RUN_SUBDIRS = frozenset({REPORT, ".hydra", TENSORBOARD, CHECKPOINTS, GEOMETRY, SET_ASIDE})
    """Subdirectories of a run that never hold other runs (skipped when searching for runs)."""


RunPath = str | os.PathLike[str] | RunDir
"""A run directory as a path (its epoch series) or a `RunDir` (either series)."""


def as_run_dir(run_dir: RunPath) -> RunDir:
    """``run_dir`` as a `RunDir`: a path is its epoch series; a `RunDir` keeps its series."""
    return run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)


# ----------------------------------------------------------------------------------------------------------- writing
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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike[str], data: bytes | str | Callable[[IO[bytes]], None]) -> Path:
    """Writes a file so that readers see either the old or the complete new file, durably (links, directories refused).

    The temporary file lives beside the target (``os.replace`` is atomic only within a filesystem), starts with a dot so
    globs skip it, gets ``0o666 & ~umask`` (``mkstemp`` gives ``0600``) and is removed if anything fails.
    """
    path = Path(path)
    if path.is_symlink():
        raise RunEnvironmentError(
            f"{path}: is a symbolic link (to {os.readlink(path)}); TGO never writes through or replaces a link it did "
            "not create: remove it, or choose another directory"
        )
    if path.is_dir():
        raise RunEnvironmentError(f"{path}: is a directory; expected a file TGO writes (move it away)")
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        _raise_if_out_of_space(err, path, existed)
        raise
    try:
        if hasattr(os, "fchmod"):  # POSIX
            os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            if callable(data):
                data(fh)
            else:
                fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        _raise_if_out_of_space(err, path, existed)
        raise
    _fsync_dir(path.parent)
    return path


_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
_TORCH_WRITE_FAILED = ("unexpected pos", "file write failed")
"""How ``torch.save`` reports a failed write into a file object (a RuntimeError from its zip writer, no errno)."""


def _raise_if_out_of_space(err: BaseException, path: Path, existed: bool) -> None:
    """A write that failed for want of space as one line naming the file, the free space and what survived."""
    where = path.parent if path.parent.exists() else Path(os.path.abspath(os.sep))
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        free = -1
    no_space = isinstance(err, OSError) and err.errno in _NO_SPACE
    if not no_space and isinstance(err, RuntimeError) and any(s in str(err) for s in _TORCH_WRITE_FAILED):
        no_space = 0 <= free < 16 * 2**20
    if not no_space:
        return
    survived = f"the previous {path.name} is intact" if existed else f"no {path.name} existed before, none was written"
    shown = f"{free / 2**20:.1f} MiB free" if free >= 0 else "free space unknown"
    raise RunEnvironmentError(
        f"{path}: no space left on the device ({shown}); {survived}: free space, then resume with ckpt_path=last"
    ) from err


def atomic_write_json(path: str | os.PathLike[str], payload: Any) -> Path:
    """`atomic_write` of a JSON document (indent 1, trailing newline)."""
    return atomic_write(path, json.dumps(payload, indent=1) + "\n")


def _format_value(value: Any) -> str:
    v = float(value)
    return "nan" if math.isnan(v) else repr(v)


def _key(key: Any) -> tuple[str, str]:
    """``(point, view)`` of a results key: an ``ObservationKey``/pair, or a bare point name (view ``all``)."""
    if isinstance(key, str):
        return key, DEFAULT_VIEW
    point, view = key
    return str(point), str(view)


class RecordWriter:
    """Writes the observations of one run; safe to recreate on resume (it reads what is already on disk)."""

    def __init__(self, run_dir: RunPath) -> None:
        self.run = as_run_dir(run_dir)

    @property
    def run_dir(self) -> Path:
        return self.run.root

    def write_observation(self, epoch: int, step: int, results: Mapping[Any, Any], *, with_covariance: bool) -> None:
        """Records one observation, spectra npz first, then the metrics rows, each atomically; ``with_covariance`` also
        stores the covariances (D x D, so only on chosen epochs) and ``kept_arrays``."""
        epoch, step = int(epoch), int(step)
        if epoch < 0 or step < 0:
            raise ValueError(f"write_observation: epoch and step must be >= 0; got epoch={epoch}, step={step}")
        arrays: dict[str, np.ndarray] = {}
        rows: list[dict[str, str]] = []
        replicates: dict[str, Mapping[str, Any]] = {}  # prefix -> {metric: leave-one-out values}
        for key, res in results.items():
            point, view = _key(key)
            for part in (point, view):
                if not part or "/" in part or "," in part:
                    raise ValueError(f"write_observation: name {part!r} cannot be an npz key or CSV cell")
            prefix = point if view == DEFAULT_VIEW else f"{point}/{view}"
            spectrum = res.spectrum
            arrays[f"{prefix}/eigenvalues"] = np.asarray(spectrum.eigenvalues, dtype=np.float64)
            arrays[f"{prefix}/n_rows"] = np.asarray(int(spectrum.n_rows), dtype=np.int64)
            arrays[f"{prefix}/n_nonfinite"] = np.asarray(int(getattr(spectrum, "n_nonfinite", 0)), dtype=np.int64)
            arrays[f"{prefix}/mean"] = np.asarray(res.mean, dtype=np.float64)
            if with_covariance and getattr(res, "alias_of", None) is None:  # an alias's covariance is its original's
                arrays[f"{prefix}/covariance"] = np.asarray(res.covariance, dtype=np.float64)
            for name, array in (getattr(res, "arrays", None) or {}).items():
                arrays[f"{prefix}/{name}"] = np.asarray(array)
            if with_covariance:
                for name, array in (getattr(res, "kept_arrays", None) or {}).items():
                    arrays[f"{prefix}/{name}"] = np.asarray(array)
            for name in JACKKNIFE_ARRAYS:
                if f"{prefix}/{name}" in arrays:
                    raise ValueError(f"write_observation: {prefix!r} has an array named {name!r}, a reserved name")
            replicates[prefix] = getattr(res, "jackknife", None) or {}
            stderr = getattr(res, "stderr", None) or {}
            for metric, value in res.observables.items():
                rows.append(
                    {
                        "epoch": str(epoch),
                        "step": str(step),
                        "point": point,
                        "view": view,
                        "metric": str(metric),
                        "value": _format_value(value),
                        "stderr": _format_value(stderr.get(metric, math.nan)),
                    }
                )
        arrays.update(_replicate_arrays(replicates))
        key = self.run.key  # the step series replaces and orders by step
        observed = {"epoch": epoch, "step": step}[key]

        atomic_write(self.run.spectra(observed), lambda fh: np.savez(fh, **arrays))  # type: ignore[arg-type]

        kept = [r for r in read_metric_rows(self.run) if int(r[key]) != observed]
        merged = sorted(kept + rows, key=lambda r: int(r[key]))  # stable: within an epoch, written order
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=METRICS_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(merged)
        atomic_write(self.run.metrics, text.getvalue())


def _replicate_arrays(replicates: Mapping[str, Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """`JACKKNIFE_METRICS` and the `JACKKNIFE_ARRAYS` of every prefix; nothing for a prefix without replicates."""
    tables: dict[str, dict[str, np.ndarray]] = {}
    for prefix, per in replicates.items():
        rows = {str(m): np.asarray(v, dtype=np.float64).reshape(-1) for m, v in per.items()}
        tables[prefix] = {m: v for m, v in rows.items() if v.size}
    metrics = list(dict.fromkeys(m for per in tables.values() for m in per))  # first-recorded order
    if not metrics:
        return {}
    unusable = [m for m in metrics if not m.isascii() or "\0" in m]  # 'S' arrays hold ASCII and drop trailing NULs
    if unusable:
        raise ValueError(f"write_observation: jackknife metric names must be ASCII without NUL; got {unusable!r}")
    row = {m: i for i, m in enumerate(metrics)}
    out: dict[str, np.ndarray] = {JACKKNIFE_METRICS: np.array([m.encode("ascii") for m in metrics], dtype=np.bytes_)}
    for prefix, per in tables.items():
        if not per:
            continue
        table = np.full((len(metrics), max(v.size for v in per.values())), np.nan, dtype=np.float64)
        groups = np.zeros(len(metrics), dtype=np.int64)
        for metric, values in per.items():
            table[row[metric], : values.size] = values
            groups[row[metric]] = values.size
        out[f"{prefix}/jackknife"], out[f"{prefix}/jackknife_groups"] = table, groups
    return out


# ----------------------------------------------------------------------------------------------------------- reading
_PARSED_ROWS: dict[Path, tuple[tuple[int, ...], tuple[dict[str, str], ...]]] = {}
"""The last few ``metrics.csv`` files parsed, by path, with the stat stamp they were parsed at (`read_metric_rows`)."""
_PARSED_FILES = 8


def read_metric_rows(run_dir: RunPath) -> list[dict[str, str]]:
    """The rows of ``metrics.csv`` as unparsed strings (rewrites keep other epochs byte-identical).

    A file unchanged since it was last read here (same inode, size and change times: tgo rewrites it by atomic rename)
    is not parsed again: a report, or the story card drawn after every observation, reads it once per view. Each
    call returns fresh row dicts, so a caller may change them."""
    path = as_run_dir(run_dir).metrics
    try:
        stat = path.stat()
    except FileNotFoundError:
        return []
    stamp = (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    cached = _PARSED_ROWS.get(path)
    if cached is None or cached[0] != stamp:
        cached = (stamp, tuple(_parse_metric_rows(path)))
        _PARSED_ROWS.pop(path, None)
        while len(_PARSED_ROWS) >= _PARSED_FILES:
            _PARSED_ROWS.pop(next(iter(_PARSED_ROWS)), None)
        _PARSED_ROWS[path] = cached
    return [dict(row) for row in cached[1]]


def _parse_metric_rows(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = tuple(reader.fieldnames or ())
            if header == METRICS_COLUMNS:
                return [dict(row) for row in reader]
            if header in _LEGACY_COLUMNS:
                missing = _LEGACY_COLUMNS[header]
                return [{column: {**row, **missing}[column] for column in METRICS_COLUMNS} for row in reader]
    except (UnicodeDecodeError, csv.Error) as err:  # binary or damaged: say so instead of a decoder traceback
        raise RecordsError(
            f"{path}: not a readable CSV text file ({err}); expected the metrics file tgo writes, with the header "
            f"{','.join(METRICS_COLUMNS)}"
        ) from err
    raise RecordsError(f"{path}: header {list(header)} is not {list(METRICS_COLUMNS)}")


def recorded_epochs(run_dir: RunPath) -> list[int]:
    """Epochs completely on disk, ascending: metrics are written last, so an interrupted epoch is observed again."""
    run = as_run_dir(run_dir)
    in_metrics = {int(row[run.key]) for row in read_metric_rows(run)}
    return sorted(in_metrics & set(run.spectra_files()))


def _require_records(path: RunPath) -> RunDir:
    run = as_run_dir(path)
    if not run.root.is_dir():
        raise RecordsError(
            f"{run.root}: not a directory (expected a run directory holding {RunDir.GEOMETRY}/{RunDir.METRICS})"
        )
    if not run.has_records():
        raise RecordsError(
            f"{run.root}: no geometry records (neither {RunDir.GEOMETRY}/{RunDir.METRICS} nor "
            f"{RunDir.GEOMETRY}/{RunDir.SPECTRA}/epoch_*.npz); is this a run directory, and has an observation been "
            "made yet?"
        )
    return run


def _rows_with_metrics_file(path: RunPath) -> list[dict[str, str]]:
    run = _require_records(path)
    if not run.metrics.is_file():
        raise RecordsError(f"{run.root}: spectra exist but {run.metrics.relative_to(run.root)} is missing")
    rows = read_metric_rows(run)
    _refuse_duplicate_rows(run.metrics, rows, run.key)
    return rows


def _refuse_duplicate_rows(path: Path, rows: Sequence[Mapping[str, str]], key_column: str = "epoch") -> None:
    """Refuses two rows for one (epoch, point, view, metric): a loader would silently keep one."""
    first_line: dict[tuple[str, str, str, str], int] = {}
    for line, row in enumerate(rows, start=2):  # line 1 is the header
        key = (row[key_column], row["point"], row["view"], row["metric"])
        if key in first_line:
            raise RecordsError(
                f"{path}: line {line} repeats {key_column} {key[0]}, point {key[1]}, view {key[2]}, metric {key[3]} "
                f"of line {first_line[key]}; expected one row per {key_column}, point, view and metric (tgo replaces "
                "an observation's rows when it observes it again, so the file was edited or concatenated: keep one of "
                "the two)"
            )
        first_line[key] = line


def load_metrics(run_dir: RunPath) -> pd.DataFrame:
    """The metrics of a run as a tidy DataFrame (columns `METRICS_COLUMNS`, in file order; NaN kept); needs pandas."""
    try:
        import pandas as pd
    except ImportError as err:  # pragma: no cover - pandas ships with the test/analysis extras
        raise ImportError(
            "tgo.records.load_metrics needs pandas: pip install 'tgo[analysis]' (or use load_series "
            "or load_spectra, which need only numpy)"
        ) from err
    rows = _rows_with_metrics_file(run_dir)
    try:
        return pd.DataFrame(
            {
                "epoch": pd.array([int(r["epoch"]) for r in rows], dtype="int64"),
                "step": pd.array([int(r["step"]) for r in rows], dtype="int64"),
                "point": pd.array([r["point"] for r in rows], dtype=object),
                "view": pd.array([r["view"] for r in rows], dtype=object),
                "metric": pd.array([r["metric"] for r in rows], dtype=object),
                "value": np.array([float(r["value"]) for r in rows], dtype=np.float64),
                "stderr": np.array([float(r["stderr"]) for r in rows], dtype=np.float64),
            },
            columns=list(METRICS_COLUMNS),
        )
    except (TypeError, ValueError) as err:
        raise RecordsError(f"{as_run_dir(run_dir).metrics}: malformed row ({err})") from err


def load_series(
    run_dir: RunPath,
    *,
    view: str = DEFAULT_VIEW,
    metrics: Sequence[str] | None = None,
    column: str = "value",
) -> Series:
    """The metrics of one view as ``{metric: {point: (epochs, values)}}`` (``column``: value or stderr); a view or
    metric that neither the run records nor TGO knows is refused (`tgo.errors.UserInputError`)."""
    if column not in ("value", "stderr"):
        raise ValueError(f"load_series: column must be 'value' or 'stderr', got {column!r}")
    rows = _rows_with_metrics_file(run_dir)
    _check_names(rows, view, metrics)
    key = as_run_dir(run_dir).key
    wanted = None if metrics is None else set(metrics)
    collected: dict[str, dict[str, dict[int, float]]] = {}
    try:
        for row in rows:
            if row["view"] != view or (wanted is not None and row["metric"] not in wanted):
                continue
            collected.setdefault(row["metric"], {}).setdefault(row["point"], {})[int(row[key])] = float(row[column])
    except (TypeError, ValueError) as err:
        raise RecordsError(f"{as_run_dir(run_dir).metrics}: malformed row ({err})") from err
    return {
        metric: {
            point: (
                np.array(sorted(values), dtype=np.int64),
                np.array([values[e] for e in sorted(values)], dtype=np.float64),
            )
            for point, values in per_point.items()
        }
        for metric, per_point in collected.items()
    }


def _check_names(rows: Sequence[Mapping[str, str]], view: str, metrics: Sequence[str] | None) -> None:
    """Refuses a view or metric that neither the run records nor TGO knows: a typo would otherwise read as no data.

    Names the records hold pass without importing the catalogue (torch); a known name not recorded gives ``{}``."""
    recorded_views, recorded_metrics = {r["view"] for r in rows}, {r["metric"] for r in rows}
    missing = [m for m in metrics or () if m not in recorded_metrics]
    if view in recorded_views and not missing:
        return
    import tgo.observatory.families  # noqa: F401  # registers the families' catalogue entries
    from tgo.spectral import CATALOGUE

    views = dict.fromkeys([*VIEWS, *(v for o in CATALOGUE.family_entries for v in o.views), *sorted(recorded_views)])
    names = dict.fromkeys([*CATALOGUE.names, *sorted(recorded_metrics)])
    for what, wrong, known in (("view", [view], views), ("metric", [m for m in missing if m not in names], names)):
        if any(w not in known for w in wrong):
            close = [c for w in wrong for c in difflib.get_close_matches(w, known, n=1)]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise UserInputError(
                f"load_series: unknown {what} {', '.join(map(repr, wrong))}{hint}; the known {what}s are "
                f"{', '.join(known)}"
            )


def layer_epoch_table(
    per_point: Mapping[str, tuple[np.ndarray, np.ndarray]], points: Sequence[str], epochs: Sequence[int]
) -> np.ndarray:
    """One metric's series as a ``[points, epochs]`` table (NaN where missing), behind every layer x epoch figure."""
    table = np.full((len(points), len(epochs)), np.nan)
    column = {int(e): j for j, e in enumerate(epochs)}
    for i, point in enumerate(points):
        for e, v in zip(*per_point.get(point, ((), ())), strict=False):
            if int(e) in column:
                table[i, column[int(e)]] = v
    return table


def _split_key(key: str) -> tuple[str, str, str] | None:
    """``(point, view, array)`` of a spectra file's key, ``None`` for a key that is not a per-(point, view) array."""
    parts = key.split("/")
    if len(parts) == 2:
        return parts[0], DEFAULT_VIEW, parts[1]
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    return None


def _load_npz(path: Path, view: str, arrays: Iterable[str] | None) -> dict[str, dict[str, np.ndarray]]:
    wanted = None if arrays is None else set(arrays)
    points: dict[str, dict[str, np.ndarray]] = {}
    try:
        with np.load(path, allow_pickle=False) as data:
            for key in data.files:
                split = _split_key(key)
                if split is None:
                    continue  # not a per-point array (`JACKKNIFE_METRICS`, or later additions)
                point, key_view, name = split
                if key_view != view or (name not in wanted if wanted is not None else name in JACKKNIFE_ARRAYS):
                    continue
                points.setdefault(point, {})[name] = data[key]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        raise RecordsError(
            f"{path}: unreadable spectra file ({type(err).__name__}: {err}); expected a complete .npz as tgo writes "
            "it (move the damaged file aside to report the other epochs)"
        ) from err
    return points


def _iter_spectra(run: RunDir, epochs: Iterable[int] | None) -> Iterator[tuple[int, Path]]:
    files = run.spectra_files()
    wanted = files.keys() if epochs is None else epochs
    for e in wanted:
        if int(e) not in files:
            raise RecordsError(f"{run.root}: no spectra for epoch {e}; available {sorted(files)}")
        yield int(e), files[int(e)]


def load_subspace_history(run_dir: RunPath, before_epoch: int) -> tuple[dict, dict]:
    """``(init, prev)``: per point ``(eigenvectors, components_90)`` of the first and latest observation before
    ``before_epoch``, from the records, so a resumed run compares with what was recorded."""
    run = as_run_dir(run_dir)
    earlier = sorted(e for e in run.spectra_files() if e < int(before_epoch))
    if not earlier:
        return {}, {}

    def read(epoch: int) -> dict[str, tuple[np.ndarray, int]]:
        points = _load_npz(run.spectra(epoch), DEFAULT_VIEW, ("eigenvectors", "components_90"))
        return {
            p: (a["eigenvectors"], int(a["components_90"]))
            for p, a in points.items()
            if "eigenvectors" in a and "components_90" in a
        }

    return read(earlier[0]), read(earlier[-1])


def load_spectra(
    run_dir: RunPath,
    epochs: Iterable[int] | None = None,
    *,
    view: str = DEFAULT_VIEW,
    arrays: Iterable[str] | None = None,
) -> dict[int, dict[str, dict[str, np.ndarray]]]:
    """The spectra of a run, ``{epoch: {point: {array: value}}}``; by default no jackknife replicates."""
    run = _require_records(run_dir)
    return {e: _load_npz(path, view, arrays) for e, path in _iter_spectra(run, epochs)}


def _describe(array: np.ndarray | None) -> str:
    """``dtype shape`` of an array for an error message, or ``missing``."""
    return "missing" if array is None else f"{array.dtype} {array.shape}"


_DAMAGED = "as tgo writes them (move the damaged file aside to report the other epochs)"


def _jackknife_metric_names(path: Path, names: np.ndarray | None) -> list[str]:
    """The file's `JACKKNIFE_METRICS` as strings, checked."""
    decoded: list[str] | None = None
    if names is not None and names.ndim == 1 and names.dtype.kind == "S":
        with contextlib.suppress(UnicodeDecodeError):
            decoded = [bytes(n).decode("ascii") for n in names.tolist()]
    if decoded is None or len(set(decoded)) != len(decoded):
        raise RecordsError(
            f"{path}: the jackknife metric names are damaged ({JACKKNIFE_METRICS} {_describe(names)}); expected "
            f"{JACKKNIFE_METRICS} ASCII bytes [M] of distinct names beside the jackknife arrays, {_DAMAGED}"
        )
    return decoded


def _read_replicates(path: Path, view: str, wanted: set[str] | None) -> dict[str, dict[str, np.ndarray]]:
    """``{metric: {point: float64 [G]}}`` of one spectra file and view, reading only the jackknife arrays."""
    names: np.ndarray | None = None
    found: dict[str, dict[str, np.ndarray]] = {}  # point -> {name in JACKKNIFE_ARRAYS: array}
    try:
        with np.load(path, allow_pickle=False) as data:
            for key in data.files:
                split = _split_key(key)
                if key == JACKKNIFE_METRICS:
                    names = data[key]
                elif split is not None and split[1] == view and split[2] in JACKKNIFE_ARRAYS:
                    found.setdefault(split[0], {})[split[2]] = data[key]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        raise RecordsError(
            f"{path}: unreadable spectra file ({type(err).__name__}: {err}); expected a complete .npz as tgo writes "
            "it (move the damaged file aside to report the other epochs)"
        ) from err
    if not found:
        return {}
    metrics = _jackknife_metric_names(path, names)
    m = len(metrics)
    checked: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for point, arrays in found.items():
        table, groups = arrays.get("jackknife"), arrays.get("jackknife_groups")
        if (
            table is None
            or groups is None
            or table.dtype != np.float64
            or table.ndim != 2
            or table.shape[0] != m
            or groups.dtype.kind not in "iu"
            or groups.shape != (m,)
            or np.any(groups < 0)
            or np.any(groups > table.shape[1])
        ):
            raise RecordsError(
                f"{path}: the jackknife arrays of point {point}, view {view} are damaged (jackknife "
                f"{_describe(table)}, jackknife_groups {_describe(groups)}, {m} {JACKKNIFE_METRICS}); expected "
                f"jackknife float64 [M, G] and jackknife_groups int64 [M] of at most G each, {_DAMAGED}"
            )
        checked[point] = table, groups
    out: dict[str, dict[str, np.ndarray]] = {}
    for i, metric in enumerate(metrics):
        if wanted is not None and metric not in wanted:
            continue
        for point, (table, groups) in checked.items():
            if groups[i] > 0:
                out.setdefault(metric, {})[point] = table[i, : int(groups[i])].copy()
    return out


def load_jackknife(
    run_dir: RunPath,
    *,
    view: str = DEFAULT_VIEW,
    metrics: Sequence[str] | None = None,
    epochs: Collection[int] | None = None,
) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The jackknife replicates of one view, ``{metric: {point: (epochs, replicates [E, G])}}``; numpy only.

    Every epoch and point shares the image groups, so a difference's stderr is ``jackknife_stderr(a[j] - b[k])``.
    ``epochs`` limits the files opened; a replicate count that changes between epochs is refused.
    """
    run = _require_records(run_dir)
    wanted = None if metrics is None else set(metrics)
    collected: dict[str, dict[str, dict[int, np.ndarray]]] = {}
    chosen = None if epochs is None else {int(e) for e in epochs}
    for epoch, path in run.spectra_files().items():
        if chosen is not None and epoch not in chosen:
            continue
        for metric, per_point in _read_replicates(path, view, wanted).items():
            for point, values in per_point.items():
                earlier = collected.setdefault(metric, {}).setdefault(point, {})
                if earlier:
                    first, first_values = next(iter(earlier.items()))
                    if first_values.size != values.size:
                        raise RecordsError(
                            f"{path}: {values.size} jackknife replicates of {metric} at point {point}, view {view}, "
                            f"but {first_values.size} in {run.spectra(first)}; the replicates of one run all come "
                            "from its image groups (was one of these epochs observed with other jackknife settings?)"
                        )
                earlier[epoch] = values
    return {
        metric: {
            point: (
                np.array(list(per_epoch), dtype=np.int64),
                np.stack(list(per_epoch.values())).astype(np.float64, copy=False),
            )
            for point, per_epoch in per_point.items()
        }
        for metric, per_point in collected.items()
    }
