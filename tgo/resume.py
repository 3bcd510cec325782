"""Where a run starts again after a kill, a preemption or a requeue, with records that agree with its checkpoint.

Records are written before ``last.ckpt``, so the checkpoint is the truth: records it does not list as observed are set
aside (moved to ``<run>/set_aside/<UTC time>/`` with a ``REASON.txt``) and observed again, and a directory killed
before its first checkpoint is set aside whole, so no requeue needs a human. A resume that cannot be this run's is
refused in one line before anything is moved (`ResumeError`).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import pickle
import shutil
import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tgo.errors import ConfigError
from tgo.records import METRICS_COLUMNS, RunDir, atomic_write, read_metric_rows
from tgo.safe_load import UnsafeCheckpointError, load_weights_only

if TYPE_CHECKING:
    import torch


def rank_zero_info(message: str) -> None:
    """Lightning's ``rank_zero_info``, imported on first use so input errors print before Lightning is imported."""
    from lightning.pytorch.utilities import rank_zero_info as info

    info(message)


def rank_zero_warn(message: str, category: type[Warning] = UserWarning) -> None:
    """Lightning's ``rank_zero_warn``, imported on first use; ``stacklevel`` one higher for this wrapper's frame."""
    from lightning.pytorch.utilities import rank_zero_warn as warn

    warn(message, stacklevel=5, category=category)


SET_ASIDE = RunDir.SET_ASIDE
GEOMETRY_CALLBACK = "SpectralGeometryCallback"
HPC_PREFIX = "hpc_ckpt_"  # Lightning's SLURM requeue checkpoints, in the run directory (its default_root_dir)

RUN_ID_KEY = "tgo_run_id"
"""The checkpoint entry naming the training whose weights it holds: a random id drawn at a fresh start, also in
``geometry/run.json`` (`RUN_ID_FILE`); a resume compares the two (`check_same_run`)."""
RUN_ID_FILE = "run.json"


class ResumeError(ConfigError):
    """A resume that cannot continue this run; raised before anything is set aside."""


def run_id_path(run: RunDir) -> Path:
    """``geometry/run.json``: the run id of the training whose records ``geometry/`` holds."""
    return run.epoch_series.geometry / RUN_ID_FILE


def new_run_id() -> str:
    """A fresh random run id."""
    return uuid.uuid4().hex


def recorded_run_id(run: RunDir) -> str | None:
    """The run id in ``geometry/run.json`` (``None``: a run older than run ids); a file TGO did not write is refused."""
    path = run_id_path(run)
    if not path.is_file():
        return None
    try:
        stamp = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ResumeError(f"{path}: unreadable ({err}); expected the run id TGO writes there") from err
    run_id = stamp.get("run_id") if isinstance(stamp, dict) else None
    if not isinstance(run_id, str) or not run_id:
        raise ResumeError(f"{path}: holds no run id; expected the JSON object TGO writes there")
    return run_id


def record_run_id(run: RunDir, run_id: str) -> None:
    """Writes ``geometry/run.json`` (atomically) unless it already names ``run_id``."""
    if recorded_run_id(run) != run_id:
        atomic_write(run_id_path(run), json.dumps({"tgo": "run id", "run_id": run_id}) + "\n")


def check_same_run(run: RunDir, checkpoint: str | Path, checkpoint_run_id: str | None) -> None:
    """Refuses a checkpoint of another training than ``run``'s, in one line; a missing id on either side passes."""
    recorded = recorded_run_id(run)
    if recorded is None or checkpoint_run_id is None or recorded == checkpoint_run_id:
        return
    raise ResumeError(
        f"ckpt_path: '{checkpoint}' holds the weights of another training (run id {checkpoint_run_id[:12]}) than the "
        f"one recorded in '{run.root}' (run id {recorded[:12]}, {run_id_path(run).relative_to(run.root)}): resuming "
        "would continue these records with another run's weights; expected one of this run's checkpoints (or a new "
        "directory for that training); nothing was moved"
    )


def check_fits_model(state: dict[str, Any], model: torch.nn.Module, checkpoint: str | Path) -> None:
    """Refuses, in one line and before anything moves, a checkpoint whose state dict does not fit ``model``."""
    from tgo.checkpoints import state_dict_mismatch

    weights = state.get("state_dict")
    problem = (
        state_dict_mismatch(model.state_dict(), weights)
        if isinstance(weights, dict)
        else "it has no state_dict of weights"
    )
    if problem:
        raise ResumeError(
            f"ckpt_path: '{checkpoint}' does not fit this run's model ({problem}); expected a checkpoint of the same "
            "model (the model settings of the run's config.yaml); nothing was moved"
        )


def _new_set_aside_dir(run: RunDir, reason: str) -> Path:
    """A fresh ``set_aside/<UTC time>[-n]/`` with ``REASON.txt``."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H-%M-%SZ")
    base = run.root / SET_ASIDE / stamp
    target, n = base, 1
    while target.exists():
        target, n = base.with_name(f"{stamp}-{n}"), n + 1
    target.mkdir(parents=True)
    atomic_write(target / "REASON.txt", reason.rstrip() + "\n")
    return target


def set_aside_attempt(run: RunDir, reason: str) -> Path | None:
    """Moves aside what an attempt without a usable checkpoint wrote; returns where (``None``: nothing to move)."""
    parts = [p for p in (run.geometry, run.tensorboard, run.checkpoints) if p.exists()]
    if not parts:
        return None
    target = _new_set_aside_dir(run, reason)
    for part in parts:
        shutil.move(str(part), str(target / part.name))
    rank_zero_info(f"[tgo] set aside {', '.join(p.name for p in parts)} in {target} ({reason})")
    return target


def set_aside_epochs(run: RunDir, epochs: Iterable[int], reason: str) -> Path | None:
    """Moves the records of ``epochs`` aside, rows copied before ``metrics.csv`` loses them (a kill keeps both)."""
    epochs = sorted(set(int(e) for e in epochs))
    rows = read_metric_rows(run)
    moving_rows = [r for r in rows if int(r[run.key]) in epochs]
    moving_files = [run.spectra(e) for e in epochs if run.spectra(e).is_file()]
    if not moving_rows and not moving_files:
        return None
    target = _new_set_aside_dir(run, reason)
    geometry = target / run.geometry.relative_to(run.root)
    (geometry / RunDir.SPECTRA).mkdir(parents=True)
    if moving_rows:
        atomic_write(geometry / RunDir.METRICS, _csv(moving_rows))
        atomic_write(run.metrics, _csv([r for r in rows if int(r[run.key]) not in epochs]))
    for path in moving_files:
        shutil.move(str(path), str(geometry / RunDir.SPECTRA / path.name))
    rank_zero_info(f"[tgo] set aside the records of {run.key}(s) {epochs} in {target} ({reason})")
    return target


def _csv(rows: list[dict[str, str]]) -> str:
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=METRICS_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def _load_lazily(checkpoint: str | Path, *, label: str | None = None) -> dict[str, Any]:
    """A checkpoint's entries, tensors memory-mapped, read with ``weights_only=True`` (`tgo.safe_load`)."""
    label = label or f"ckpt_path: '{checkpoint}'"
    state = load_weights_only(checkpoint, label=label)
    if not isinstance(state, dict):
        raise ConfigError(
            f"{label} holds a {type(state).__name__}, not a Lightning checkpoint; expected a checkpoint written by "
            "tgo.train"
        )
    return state


def check_checkpoint(checkpoint: str | Path) -> None:
    """Stops a start from ``checkpoint`` with one line if TGO refuses to read it; cheap, so it comes first."""
    _load_lazily(checkpoint)


def observed_in_checkpoint(checkpoint: str | Path) -> list[int] | None:
    """The epochs the geometry callback had observed at the save, the one in flight included (``None``: none)."""
    return observed_in_state(_load_lazily(checkpoint))


def observed_in_state(state: dict[str, Any]) -> list[int] | None:
    """`observed_in_checkpoint` of a loaded checkpoint."""
    for key, value in (state.get("callbacks") or {}).items():
        if GEOMETRY_CALLBACK in str(key) and isinstance(value, dict):
            epochs = [*value.get("observed_epochs", []), *value.get("pending_epochs", [])]
            return sorted({int(e) for e in epochs})
    return None


def _on_disk(run: RunDir) -> set[int]:
    """The keys (epochs, or steps of the step series) with any record on disk: rows or a spectra file."""
    return {int(r[run.key]) for r in read_metric_rows(run)} | set(run.spectra_files())


@dataclass(frozen=True)
class NewerRecords:
    """What a resume from a checkpoint sets aside: epochs and steps recorded after it was saved."""

    epochs: list[int]
    steps: list[int]


def records_after(run: RunDir, observed: Collection[int] | None, *, epoch: int, step: int) -> NewerRecords:
    """The records on disk made after a checkpoint, of weights a resume from it retrains: epochs it does not list as
    observed (``observed=None``: every epoch after its ``epoch``), and every step-series record after its ``step``."""
    on_disk = _on_disk(run.epoch_series)
    epochs = sorted(on_disk - set(observed)) if observed is not None else sorted(e for e in on_disk if e > epoch)
    steps = sorted(s for s in _on_disk(run.step_series) if s > step)
    return NewerRecords(epochs, steps)


def check_resume_records(run: RunDir, newer: NewerRecords) -> None:
    """Refuses a resume keeping a duplicated ``metrics.csv`` row: which is the checkpoint's cannot be told."""
    for series, leaving in ((run.epoch_series, set(newer.epochs)), (run.step_series, set(newer.steps))):
        first: dict[tuple[str, str, str, str], int] = {}
        for line, row in enumerate(read_metric_rows(series), start=2):  # line 1 is the header
            if int(row[series.key]) in leaving:
                continue
            key = (row[series.key], row["point"], row["view"], row["metric"])
            if key in first:
                raise ResumeError(
                    f"{series.metrics}: line {line} repeats {series.key} {key[0]}, point {key[1]}, view {key[2]}, "
                    f"metric {key[3]} of line {first[key]}; a resume would carry both into the run (the report refuses "
                    "it); expected one row per observation: keep the one of this run, then resume; nothing was moved"
                )
            first[key] = line


def set_aside_records_after(run: RunDir, checkpoint: str | Path, newer: NewerRecords, *, step: int) -> None:
    """Sets aside the records ``newer`` of a resume from ``checkpoint``, with their reason."""
    name = Path(checkpoint).name
    for series, keys, why in (
        (run.epoch_series, newer.epochs, "(of weights after it); the resumed run retrains"),
        (run.step_series, newer.steps, f"(global step {step}); the resumed run retrains those steps"),
    ):
        if keys:
            set_aside_epochs(series, keys, f"recorded after {name} was saved {why} and observes them again")


def check_resume(run: RunDir, checkpoint: str | Path, model: torch.nn.Module | None = None) -> NewerRecords:
    """Every check that stops a resume, before anything is set aside; returns what the resume sets aside."""
    from tgo.checkpoints import checkpoint_epoch

    state = _load_lazily(checkpoint)
    if model is not None:
        check_fits_model(state, model, checkpoint)
    check_same_run(run, checkpoint, state.get(RUN_ID_KEY))
    epoch = checkpoint_epoch(state)[0] if "epoch" in state else 0
    newer = records_after(run, observed_in_state(state), epoch=epoch, step=int(state.get("global_step", 0)))
    check_resume_records(run, newer)
    return newer


def remove_stale_temporaries(run: RunDir) -> list[Path]:
    """Deletes the ``.<name>.<random>.tmp`` files a killed `tgo.records.atomic_write` left."""
    steps = run.step_series
    places = [run.geometry, run.spectra_dir, steps.geometry, steps.spectra_dir, run.checkpoints, run.root]
    stale = [p for place in places if place.is_dir() for p in place.glob(".*.tmp") if p.is_file()]
    for path in stale:
        path.unlink()
    if stale:
        rank_zero_info(f"[tgo] removed {len(stale)} incomplete temporary file(s) a killed run left in {run.root}")
    return stale


def set_aside_newer_checkpoints(run: RunDir, checkpoint: str | Path) -> list[Path]:
    """Sets aside checkpoints saved after ``checkpoint`` (a ``best_epoch_*.ckpt`` of retrained weights)."""
    restored = Path(checkpoint).resolve()
    step = int(_load_lazily(restored).get("global_step", 0))
    newer = []
    for path in sorted(run.checkpoints.glob("*.ckpt")) if run.checkpoints.is_dir() else []:
        if path.resolve() == restored:
            continue
        try:
            other = int(_load_lazily(path, label=str(path)).get("global_step", 0))
        except UnsafeCheckpointError as err:  # not TGO's, and never run: left where it is
            rank_zero_warn(f"[tgo] resume: skipped {err}; it is left where it is and not used", category=RuntimeWarning)
            continue
        except (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError):  # unreadable: not used, left
            continue
        if other > step:
            newer.append(path)
    if newer:
        target = _new_set_aside_dir(
            run, f"saved after {restored.name} (global step {step}); the resumed run retrains those weights"
        )
        (target / RunDir.CHECKPOINTS).mkdir()
        for path in newer:
            shutil.move(str(path), str(target / RunDir.CHECKPOINTS / path.name))
        rank_zero_info(f"[tgo] set aside {len(newer)} checkpoint(s) newer than {restored.name} in {target}")
    return newer


def newest_checkpoint(run: RunDir) -> Path | None:
    """The newest (by modification time) of ``last.ckpt`` and Lightning's SLURM ``hpc_ckpt_<n>.ckpt``."""
    candidates = [p for p in run.root.glob(f"{HPC_PREFIX}*.ckpt") if p.is_file()]
    if run.last_checkpoint.is_file():
        candidates.append(run.last_checkpoint)
    return max(candidates, key=lambda p: p.stat().st_mtime_ns, default=None)


@dataclass(frozen=True)
class StartPlan:
    """How a launch starts: from ``checkpoint`` (``None``: scratch), ``start_over`` saying why."""

    checkpoint: str | None
    start_over: str | None = None

    def prepare(self, run: RunDir, checkpoint_file: str | None) -> None:
        """Sets aside what this start replaces: rank 0, after every input check, just before training."""
        if self.start_over is None and checkpoint_file is None:
            return
        if self.start_over is None and checkpoint_file is not None:
            check_checkpoint(checkpoint_file)  # a refused checkpoint stops the start before anything is removed
        remove_stale_temporaries(run)
        if self.start_over is not None:
            rank_zero_info(f"[tgo] {self.start_over}")
            set_aside_attempt(run, self.start_over)
        elif checkpoint_file is not None:
            set_aside_newer_checkpoints(run, checkpoint_file)


def plan_start(requested: str | None, run: RunDir, *, requeued: bool) -> StartPlan:
    """Chooses where this launch starts: a SLURM requeue resumes from the newest checkpoint; ``ckpt_path=last`` (or a
    requeue) without a checkpoint starts over, setting aside what an earlier attempt wrote."""
    started = run.looks_like_run()
    if requested is None and requeued and started:
        newest = newest_checkpoint(run)
        if newest is not None:
            return StartPlan(str(newest))
        return StartPlan(None, start_over="SLURM requeued the job before its first checkpoint was written")
    if requested == "last" and not run.last_checkpoint.is_file():
        # Also where nothing of tgo's is there yet: a kill during start-up leaves only Hydra's files (or no
        # directory), and the relaunch must still go on. A mistyped directory then starts a new run there.
        why = "was stopped before its first checkpoint" if started else "holds no checkpoint (nothing was saved yet)"
        return StartPlan(None, start_over=f"ckpt_path=last, but {run.root} {why}: starting it from scratch")
    return StartPlan(requested)


class ChangedAnalysisSubsetError(ConfigError):
    """A resumed run would observe other images (or the same keys with other content) than its earlier epochs."""


def check_same_analysis_subset(run: RunDir, current: dict[str, Any]) -> None:
    """Stops a resume whose analysis subset differs from the run's ``analysis_subset.json`` (no manifest yet passes)."""
    if not run.manifest.is_file():
        return
    try:
        earlier = json.loads(run.manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # ValueError: not JSON, or not UTF-8
        raise ChangedAnalysisSubsetError(
            f"{run.manifest}: unreadable ({err}); expected the run's own manifest to check the resumed subset against"
        ) from err
    changes = []
    for field in ("source", "class_names"):
        if earlier.get(field) != current.get(field):
            changes.append(f"{field} {_short(earlier.get(field))} then, {_short(current.get(field))} now")
    size_then = (earlier.get("source_info") or {}).get("image_size")
    size_now = (current.get("source_info") or {}).get("image_size")
    if size_then != size_now:
        changes.append(f"image size {size_then} then, {size_now} now")
    then = {(i["key"], i["label"]): i.get("sha256") for i in earlier.get("items", [])}
    now = {(i["key"], i["label"]): i.get("sha256") for i in current.get("items", [])}
    removed, added = sorted(then.keys() - now.keys()), sorted(now.keys() - then.keys())
    content = sorted(k for k in then.keys() & now.keys() if then[k] and now[k] and then[k] != now[k])
    if removed or added:
        example = (removed or added)[0][0]
        changes.append(
            f"{len(then)} images then, {len(now)} now ({len(removed)} left out, {len(added)} new, e.g. {example!r})"
        )
    if content:
        changes.append(f"{len(content)} image(s) changed on disk, e.g. {content[0][0]!r}")
    if changes:
        raise ChangedAnalysisSubsetError(
            f"resume: the analysis subset differs from the run's own {run.manifest}: {'; '.join(changes)}; expected "
            "the data settings the run started with (or start a new run for the new subset)"
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."
