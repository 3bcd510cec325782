"""``SpectralGeometryCallback``: observe the spectral geometry of the network every N epochs.

A thin orchestrator: it decides *when* (epoch 0 before any update, every N completed epochs, always the last), takes
the DataModule's frozen analysis subset and hands the *how* to ``tgo.observatory`` (points, streaming pass, the
multi-rank pipeline), ``tgo.records`` (files) and ``tgo.viz`` (figures). Every setting is an
``ObservationSettings`` (the ``observation`` config group), shared with ``python -m tgo.observe``.

Epoch k means "after k completed training epochs". Observations happen at ``on_train_start`` (epoch 0, or a due
epoch a crashed run did not record before its checkpoint) and at ``on_train_epoch_end``. The records on disk are the
source of truth for what was already observed, so a resumed run neither repeats nor skips an epoch.

Scalars go to every Lightning logger of the trainer (``log_metrics``: CSV, W&B, MLflow alike) with the epoch as
step: the ``all`` view as ``geometry/<metric>/<point>`` (every observable, its probe metrics included), the other
views (``cls``, ``patch``, ``between_image``, ``within_image``) as ``geometry_<view>/<metric>/<point>`` (only
``CATALOGUE.charted_on(view)``: the charted covariance observables and the view's charted probes), and their
jackknife standard errors as ``geometry_stderr/...`` and ``geometry_stderr_<view>/...`` (`geometry_scalars`).

TensorBoard gets the same values differently, because it colours lines by run and sorts names alphabetically: every
point is its own run, ``<log dir>/points/<NN>_<point>`` (`tgo.callbacks.tensorboard_runs.PointRuns`, depth-ordered
names), holding the tags without the point, ``geometry/<metric>``, ``geometry_<view>/<metric>``,
``geometry_stderr[_<view>]/<metric>`` and ``geometry_band/<metric>/{lower,upper}`` (`point_scalars`). So one chart
is one observable with every point as its own coloured, labelled line in depth order. The Lightning TensorBoard run
itself keeps only the run-level scalars (``geometry/pass_seconds``, ``geometry/blocking_seconds``), the figures,
histograms and a custom-scalars layout (`custom_scalar_layout`): the per-point copies there would be ~300
one-line cards listed ``block_01 .. block_12, cls, patch_embed, pos_embed``, beside the per-point runs' charts.
The figures include one depth profile per main observable (`tgo.viz.depth_profile_figure`, one line per observed
epoch on a colour ramp), drawn from the records just written (so a resumed run's figures show its whole history).
Every figure is one TensorBoard card, drawn to be read at the card's size (`tgo.viz.CARD_FIGSIZE`): one spectra
card per point (``spectra/<NN>_<point>``), one layer x epoch heatmap per charted observable
(``layer_epoch/<metric>``), the decay curves of every point (``decay/all_points``), the correlation matrices
(``correlation/<NN>_<point>``) and the log-eigenvalue histograms (``spectrum_log10/<NN>_<point>``). Per-point tags
carry the point runs' depth index (`tgo.callbacks.tensorboard_runs.point_run_names`), so TensorBoard's alphabetical
lists show them in depth order.

Figures are rendered off the training thread: once an observation is recorded and its scalars logged, its figures
go to a bounded background `FigureWorker` (at most ``FIGURES_IN_FLIGHT`` observations queued or rendering; a further
one waits), which draws them with matplotlib's object API and an Agg canvas and writes them through the same
TensorBoard writer. The worker is drained and the writer flushed at ``on_fit_end``, ``on_exception`` and ``teardown``,
so every figure is written before ``fit`` returns or re-raises; a hard crash loses at most the figures in flight,
never records. ``geometry/blocking_seconds`` logs the time the observation held the training thread (the pass,
the scalars and the hand-off), beside ``geometry/pass_seconds``.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loggers import Logger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.seed import isolate_rng

from tgo import viz
from tgo.errors import UserInputError
from tgo.observatory import (
    DEFAULT_VIEW,
    NonFiniteActivationsError,
    ObservationKey,
    ObservationPoint,
    ObservationSettings,
    PointResult,
    RecordPlan,
    Results,
    ShardPlan,
    observe_and_record,
    points_from_config,
    resolve_points,
)
from tgo.observatory.find_vit import ModelSpec
from tgo.observatory.standalone import (
    DEFAULT_BATCH_SIZE,
    RunDirectoryError,
    claim_run_directory,
    observation_settings,
    prepare_analysis,
    vit_network,
)
from tgo.observatory.stream import token_layouts
from tgo.observatory.views import VIEWS
from tgo.records import RecordWriter, RunDir, load_series, load_spectra, recorded_epochs
from tgo.spectral import CATALOGUE

from .figure_worker import FigureWorker
from .tensorboard_runs import PointRuns, point_run_names

__all__ = [
    "NonFiniteActivationsError",
    "SpectralGeometryCallback",
    "geometry_scalars",
    "geometry_tag",
    "logged_metrics",
    "point_scalars",
]

FIGURES_IN_FLIGHT = 2
"""Observations whose figures may be queued or rendering at once; the next observation's hand-off waits for one."""
DEPTH_PROFILES = ("effective_rank", "participation_ratio", "stable_rank", "spectral_anisotropy")
"""The observables drawn against depth in TensorBoard, one figure each. The report also draws spectral entropy (the
log of the effective rank: the same profile) and flatness; TensorBoard keeps to four because every figure costs
background rendering time at each observation."""
FIGURE_DRAIN_TIMEOUT_S = 600.0
"""How long the end of ``fit`` (or an exception) waits for the figures in flight before warning and going on."""


def geometry_tag(metric: str, key: ObservationKey, *, kind: str = "geometry") -> str:
    """The logger key of one observable: ``geometry/<metric>/<point>``, ``geometry_<view>/<metric>/<point>``.

    The ``all`` view keeps the unsuffixed prefix (the key of records and dashboards from before views existed).
    ``kind="geometry_stderr"`` names its jackknife standard error (``geometry_stderr_<view>/...`` for other views).
    """
    return f"{_tag_prefix(key.view, kind)}/{metric}/{key.point}"


def _tag_prefix(view: str, kind: str = "geometry") -> str:
    return kind if view == DEFAULT_VIEW else f"{kind}_{view}"


def logged_metrics(key: ObservationKey, result: PointResult) -> list[str]:
    """The metrics of one (point, view) that go to the loggers, in record order.

    Every observable of the ``all`` view (its probe metrics included); of the other views only those charted on it
    (`tgo.spectral.Catalogue.charted_on`): about half the scalars of logging every record (1148 against 2280 per
    observation of the smoke experiment's 7 points, values and standard errors together).
    """
    if key.view == DEFAULT_VIEW:
        return list(result.observables)
    charted = set(CATALOGUE.charted_on(key.view))
    return [metric for metric in result.observables if metric in charted]


def _metric_scalars(results: Results) -> Iterator[tuple[str, str, float]]:
    """``(point, <prefix>/<metric>, value)`` of every `logged_metrics` value (NaN included) and its finite stderr."""
    for key, result in results.items():
        metrics = logged_metrics(key, result)
        for metric in metrics:
            yield key.point, f"{_tag_prefix(key.view)}/{metric}", float(result.observables[metric])
        for metric in metrics:
            if math.isfinite(se := result.stderr.get(metric, math.nan)):
                yield key.point, f"{_tag_prefix(key.view, 'geometry_stderr')}/{metric}", float(se)


def geometry_scalars(results: Results) -> dict[str, float]:
    """``{logger key: value}`` of one observation: every `logged_metrics` value (NaN included) and its finite stderr."""
    return {f"{tag}/{point}": value for point, tag, value in _metric_scalars(results)}


def point_scalars(results: Results) -> dict[str, dict[str, float]]:
    """``{point: {tag: value}}``: `geometry_scalars` without the point in the tag, plus the ``all`` view's bands.

    What each point's own TensorBoard run holds (`tgo.callbacks.tensorboard_runs.PointRuns`): the same tag in every run,
    so TensorBoard draws one chart per tag with one line per point. The bands ``geometry_band/<metric>/lower`` and
    ``/upper`` (value -/+ stderr of the charted observables, where both are finite) feed the custom-scalars Margin
    charts.
    """
    scalars: dict[str, dict[str, float]] = {point: {} for point in results.by_point()}
    for point, tag, value in _metric_scalars(results):
        scalars.setdefault(point, {})[tag] = value
    for point, result in results.by_point().items():
        for metric in CATALOGUE.charted:
            value, se = result.observables.get(metric, math.nan), result.stderr.get(metric, math.nan)
            if math.isfinite(value) and math.isfinite(se):
                scalars[point][f"geometry_band/{metric}/lower"] = value - se
                scalars[point][f"geometry_band/{metric}/upper"] = value + se
    return scalars


class SpectralGeometryCallback(L.Callback):
    """Observes covariance spectra at the configured points of the LightningModule's ViT on the analysis set.

    In any Lightning training, in a few lines::

        from tgo.callbacks import SpectralGeometryCallback
        from tgo.data import stratified_subset
        analysis = stratified_subset(val_set, per_class=10, seed=0)  # any labelled Dataset of (image, label)
        geometry = SpectralGeometryCallback(analysis=analysis, every_n_epochs=5)  # finds the timm ViT in your module
        trainer = L.Trainer(max_epochs=20, callbacks=[geometry])

    Records go to ``<trainer.default_root_dir>/geometry/`` (``python -m tgo.report <default_root_dir>`` reads them).
    In a directory that ``tgo.train`` did not make its run, TGO writes only ``geometry/`` and
    ``analysis_subset.json`` there and refuses, before the first training step, a ``geometry/`` or manifest it did
    not make, or the records of another training (`tgo.observatory.standalone.claim_run_directory`).

    Everything is checked in ``setup``, before any training step, each problem in one line: no analysis set, one
    that is not a map-style dataset of ``(image tensor, int label)``, no / several / a missing ViT, a network that
    is not a ViT, bad settings (in the constructor). An analysis set whose classes have unequal counts warns once.

    Args:
        settings: `ObservationSettings`, or the ``observation`` config node / a mapping of its keys (validated;
            ``None`` means the defaults).
        analysis: The analysis set: a map-style ``Dataset`` of ``(image, label)`` (`tgo.data.stratified_subset`
            draws one), or a ``DataLoader`` over one (its dataset, batch size and workers are used). ``None``: the
            DataModule's ``analysis_dataset`` (with its ``analysis_batch_size`` and ``num_workers``), as
            ``python -m tgo.train`` uses it. The same set must be given on every rank.
        model: The ViT inside the LightningModule: an attribute path (``"backbone"``, ``"encoder.vit"``), a
            callable taking the LightningModule and returning it, or ``None``: the one timm ``VisionTransformer``
            among its submodules (`tgo.observatory.find_vit`).
        **setting_overrides: Any `ObservationSettings` key (``every_n_epochs=5``, ``groups=0``, ...), applied over
            ``settings`` and validated the same way.
    """

    def __init__(
        self,
        settings: ObservationSettings | Mapping[str, Any] | None = None,
        *,
        analysis: Any = None,
        model: ModelSpec = None,
        **setting_overrides: Any,
    ) -> None:
        super().__init__()
        self.settings = observation_settings(settings, setting_overrides)
        if model is not None and not isinstance(model, str) and not callable(model):
            raise UserInputError(
                f"SpectralGeometryCallback: model={model!r}; expected None (find the ViT), an attribute path such as "
                "'backbone', or a callable taking the LightningModule and returning the network"
            )
        self.analysis = analysis
        self.model = model
        self.points: list[ObservationPoint] = []
        self.observed_epochs: list[int] = []
        self.last_pass_seconds: float | None = None  # stream + reduce + eigendecompose + records
        self.last_logging_seconds: float | None = None  # logger scalars and handing the figures to the worker
        self.last_blocking_seconds: float | None = None  # the whole observation on the training thread
        self._run: RunDir | None = None
        self._figures: FigureWorker | None = None  # rank 0's background figure renderer, started on first use
        self._point_runs: PointRuns | None = None  # rank 0's per-point TensorBoard runs, opened on first use
        self._views = tuple(view for view in VIEWS if view != "prefix")  # the views recorded, known in setup
        self._analysis: Any = None  # the checked analysis set (with .labels), settled in setup
        self._analysis_batch_size = DEFAULT_BATCH_SIZE
        self._analysis_num_workers = 0
        self._warned_unstratified = False
        self._claimed: RunDir | None = None  # the run directory checked (and its manifest written) at train start

    # ----------------------------------------------------------------------------------------- lifecycle
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Finds the network, resolves the observation points and (to fit) checks the analysis set, before training,
        so a bad input fails before any update."""
        net = self._network(pl_module)
        self.points = points_from_config(self.settings.points, net)
        resolve_points(net, self.points)
        prefix = any("prefix" in layout.kinds for layout in token_layouts(net, self.points).values())
        self._views = tuple(view for view in VIEWS if view != "prefix" or prefix)
        self._run = RunDir(trainer.default_root_dir)
        if stage == "fit":
            self._settle_analysis(trainer)

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
        """Outside a ``tgo.train`` run directory: rank 0 checks that TGO may record into ``default_root_dir`` (and,
        with ``analysis=``, writes its manifest); every rank raises together if not. Collective."""
        assert self._run is not None
        problem = None
        if trainer.is_global_zero and not self._run.is_marked():
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
        if self._claimed != self._run:
            self._claim_run_directory(trainer)
            self._claimed = self._run
        if trainer.is_global_zero:
            self._add_custom_scalar_layout(trainer)
        completed = trainer.current_epoch
        if self._should_observe(completed, trainer):
            self.observe_epoch(trainer, pl_module, completed)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        completed = trainer.current_epoch + 1
        if self._should_observe(completed, trainer):
            self.observe_epoch(trainer, pl_module, completed)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.finish_tensorboard(trainer)
        if trainer.is_global_zero and self._run is not None:
            notice = nonfinite_notice(self._run)
            if notice:
                warnings.warn(notice, RuntimeWarning, stacklevel=2)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.finish_tensorboard(trainer)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.finish_tensorboard(trainer)

    def finish_tensorboard(self, trainer: L.Trainer | None = None) -> bool:
        """Drains the figures (`drain_figures`) and closes the per-point runs; idempotent (every end of ``fit``
        calls it). ``False`` if figures were still rendering at the timeout."""
        drained = self.drain_figures(trainer)
        runs, self._point_runs = self._point_runs, None
        if runs is not None:
            runs.close()
        return drained

    def drain_figures(self, trainer: L.Trainer | None = None, timeout: float = FIGURE_DRAIN_TIMEOUT_S) -> bool:
        """Waits for every queued figure, stops the worker and flushes TensorBoard. ``False`` if it timed out."""
        worker, self._figures = self._figures, None
        drained = True
        if worker is not None:
            drained = worker.close(timeout)
            if not drained:
                warnings.warn(
                    f"[tgo] TensorBoard figures still rendering after {timeout:.0f} s; going on without them "
                    "(the records are complete)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        tensorboard = self._tensorboard(trainer) if trainer is not None else None
        if tensorboard is not None and worker is not None:
            tensorboard.experiment.flush()
        return drained

    def state_dict(self) -> dict[str, Any]:
        return {"observed_epochs": list(self.observed_epochs)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.observed_epochs = sorted(set(self.observed_epochs) | set(state_dict.get("observed_epochs", [])))

    # ----------------------------------------------------------------------------------------- schedule
    def _is_due(self, completed: int, trainer: L.Trainer) -> bool:
        every = self.settings.every_n_epochs
        return completed == 0 or completed % every == 0 or completed == trainer.max_epochs

    def _should_observe(self, completed: int, trainer: L.Trainer) -> bool:
        """Due and not yet recorded, as decided by rank 0 and broadcast, so every rank enters the pass together.

        Only rank 0 is sure to see the records (other nodes may not share its disk); a rank deciding on its own
        could skip a collective that the others enter and hang the job.
        """
        if not self._is_due(completed, trainer):  # pure arithmetic: identical on every rank
            return False
        decision = not self._already_observed(completed) if trainer.is_global_zero else False
        return bool(trainer.strategy.broadcast(decision, src=0))

    def _already_observed(self, epoch: int) -> bool:
        on_disk = recorded_epochs(self._run.root) if self._run is not None else []
        return epoch in self.observed_epochs or epoch in on_disk

    # ----------------------------------------------------------------------------------------- observation
    def observe_epoch(self, trainer: L.Trainer, pl_module: L.LightningModule, epoch: int) -> None:
        """Runs one observation on every rank; rank 0 records and logs. Collective: call on all ranks.

        Earlier observations' figures still rendering are paused meanwhile (between figures), so they do not
        contend with the pass for the GIL; they resume when the observation returns.

        The pass runs with the random generators isolated (its data loader draws a seed from torch's global
        generator): training draws the same random numbers however often it is observed, and a resumed run continues
        the uninterrupted run's stream (`tgo.callbacks.random_state`).
        """
        held = self._figures.held() if self._figures is not None else contextlib.nullcontext()
        with held, isolate_rng():
            self._observe_epoch(trainer, pl_module, epoch)

    def _observe_epoch(self, trainer: L.Trainer, pl_module: L.LightningModule, epoch: int) -> None:
        assert self._run is not None, "setup() runs before any observation"
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
        keep = self.settings.keeps_covariance(epoch, first=epoch == 0, last=epoch == trainer.max_epochs)
        record = RecordPlan(writer=RecordWriter(self._run), epoch=epoch, step=trainer.global_step, with_covariance=keep)
        results = observe_and_record(
            self._network(pl_module),
            dataset,
            self.points,
            settings=self.settings,
            plan=plan,
            record=record,
            all_reduce_sum=lambda t: trainer.strategy.reduce(t, reduce_op="sum"),
            is_global_zero=trainer.is_global_zero,
            device=pl_module.device,
        )
        self.last_pass_seconds = time.perf_counter() - start
        if results is not None:
            logging_start = time.perf_counter()
            self._log(trainer, epoch, results)
            self.last_logging_seconds = time.perf_counter() - logging_start
            self.last_blocking_seconds = time.perf_counter() - start
            for logger in trainer.loggers:
                logger.log_metrics({"geometry/blocking_seconds": self.last_blocking_seconds}, step=epoch)
            rank_zero_info(
                f"[tgo] geometry observed at epoch {epoch} over {len(dataset)} images in "
                f"{self.last_pass_seconds:.2f} s (+{self.last_logging_seconds:.2f} s logging; figures in background)"
            )
        self.observed_epochs = sorted(set(self.observed_epochs) | {epoch})
        trainer.strategy.barrier("tgo_geometry_observed")

    # ----------------------------------------------------------------------------------------- logging
    def _log(self, trainer: L.Trainer, epoch: int, results: Results) -> None:
        """Scalars to every logger (to TensorBoard as per-point runs); figures and histograms to TensorBoard only."""
        run_level = {"geometry/pass_seconds": float(self.last_pass_seconds or 0.0)}
        scalars = {**geometry_scalars(results), **run_level}
        for logger in trainer.loggers:
            logger.log_metrics(run_level if isinstance(logger, TensorBoardLogger) else scalars, step=epoch)
        tensorboard = self._tensorboard(trainer)
        if tensorboard is not None:
            if self._point_runs is None:
                self._point_runs = PointRuns(tensorboard.log_dir, [point.name for point in self.points])
            self._point_runs.write(point_scalars(results), step=epoch)
        assert self._run is not None
        recorded = recorded_epochs(self._run.root)  # read once: the thinning index and the figures' history
        index = recorded.index(epoch)  # the run's n-th observation, resumed runs included
        due = index % self.settings.figures.every_n_observations == 0 or epoch == trainer.max_epochs
        if tensorboard is not None and due:
            if self._figures is None:
                self._figures = FigureWorker(FIGURES_IN_FLIGHT, name="tgo-geometry-figures")
            job = self._figure_job(tensorboard.experiment, epoch, results, recorded)
            self._figures.submit(job, label=f"geometry figures of epoch {epoch}")

    @staticmethod
    def _tensorboard(trainer: L.Trainer) -> TensorBoardLogger | None:
        loggers: list[Logger] = list(trainer.loggers)
        return next((lg for lg in loggers if isinstance(lg, TensorBoardLogger)), None)

    def _add_custom_scalar_layout(self, trainer: L.Trainer) -> None:
        tensorboard = self._tensorboard(trainer)
        if tensorboard is not None:
            tensorboard.experiment.add_custom_scalars(self.custom_scalar_layout())

    def custom_scalar_layout(self) -> dict[str, dict[str, list[Any]]]:
        """TensorBoard's custom-scalars layout: ``{category: {chart title: [chart kind, [tag regexes]]}}``.

        The per-point runs already give every tag its own chart of coloured lines, one per point; this layout is
        kept because it is the curated page: only the charted observables (the Time Series page also lists standard
        errors, bands and diagnostics), in catalogue order rather than alphabetically, and standard-error bands,
        which no other page draws. Per view the model records (``prefix`` only with registers or a distillation
        token, known in ``setup``) one category of Multiline charts, one per charted observable of that
        view (its probes included), each matching exactly ``geometry[_<view>]/<metric>`` (TensorBoard anchors the
        regex at the start of the tag; the ``$`` keeps ``effective_rank`` from also matching
        ``effective_rank_vs_noise``) and drawing one line per point run; with the probes off, only the ``all``
        view's charted covariance observables. With jackknife groups, one more category of ``value -/+ 1 s.e.``
        Margin charts, one per charted observable of the ``all`` view, each band a point run's; added in reverse
        catalogue order, because TensorBoard lists a category's Margin charts last-added first.
        """
        layout: dict[str, dict[str, list[Any]]] = {}
        probes = self.settings.probes.enabled  # without probes only the all view and no probe metric is recorded
        for view in self._views if probes else (DEFAULT_VIEW,):
            own = view != DEFAULT_VIEW  # the all view keeps the category and chart titles of before views existed
            category = f"TGO geometry, {view} view (one line per point)" if own else "TGO geometry (one line per point)"
            layout[category] = {
                f"{metric} ({view})" if own else metric: ["Multiline", [f"{_tag_prefix(view)}/{metric}$"]]
                for metric in (CATALOGUE.charted_on(view) if probes else CATALOGUE.charted)
            }
        if self.settings.groups:
            layout["TGO geometry \u00b1 1 jackknife s.e. (one band per point)"] = {
                metric: [
                    "Margin",
                    [f"geometry/{metric}", f"geometry_band/{metric}/lower", f"geometry_band/{metric}/upper"],
                ]
                for metric in reversed(CATALOGUE.charted)  # TensorBoard lists Margin charts last-added first
            }
        return layout

    def _log_figures(self, writer: Any, epoch: int, results: Results, recorded: list[int]) -> None:
        """Draws and writes one observation's figures on the calling thread (what the worker runs, in one call)."""
        for _ in self._figure_job(writer, epoch, results, recorded)():
            pass

    def _figure_job(
        self, writer: Any, epoch: int, results: Results, recorded: list[int]
    ) -> Callable[[], Iterator[None]]:
        """One observation's figures as a job for the background worker, drawn from what was just recorded.

        The arrays it needs are copied now (the job owns them); the history (spectra of the ``recorded`` epochs,
        the metrics series up to ``epoch``) is read from the records by the job: they hold the whole history, also
        of a resumed run, and are written atomically, so a later observation being recorded meanwhile is harmless.
        """
        assert self._run is not None
        root = self._run.root
        figures = self.settings.figures
        own = results.by_point()  # the default view of every point, in depth order
        eigenvalues = {point: np.array(result.spectrum.eigenvalues, copy=True) for point, result in own.items()}
        covariances = {
            point: np.array(result.covariance, copy=True)
            for point, result in own.items()
            if figures.heatmaps and np.all(np.isfinite(result.covariance))
        }
        recorded = list(recorded)
        names = list(own)
        tag_names = point_run_names(names)  # <NN>_<point>: TensorBoard sorts tags as strings, so in depth order

        def job() -> Iterator[None]:  # one step per figure: the worker may pause between them
            for point, values in eigenvalues.items():
                positive = values[np.isfinite(values) & (values > 0)]
                if figures.histograms and positive.size:
                    writer.add_histogram(f"spectrum_log10/{tag_names[point]}", np.log10(positive), global_step=epoch)
                if point in covariances:
                    image = viz.correlation_card(covariances[point], max_dim=figures.heatmap_max_dim)
                    writer.add_image(f"correlation/{tag_names[point]}", image, global_step=epoch, dataformats="HWC")
            yield
            if figures.spectra:  # one card per point: a grid of every point is unreadable at a card's size
                spectra = load_spectra(root, recorded, arrays=("eigenvalues",))
                histories = {
                    name: [(e, per_point[name]["eigenvalues"]) for e, per_point in spectra.items() if name in per_point]
                    for name in names
                }
                for name, image in viz.spectrum_cards(histories):
                    writer.add_image(f"spectra/{tag_names[name]}", image, global_step=epoch, dataformats="HWC")
                    yield
            if figures.decay:
                decay = viz.decay_curves_figure(eigenvalues, title=f"spectral decay, epoch {epoch}")
                self._add_figure(writer, "decay/all_points", decay, epoch)
                yield
            if figures.layer_epoch:  # the layer x epoch summaries: one heatmap and one depth profile per observable
                series = load_series(root, metrics=CATALOGUE.charted)
                epochs = sorted(
                    {int(e) for per_point in series.values() for es, _ in per_point.values() for e in es if e <= epoch}
                )
                tables = {
                    metric: _layer_epoch_table(series.get(metric, {}), names, epochs) for metric in CATALOGUE.charted
                }
                for metric, image in viz.layer_epoch_cards(tables, names, epochs):
                    writer.add_image(f"layer_epoch/{metric}", image, global_step=epoch, dataformats="HWC")
                    yield
                for metric, profiles in _depth_profiles(root, names, epoch).items():
                    figure = viz.depth_profile_figure(profiles, names, title=metric, fontsize=viz.CARD_FONTSIZE)
                    self._add_figure(writer, f"depth_profile/{metric}", figure, epoch)
                    yield
            writer.flush()

        return job

    @staticmethod
    def _add_figure(writer: Any, tag: str, fig: Any, epoch: int) -> None:
        """Renders with the figure's own Agg canvas (never pyplot: this runs on the worker thread)."""
        writer.add_image(tag, viz.render_rgb(fig), global_step=epoch, dataformats="HWC")

    # ----------------------------------------------------------------------------------------- helpers
    def _network(self, pl_module: L.LightningModule) -> torch.nn.Module:
        """The network inside the LightningModule (``model=``, else its one timm ViT, else its ``net``), never the DDP
        wrapper or a compiled copy."""
        return vit_network(pl_module, self.model, self.settings, what="the LightningModule")


def nonfinite_notice(run: RunDir) -> str | None:
    """The end-of-run notice of every recorded observation with non-finite activations (``nonfinite=warn``).

    Each one was warned about when it happened, but in a long log that is easy to miss; a run whose records hold
    NaN observables says so once more when it ends, with every epoch and point, or ``None`` when all are finite.
    """
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


def _depth_profiles(
    root: Any, points: list[str], up_to: int, metrics: tuple[str, ...] = DEPTH_PROFILES
) -> dict[str, dict[int, tuple[np.ndarray, np.ndarray]]]:
    """``{metric: {epoch: (values [P], stderrs [P])}}`` of the recorded epochs ``<= up_to``, for the depth profiles.

    Read from the records (the whole history, also of a resumed run), NaN where a point has no value; metrics
    that were not recorded are left out.
    """
    values = load_series(root, metrics=metrics)
    stderrs = load_series(root, metrics=metrics, column="stderr")
    profiles: dict[str, dict[int, tuple[np.ndarray, np.ndarray]]] = {}
    for metric in (m for m in metrics if m in values):
        epochs = sorted({int(e) for es, _ in values[metric].values() for e in es if e <= up_to})
        value_table = _layer_epoch_table(values[metric], points, epochs)
        stderr_table = _layer_epoch_table(stderrs.get(metric, {}), points, epochs)
        profiles[metric] = {e: (value_table[:, j], stderr_table[:, j]) for j, e in enumerate(epochs)}
    return profiles


def _layer_epoch_table(
    per_point: Mapping[str, tuple[np.ndarray, np.ndarray]], points: list[str], epochs: list[int]
) -> np.ndarray:
    """``[len(points), len(epochs)]`` values of one metric, NaN where a point has no value at an epoch."""
    table = np.full((len(points), len(epochs)), np.nan)
    column = {e: j for j, e in enumerate(epochs)}
    for i, point in enumerate(points):
        for e, v in zip(*per_point.get(point, ((), ())), strict=False):
            if int(e) in column:  # epochs recorded after the figure's own are not drawn
                table[i, column[int(e)]] = v
    return table
