"""``SpectralGeometryCallback``: observe the spectral geometry of the network every N epochs.

A thin orchestrator: it decides *when* (epoch 0 before any update, every N completed epochs, always the last),
takes the DataModule's frozen analysis subset, and hands the *how* to ``tgo.observatory`` (hooks, sharding,
reduction), ``tgo.spectral`` (numerics), ``tgo.records`` (files) and ``tgo.viz`` (figures).

Epoch k means "after k completed training epochs". Observations happen at ``on_train_start`` (epoch 0, or a due
epoch a crashed run did not record before its checkpoint) and at ``on_train_epoch_end``. The records on disk are
the source of truth for what was already observed, so a resumed run neither repeats nor skips an epoch.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info

from tgo import viz
from tgo.errors import UserInputError
from tgo.observatory.points import ObservationPoint, points_from_config, resolve_points, unwrap_model
from tgo.observatory.sharded import NonFiniteActivationsError, RecordPlan, ShardPlan, observe_and_record
from tgo.records import RecordWriter, load_spectra

__all__ = ["NonFiniteActivationsError", "SpectralGeometryCallback"]

GRAM_DTYPES = {"float64": torch.float64, "float32": torch.float32}
NONFINITE_POLICIES = ("warn", "error")
# Observables drawn as layer x epoch heatmaps and custom-scalar charts (all are logged as scalars).
CHART_OBSERVABLES = (
    "effective_rank", "stable_rank", "participation_ratio", "spectral_entropy", "spectral_anisotropy",
    "spectral_flatness", "offdiag_energy_fraction", "power_law_alpha",
)


class SpectralGeometryCallback(L.Callback):
    """Observes covariance spectra at the configured points of ``pl_module.net`` on the analysis subset.

    Args:
        every_n_epochs: Observe after every N completed epochs (epoch 0 and the final epoch are always observed).
        points: ``{"preset": "vit", "extra": [{name, module, read, tokens}, ...]}``; see ``tgo.observatory``.
        gram_dtype: ``float64`` (exact to ~1e-15) or ``float32`` (~5e-8, faster on GPUs).
        batch_size: Images per observation forward pass (``None``: the DataModule's analysis batch size).
        num_workers: DataLoader workers for the observation pass (``None``: the DataModule's).
        nonfinite: ``warn`` records NaN observables for a point with non-finite activations and keeps training;
            ``error`` stops training.
        covariance_epochs: Epochs whose full covariance matrices are stored in the records; ``null`` means the
            first and the last epoch.
        fit_range: ``[start, stop]`` 1-based eigenvalue index range of the power-law fit (``null``: default).
        figures: ``every_n_observations`` (thin figures; scalars are never thinned), and booleans ``spectra``,
            ``histograms``, ``heatmaps``, ``decay``, ``layer_epoch``; ``heatmap_max_dim`` caps heatmap size.
    """

    def __init__(
        self,
        every_n_epochs: int = 5,
        points: Mapping[str, Any] | None = None,
        gram_dtype: str = "float64",
        batch_size: int | None = None,
        num_workers: int | None = None,
        nonfinite: str = "warn",
        covariance_epochs: Sequence[int] | None = None,
        fit_range: Sequence[int] | None = None,
        figures: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if isinstance(every_n_epochs, bool) or not isinstance(every_n_epochs, int) or every_n_epochs <= 0:
            raise UserInputError(f"callbacks.spectral_geometry.every_n_epochs: expected a positive integer, "
                                 f"got {every_n_epochs!r}")
        if gram_dtype not in GRAM_DTYPES:
            raise UserInputError(f"callbacks.spectral_geometry.gram_dtype: expected one of {list(GRAM_DTYPES)}, "
                                 f"got {gram_dtype!r}")
        if nonfinite not in NONFINITE_POLICIES:
            raise UserInputError(f"callbacks.spectral_geometry.nonfinite: expected one of {NONFINITE_POLICIES}, "
                                 f"got {nonfinite!r}")
        if batch_size is not None and batch_size <= 0:
            raise UserInputError(f"callbacks.spectral_geometry.batch_size: expected a positive integer, "
                                 f"got {batch_size!r}")
        self.every_n_epochs = every_n_epochs
        self.points_spec = dict(points) if points is not None else {"preset": "vit"}
        self.gram_dtype = GRAM_DTYPES[gram_dtype]
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.nonfinite = nonfinite
        self.covariance_epochs = None if covariance_epochs is None else {int(e) for e in covariance_epochs}
        self.fit_range = (int(fit_range[0]), int(fit_range[1])) if fit_range is not None else None
        self.figures = {"every_n_observations": 1, "spectra": True, "histograms": True, "heatmaps": True,
                        "decay": True, "layer_epoch": True, "heatmap_max_dim": 384, **dict(figures or {})}
        self.points: list[ObservationPoint] = []
        self.observed_epochs: list[int] = []
        self.last_pass_seconds: float | None = None  # stream + reduce + eigendecompose + records
        self.last_logging_seconds: float | None = None  # TensorBoard scalars and figures
        self._writer: RecordWriter | None = None
        self._history: dict[str, list[tuple[int, np.ndarray]]] = {}
        self._scalars: dict[str, dict[str, dict[int, float]]] = {}

    # ----------------------------------------------------------------------------------------- lifecycle
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Resolves the observation points before training, so a bad module path fails before any update."""
        net = self._network(pl_module)
        self.points = points_from_config(self.points_spec, net)
        resolve_points(net, self.points)
        self._writer = RecordWriter(self._run_dir(trainer))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            self._restore_history()
            self._add_custom_scalar_layout(trainer)
        completed = trainer.current_epoch
        if self._should_observe(completed, trainer):
            self.observe(trainer, pl_module, completed)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        completed = trainer.current_epoch + 1
        if self._should_observe(completed, trainer):
            self.observe(trainer, pl_module, completed)

    def state_dict(self) -> dict[str, Any]:
        return {"observed_epochs": list(self.observed_epochs), "every_n_epochs": self.every_n_epochs}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.observed_epochs = sorted(set(self.observed_epochs) | set(state_dict.get("observed_epochs", [])))

    # ----------------------------------------------------------------------------------------- schedule
    def _is_due(self, completed: int, trainer: L.Trainer) -> bool:
        return completed == 0 or completed % self.every_n_epochs == 0 or completed == trainer.max_epochs

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
        on_disk = self._writer.observed_epochs() if self._writer is not None else []
        return epoch in self.observed_epochs or epoch in on_disk

    # ----------------------------------------------------------------------------------------- observation
    def observe(self, trainer: L.Trainer, pl_module: L.LightningModule, epoch: int) -> None:
        """Runs one observation on every rank; rank 0 writes records and TensorBoard. Collective: call on all."""
        start = time.perf_counter()
        datamodule = trainer.datamodule
        dataset = datamodule.analysis_dataset
        plan = ShardPlan(rank=trainer.global_rank, world_size=trainer.world_size,
                         batch_size=self.batch_size or getattr(datamodule, "analysis_batch_size", 64),
                         num_workers=self.num_workers if self.num_workers is not None
                         else getattr(datamodule, "num_workers", 0))
        record = RecordPlan(writer=self._writer, epoch=epoch, step=trainer.global_step,
                            with_covariance=self._keeps_covariance(epoch, trainer), nonfinite=self.nonfinite,
                            fit_range=self.fit_range)
        results = observe_and_record(self._network(pl_module), dataset, self.points, plan=plan, record=record,
                                     all_reduce_sum=lambda t: trainer.strategy.reduce(t, reduce_op="sum"),
                                     is_global_zero=trainer.is_global_zero, device=pl_module.device,
                                     gram_dtype=self.gram_dtype)
        self.last_pass_seconds = time.perf_counter() - start
        if results is not None:
            logging_start = time.perf_counter()
            self._log_tensorboard(trainer, epoch, results)
            self.last_logging_seconds = time.perf_counter() - logging_start
            rank_zero_info(f"[tgo] geometry observed at epoch {epoch} over {len(dataset)} images in "
                           f"{self.last_pass_seconds:.2f} s (+{self.last_logging_seconds:.2f} s TensorBoard figures)")
        self.observed_epochs = sorted(set(self.observed_epochs) | {epoch})
        trainer.strategy.barrier("tgo_geometry_observed")

    def _keeps_covariance(self, epoch: int, trainer: L.Trainer) -> bool:
        if self.covariance_epochs is not None:
            return epoch in self.covariance_epochs
        return epoch == 0 or epoch == trainer.max_epochs

    # ----------------------------------------------------------------------------------------- tensorboard
    @staticmethod
    def _tensorboard(trainer: L.Trainer):
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                return logger.experiment
        return None

    def _add_custom_scalar_layout(self, trainer: L.Trainer) -> None:
        writer = self._tensorboard(trainer)
        if writer is None:
            return
        charts = {metric: ["Multiline", [f"geometry/{metric}/.*"]] for metric in CHART_OBSERVABLES}
        writer.add_custom_scalars({"TGO geometry (one line per point)": charts})

    def _log_tensorboard(self, trainer: L.Trainer, epoch: int, results: Mapping[str, Any]) -> None:
        for name, result in results.items():
            self._history.setdefault(name, []).append((epoch, result.spectrum.eigenvalues))
            for metric, value in result.observables.items():
                self._scalars.setdefault(metric, {}).setdefault(name, {})[epoch] = float(value)
        writer = self._tensorboard(trainer)
        if writer is None:
            return
        for name, result in results.items():
            for metric, value in result.observables.items():
                writer.add_scalar(f"geometry/{metric}/{name}", float(value), global_step=epoch)
        writer.add_scalar("geometry/pass_seconds", self.last_pass_seconds or 0.0, global_step=epoch)
        index = len(self._history[next(iter(results))]) - 1
        if index % int(self.figures["every_n_observations"]) == 0 or epoch == trainer.max_epochs:
            self._log_figures(writer, epoch, results)
        writer.flush()

    def _log_figures(self, writer: Any, epoch: int, results: Mapping[str, Any]) -> None:
        figures = self.figures
        for name, result in results.items():
            eigenvalues = result.spectrum.eigenvalues
            positive = eigenvalues[np.isfinite(eigenvalues) & (eigenvalues > 0)]
            if figures["histograms"] and positive.size:
                writer.add_histogram(f"spectrum_log10/{name}", np.log10(positive), global_step=epoch)
            if figures["heatmaps"] and np.all(np.isfinite(result.covariance)):
                image = viz.correlation_image(result.covariance, max_dim=int(figures["heatmap_max_dim"]))
                writer.add_image(f"correlation/{name}", image, global_step=epoch, dataformats="HWC")
        if figures["spectra"]:
            histories = {name: self._history[name] for name in results}
            self._add_figure(writer, "spectra/all_points", viz.spectra_grid_figure(histories), epoch)
        if figures["decay"]:
            spectra = {name: result.spectrum.eigenvalues for name, result in results.items()}
            self._add_figure(writer, "decay/all_points", viz.decay_curves_figure(spectra, title=f"epoch {epoch}"),
                             epoch)
        if figures["layer_epoch"]:
            names = list(results)
            epochs = sorted({e for series in self._scalars.get(CHART_OBSERVABLES[0], {}).values() for e in series})
            tables = {metric: np.array([[self._scalars.get(metric, {}).get(p, {}).get(e, np.nan) for e in epochs]
                                        for p in names]) for metric in CHART_OBSERVABLES}
            self._add_figure(writer, "layer_epoch/all_observables", viz.layer_epoch_grid_figure(tables, names, epochs),
                             epoch)

    @staticmethod
    def _add_figure(writer: Any, tag: str, fig: Any, epoch: int) -> None:
        writer.add_figure(tag, fig, global_step=epoch, close=False)
        viz.close(fig)

    def _restore_history(self) -> None:
        """Reloads earlier spectra and scalars of a resumed run, so its figures keep the whole trajectory."""
        if self._writer is None or self._history:
            return
        observed = self._writer.observed_epochs()
        if not observed:
            return
        for epoch, per_point in load_spectra(self._writer.run_dir, epochs=observed).items():
            for name, arrays in per_point.items():
                self._history.setdefault(name, []).append((epoch, arrays["eigenvalues"]))
        for row in self._writer.metric_rows():
            if int(row["epoch"]) in observed:
                self._scalars.setdefault(row["metric"], {}).setdefault(row["point"], {})[int(row["epoch"])] = \
                float(row["value"])

    # ----------------------------------------------------------------------------------------- helpers
    @staticmethod
    def _network(pl_module: L.LightningModule) -> torch.nn.Module:
        """The timm network inside the LightningModule (never the DDP wrapper or a compiled copy)."""
        module = unwrap_model(pl_module)
        return unwrap_model(getattr(module, "net", module))

    @staticmethod
    def _run_dir(trainer: L.Trainer) -> Path:
        return Path(trainer.default_root_dir)
