"""Where a run starts again after a kill, a preemption or a requeue, with records that agree with its checkpoint.

A run's records (``geometry/``) and its checkpoint are written at different moments of an epoch's end: the records
first, then ``last.ckpt``. A kill between the two leaves records of an epoch whose weights were thrown away; the
resumed run retrains that epoch, and the old records would stand for weights that no longer exist. The checkpoint
is the truth: records of epochs it does not list as observed are *set aside* (moved, never deleted) and observed
again. A directory killed before its first checkpoint is set aside as a whole and started from scratch, so neither
``ckpt_path=last`` nor a SLURM requeue needs a human.

Set-aside files go to ``<run>/set_aside/<UTC time>/`` with a ``REASON.txt`` saying why.

The step series (``geometry/steps/``, ``observation.early``) is keyed by the optimizer step, so its rule is the
checkpoint's global step: an observation of a later step was made of weights the resumed run retrains, and is set
aside the same way (`reconcile_step_records`).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import pickle
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tgo.errors import ConfigError
from tgo.records import METRICS_COLUMNS, RunDir, atomic_write, read_metric_rows
from tgo.safe_load import UnsafeCheckpointError, load_weights_only


def rank_zero_info(message: str) -> None:
    """Lightning's ``rank_zero_info``, imported on first use: ``tgo.train`` imports this module, and its input
    errors (config, run directory) are printed before Lightning (seconds to import) is needed."""
    from lightning.pytorch.utilities import rank_zero_info as info

    info(message)


def rank_zero_warn(message: str, category: type[Warning] = UserWarning) -> None:
    """Lightning's ``rank_zero_warn``, imported on first use (`rank_zero_info`); ``stacklevel`` one above its default
    4 for this wrapper's frame, so the warning names the line that calls this, as a direct call's would."""
    from lightning.pytorch.utilities import rank_zero_warn as warn

    warn(message, stacklevel=5, category=category)


SET_ASIDE = RunDir.SET_ASIDE
GEOMETRY_CALLBACK = "SpectralGeometryCallback"
HPC_PREFIX = "hpc_ckpt_"  # Lightning's SLURM requeue checkpoints, in the run directory (its default_root_dir)


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
    """Moves what an attempt without a usable checkpoint wrote (records, TensorBoard events, checkpoints) aside.

    Returns:
        The set-aside directory, or ``None`` when there was nothing to move.
    """
    parts = [p for p in (run.geometry, run.tensorboard, run.checkpoints) if p.exists()]
    if not parts:
        return None
    target = _new_set_aside_dir(run, reason)
    for part in parts:
        shutil.move(str(part), str(target / part.name))
    rank_zero_info(f"[tgo] set aside {', '.join(p.name for p in parts)} in {target} ({reason})")
    return target


def set_aside_epochs(run: RunDir, epochs: Iterable[int], reason: str) -> Path | None:
    """Moves the records of ``epochs`` aside: their spectra files and their rows of ``metrics.csv`` (of ``run``'s
    series: in the step series ``epochs`` are steps, moved to ``<set aside>/geometry/steps/``).

    The set-aside rows are written to ``<set aside>/geometry/metrics.csv`` before ``metrics.csv`` is rewritten
    without them (atomically), so a kill in between leaves them in both places, never in neither.
    """
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
    """A checkpoint's entries with its tensors memory-mapped, not read: only small entries are looked at here.

    Read with ``weights_only=True`` (`tgo.safe_load`), so no file's pickled code ever runs.

    Args:
        checkpoint: The file.
        label: How an error names it (default ``ckpt_path: '<file>'``: the checkpoint a resume starts from).

    Raises:
        UnsafeCheckpointError: the file needs a global outside the weights-only set, named in the one-line message
            (`tgo.train` prints it and exits with status 2).
        ConfigError: the file holds something other than a checkpoint's entries.
    """
    label = label or f"ckpt_path: '{checkpoint}'"
    state = load_weights_only(checkpoint, label=label)
    if not isinstance(state, dict):
        raise ConfigError(
            f"{label} holds a {type(state).__name__}, not a Lightning checkpoint; expected a checkpoint written by "
            "tgo.train"
        )
    return state


def check_checkpoint(checkpoint: str | Path) -> None:
    """Stops a start from ``checkpoint`` with one line if TGO refuses to read it (`_load_lazily`): cheap (its tensors
    are memory-mapped, not read), so it can come before any data is read or anything is moved."""
    _load_lazily(checkpoint)


def observed_in_checkpoint(checkpoint: str | Path) -> list[int] | None:
    """The epochs the geometry callback had observed when ``checkpoint`` was saved (``None``: no such callback).

    An epoch whose summary was still in flight (``pending_epochs``, `observation.summary.background`) counts: it
    observed the checkpoint's own weights, so records of it written after the checkpoint are that checkpoint's, not
    newer ones; if the run died before they were written, the resumed run observes that epoch again.
    """
    state = _load_lazily(checkpoint)
    for key, value in (state.get("callbacks") or {}).items():
        if GEOMETRY_CALLBACK in str(key) and isinstance(value, dict):
            epochs = [*value.get("observed_epochs", []), *value.get("pending_epochs", [])]
            return sorted({int(e) for e in epochs})
    return None


def reconcile_records(run: RunDir, checkpoint: str | Path) -> list[int]:
    """Sets aside the records of every epoch that ``checkpoint`` does not list as observed; returns those epochs.

    Such records were written after the checkpoint was saved (the kill came between the records and the next
    checkpoint), so they describe weights the resumed run is about to retrain: that epoch is observed again.
    """
    observed = observed_in_checkpoint(checkpoint)
    if observed is None:
        return []
    on_disk = {int(r["epoch"]) for r in read_metric_rows(run.root)} | set(run.spectra_files())
    newer = sorted(on_disk - set(observed))
    if newer:
        set_aside_epochs(
            run,
            newer,
            f"recorded after {Path(checkpoint).name} was saved (it lists epochs {observed} as observed); the "
            "resumed run retrains and observes them again",
        )
    return newer


def reconcile_step_records(run: RunDir, checkpoint: str | Path) -> list[int]:
    """Sets aside the step series' records of steps after ``checkpoint``'s global step; returns those steps.

    An observation at step ``s`` is of the weights after ``s`` optimizer steps; a checkpoint at global step ``g``
    descends from every one with ``s <= g``, and the resumed run retrains the steps after ``g`` (and observes them
    again when due).
    """
    steps = run.step_series
    step = int(_load_lazily(checkpoint).get("global_step", 0))
    on_disk = {int(r["step"]) for r in read_metric_rows(steps)} | set(steps.spectra_files())
    newer = sorted(s for s in on_disk if s > step)
    if newer:
        set_aside_epochs(
            steps,
            newer,
            f"recorded after {Path(checkpoint).name} was saved (global step {step}); the resumed run retrains those "
            "steps and observes them again",
        )
    return newer


def remove_stale_temporaries(run: RunDir) -> list[Path]:
    """Deletes the hidden ``.<name>.<random>.tmp`` files a killed writer left (`tgo.records.atomic_write` and the
    checkpoints written through it). Each is an incomplete copy of a file whose real name holds the previous complete
    version (or nothing), so it carries nothing to keep. Call only when no other process writes this run."""
    steps = run.step_series
    places = [run.geometry, run.spectra_dir, steps.geometry, steps.spectra_dir, run.checkpoints, run.root]
    stale = [p for place in places if place.is_dir() for p in place.glob(".*.tmp") if p.is_file()]
    for path in stale:
        path.unlink()
    if stale:
        rank_zero_info(f"[tgo] removed {len(stale)} incomplete temporary file(s) a killed run left in {run.root}")
    return stale


def set_aside_newer_checkpoints(run: RunDir, checkpoint: str | Path) -> list[Path]:
    """Sets aside checkpoint files saved after ``checkpoint`` (a larger global step) in ``checkpoints/``.

    A kill after the best-by-validation checkpoint of an epoch but before that epoch's ``last.ckpt`` leaves a
    ``best_epoch_*.ckpt`` of weights the resumed run retrains (and next to it the previous best, which the
    checkpoint callback would otherwise have deleted). The restored checkpoint's own callback state still names
    the earlier best, so the newer file would be orphaned: it is moved aside with the records of the same epoch.
    """
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
    """The newest of ``checkpoints/last.ckpt`` and Lightning's SLURM requeue checkpoints ``hpc_ckpt_<n>.ckpt``.

    A requeue checkpoint is written when the preemption signal arrives (mid-epoch); ``last.ckpt`` at every epoch's
    end. Whichever was written last holds the most training; modification time decides.
    """
    candidates = [p for p in run.root.glob(f"{HPC_PREFIX}*.ckpt") if p.is_file()]
    if run.last_checkpoint.is_file():
        candidates.append(run.last_checkpoint)
    return max(candidates, key=lambda p: p.stat().st_mtime_ns, default=None)


@dataclass(frozen=True)
class StartPlan:
    """How a launch starts: from ``checkpoint`` (``None``: from scratch), after setting aside what must be.

    ``start_over`` names why an earlier attempt in this directory is set aside as a whole (it left no checkpoint).
    """

    checkpoint: str | None
    start_over: str | None = None

    def prepare(self, run: RunDir, checkpoint_file: str | None) -> None:
        """Sets aside what this start replaces. Rank 0 only, after every input check passed, just before training.

        Args:
            run: The run directory.
            checkpoint_file: ``checkpoint`` resolved to its file (``last`` is ``checkpoints/last.ckpt``).
        """
        if self.start_over is None and checkpoint_file is None:
            return
        if self.start_over is None and checkpoint_file is not None:
            check_checkpoint(checkpoint_file)  # a refused checkpoint stops the start before anything is removed
        remove_stale_temporaries(run)
        if self.start_over is not None:
            rank_zero_info(f"[tgo] {self.start_over}")
            set_aside_attempt(run, self.start_over)
        elif checkpoint_file is not None:
            reconcile_records(run, checkpoint_file)
            reconcile_step_records(run, checkpoint_file)
            set_aside_newer_checkpoints(run, checkpoint_file)


def plan_start(requested: str | None, run: RunDir, *, requeued: bool) -> StartPlan:
    """Chooses where this launch starts from.

    - A job that SLURM requeued, launched again with its original arguments (no ``ckpt_path``), resumes from the
      newest checkpoint of its directory (`newest_checkpoint`).
    - ``ckpt_path=last`` (or a requeue) in a directory without a checkpoint (killed before its first one, or even
      before tgo wrote anything) starts that run over from scratch, whatever an earlier attempt wrote set aside.
    - Anything else is what was asked for (checked by the caller).
    """
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
    """Stops a resume whose analysis subset differs from the one in the run's own ``analysis_subset.json``.

    Every epoch of a run must be measured on the same images: a changed ``data.analysis`` setting, another image
    size or class list, or a pinned image whose bytes changed on disk would make the trend compare two subsets.
    Nothing to compare (no manifest yet: the run never got that far) passes.

    Args:
        run: The run directory being resumed.
        current: The manifest the resumed run would write (`TGODataModule.manifest`).

    Raises:
        ChangedAnalysisSubsetError: naming what changed, before anything is written.
    """
    if not run.manifest.is_file():
        return
    try:
        earlier = json.loads(run.manifest.read_text())
    except (OSError, json.JSONDecodeError) as err:
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
