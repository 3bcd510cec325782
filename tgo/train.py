"""``python -m tgo.train``: compose the config, validate it, instantiate everything, train; bad input (config, data,
model, observation points) is one line before ``trainer.fit``, not a traceback."""

from __future__ import annotations

import itertools
import logging
import math
import os
import shutil
import signal
import sys
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from tgo.config import CONFIG_MODULE, validate_config
from tgo.errors import ConfigError, Stopped, UserInputError, find_error, stopped_by_sigterm
from tgo.launch import check_accelerator, distributed_job, is_requeued_slurm_job, slurm_requeue_plugins
from tgo.observatory.pipeline import NonFiniteActivationsError
from tgo.observatory.settings import ObservationSettings
from tgo.records import RunDir, atomic_write, recorded_epochs
from tgo.resume import check_checkpoint, check_resume, check_same_analysis_subset, plan_start
from tgo.run_lock import LOCK_NAME, RunLock, RunLockError, launcher_rank

if TYPE_CHECKING:
    import lightning as L

# Lightning (and timm, through tgo.checkpoints) are imported where training starts, not at the top: they take
# seconds to import, and every input error before that (Hydra's, the config's, the accelerator's, the run
# directory's) is then one line within about the time torch takes to import.

LAUNCHED_AT = time.time()
"""When this process imported ``tgo.train``: before Hydra made (or reused) the run directory."""

HYDRA_ENTRIES = frozenset({".hydra", "train.log"})
"""What Hydra itself writes into a run directory before ``tgo.train`` runs (its config copies and the job log)."""

MIN_FREE_BYTES = 64 * 2**20
"""Less free space than this where the run directory goes is refused before any work: checkpoints would not fit."""


def instantiate_named(group: DictConfig | None) -> list[Any]:
    """Instantiates a name-keyed group (callbacks, loggers); entries set to null are disabled."""
    if group is None:
        return []
    return [instantiate(node) for _, node in group.items() if node is not None]


def without_logger_only_callbacks(callbacks: list[Any], loggers: list[Any]) -> list[Any]:
    """Drops ``LearningRateMonitor`` when every logger is disabled: Lightning refuses to start with it and no logger."""
    from lightning.pytorch.callbacks import LearningRateMonitor
    from lightning.pytorch.utilities import rank_zero_info

    if loggers or not any(isinstance(c, LearningRateMonitor) for c in callbacks):
        return callbacks
    rank_zero_info("[tgo] every logger is disabled: learning rates are not logged (lr_monitor needs a logger)")
    return [c for c in callbacks if not isinstance(c, LearningRateMonitor)]


def _unreadable_checkpoint(path: Path) -> str | None:
    """Why ``path`` cannot be a ``torch.save`` zip archive (every member's CRC checked), or ``None``."""
    if path.stat().st_size == 0:
        return "is empty (0 bytes)"
    if not zipfile.is_zipfile(path):
        return "is not a torch.save archive (truncated, or not a checkpoint)"
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (OSError, zipfile.BadZipFile, EOFError) as err:
        return f"cannot be read ({err})"
    return None if damaged is None else f"is damaged ({damaged} fails its checksum)"


def resolve_ckpt_path(ckpt_path: str | None, output_dir: Path) -> str | None:
    """Resolves ``ckpt_path`` (``last``: this run's ``checkpoints/last.ckpt``); a bad file fails in one line."""
    if ckpt_path is None:
        return None
    path = RunDir(output_dir).last_checkpoint if ckpt_path == "last" else Path(ckpt_path)
    if not path.is_file():
        raise ConfigError(
            f"ckpt_path: '{path}' does not exist; expected a Lightning checkpoint file "
            "(or `last` together with hydra.run.dir=<the run directory to resume>)."
        )
    problem = _unreadable_checkpoint(path)
    if problem:
        raise ConfigError(
            f"ckpt_path: '{path}' {problem}; expected a complete Lightning checkpoint file "
            "(resume from another checkpoint of the run, or start a new run)"
        )
    check_checkpoint(path)  # never unpickles anything but tensors and plain containers (tgo.safe_load)
    return str(path)


def refuse_to_overwrite(output_dir: Path, ckpt_path: str | None) -> None:
    """Refuses a fresh run where one already is: it would overwrite ``last.ckpt`` and mix the records."""
    if ckpt_path is not None:
        return
    run = RunDir(output_dir)
    existing = [p for p in (run.metrics, run.last_checkpoint) if p.exists()]
    if existing:
        raise ConfigError(
            f"hydra.run.dir: '{output_dir}' already holds a run ({existing[0].name} exists); resume it "
            "with ckpt_path=last, or choose a new directory (the default makes a fresh one per run)."
        )


def check_run_directory(output_dir: Path, ckpt_path: str | None, *, launched_at: float = LAUNCHED_AT) -> None:
    """Refuses a run directory that is not TGO's to write into, and a resume of a directory that did not exist.

    Used: a new directory, one with only Hydra's files, or a TGO run; anything else is the user's. ``ckpt_path=last`` in
    a directory this launch just made is a mistyped path, not a resume.
    """
    run = RunDir(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise ConfigError(f"hydra.run.dir: '{output_dir}' is a file; expected a directory for the run (or a new path)")
    if not output_dir.is_dir():
        if ckpt_path == "last":
            raise ConfigError(_nothing_to_resume(output_dir))
        return
    # Before Hydra rewrites a running run's .hydra/; DDP's other ranks are launched beside rank 0's lock
    held = RunLock(output_dir, what="hydra.run.dir").refusal() if launcher_rank() == 0 else None
    if held is not None:
        raise RunLockError(held)
    unsafe = run.unsafe_entry()
    if unsafe is not None:
        raise ConfigError(
            f"hydra.run.dir: '{output_dir}': {unsafe}; TGO never writes through a link nor replaces what it did not "
            "make: move it away, or choose another directory"
        )
    if is_tgo_run(run):
        return
    foreign = sorted(p.name for p in output_dir.iterdir() if p.name not in HYDRA_ENTRIES and p.name != LOCK_NAME)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        copied = " (its .tgo-run was made for another directory)" if run.read_marker() is not None else ""
        raise ConfigError(
            f"hydra.run.dir: '{output_dir}' holds files TGO did not make ({shown}) and is not a TGO run{copied or ''} "
            f"(no {RunDir.MARKER} made for it); expected a new or empty directory, or a run to resume: choose another "
            "directory"
        )
    if ckpt_path == "last" and _made_by_this_launch(output_dir, launched_at):
        raise ConfigError(_nothing_to_resume(output_dir))


def is_tgo_run(run: RunDir) -> bool:
    """Whether TGO made this directory a run: its own marker, or what an older (or moved) run always has (manifest,
    ``last.ckpt`` or ``metrics.csv``); a ``config.yaml`` alone is a common name for a user's file."""
    return run.is_marked() or run.manifest.is_file() or run.last_checkpoint.is_file() or run.metrics.is_file()


def _made_by_this_launch(output_dir: Path, launched_at: float) -> bool:
    """Whether the directory (and Hydra's ``.hydra`` in it) appeared after this process started."""
    made = [output_dir, output_dir / ".hydra"]
    return all(not p.exists() or p.stat().st_mtime >= launched_at - 1e-3 for p in made)


def _nothing_to_resume(output_dir: Path) -> str:
    return (
        f"ckpt_path=last: hydra.run.dir '{output_dir}' did not exist before this launch, so there is no run to "
        "resume; expected the directory of an existing run (it holds checkpoints/last.ckpt), or leave ckpt_path "
        "out to start a new run"
    )


def mark_run_directory(output_dir: Path) -> None:
    """Writes the `tgo.records.RunDir.marker` (once): this directory is a TGO run."""
    RunDir(output_dir).mark("train")


def preflight(argv: list[str], *, min_free: int = MIN_FREE_BYTES) -> str | None:
    """Why the command line's run directory cannot be written, checked before Hydra makes it and writes ``.hydra/``
    there (``hydra.run.dir=``, else the nearest directory above ``paths.log_dir``); ``None``: fine."""
    overrides = dict(a.split("=", 1) for a in argv if "=" in a and not a.startswith("-"))
    target = overrides.get("hydra.run.dir")
    key = "hydra.run.dir"
    if target is None:
        key = "paths.log_dir"
        target = overrides.get("paths.log_dir", os.path.join(os.environ.get("TGO_ROOT", "."), "outputs"))
    path = Path(target)
    if key == "hydra.run.dir":  # the run directory itself: the same refusals as `check_run_directory`, before Hydra
        try:
            check_run_directory(path, overrides.get("ckpt_path"), launched_at=math.inf)
        except UserInputError as err:
            return str(err)
    if path.exists() and not path.is_dir():
        return f"{key}: '{path}' is a file; expected a directory for the run (or a new path)"
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        return f"{key}: '{existing}' (above '{path}') is a file, so the run directory cannot be made; choose another"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{key}: '{existing}' is not writable (read-only filesystem or permissions); choose a writable path"
    free = shutil.disk_usage(existing).free
    if free < min_free:
        return (
            f"{key}: the filesystem of '{existing}' has {free / 2**20:.1f} MiB free, less than the "
            f"{min_free / 2**20:.0f} MiB a run needs for its records and checkpoints; free space or choose another path"
        )
    return None


def make_ddp_relaunch_job_local() -> None:
    """Makes Lightning's DDP re-launch run this multirun job in its directory, not the whole sweep again."""
    if not HydraConfig.initialized():
        return
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return
    sys.argv = [sys.argv[0], *hydra_cfg.overrides.task]
    OmegaConf.set_readonly(hydra_cfg, False)  # type: ignore[arg-type]  # HydraConf is a DictConfig at run time
    hydra_cfg.run.dir = hydra_cfg.runtime.output_dir
    OmegaConf.set_readonly(hydra_cfg, True)  # type: ignore[arg-type]


def trainer_plugins(cfg: DictConfig) -> list[Any]:
    """The trainer's plugins plus `AtomicCheckpointIO` and, on SLURM, the preemption listener."""
    from lightning.pytorch.plugins.io import CheckpointIO

    from tgo.checkpoints import AtomicCheckpointIO

    plugins = list(instantiate(cfg.trainer.get("plugins")) or [])
    if not any(isinstance(p, CheckpointIO) for p in plugins):
        plugins.append(AtomicCheckpointIO())
    return plugins + slurm_requeue_plugins(plugins)


def run(cfg: DictConfig) -> dict[str, float]:
    """Trains one experiment from a composed config; returns the final callback metrics as floats."""
    validate_config(cfg)
    check_accelerator(cfg.trainer.accelerator)
    output_dir = Path(cfg.paths.output_dir)
    check_run_directory(output_dir, cfg.get("ckpt_path"))
    # One process per run directory: the launching process (rank 0) holds the lock from before anything is planned,
    # moved or written until the end, an exception or a signal included; DDP's other ranks never take it.
    lock = RunLock(output_dir, what="hydra.run.dir") if launcher_rank() == 0 else None
    if lock is not None:
        lock.acquire()
    try:
        return _train(cfg, output_dir)
    finally:
        if lock is not None:
            lock.release()


class RunStopped(Exception):
    """A signal ended the training (SIGTERM, or SIGINT: Ctrl+C); `hydra_main` exits with ``128 + signum``."""

    def __init__(self, signum: int, line: str) -> None:
        super().__init__(line)
        self.signum = signum


def _stopping_signal(trainer: L.Trainer, stop: SystemExit) -> int | None:
    """The signal behind Lightning's exit from ``fit`` (``None``: another exit, re-raised)."""
    if getattr(trainer, "received_sigterm", False):
        return int(signal.SIGTERM)
    if isinstance(stop.__context__, KeyboardInterrupt):
        return int(signal.SIGINT)
    return None


def _stopped_line(signum: int, trainer: L.Trainer, output_dir: Path) -> str:
    """The one line a stopped run ends with: which signal, where, what is kept, how to go on."""
    epochs = recorded_epochs(output_dir)
    kept = f"the records of epochs {epochs} are intact" if epochs else "no epoch was recorded yet"
    last = RunDir(output_dir).last_checkpoint
    checkpoint = (
        f"{last.relative_to(output_dir)} holds the last completed epoch" if last.is_file() else "no checkpoint yet"
    )
    done = trainer.current_epoch  # the epoch in progress, counted from 0: the epochs completed (TGO's epoch label)
    return (
        f"tgo.train: stopped by {signal.Signals(signum).name} after {done} completed training epoch"
        f"{'' if done == 1 else 's'}: {kept}, {checkpoint}; resume with ckpt_path=last "
        f"hydra.run.dir={output_dir.resolve()}"
    )


def _train(cfg: DictConfig, output_dir: Path) -> dict[str, float]:
    """`run` after the run directory is checked and locked: until ``fit`` SIGTERM ends it with one line, then
    Lightning's handler stops at the next batch with the records whole."""
    try:
        with stopped_by_sigterm():
            trainer, model, datamodule, ckpt_path = _prepare(cfg, output_dir)
    except Stopped as stop:
        epochs = recorded_epochs(output_dir) if output_dir.is_dir() else []
        kept = f"the records of epochs {epochs} are intact" if epochs else "no epoch was recorded"
        line = f"tgo.train: stopped by {stop.name} before training started: {kept}; nothing was trained"
        raise RunStopped(stop.signum, line) from None
    with distributed_job():  # a multirun's next job must not join this job's process group
        # weights_only=True: Lightning's own load of the checkpoint never unpickles arbitrary objects either (TGO's
        # checkpoints need nothing else; tgo.safe_load has already refused a file that would)
        try:
            trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
        except SystemExit as stop:
            signum = _stopping_signal(trainer, stop)
            if signum is None:
                raise
            raise RunStopped(signum, _stopped_line(signum, trainer, output_dir)) from stop
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    if trainer.is_global_zero:
        from lightning.pytorch.utilities import rank_zero_info

        summary = ", ".join(f"{k}={metrics[k]:.4f}" for k in ("val/acc_top1", "val/acc_top5") if k in metrics)
        rank_zero_info(f"[tgo] done: {summary}; results in {output_dir.resolve()}")
    return metrics


def _prepare(cfg: DictConfig, output_dir: Path) -> tuple[Any, Any, Any, str | None]:
    """Everything before ``fit``; returns (trainer, model, datamodule, ckpt_path)."""
    start = plan_start(cfg.get("ckpt_path"), RunDir(output_dir), requeued=is_requeued_slurm_job())
    ckpt_path = resolve_ckpt_path(start.checkpoint, output_dir)
    if start.start_over is None:
        refuse_to_overwrite(output_dir, ckpt_path)
    import lightning as L
    from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

    L.seed_everything(cfg.seed, workers=True)

    datamodule = instantiate(cfg.data).validate()  # scans the data and settles the analysis subset now
    model = instantiate(
        cfg.model, num_classes=datamodule.num_classes, img_size=datamodule.image_size, in_chans=datamodule.in_chans
    )
    loggers = instantiate_named(cfg.get("logger"))
    callbacks = without_logger_only_callbacks(instantiate_named(cfg.get("callbacks")), loggers)
    make_ddp_relaunch_job_local()
    trainer: L.Trainer = instantiate(
        cfg.trainer, callbacks=callbacks, logger=loggers or False, plugins=trainer_plugins(cfg)
    )

    if ckpt_path is not None:  # every rank checks (they all stop before fit), before anything is moved or written
        check_same_analysis_subset(RunDir(output_dir), datamodule.manifest())
        check_resume(RunDir(output_dir), ckpt_path, model)  # this run's, this model's, no duplicate kept (tgo.resume)
    # Before fit the strategy has not set ranks up yet; rank_zero_only.rank reads them from the launcher's environment
    # (LOCAL_RANK / NODE_RANK of Lightning's re-launch, SLURM_PROCID on a cluster), so only one process writes.
    if getattr(rank_zero_only, "rank", 0) == 0:
        mark_run_directory(output_dir)
        start.prepare(RunDir(output_dir), ckpt_path)  # newer checkpoints aside (the callback: newer records)
        atomic_write(RunDir(output_dir).config, OmegaConf.to_yaml(cfg, resolve=False))
        groups = ObservationSettings.from_config(cfg.observation).groups if "observation" in cfg else 0
        manifest = datamodule.write_manifest(output_dir, jackknife_groups=groups)
        rank_zero_info(f"[tgo] run directory: {output_dir.resolve()}")
        rank_zero_info(f"[tgo] analysis subset manifest: {manifest}")
        rank_zero_info(f"[tgo] TensorBoard: tensorboard --logdir {RunDir(output_dir).tensorboard.resolve()}")
    return trainer, model, datamodule, ckpt_path


def main() -> float | None:
    """``python -m tgo.train`` / ``tgo-train``: `preflight`, then Hydra; the ``hydra.run.dir`` lock is taken first, so a
    second launch cannot replace the first's Hydra record before being refused."""
    problem = preflight(sys.argv[1:])
    if problem is not None:
        print(f"tgo.train: error: {problem}", file=sys.stderr)
        sys.exit(2)
    lock = _early_lock(sys.argv[1:])
    try:
        return hydra_main()
    finally:
        if lock is not None:
            lock.release()


def _early_lock(argv: list[str]) -> RunLock | None:
    """The lock of the command line's ``hydra.run.dir`` for a single run (``None`` where there is none to take)."""
    overrides = dict(a.split("=", 1) for a in argv if "=" in a and not a.startswith("-"))
    target = overrides.get("hydra.run.dir")
    if target is None or launcher_rank() != 0 or any(a in ("-m", "--multirun") for a in argv):
        return None
    try:
        return RunLock(Path(target), what="hydra.run.dir").acquire()
    except RunLockError as err:
        print(f"tgo.train: error: {err}", file=sys.stderr)
        sys.exit(2)


@hydra.main(version_base="1.3", config_path=f"pkg://{CONFIG_MODULE}", config_name="train")
def hydra_main(cfg: DictConfig) -> float | None:
    """Hydra entry point: bad input exits 2 with one line, a signal ``128 + signum``."""
    logging.captureWarnings(True)  # warnings reach <run dir>/train.log with every other message (conf/hydra)
    try:
        metrics = run(cfg)
    except RunStopped as stop:
        from lightning.pytorch.utilities import rank_zero_only

        if getattr(rank_zero_only, "rank", 0) == 0:
            print(stop, file=sys.stderr)
        sys.exit(128 + stop.signum)
    except Exception as error:
        line = error_line(error)
        if line is None:
            raise
        print(line, file=sys.stderr)
        sys.exit(2)
    return metrics.get("val/acc_top1")


def error_line(error: BaseException) -> str | None:
    """The one line `main` prints for an error that needs a changed input, or ``None`` for a bug."""
    found = find_error(error, (UserInputError, NonFiniteActivationsError))
    if found is None:
        return None
    key = "observation.nonfinite: " if isinstance(found, NonFiniteActivationsError) else ""
    return f"tgo.train: error: {key}{_original_message(found)}"


def _original_message(error: BaseException) -> str:
    """The error's message on one line: a DataLoader worker's re-raise carries the whole traceback (the original message
    is its last line, after ``X: ``); other multi-line messages are joined with "; " so the culprit's line is kept."""
    message = str(error)
    if "\n" not in message:
        return message
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if "Original Traceback" in message:
        return lines[-1].partition(f"{type(error).__name__}: ")[2] or lines[-1]
    joined = lines[0]
    for previous, line in itertools.pairwise(lines):
        joined += (" " if previous.endswith(":") else "; ") + line
    return joined


if __name__ == "__main__":
    main()
