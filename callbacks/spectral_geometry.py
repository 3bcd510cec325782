"""``SpectralGeometryCallback``: observe the spectral geometry of the network every N epochs.

A thin orchestrator: it decides *when* (epoch 0 before any update, every N completed epochs, always the last), takes
the DataModule's frozen analysis subset and hands the *how* to ``tgo.observatory`` (points, streaming pass, the
multi-rank pipeline), ``tgo.records`` (files) and ``tgo.viz`` (figures). Every setting is an
``ObservationSettings`` (the ``observation`` config group), shared with ``python -m tgo.observe``.

Epoch k means "after k completed training epochs". Observations happen at ``on_train_start`` (epoch 0, or a due
epoch a crashed run did not record before its checkpoint) and at ``on_train_epoch_end``. The records on disk are the
source of truth for what was already observed, so a resumed run neither repeats nor skips an epoch.

Scalars go to every Lightning logger of the trainer (``log_metrics``: TensorBoard, CSV, W&B, MLflow alike) with the
epoch as step: the ``all`` view as ``geometry/<metric>/<point>`` (every observable, its probe metrics included), the
other views (``cls``, ``patch``, ``between_image``, ``within_image``) as ``geometry_<view>/<metric>/<point>`` (only
``CATALOGUE.charted_on(view)``: the charted covariance observables and the view's charted probes), and their
jackknife standard errors as ``geometry_stderr/...`` and ``geometry_stderr_<view>/...`` (`geometry_scalars`).
TensorBoard also gets a custom-scalars layout (per view one chart per charted observable, and ``value -/+ stderr``
Margin charts per point of the ``all`` view), histograms and figures, drawn from the records just written (so a
resumed run's figures show its whole history).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loggers import Logger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info

from tgo import viz
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
    unwrap_model,
)
from tgo.observatory.views import VIEWS
from tgo.records import RecordWriter, RunDir, load_series, load_spectra, recorded_epochs
from tgo.spectral import CATALOGUE

__all__ = [
    "NonFiniteActivationsError",
    "SpectralGeometryCallback",
    "geometry_scalars",
    "geometry_tag",
    "logged_metrics",
]


def geometry_tag(metric: str, key: ObservationKey, *, kind: str = "geometry") -> str:
    """The logger key of one observable: ``geometry/<metric>/<point>``, ``geometry_<view>/<metric>/<point>``.

    The ``all`` view keeps the unsuffixed prefix (the key of records and dashboards from before views existed).
    ``kind="geometry_stderr"`` names its jackknife standard error (``geometry_stderr_<view>/...`` for other views),
    ``geometry_band`` its TensorBoard band.
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


def geometry_scalars(results: Results) -> dict[str, float]:
    """``{logger key: value}`` of one observation: every `logged_metrics` value (NaN included) and its finite stderr."""
    scalars: dict[str, float] = {}
    for key, result in results.items():
        metrics = logged_metrics(key, result)
        scalars.update({geometry_tag(metric, key): float(result.observables[metric]) for metric in metrics})
        scalars.update(
            {
                geometry_tag(metric, key, kind="geometry_stderr"): float(se)
                for metric in metrics
                if math.isfinite(se := result.stderr.get(metric, math.nan))
            }
        )
    return scalars


class SpectralGeometryCallback(L.Callback):
    """Observes covariance spectra at the configured points of ``pl_module.net`` on the analysis subset.

    Args:
        settings: `ObservationSettings`, or the ``observation`` config node / a mapping of its keys (validated;
            ``None`` means the defaults).
    """

    def __init__(self, settings: ObservationSettings | Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.settings = ObservationSettings.from_config(settings)
        self.points: list[ObservationPoint] = []
        self.observed_epochs: list[int] = []
        self.last_pass_seconds: float | None = None  # stream + reduce + eigendecompose + records
        self.last_logging_seconds: float | None = None  # logger scalars and TensorBoard figures
        self._run: RunDir | None = None

    # ----------------------------------------------------------------------------------------- lifecycle
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Resolves the observation points before training, so a bad module path fails before any update."""
        net = self._network(pl_module)
        self.points = points_from_config(self.settings.points, net)
        resolve_points(net, self.points)
        self._run = RunDir(trainer.default_root_dir)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            self._add_custom_scalar_layout(trainer)
        completed = trainer.current_epoch
        if self._should_observe(completed, trainer):
            self.observe_epoch(trainer, pl_module, completed)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        completed = trainer.current_epoch + 1
        if self._should_observe(completed, trainer):
            self.observe_epoch(trainer, pl_module, completed)

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
        """Runs one observation on every rank; rank 0 records and logs. Collective: call on all ranks."""
        assert self._run is not None, "setup() runs before any observation"
        start = time.perf_counter()
        datamodule = trainer.datamodule  # type: ignore[attr-defined]  # set by fit(datamodule=...)
        dataset = datamodule.analysis_dataset
        plan = ShardPlan.for_rank(
            self.settings,
            rank=trainer.global_rank,
            world_size=trainer.world_size,
            default_batch_size=getattr(datamodule, "analysis_batch_size", 64),
            default_num_workers=getattr(datamodule, "num_workers", 0),
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
            rank_zero_info(
                f"[tgo] geometry observed at epoch {epoch} over {len(dataset)} images in "
                f"{self.last_pass_seconds:.2f} s (+{self.last_logging_seconds:.2f} s logging)"
            )
        self.observed_epochs = sorted(set(self.observed_epochs) | {epoch})
        trainer.strategy.barrier("tgo_geometry_observed")

    # ----------------------------------------------------------------------------------------- logging
    def _log(self, trainer: L.Trainer, epoch: int, results: Results) -> None:
        """Scalars to every logger; TensorBoard extras (histograms, images, figures) to TensorBoard only."""
        scalars = geometry_scalars(results)
        scalars["geometry/pass_seconds"] = float(self.last_pass_seconds or 0.0)
        for logger in trainer.loggers:
            logger.log_metrics(scalars, step=epoch)
        tensorboard = self._tensorboard(trainer)
        if tensorboard is not None:
            self._log_bands(tensorboard.experiment, epoch, results)
        assert self._run is not None
        recorded = recorded_epochs(self._run.root)  # read once: the thinning index and the figures' history
        index = recorded.index(epoch)  # the run's n-th observation, resumed runs included
        due = index % self.settings.figures.every_n_observations == 0 or epoch == trainer.max_epochs
        if tensorboard is not None and due:
            self._log_figures(tensorboard.experiment, epoch, results, recorded)
            tensorboard.experiment.flush()

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

        Per view one category of Multiline charts, one per charted observable of that view (its probes included),
        each matching ``geometry[_<view>]/<metric>/.*`` (TensorBoard anchors the regex at the start of the tag and
        draws one line per point); with the probes off, only the ``all`` view's charted covariance observables. With
        jackknife groups, per charted observable of the ``all`` view a category of ``value -/+ 1 s.e.`` Margin
        charts, one per point in depth order.
        """
        layout: dict[str, dict[str, list[Any]]] = {}
        probes = self.settings.probes.enabled  # without probes only the all view and no probe metric is recorded
        for view in VIEWS if probes else (DEFAULT_VIEW,):
            own = view != DEFAULT_VIEW  # the all view keeps the category and chart titles of before views existed
            category = f"TGO geometry, {view} view (one line per point)" if own else "TGO geometry (one line per point)"
            layout[category] = {
                f"{metric} ({view})" if own else metric: ["Multiline", [f"{_tag_prefix(view)}/{metric}/.*"]]
                for metric in (CATALOGUE.charted_on(view) if probes else CATALOGUE.charted)
            }
        if self.settings.groups:
            for metric in CATALOGUE.charted:
                # TensorBoard lists a category's charts last-added first: add them deepest first to read in depth order.
                layout[f"TGO {metric} \u00b1 1 jackknife s.e."] = {
                    f"{depth:02d} {point.name}": ["Margin", [geometry_tag(metric, key), *self._band_tags(metric, key)]]
                    for depth, point in reversed(list(enumerate(self.points)))
                    for key in [ObservationKey(point.name)]
                }
        return layout

    @staticmethod
    def _band_tags(metric: str, key: ObservationKey) -> tuple[str, str]:
        band = geometry_tag(metric, key, kind="geometry_band")
        return f"{band}/lower", f"{band}/upper"

    def _log_bands(self, writer: Any, epoch: int, results: Results) -> None:
        """value -/+ stderr of the ``all`` view's charted observables, drawn by the custom-scalars Margin charts."""
        for point, result in results.by_point().items():
            key = ObservationKey(point)
            for metric in CATALOGUE.charted:
                value, se = result.observables.get(metric, math.nan), result.stderr.get(metric, math.nan)
                if math.isfinite(value) and math.isfinite(se):
                    lower, upper = self._band_tags(metric, key)
                    writer.add_scalar(lower, value - se, global_step=epoch)
                    writer.add_scalar(upper, value + se, global_step=epoch)

    def _log_figures(self, writer: Any, epoch: int, results: Results, recorded: list[int]) -> None:
        """Draws from what was just recorded: the records hold the whole history, also of a resumed run."""
        assert self._run is not None
        figures = self.settings.figures
        own = results.by_point()  # the default view of every point, in depth order
        for point, result in own.items():
            eigenvalues = result.spectrum.eigenvalues
            positive = eigenvalues[np.isfinite(eigenvalues) & (eigenvalues > 0)]
            if figures.histograms and positive.size:
                writer.add_histogram(f"spectrum_log10/{point}", np.log10(positive), global_step=epoch)
            if figures.heatmaps and np.all(np.isfinite(result.covariance)):
                image = viz.correlation_image(result.covariance, max_dim=figures.heatmap_max_dim)
                writer.add_image(f"correlation/{point}", image, global_step=epoch, dataformats="HWC")
        names = list(own)
        if figures.spectra:
            spectra = load_spectra(self._run.root, recorded, arrays=("eigenvalues",))
            histories = {
                name: [(e, per_point[name]["eigenvalues"]) for e, per_point in spectra.items() if name in per_point]
                for name in names
            }
            self._add_figure(writer, "spectra/all_points", viz.spectra_grid_figure(histories), epoch)
        if figures.decay:
            decay = {point: result.spectrum.eigenvalues for point, result in own.items()}
            self._add_figure(writer, "decay/all_points", viz.decay_curves_figure(decay, title=f"epoch {epoch}"), epoch)
        if figures.layer_epoch:
            series = load_series(self._run.root, metrics=CATALOGUE.charted)
            epochs = sorted({int(e) for per_point in series.values() for es, _ in per_point.values() for e in es})
            tables = {metric: _layer_epoch_table(series.get(metric, {}), names, epochs) for metric in CATALOGUE.charted}
            self._add_figure(
                writer, "layer_epoch/all_observables", viz.layer_epoch_grid_figure(tables, names, epochs), epoch
            )

    @staticmethod
    def _add_figure(writer: Any, tag: str, fig: Any, epoch: int) -> None:
        writer.add_figure(tag, fig, global_step=epoch, close=False)
        viz.close(fig)

    # ----------------------------------------------------------------------------------------- helpers
    @staticmethod
    def _network(pl_module: L.LightningModule) -> torch.nn.Module:
        """The timm network inside the LightningModule (never the DDP wrapper or a compiled copy)."""
        module = unwrap_model(pl_module)
        return unwrap_model(getattr(module, "net", module))


def _layer_epoch_table(
    per_point: Mapping[str, tuple[np.ndarray, np.ndarray]], points: list[str], epochs: list[int]
) -> np.ndarray:
    """``[len(points), len(epochs)]`` values of one metric, NaN where a point has no value at an epoch."""
    table = np.full((len(points), len(epochs)), np.nan)
    column = {e: j for j, e in enumerate(epochs)}
    for i, point in enumerate(points):
        for e, v in zip(*per_point.get(point, ((), ())), strict=False):
            table[i, column[int(e)]] = v
    return table
