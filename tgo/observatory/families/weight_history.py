"""The weights the ``weights`` family keeps between observations, for the relative update ``||W_t - W_prev||_F``.

The records hold geometry, not weights, so the previous observation's weights are kept beside them: one file per
observed epoch, ``<run>/geometry/weights/epoch_XXXXXX.npz``, written atomically by rank 0 (`tgo.records.atomic_write`)
and read back without pickle (``np.load(allow_pickle=False)``). Each holds, per recorded map, the weight exactly as the
observation saw it (``<point>/<map>``: float32 for float32/bfloat16/float16 weights, which float32 holds exactly;
float64 for float64 weights), the ``epoch`` it belongs to and a ``format`` marker naming this module's layout.

**Which file is the previous observation's.** The previous observation of epoch ``e`` is the latest epoch ``< e``
that the records hold (`tgo.records.recorded_epochs`: rows in ``metrics.csv`` and a spectra file), and its weights are
the file of *that* epoch, or none (NaN relative updates). A file of an epoch the records do not hold (an observation
killed before its metrics were written, an epoch a resume set aside) is never read: when that epoch is observed again
its file is replaced. So a resumed run, an epoch re-observed after a crash and ``tgo.observe`` re-observing a
trajectory all compare with what the records say was observed before.

**What is kept.** After writing epoch ``e`` (`write_weights`), the files of epochs older than both ``e`` and the
previous observation it was compared with are deleted: those two are what re-observing ``e`` (after a crash between
this file and the metrics) and observing the next epoch need. Only files that this module wrote (their name and
``format`` marker) are deleted, and only older ones; newer epochs' files (an offline re-observation of an old epoch)
are left. About ``4 bytes x weights`` per file: 85 MB for ViT-S/16, 340 MB for ViT-B/16, two files at a time
(``observation.weights.relative_update: false`` keeps none).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tgo.records import SERIES, RunDir, RunPath, as_run_dir, atomic_write, recorded_epochs

__all__ = [
    "WEIGHTS_DIR",
    "WEIGHTS_FORMAT",
    "WeightHistory",
    "read_weight_history",
    "weight_files",
    "weights_dir",
    "write_weights",
]

WEIGHTS_DIR = "weights"
"""The directory under ``geometry/`` that holds the kept weights."""

WEIGHTS_FORMAT = "tgo-weights-1"
"""The ``format`` marker of every file this module writes (a file without it is not TGO's and is never touched)."""

_FILE_RE = {series: re.compile(rf"^{series}_(\d{{6,}})\.npz$") for series in SERIES}  # the key of each series
_RESERVED = ("format", "epoch")


def weights_dir(run_dir: RunPath) -> Path:
    """``<run>/geometry/weights`` (the step series': ``<run>/geometry/steps/weights``, keyed by step)."""
    return as_run_dir(run_dir).geometry / WEIGHTS_DIR


def _weights_file(run_dir: RunPath, epoch: int) -> Path:
    """``epoch_XXXXXX.npz`` (the step series: ``step_XXXXXX.npz``)."""
    return weights_dir(run_dir) / f"{as_run_dir(run_dir).key}_{int(epoch):06d}.npz"


def weight_files(run_dir: RunPath, *, verified: bool = False) -> dict[int, Path]:
    """``{epoch: path}`` of the files named as this module names them (``epoch_XXXXXX.npz``), ascending; with
    ``verified`` only those that carry its ``format`` marker and their own epoch (each opened, nothing unpickled)."""
    where = weights_dir(run_dir)
    if not where.is_dir():
        return {}
    found = {}
    for path in where.iterdir():
        match = _FILE_RE[as_run_dir(run_dir).key].match(path.name)
        if match and path.is_file():
            found[int(match.group(1))] = path
    if verified:
        found = {epoch: path for epoch, path in found.items() if _is_ours(path, epoch)}
    return dict(sorted(found.items()))


def _is_ours(path: Path, epoch: int | None = None) -> bool:
    """Whether ``path`` is a file this module wrote (of ``epoch``, if given): an npz with its marker."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            if "format" not in npz.files or str(npz["format"]) != WEIGHTS_FORMAT:
                return False
            return epoch is None or ("epoch" in npz.files and int(npz["epoch"]) == int(epoch))
    except (OSError, ValueError, KeyError, EOFError):
        return False
    except Exception:  # a damaged zip raises zipfile.BadZipFile and others: not ours either way
        return False


@dataclass(frozen=True)
class WeightHistory:
    """What the family knows, on rank 0, of the observation before this one.

    Attributes:
        run_dir: The run directory (where this observation's weights are written).
        epoch: This observation's epoch.
        previous_epoch: The latest recorded epoch before it (``None``: none).
        previous_path: The kept weights of ``previous_epoch`` (``None``: not kept).
    """

    run_dir: RunDir
    epoch: int
    previous_epoch: int | None
    previous_path: Path | None

    def load_previous(self) -> dict[str, np.ndarray]:
        """The previous observation's weights ``{"<point>/<map>": array}`` (empty: none kept, or unreadable, which is
        said in one warning: the relative updates are NaN then, the rest of the observation is unaffected)."""
        if self.previous_path is None:
            return {}
        try:
            with np.load(self.previous_path, allow_pickle=False) as npz:
                if str(npz["format"]) != WEIGHTS_FORMAT or int(npz["epoch"]) != self.previous_epoch:
                    raise ValueError(f"not the {WEIGHTS_FORMAT} weights of epoch {self.previous_epoch}")
                return {k: np.asarray(npz[k]) for k in npz.files if k not in _RESERVED}
        except Exception as err:  # a damaged or foreign file: say so once, record NaN
            warnings.warn(
                f"[tgo] observation.weights: cannot read the kept weights {self.previous_path} ({err}); the relative "
                f"updates of epoch {self.epoch} are recorded as NaN",
                RuntimeWarning,
                stacklevel=2,
            )
            return {}


def read_weight_history(run_dir: RunPath, epoch: int) -> WeightHistory:
    """The `WeightHistory` of an observation of ``epoch`` in ``run_dir`` (reads ``metrics.csv``, not the weights;
    in the step series ``epoch`` is the optimizer step)."""
    root = as_run_dir(run_dir)
    earlier = [e for e in recorded_epochs(root) if e < int(epoch)] if root.metrics.is_file() else []
    previous = earlier[-1] if earlier else None
    path = weight_files(root, verified=True).get(previous) if previous is not None else None
    return WeightHistory(root, int(epoch), previous, path)


def write_weights(history: WeightHistory, weights: Mapping[str, np.ndarray]) -> Path | None:
    """Writes this observation's weights (atomically) and deletes TGO's files older than what is still needed.

    Args:
        history: This observation's `WeightHistory` (run directory, epoch, previous observation).
        weights: ``{"<point>/<map>": array}``, exact copies.

    Returns:
        The file written (``None``: a file of that name that TGO did not write is in the way, said in a warning).
    """
    arrays: dict[str, np.ndarray] = {
        "format": np.asarray(WEIGHTS_FORMAT),
        "epoch": np.asarray(history.epoch, dtype=np.int64),
    }
    for key, array in weights.items():
        if key in _RESERVED:
            raise ValueError(f"write_weights: {key!r} is a reserved name")
        arrays[key] = np.asarray(array)
    path = _weights_file(history.run_dir, history.epoch)
    if path.exists() and not _is_ours(path, history.epoch):  # never replace a file TGO did not write
        warnings.warn(
            f"[tgo] observation.weights: {path} is not TGO's kept weights of epoch {history.epoch}; it is left as it "
            "is and this observation's weights are not kept (the next relative update is NaN)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    atomic_write(path, lambda fh: np.savez(fh, **arrays))  # type: ignore[arg-type]
    previous = history.previous_epoch if history.previous_path is not None else None
    kept_from = history.epoch if previous is None else previous
    for epoch, old in weight_files(history.run_dir, verified=True).items():
        if epoch < kept_from:
            old.unlink(missing_ok=True)
    return path
