"""The weights the ``weights`` family keeps between observations, for the relative update ``||W_t - W_prev||_F``.

The records hold geometry, not weights, so the previous observation's weights are kept beside them: one file per
observed epoch, ``<run>/geometry/weights/epoch_XXXXXX.npz``, written atomically by rank 0 (`tgo.records.atomic_write`)
and read back without pickle (``np.load(allow_pickle=False)``). Each holds, per recorded map, the weight exactly as the
observation saw it, in the training dtype (``<point>/<map>``: float32, float64, float16; a bfloat16 weight as its
uint16 bit pattern, named in the ``bfloat16`` entry, since numpy has no bfloat16; read back as the float32 or float64
copy the family measures, which holds every one of them exactly), the ``epoch`` it belongs to, a ``format`` marker
naming this module's layout and a ``digest`` of the maps as read back (BLAKE2b of names, dtypes, shapes and bytes).

**What is checked before the file is used** (`WeightHistory.load_previous`): it is read without pickle (a pickled or
truncated file is refused), carries the marker, the previous epoch and its digest (a map changed since, a transposed
one, is refused), each map has the shape and dtype of the model's weight and only finite values, and reproduces the
squared Frobenius norm the records hold for it at that epoch (stable rank x spectral norm^2 in ``metrics.csv``, to
1e-9): the kept weights of another run, or of another epoch renamed, do not. A file that fails is named in one
warning saying what is wrong and not used (the relative updates are NaN); it is never deleted.

**Which file is the previous observation's.** The previous observation of epoch ``e`` is the latest epoch ``< e``
that the records hold (`tgo.records.recorded_epochs`: rows in ``metrics.csv`` and a spectra file), and its weights are
the file of *that* epoch, or none (NaN relative updates). A file of an epoch the records do not hold (an observation
killed before its metrics were written, an epoch a resume set aside) is never read: when that epoch is observed again
its file is replaced. So a resumed run, an epoch re-observed after a crash and ``tgo.observe`` re-observing a
trajectory all compare with what the records say was observed before.

**What is kept.** After writing epoch ``e`` (`write_weights`), the files of epochs older than what re-observing ``e``
(after a crash between this file and the metrics) needs are deleted: its previous observation's and, for the step
angle (``observation.weights.step_angle``), the one before that. Only files that this module wrote (their name and
``format`` marker) are deleted, and only older ones; newer epochs' files (an offline re-observation of an old epoch)
are left. ``4 bytes x measured weights`` per file (2 for float16 or bfloat16 weights, 8 for float64): 86 MB for
ViT-S/16, 340 MB for ViT-B/16, three files at a time (two without the step angle; ``observation.weights.relative_update:
false`` keeps none).
"""

from __future__ import annotations

import hashlib
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tgo.records import SERIES, RunDir, RunPath, as_run_dir, atomic_write, read_metric_rows, recorded_epochs

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
_RESERVED = ("format", "epoch", "digest", "bfloat16")
_HALF = ("float16", "bfloat16")  # training dtypes kept at 2 bytes per weight (`_encode`)
_NORM_METRICS = ("weight_stable_rank", "weight_spectral_norm")  # ||W||_F^2 = stable rank x spectral norm^2


def weights_dir(run_dir: RunPath) -> Path:
    """``<run>/geometry/weights`` (the step series': ``<run>/geometry/steps/weights``, keyed by step)."""
    return as_run_dir(run_dir).folder(WEIGHTS_DIR)


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
        previous_path: The file named as the kept weights of ``previous_epoch`` (``None``: none); whether it is
            usable is decided when it is read (`load_previous`).
        recorded_norms: ``{"<point>/<map>": ||W||_F^2}`` of ``previous_epoch`` as this run recorded it (stable rank
            times squared spectral norm, from ``metrics.csv``): what the kept weights must reproduce to be the ones
            this run observed then.
        earlier_epoch, earlier_path, earlier_norms: The same of the recorded epoch before ``previous_epoch``, for
            the angle between the two latest steps (``observation.weights.step_angle``).
    """

    run_dir: RunDir
    epoch: int
    previous_epoch: int | None
    previous_path: Path | None
    recorded_norms: Mapping[str, float] = field(default_factory=dict)
    earlier_epoch: int | None = None
    earlier_path: Path | None = None
    earlier_norms: Mapping[str, float] = field(default_factory=dict)

    def load_previous(self, current: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """The previous observation's weights ``{"<point>/<map>": array}``, checked before any is used.

        The file is read without pickle, must carry the `WEIGHTS_FORMAT` marker and ``previous_epoch``, and each map
        in it must have the shape and dtype of this observation's copy in ``current`` (a transposed map, or one of
        another model, is refused), hold only finite values, and reproduce the squared Frobenius norm this run
        recorded for it at ``previous_epoch`` (to 1e-9, far below any training step; another run's weights do not).
        A file that fails any check is named in one warning, with what is wrong, and none of it is used: the
        relative updates are NaN then, the rest of the observation is unaffected. Maps absent from the file (a point
        added since) have no previous weights.

        Args:
            current: ``{"<point>/<map>": array}`` this observation's weights (``None``: shapes are not checked).

        Returns:
            ``{}`` when no file is kept or the file is refused.
        """
        return self._load(self.previous_path, self.previous_epoch, self.recorded_norms, current, "relative updates")

    def load_earlier(self, current: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """The weights of the observation before the previous one, checked as `load_previous` checks its file
        (``{}``: none kept, or refused in one warning; the step angles are NaN then)."""
        return self._load(self.earlier_path, self.earlier_epoch, self.earlier_norms, current, "step angles")

    def _load(
        self,
        path: Path | None,
        epoch: int | None,
        norms: Mapping[str, float],
        current: Mapping[str, np.ndarray] | None,
        what: str,
    ) -> dict[str, np.ndarray]:
        if path is None:
            return {}
        try:
            with np.load(path, allow_pickle=False) as npz:  # an object array raises: never unpickled
                loaded = {k: np.asarray(npz[k]) for k in npz.files}
            problem = _problem(loaded, current or {}, norms, epoch)
        except Exception as err:  # a truncated, pickled or otherwise damaged file: zipfile, ValueError, OSError, ...
            problem = f"not a readable npz of arrays ({type(err).__name__}: {err})"
        if problem is None:
            return loaded
        warnings.warn(
            f"[tgo] observation.weights: the kept weights {path} are not used: {problem}; the {what} of epoch "
            f"{self.epoch} are recorded as NaN",
            RuntimeWarning,
            stacklevel=3,
        )
        return {}


def _problem(
    loaded: Mapping[str, np.ndarray],
    current: Mapping[str, np.ndarray],
    norms: Mapping[str, float],
    epoch: int | None,
) -> str | None:
    """What makes a loaded kept-weights file unusable (one clause), or None; strips the reserved keys in place."""
    marker, held = loaded.get("format"), loaded.get("epoch")
    if marker is None or marker.shape != () or str(marker) != WEIGHTS_FORMAT:
        return f"no {WEIGHTS_FORMAT!r} format marker (not a file TGO wrote)"
    if held is None or held.shape != () or held.dtype.kind not in "iu" or int(held) != epoch:
        return f"it holds epoch {held!r}, not the previous recorded epoch {epoch}"
    assert isinstance(loaded, dict)
    digest = loaded.pop("digest", None)
    bfloat16 = loaded.get("bfloat16")
    for key in _RESERVED:
        loaded.pop(key, None)
    if (problem := _decode(loaded, bfloat16)) is not None:
        return problem
    for key, array in loaded.items():
        if key in current and array.shape != current[key].shape:
            return f"{key} has shape {array.shape}, expected {current[key].shape} (the model's weight)"
        if key in current and array.dtype != current[key].dtype:
            return f"{key} has dtype {array.dtype}, expected {current[key].dtype}"
        if array.dtype.kind != "f":
            return f"{key} has dtype {array.dtype}, expected float32 or float64"
        bad = int(array.size - np.count_nonzero(np.isfinite(array)))
        if bad:
            return f"{key} holds {bad} non-finite values of {array.size}"
    if digest is not None and (digest.shape != () or str(digest) != _digest(loaded)):  # of the decoded maps
        return "its arrays are not the ones written with it (the content digest differs: changed since)"
    for key, array in loaded.items():
        want = norms.get(key, math.nan)
        have = float(np.sum(np.square(array, dtype=np.float64)))
        if math.isfinite(want) and not math.isclose(have, want, rel_tol=1e-9):
            return (
                f"{key} has ||W||_F^2 = {have:.9g}, but this run recorded {want:.9g} at epoch {epoch} (the kept "
                "weights of another run, or changed since)"
            )
    return None


def _encode(weights: Mapping[str, np.ndarray], dtypes: Mapping[str, str]) -> dict[str, np.ndarray]:
    """The arrays to store: a map whose training dtype (``dtypes``) is float16 as float16, bfloat16 as the upper 16 bits
    of its float32 copy (uint16; listed under ``bfloat16``), each only where that is exact; any other as it is."""
    out: dict[str, np.ndarray] = {}
    bfloat16 = []
    for key, array in weights.items():
        array = np.asarray(array)
        kind = dtypes.get(key)
        if kind in _HALF and array.dtype == np.float32:
            if kind == "float16" and np.array_equal((half := array.astype(np.float16)).astype(np.float32), array):
                out[key] = half
                continue
            bits = array.view(np.uint32)
            if kind == "bfloat16" and not np.any(bits & np.uint32(0xFFFF)):
                out[key] = (bits >> np.uint32(16)).astype(np.uint16)
                bfloat16.append(key)
                continue
        out[key] = array
    if bfloat16:
        out["bfloat16"] = np.asarray(bfloat16)
    return out


def _decode(loaded: dict[str, np.ndarray], bfloat16: np.ndarray | None) -> str | None:
    """Turns stored float16 and bfloat16 maps back into the float32 copies the family measures, in place (exact);
    what makes the ``bfloat16`` entry unusable (one clause), or None."""
    if bfloat16 is not None:
        if bfloat16.ndim != 1 or bfloat16.dtype.kind != "U":
            return f"its bfloat16 entry is {bfloat16.dtype} {bfloat16.shape}, expected a list of map names"
        for key in (str(k) for k in bfloat16):
            bits = loaded.get(key)
            if bits is None or bits.dtype != np.uint16:
                return f"{key} is listed as bfloat16 but holds {None if bits is None else bits.dtype}, expected uint16"
            loaded[key] = (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    for key, array in loaded.items():
        if array.dtype == np.float16:
            loaded[key] = array.astype(np.float32)
    return None


def _digest(weights: Mapping[str, np.ndarray]) -> str:
    """BLAKE2b of every map's name, dtype, shape and bytes, in name order: written with the weights, checked when
    they are read, so a map changed in place since (transposed, edited, bytes flipped) is not used."""
    h = hashlib.blake2b(digest_size=32)
    for key in sorted(weights):
        array = np.ascontiguousarray(weights[key])
        h.update(f"{key}|{array.dtype.str}|{array.shape}|".encode())
        h.update(array.data.cast("B"))  # the bytes, without a copy
    return h.hexdigest()


def _recorded_norms(rows: Sequence[Mapping[str, str]], key: str, epoch: int | None) -> dict[str, float]:
    """``{"<point>/<map>": stable rank x spectral norm^2}`` of one recorded epoch (the squared Frobenius norm)."""
    if epoch is None:
        return {}
    found: dict[tuple[str, str], dict[str, float]] = {}
    for row in rows:
        view = row.get("view", "")
        if row.get(key) == str(epoch) and view.startswith("weights_") and row.get("metric") in _NORM_METRICS:
            try:
                found.setdefault((row["point"], view), {})[row["metric"]] = float(row["value"])
            except (KeyError, ValueError):
                continue
    return {
        f"{point}/{view.removeprefix('weights_')}": m["weight_stable_rank"] * m["weight_spectral_norm"] ** 2
        for (point, view), m in found.items()
        if len(m) == 2
    }


def read_weight_history(run_dir: RunPath, epoch: int) -> WeightHistory:
    """The `WeightHistory` of an observation of ``epoch`` in ``run_dir`` (reads ``metrics.csv``, not the weights;
    in the step series ``epoch`` is the optimizer step)."""
    root = as_run_dir(run_dir)
    rows = read_metric_rows(root) if root.metrics.is_file() else []
    before = [e for e in recorded_epochs(root) if e < int(epoch)] if rows else []
    previous = before[-1] if before else None
    earlier = before[-2] if len(before) >= 2 else None
    files = weight_files(root)  # each checked when it is read (`WeightHistory.load_previous`, `load_earlier`)
    return WeightHistory(
        root,
        int(epoch),
        previous,
        files.get(previous) if previous is not None else None,
        _recorded_norms(rows, root.key, previous),
        earlier,
        files.get(earlier) if earlier is not None else None,
        _recorded_norms(rows, root.key, earlier),
    )


def write_weights(
    history: WeightHistory,
    weights: Mapping[str, np.ndarray],
    *,
    keep_earlier: bool = False,
    dtypes: Mapping[str, str] | None = None,
) -> Path | None:
    """Writes this observation's weights (atomically) and deletes TGO's files older than what is still needed.

    Args:
        history: This observation's `WeightHistory` (run directory, epoch, previous observation).
        weights: ``{"<point>/<map>": array}``, exact copies.
        keep_earlier: Keep the earlier observation's file too (the step angle: re-observing this epoch after a
            crash needs the two observations before it).
        dtypes: ``{"<point>/<map>": training dtype}`` (``"float16"``, ``"bfloat16"``: kept at 2 bytes per weight;
            any other or none: as given).

    Returns:
        The file written (``None``: a file of that name that TGO did not write is in the way, or ``weights/`` is a
        file or a symbolic link, said in a warning).
    """
    arrays: dict[str, np.ndarray] = {
        "format": np.asarray(WEIGHTS_FORMAT),
        "epoch": np.asarray(history.epoch, dtype=np.int64),
    }
    for key in weights:
        if key in _RESERVED:
            raise ValueError(f"write_weights: {key!r} is a reserved name")
    arrays.update(_encode(weights, dtypes or {}))
    arrays["digest"] = np.asarray(_digest({k: np.asarray(v) for k, v in weights.items()}))  # of what is read back
    path = _weights_file(history.run_dir, history.epoch)
    where = path.parent
    if where.is_symlink() or (where.exists() and not where.is_dir()):  # never write into, or through, what is there
        warnings.warn(
            f"[tgo] observation.weights: {where} is {'a link' if where.is_symlink() else 'a file'}, not the directory "
            f"TGO keeps weights in; it is left as it is and epoch {history.epoch}'s weights are not kept (the next "
            "relative update is NaN)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    if path.exists() and not _is_ours(path, history.epoch):  # never replace a file TGO did not write
        warnings.warn(
            f"[tgo] observation.weights: {path} is not TGO's kept weights of epoch {history.epoch}; it is left as it "
            "is and this observation's weights are not kept (the next relative update is NaN)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    atomic_write(path, lambda fh: np.savez(fh, **arrays))  # type: ignore[arg-type]
    needed = [history.epoch]
    if history.previous_path is not None and history.previous_epoch is not None:
        needed.append(history.previous_epoch)
    if keep_earlier and history.earlier_path is not None and history.earlier_epoch is not None:
        needed.append(history.earlier_epoch)
    kept_from = min(needed)
    for epoch, old in weight_files(history.run_dir, verified=True).items():
        if epoch < kept_from:
            old.unlink(missing_ok=True)
    return path
