"""``SpectralGeometryCallback``: observe the spectral geometry of the network every N epochs.

A thin orchestrator: it decides *when* (epoch 0, every N epochs, the last; with ``observation.early`` the step series)
and hands the *how* to ``tgo.observatory``, ``tgo.records`` and `tgo.callbacks.dashboard`. The records on disk decide
what was already observed, so a resumed run neither repeats nor skips one; rank 0 decides and broadcasts, at due steps
only. The flow and the ``geometry/blocking_seconds`` accounting: docs/architecture.md and docs/usage.md."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import time
import warnings
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.seed import isolate_rng

from tgo.errors import UserInputError, print_user_errors_as_one_line
from tgo.observatory import (
    NonFiniteActivationsError,
    ObservationPoint,
    ObservationSettings,
    RecordPlan,
    Results,
    ShardPlan,
    points_from_config,
    resolve_points,
)
from tgo.observatory.families import TrainingCollector, TrainingInfo, enabled_families
from tgo.observatory.find_vit import ModelSpec
from tgo.observatory.pipeline import reduce_observation, summarize_and_record, summary_share
from tgo.observatory.sharded import check_strategy, sharded_forward
from tgo.observatory.share import GatherBytes, summary_gather
from tgo.observatory.standalone import (
    DEFAULT_BATCH_SIZE,
    RunDirectoryError,
    claim_run_directory,
    observation_settings,
    prepare_analysis,
    vit_network,
)
from tgo.observatory.warmup import warm_up
from tgo.progress import lightning_progress, timed_wait
from tgo.records import DEFAULT_VIEW, RecordWriter, RunDir, load_spectra, recorded_epochs
from tgo.resume import (
    RUN_ID_KEY,
    NewerRecords,
    ResumeError,
    check_resume_records,
    check_same_run,
    new_run_id,
    record_run_id,
    recorded_run_id,
    records_after,
    set_aside_records_after,
)
from tgo.run_description import record_training

from .background import BACKGROUND_NICE, BackgroundLane, waiting_for
from .dashboard import (
    DEPTH_PROFILES,
    FIGURE_DRAIN_TIMEOUT_S,
    StoryFunction,
    TensorBoardDashboard,
    geometry_scalars,
    geometry_tag,
    logged_metrics,
    point_scalars,
    tensorboard_logger,
    tgo_story,
)
from .logger_keys import headline_scalars, observation_keys

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a callback's name: one path segment, one key prefix

__all__ = [
    "DEPTH_PROFILES",
    "NonFiniteActivationsError",
    "SpectralGeometryCallback",
    "geometry_scalars",
    "geometry_tag",
    "logged_metrics",
    "nonfinite_notice",
    "point_scalars",
]


class SpectralGeometryCallback(L.Callback):
    """Observes covariance spectra at the configured points of the LightningModule's ViT on the analysis set.

    In any Lightning training::

        geometry = SpectralGeometryCallback(analysis=stratified_subset(val_set, per_class=10), every_n_epochs=5)
        trainer = L.Trainer(max_epochs=20, callbacks=[geometry])

    Records go to the first logger's versioned directory, as Lightning's ``ModelCheckpoint`` places its checkpoints
    (``lightning_logs/version_N/geometry/``; ``default_root_dir`` without a logger; ``dirpath`` when given), so
    rerunning a script starts new records and never mixes two trainings; a resume (``ckpt_path``) continues the
    records of the checkpoint's training wherever they are. Outside a ``tgo.train`` run directory TGO refuses a
    ``geometry/`` it did not make (`tgo.observatory.standalone.claim_run_directory`). Every input is checked in
    ``setup``, before any training step, each problem in one line.

    Args:
        settings: `ObservationSettings`, the ``observation`` node or a mapping of its keys (``None``: the defaults).
        analysis: A map-style ``Dataset`` of ``(image, label)`` or a ``DataLoader`` over one; ``None``: the
            DataModule's ``analysis_dataset``. The same set on every rank.
        model: The ViT inside the module: an attribute path, a callable of the module, or ``None`` (its one timm ViT).
        story: ``story(run_dir, epoch) -> Figure | {name: Figure} | None``, drawn first as ``0_story/...``;
            ``None``: `tgo.callbacks.dashboard.tgo_story`.
        dirpath: The directory of the records (``geometry/``, ``analysis_subset.json``); ``None``: see above.
        name: Several networks in one training (teacher and student, EMA): each callback a ``name``, recorded under
            ``<directory>/<name>/``, its logger keys and TensorBoard runs prefixed ``<name>/``, its checkpoint state
            kept apart.
        **setting_overrides: Any `ObservationSettings` key, applied over ``settings`` and validated the same way."""

    def __init__(
        self,
        settings: ObservationSettings | Mapping[str, Any] | None = None,
        *,
        analysis: Any = None,
        model: ModelSpec = None,
        story: StoryFunction | None = None,
        dirpath: str | os.PathLike[str] | None = None,
        name: str | None = None,
        **setting_overrides: Any,
    ) -> None:
        super().__init__()
        self.settings = observation_settings(settings, setting_overrides)
        if name is not None and (not isinstance(name, str) or not _NAME.fullmatch(name)):
            raise UserInputError(
                f"SpectralGeometryCallback: name={name!r}; expected a short name of letters, digits, '_', '-' or '.' "
                "(e.g. 'teacher'): the records' subdirectory and the prefix of its logger keys"
            )
        self.dirpath = dirpath
        self.name = name
        print_user_errors_as_one_line()
        if model is not None and not isinstance(model, str) and not callable(model):
            raise UserInputError(
                f"SpectralGeometryCallback: model={model!r}; expected None (find the ViT), an attribute path such as "
                "'backbone', or a callable taking the LightningModule and returning the network"
            )
        self.analysis = analysis
        self.model = model
        self.story = story if story is not None else tgo_story
        self.points: list[ObservationPoint] = []
        self.observed_epochs: list[int] = []
        self.observed_steps: list[int] = []  # the step series (observation.early)
        self._early: frozenset[int] | None = None  # its due steps, fixed at each fit's train start
        self._steps_checked: set[int] = set()  # due steps already decided in this process (gradient accumulation)
        self.last_pass_seconds: float | None = None  # the stream and the reduction (the pass's collectives)
        self.last_summary_seconds: float | None = None  # summary + records (in the background, or inline)
        self.last_logging_seconds: float | None = None  # logger scalars and handing the figures to the worker
        self.last_blocking_seconds: float | None = None  # the whole observation on the training thread
        self._logged_steps: dict[tuple[str, int], int] = {}  # (series, key) -> its optimizer step (non-TB loggers)
        # the summary in flight (observation.summary.background)
        self._summaries = BackgroundLane(1, name="tgo-summary", collect=True, nice=BACKGROUND_NICE)
        # Training-time collectors, by family name: statistics the enabled families gather between observations
        # (`MeasurementFamily.collector`), read back through `TrainingInfo.collectors`.
        self.collectors: dict[str, TrainingCollector] = {}
        self._gather: GatherBytes | None = None  # the shared summary's gather over TGO's own gloo group
        self._eigvalsh: Any = None  # the summary's eigensolver (observation.summary.eigensolver), on first use
        self._run: RunDir | None = None
        self._dashboard: TensorBoardDashboard | None = None  # rank 0's per-point runs and figure worker, on first use
        self._named_writer: Any = None  # a named callback's TensorBoard run for its figures, on first use
        self._analysis: Any = None  # the checked analysis set (with .labels), settled in setup
        self._analysis_batch_size = DEFAULT_BATCH_SIZE
        self._analysis_num_workers = 0
        self._warned_unstratified = False
        self._claimed: RunDir | None = None  # the run directory checked (and its manifest written) at train start
        self.run_id: str | None = None  # the training's id (`tgo.resume.RUN_ID_KEY`), settled at each train start
        self._restored: dict[str, Any] | None = None  # what the checkpoint of this fit said, until train start

    @property
    def state_key(self) -> str:
        """Lightning's key of this callback's checkpoint state: a named callback's is its own, so several coexist."""
        return self._generate_state_key(name=self.name) if self.name else super().state_key

    # ----------------------------------------------------------------------------------------- lifecycle
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Finds the network and points and checks the analysis set, so a bad input fails before any update."""
        net = self._network(pl_module)
        self.points = points_from_config(self.settings.points, net)
        resolve_points(net, self.points)
        self._run = RunDir(self._records_root(trainer))
        if stage == "fit":
            check_strategy(trainer.strategy, enabled_families(self.settings))  # one line, before the fit trains
            self._settle_analysis(trainer)
            # the shared summary's gather runs over a gloo group of its own, never the training's collectives
            self._gather = self._gather or summary_gather(trainer.world_size, self.settings.summary.share)
            for family in enabled_families(self.settings):
                if family.name not in self.collectors and (collector := family.collector(self.settings)) is not None:
                    self.collectors[family.name] = collector
            # once per process: the observations' printed seconds are steady costs
            warmed = warm_up(self.settings, trainer.strategy.root_device)
            if warmed is not None:
                rank_zero_info(f"[tgo] geometry: one-time imports and solver set-up in {warmed:.2f} s")

    def _records_root(self, trainer: L.Trainer) -> str:
        """Where this fit records, the same on every rank (rank 0 decides: loggers count versions per process)."""
        if self.dirpath is not None:
            base = os.fspath(self.dirpath)
        elif trainer.loggers:
            base = versioned_log_dir(trainer.loggers[0], trainer.default_root_dir)
        else:
            base = os.fspath(trainer.default_root_dir)
        root = os.path.join(base, self.name) if self.name else base
        return str(trainer.strategy.broadcast(root, src=0))

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The families' training-time collectors attach (under DDP the model is wrapped by now)."""
        for collector in self.collectors.values():
            collector.attach(trainer, pl_module, self._network(pl_module))

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, *args: Any) -> None:
        for collector in self.collectors.values():
            collector.on_train_batch_start(batch)

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for collector in self.collectors.values():
            collector.on_after_backward()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        for collector in self.collectors.values():
            collector.on_before_optimizer_step(trainer)

    def _settle_analysis(self, trainer: L.Trainer) -> None:
        """The analysis set, checked, with its batch size and workers: ``analysis=`` or the DataModule's."""
        if self.analysis is not None:
            where = "SpectralGeometryCallback(analysis=...)"
            dataset, batch_size, num_workers, notice = prepare_analysis(self.analysis, where=where)
        else:
            datamodule = getattr(trainer, "datamodule", None)
            given = getattr(datamodule, "analysis_dataset", None) if datamodule is not None else None
            if given is None:
                held = f"{type(datamodule).__name__} has no analysis_dataset" if datamodule else "no DataModule"
                raise UserInputError(
                    f"SpectralGeometryCallback: no analysis set ({held}); pass analysis=<a Dataset of (image, label)>, "
                    "e.g. tgo.data.stratified_subset(val_set, per_class=10), or give the DataModule an analysis_dataset"
                )
            dataset, _, _, notice = prepare_analysis(given, where="trainer.datamodule.analysis_dataset")
            batch_size = getattr(datamodule, "analysis_batch_size", DEFAULT_BATCH_SIZE)
            num_workers = getattr(datamodule, "num_workers", 0)
        self._analysis = dataset
        self._analysis_batch_size = int(batch_size or DEFAULT_BATCH_SIZE)
        self._analysis_num_workers = int(num_workers or 0)
        if notice and not self._warned_unstratified and trainer.is_global_zero:
            warnings.warn(notice, UserWarning, stacklevel=2)
            self._warned_unstratified = True

    def _claim_run_directory(self, trainer: L.Trainer) -> None:
        assert self._run is not None
        problem = None
        if trainer.is_global_zero and getattr(self, "_run_lock", None) is None:  # one process per run directory
            from tgo.run_lock import RunLock, RunLockError

            try:  # re-entrant: under tgo.train this process holds it already; released at teardown
                self._run_lock: Any = RunLock(self._run.root, what="trainer.default_root_dir").acquire()
            except RunLockError as err:
                problem = str(err)
        if problem is None and trainer.is_global_zero and not self._run.is_marked():
            from tgo.data.subsets import analysis_manifest

            manifest = None
            if self.analysis is not None:
                written_by = "tgo.callbacks.SpectralGeometryCallback(analysis=...)"
                manifest = analysis_manifest(self._analysis, written_by=written_by, groups=self.settings.groups)
            fresh = trainer.ckpt_path is None and not self.observed_epochs
            try:
                claim_run_directory(self._run.root, manifest=manifest, fresh=fresh, what="trainer.default_root_dir")
            except RunDirectoryError as err:
                problem = str(err)
        problem = trainer.strategy.broadcast(problem, src=0)
        if problem:
            raise RunDirectoryError(problem)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._continue_checkpoint_records(trainer)
        if self._claimed != self._run:
            self._claim_run_directory(trainer)
            self._claimed = self._run
        self._early, self._steps_checked = None, set()  # this fit's step schedule (its loader's length)
        self.early_steps(trainer)  # a schedule it cannot make is refused before the first observation
        self._settle_resume(trainer)  # the last check before anything is set aside; then reconciles a resume
        assert self._run is not None
        record_training(self._run.root, trainer, self._network(pl_module), self._analysis)  # run_description.json
        completed = trainer.current_epoch
        if self._should_observe(completed, trainer):
            self.observe_epoch(trainer, pl_module, completed)
        if self._should_observe_step(trainer):  # step 0, or a resumed run's due step not yet recorded
            self.observe_step(trainer, pl_module)

    def _continue_checkpoint_records(self, trainer: L.Trainer) -> None:
        """A resume continues the records of the checkpoint's training where they are (this fit's logger starts a new
        version; without ``dirpath`` the records follow the training, not the logger). Rank 0 decides."""
        recorded = (self._restored or {}).get("records_dir")
        if self.dirpath is not None or not recorded or self._run is None or recorded == str(self._run.root):
            return
        found = os.path.isdir(recorded) if trainer.is_global_zero else False
        if trainer.strategy.broadcast(found, src=0):
            rank_zero_info(f"[tgo] resuming: the geometry records of this training continue in {recorded}")
            self._run = RunDir(recorded)
        else:
            rank_zero_info(
                f"[tgo] resuming: the checkpoint's records directory {recorded} is gone; this fit records into "
                f"{self._run.root}"
            )

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        completed = trainer.current_epoch + 1
        if self._should_observe(completed, trainer):
            self.observe_epoch(trainer, pl_module, completed)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self._summaries.pending is not None and self._summaries.done:
            self.collect_summary(trainer)
        if self._should_observe_step(trainer):
            self.observe_step(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._claimed is not None and self._run is not None:  # a fit's validation: its metrics are described
            record_training(self._run.root, trainer, self._network(pl_module), self._analysis, validated=True)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """A checkpoint of later weights than the summary in flight waits for it (its records could otherwise be lost
        with weights the checkpoint no longer holds); one of the observed weights lists the epoch as pending instead."""
        if self.run_id is not None:  # whose weights these are: a resume from it into another run is refused
            checkpoint[RUN_ID_KEY] = self.run_id
        pending = self._summaries.pending
        # The last epoch's checkpoint waits too: a resume from it finds max_epochs reached and observes nothing.
        end = trainer.max_epochs if trainer.max_epochs is not None and trainer.max_epochs >= 0 else None  # -1: no end
        last = end is not None and pending is not None and pending.epoch >= end
        if pending is not None and (pending.step < trainer.global_step or last):
            self.collect_summary(trainer)
            checkpoint.setdefault("callbacks", {})[self.state_key] = self.state_dict()

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        figures = self._dashboard.figures_in_flight if self._dashboard is not None else 0
        what = waiting_for(self._summaries, figures, tensorboard=tensorboard_logger(trainer) is not None)
        with self._timed_wait(trainer, what):
            self.collect_summary(trainer)
            self.finish_tensorboard(trainer)
        if trainer.is_global_zero and self._run is not None:
            record_training(self._run.root, trainer, self._network(pl_module), self._analysis)
            notice = nonfinite_notice(self._run)
            if notice:
                warnings.warn(notice, RuntimeWarning, stacklevel=2)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._end(trainer)  # Lightning skips teardown after an exception (a signal included)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._end(trainer, close=True)
        if stage == "fit":  # the collectors' hooks leave the parameters with the fit
            for collector in self.collectors.values():
                collector.detach()

    def _end(self, trainer: L.Trainer, *, close: bool = False) -> None:
        """Records the summary in flight, closes TensorBoard (and, with ``close``, the summary lane) and then releases
        the run directory (the next fit claims it)."""
        self._flush_after_failure(trainer)
        self.finish_tensorboard(trainer)
        if close:
            self._summaries.close()
        lock, self._run_lock = getattr(self, "_run_lock", None), None
        if lock is not None:
            lock.release()
            self._claimed = None

    @staticmethod
    def _timed_wait(trainer: L.Trainer, what: str | None) -> contextlib.AbstractContextManager[None]:
        """`timed_wait` for ``what`` on rank 0 (a line before the wait and one with its seconds); silent when nothing
        is running or on other ranks."""
        say = (lambda line: rank_zero_info(f"[tgo] {line}")) if what and trainer.is_global_zero else None
        return timed_wait(what or "", say)

    def collect_summary(self, trainer: L.Trainer, timeout: float | None = None) -> bool:
        """Waits for the summary in flight and, on rank 0, logs it; re-raises its exception. ``False``: none pending."""
        start = time.perf_counter()
        collected = self._summaries.result(timeout)
        if collected is None:
            return False
        pending, results = collected
        self._finish(trainer, pending.series, pending.key, results, pending.seconds)
        self._log_blocking(trainer, pending.series, pending.key, pending.held_seconds + time.perf_counter() - start)
        return True

    def _flush_after_failure(self, trainer: L.Trainer) -> None:
        """The summary in flight is still recorded; its failure is warned about, not raised over the one in flight."""
        try:
            self.collect_summary(trainer, timeout=FIGURE_DRAIN_TIMEOUT_S)
        except Exception as error:
            warnings.warn(f"[tgo] the summary in flight did not complete: {error!r}", RuntimeWarning, stacklevel=2)

    def finish_tensorboard(self, trainer: L.Trainer | None = None) -> bool:
        """Drains the figures and closes the per-point runs (idempotent); ``False`` if figures were still rendering."""
        drained = self.drain_figures(trainer)
        dashboard, self._dashboard = self._dashboard, None
        if dashboard is not None:
            dashboard.close_point_runs()
        writer, self._named_writer = self._named_writer, None
        if writer is not None:
            writer.close()
        return drained

    def drain_figures(self, trainer: L.Trainer | None = None, timeout: float = FIGURE_DRAIN_TIMEOUT_S) -> bool:
        """Waits for every queued figure, stops the worker and flushes TensorBoard. ``False`` if it timed out."""
        if self._dashboard is None:
            return True
        drained, running = self._dashboard.drain_figures(timeout)
        tensorboard = tensorboard_logger(trainer) if trainer is not None else None
        if tensorboard is not None and running:
            tensorboard.experiment.flush()
        return drained

    def state_dict(self) -> dict[str, Any]:
        """``pending_*``: what was still in flight at the checkpoint (its records may be missing if the run died)."""
        pending = self._summaries.pending
        return {
            "records_dir": os.path.abspath(self._run.root) if self._run is not None else None,
            "observed_epochs": list(self.observed_epochs),
            "pending_epochs": [pending.epoch] if pending and pending.series == "epoch" else [],
            "observed_steps": list(self.observed_steps),
            "pending_steps": [pending.step] if pending and pending.series == "step" else [],
        }

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """A fit restores a checkpoint: its run id is kept for the train start's check (`_settle_resume`)."""
        run_id = checkpoint.get(RUN_ID_KEY)
        self._restored = {"run_id": str(run_id) if run_id else None, "observed": None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The checkpoint decides what was observed (records after it are set aside at train start)."""
        self.observed_epochs = sorted({int(e) for e in state_dict.get("observed_epochs", [])})
        self.observed_steps = sorted({int(s) for s in state_dict.get("observed_steps", [])})
        pending = [int(e) for e in state_dict.get("pending_epochs", [])]
        restored = self._restored if self._restored is not None else {"run_id": None}
        records_dir = state_dict.get("records_dir")
        self._restored = {
            **restored,
            "observed": sorted({*self.observed_epochs, *pending}),
            "records_dir": str(records_dir) if isinstance(records_dir, str) and records_dir else None,
        }
        for series in ("epoch", "step"):
            pending = [int(e) for e in state_dict.get(f"pending_{series}s", [])]
            if pending:
                rank_zero_info(
                    f"[tgo] this checkpoint was saved while the summary of {series} {pending} was in flight; an "
                    f"observation whose records are missing is observed again from these weights"
                )

    # ----------------------------------------------------------------------------------------- resume
    def _settle_resume(self, trainer: L.Trainer) -> None:
        """Settles this fit's run id and, at a resume, sets aside the records made after the checkpoint (observed again
        when due). Rank 0 checks and moves; every rank raises together if it refused. Collective."""
        assert self._run is not None
        restored, self._restored = self._restored, None
        checkpoint = trainer.ckpt_path
        problem, run_id, newer = None, self.run_id, NewerRecords([], [])
        if trainer.is_global_zero:
            try:
                run_id, newer = self._reconcile(trainer, checkpoint, restored)
            except UserInputError as err:  # ResumeError, or unreadable records (RecordsError)
                problem = str(err)
        problem, run_id, newer = trainer.strategy.broadcast((problem, run_id, newer), src=0)
        if problem:
            raise ResumeError(problem)
        self.run_id = run_id
        self.observed_epochs = [e for e in self.observed_epochs if e not in newer.epochs]
        self.observed_steps = [s for s in self.observed_steps if s not in newer.steps]

    def _reconcile(
        self, trainer: L.Trainer, checkpoint: Any, restored: dict[str, Any] | None
    ) -> tuple[str, NewerRecords]:
        """Rank 0's part of `_settle_resume`: the run id and the records set aside."""
        assert self._run is not None
        run = self._run
        if checkpoint is None or restored is None:  # a fit from scratch, or one continuing in this process
            run_id = self.run_id or new_run_id()
            record_run_id(run, run_id)
            return run_id, NewerRecords([], [])
        check_same_run(run, checkpoint, restored["run_id"])
        step = int(trainer.global_step)
        newer = records_after(run, restored["observed"], epoch=int(trainer.current_epoch), step=step)
        check_resume_records(run, newer)
        set_aside_records_after(run, checkpoint, newer, step=step)
        run_id = restored["run_id"] or recorded_run_id(run) or self.run_id or new_run_id()
        record_run_id(run, run_id)
        return run_id, newer

    # ----------------------------------------------------------------------------------------- schedule
    def _should_observe(self, completed: int, trainer: L.Trainer) -> bool:
        """Due and not yet recorded, decided by rank 0 (only it is sure to see the records) and broadcast, so no rank
        skips a collective the others enter."""
        every = self.settings.every_n_epochs
        if not (completed == 0 or completed % every == 0 or completed == trainer.max_epochs):  # same on every rank
            return False
        decision = not self._already_observed(completed) if trainer.is_global_zero else False
        return bool(trainer.strategy.broadcast(decision, src=0))

    def _already_observed(self, epoch: int, series: str = "epoch") -> bool:
        """Recorded in memory or on rank 0's disk (an on-disk one is remembered: later checkpoints list it)."""
        observed = self.observed_steps if series == "step" else self.observed_epochs
        on_disk = recorded_epochs(RunDir(self._run.root, series)) if self._run is not None else []
        if epoch in on_disk:  # e.g. the pending epoch of the checkpoint resumed from: later checkpoints list it
            self._mark_observed(series, epoch)
        return epoch in observed or epoch in on_disk

    def _mark_observed(self, series: str, key: int) -> None:
        if series == "step":
            self.observed_steps = sorted(set(self.observed_steps) | {key})
        else:
            self.observed_epochs = sorted(set(self.observed_epochs) | {key})

    def early_steps(self, trainer: L.Trainer) -> frozenset[int]:
        """The step series' due steps, fixed at each fit's start; refuses an unknown first epoch (iterable loader)."""
        if self._early is None:
            early = self.settings.early
            if not early.enabled:
                self._early = frozenset()
            else:
                until = early.until_step if early.until_step is not None else self._first_epoch_steps(trainer)
                self._early = frozenset(early.steps(until))
        return self._early

    @staticmethod
    def _first_epoch_steps(trainer: L.Trainer) -> int:
        batches = trainer.num_training_batches
        if not math.isfinite(batches):
            raise UserInputError(
                "observation.early.until_step: null means the first epoch's optimizer steps, but the training "
                "dataloader has no length; set observation.early.until_step=<the last step to observe>"
            )
        return max(1, math.ceil(int(batches) / max(1, int(trainer.accumulate_grad_batches))))

    def _should_observe_step(self, trainer: L.Trainer) -> bool:
        """Due in the step series and not yet recorded; decided once per process (gradient accumulation)."""
        step = int(trainer.global_step)
        if step not in self.early_steps(trainer) or step in self._steps_checked:  # arithmetic: same on every rank
            return False
        self._steps_checked.add(step)
        decision = not self._already_observed(step, "step") if trainer.is_global_zero else False
        return bool(trainer.strategy.broadcast(decision, src=0))

    # ----------------------------------------------------------------------------------------- observation
    def observe_epoch(self, trainer: L.Trainer, pl_module: L.LightningModule, epoch: int) -> None:
        """Runs one observation on every rank; rank 0 records and logs. Collective: call on all ranks.

        Returns once the stream and the reduction are done (the summary may finish in the background). Figures still
        rendering are paused meanwhile (GIL), and the random generators are isolated so that training draws the same
        numbers however often it is observed (`tgo.callbacks.random_state`)."""
        self._observe(trainer, pl_module, "epoch", epoch)

    def observe_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """One observation of the step series keyed by ``trainer.global_step``, as `observe_epoch`."""
        self._observe(trainer, pl_module, "step", int(trainer.global_step))

    @functools.cached_property
    def _step_settings(self) -> ObservationSettings:
        """The epoch series' settings without covariances."""
        return self.settings.replace(keep_covariance="none")

    def _observe(self, trainer: L.Trainer, pl_module: L.LightningModule, series: str, key: int) -> None:
        held = self._dashboard.held() if self._dashboard is not None else contextlib.nullcontext()
        with held, isolate_rng():
            self._observe_series(trainer, pl_module, series, key)

    def _observe_series(self, trainer: L.Trainer, pl_module: L.LightningModule, series: str, key: int) -> None:
        assert self._run is not None, "setup() runs before any observation"
        # At most one summary in flight: here training waits for the one before, and says so when it has to wait.
        with self._timed_wait(trainer, waiting_for(self._summaries, 0, tensorboard=False)):
            self.collect_summary(trainer)
        start = time.perf_counter()
        if self._analysis is None:  # observe_epoch called without a fit's setup
            self._settle_analysis(trainer)
        dataset = self._analysis
        plan = ShardPlan.for_rank(
            self.settings,
            rank=trainer.global_rank,
            world_size=trainer.world_size,
            default_batch_size=self._analysis_batch_size,
            default_num_workers=self._analysis_num_workers,
        )
        if series == "step":
            settings, epoch, keep = self._step_settings, int(trainer.current_epoch), False
        else:
            settings, epoch = self.settings, key
            keep = settings.keeps_covariance(epoch, first=epoch == 0, last=epoch == trainer.max_epochs)
        writer = RecordWriter(RunDir(self._run.root, series))
        self._logged_steps[(series, key)] = int(trainer.global_step)
        record = RecordPlan(writer=writer, epoch=epoch, step=trainer.global_step, with_covariance=keep)
        network = self._network(pl_module)
        with lightning_progress(trainer, f"{self._label}geometry of {record.label}") as progress:
            reduced = reduce_observation(
                network,
                dataset,
                self.points,
                settings=settings,
                plan=plan,
                record=record,
                all_reduce_sum=lambda t: trainer.strategy.reduce(t, reduce_op="sum"),
                is_global_zero=trainer.is_global_zero,
                device=pl_module.device,
                training=self._training_info(trainer, pl_module, epoch),
                forward=sharded_forward(trainer.strategy, pl_module, network),  # None under DDP or on one device
                progress=progress,
            )
        self.last_pass_seconds = time.perf_counter() - start
        share = summary_share(self.settings, plan, self._gather, trainer.is_global_zero)
        eigvalsh = self._summary_eigvalsh(pl_module.device)
        background = self.settings.summary.background
        if share.is_shared or trainer.is_global_zero:

            def job() -> Results | None:
                return summarize_and_record(reduced, share=share, eigvalsh=eigvalsh)

            if background:
                pending = self._summaries.submit(
                    job, label=f"summary of {series} {key}", epoch=epoch, step=trainer.global_step, series=series
                )
                pending.held_seconds = time.perf_counter() - start
            else:
                summary_start = time.perf_counter()
                results = job()
                self._finish(trainer, series, key, results, time.perf_counter() - summary_start)
                self._log_blocking(trainer, series, key, time.perf_counter() - start)
        else:
            self._mark_observed(series, key)
        if trainer.is_global_zero:
            where = "in the background" if background else f"in {self.last_summary_seconds or 0.0:.2f} s"
            rank_zero_info(
                f"[tgo] {self._label}geometry of {record.label} streamed and reduced over {len(dataset)} images in "
                f"{self.last_pass_seconds:.2f} s; summary {where}"
                + (f" shared by {share.world_size} ranks" if share.is_shared else "")
            )
        if not background and not share.is_shared:
            trainer.strategy.barrier("tgo_geometry_observed")

    def _training_info(self, trainer: L.Trainer, pl_module: L.LightningModule, epoch: int) -> TrainingInfo:
        """What the optimisation families read of the training loop: the first optimizer, its learning rate, the
        module's loss (`tgo.optimisation.training_loss`) and the collectors."""
        from tgo.optimisation import training_loss

        optimizers = trainer.optimizers
        optimizer = optimizers[0] if optimizers else None
        lr = float(optimizer.param_groups[0]["lr"]) if optimizer is not None else math.nan
        loss = training_loss(pl_module)
        return TrainingInfo(
            epoch=int(epoch),
            global_step=int(trainer.global_step),
            optimizer=optimizer,
            learning_rate=lr,
            loss=loss,
            collectors=dict(self.collectors),
        )

    def _summary_eigvalsh(self, device: torch.device) -> Any:
        """The summary's eigensolver (``summary.eigensolver``), resolved once for the observation's device."""
        if self._eigvalsh is None:
            from tgo.spectral.eigensolver import resolve_eigvalsh

            self._eigvalsh = resolve_eigvalsh(self.settings.summary.eigensolver, device)
        return self._eigvalsh

    def _log_blocking(self, trainer: L.Trainer, series: str, key: int, seconds: float) -> None:
        """Every second the observation held the training thread, including the wait for its summary and its logging."""
        self.last_blocking_seconds = seconds
        step = self._logged_steps.pop((series, key), key)  # other loggers: the optimizer step; its last use
        if trainer.is_global_zero:
            tag = f"{self._key_prefix(series)}geometry/blocking_seconds"
            for logger in trainer.loggers:
                if isinstance(logger, TensorBoardLogger):
                    logger.log_metrics({tag: seconds}, step=key)
                else:
                    logger.log_metrics({tag: seconds, **observation_keys(series, key)}, step=step)

    def _finish(
        self, trainer: L.Trainer, series: str, key: int, results: Results | None, seconds: float | None
    ) -> None:
        """An observation's summary is recorded: on rank 0 its scalars and figures are logged (training thread)."""
        self.last_summary_seconds = seconds
        self._mark_observed(series, key)
        if results is None:
            return
        logging_start = time.perf_counter()
        if series == "step":  # scalars only: the report draws the step series
            self._log_scalars(trainer, key, results, series="step")
        else:
            self._log(trainer, key, results)
        self.last_logging_seconds = time.perf_counter() - logging_start

    # ----------------------------------------------------------------------------------------- logging
    def _log(self, trainer: L.Trainer, epoch: int, results: Results) -> None:
        """Scalars to every logger (to TensorBoard as per-point runs); figures, when due, to TensorBoard only."""
        tensorboard = self._log_scalars(trainer, epoch, results, series="epoch")
        assert self._run is not None
        recorded = recorded_epochs(self._run.root)  # read once: the thinning index and the figures' history
        index = recorded.index(epoch)  # the run's n-th observation, resumed runs included
        due = index % self.settings.figures.every_n_observations == 0 or epoch == trainer.max_epochs
        if self._dashboard is not None and tensorboard is not None and due:
            self._dashboard.submit_figures(
                self._figure_writer(tensorboard), self._run.root, epoch, results, recorded, self.settings.figures
            )

    def _log_scalars(self, trainer: L.Trainer, key: int, results: Results, *, series: str) -> Any:
        """Scalars at step ``key`` to TensorBoard, in its per-point runs (the step series: view ``all`` only); to every
        other logger the headline set at the observation's optimizer step (`logger_keys`). Returns the TensorBoard
        logger, if any."""
        prefix = self._key_prefix(series)
        run_level = {
            f"{prefix}geometry/pass_seconds": float(self.last_pass_seconds or 0.0),
            f"{prefix}geometry/summary_seconds": float(self.last_summary_seconds or 0.0),
        }
        scalars = {**headline_scalars(results, prefix=prefix), **run_level, **observation_keys(series, key)}
        step = self._logged_steps.get((series, key), key)
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.log_metrics(run_level, step=key)
            else:
                logger.log_metrics(scalars, step=step)
        tensorboard = tensorboard_logger(trainer)
        if tensorboard is not None:
            if self._dashboard is None:
                points = [point.name for point in self.points]
                self._dashboard = TensorBoardDashboard(self._tensorboard_dir(tensorboard), points, story=self.story)
            if series == "step":
                results = Results({k: value for k, value in results.items() if k.view == DEFAULT_VIEW})
            self._dashboard.write_scalars(results, key, prefix=_series_prefix(series))
        return tensorboard

    @property
    def _label(self) -> str:
        """A named callback's messages start with its name (several networks in one fit)."""
        return f"{self.name}: " if self.name else ""

    def _key_prefix(self, series: str) -> str:
        """A logger key's prefix: the callback's name (several networks) and the step series' ``steps_``."""
        return (f"{self.name}/" if self.name else "") + _series_prefix(series)

    def _tensorboard_dir(self, tensorboard: TensorBoardLogger) -> str:
        """The TensorBoard directory of this callback's runs: a named callback's is a subfolder (``<name>/points``)."""
        return os.path.join(tensorboard.log_dir, self.name) if self.name else tensorboard.log_dir

    def _figure_writer(self, tensorboard: TensorBoardLogger) -> Any:
        """Where figures go: the logger's own run, or a named callback's run ``<log_dir>/<name>`` (tags kept apart)."""
        if not self.name:
            return tensorboard.experiment
        if self._named_writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._named_writer = SummaryWriter(log_dir=self._tensorboard_dir(tensorboard))
        return self._named_writer

    # ----------------------------------------------------------------------------------------- helpers
    def _network(self, pl_module: L.LightningModule) -> torch.nn.Module:
        return vit_network(pl_module, self.model, self.settings, what="the LightningModule")


def versioned_log_dir(logger: Any, default_root_dir: str | os.PathLike[str]) -> str:
    """A logger's versioned directory, as Lightning's ``ModelCheckpoint`` resolves it: ``log_dir`` for TensorBoard and
    CSV, else ``<save_dir or default_root_dir>/<name>/<version>``."""
    log_dir = getattr(logger, "log_dir", None)
    if isinstance(logger, TensorBoardLogger | CSVLogger) and log_dir:
        return os.fspath(log_dir)
    save_dir = logger.save_dir if logger.save_dir is not None else default_root_dir
    version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
    return os.path.join(os.fspath(save_dir), str(logger.name or ""), version)


def _series_prefix(series: str) -> str:
    """The logger-key prefix of a record series: none for the epoch series, ``steps_`` for the step series."""
    return "steps_" if series == "step" else ""


def nonfinite_notice(run: RunDir) -> str | None:
    """The end-of-run notice of every observation with non-finite activations (easy to miss in a long log)."""
    found = {}
    for epoch, points in load_spectra(run.root, arrays=("n_nonfinite",)).items():
        bad = {point: int(arrays["n_nonfinite"]) for point, arrays in points.items() if int(arrays["n_nonfinite"])}
        if bad:
            found[epoch] = bad
    if not found:
        return None
    listed = "; ".join(f"epoch {epoch}: {bad}" for epoch, bad in found.items())
    return (
        f"[tgo] this run recorded non-finite activations in {len(found)} observation(s) (rows excluded, observables "
        f"NaN): {listed}. Check the learning rate or the data; observation.nonfinite=error stops at the first one"
    )
