"""How an observation is presented to the loggers and to TensorBoard: tags, per-point runs, layout, figures.

`tgo.callbacks.spectral_geometry` decides *when* an observation is made and *which* observations get figures; this
module decides *how* each one is shown. Nothing here changes a record: the scalars are the recorded values and the
figures are drawn from the records.

Scalars go to every Lightning logger of the trainer (``log_metrics``: CSV, W&B, MLflow alike) with the epoch as
step: the ``all`` view as ``geometry/<metric>/<point>`` (every observable, its probe metrics included), the other
views (``cls``, ``prefix``, ``patch``, ``between_image``, ``within_image``) as ``geometry_<view>/<metric>/<point>``
(only ``CATALOGUE.charted_on(view)``: the charted covariance observables and the view's charted probes), and their
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

Figures are rendered off the training thread: `TensorBoardDashboard.submit_figures` hands one observation's figures
(`figure_job`) to a bounded background `tgo.callbacks.figure_worker.FigureWorker` (at most ``FIGURES_IN_FLIGHT``
observations queued or rendering; a further one waits), which draws them with matplotlib's object API and an Agg
canvas and writes them through the same TensorBoard writer. `TensorBoardDashboard.close` drains the worker and closes
the per-point runs; the callback calls it at every end of ``fit``, so every figure is written before ``fit`` returns
or re-raises; a hard crash loses at most the figures in flight, never records.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import lightning as L
import numpy as np
from lightning.pytorch.loggers import TensorBoardLogger

from tgo import viz
from tgo.observatory import ObservationKey, PointResult, Results
from tgo.observatory.families.attention import ATTENTION_CHARTED, ATTENTION_VIEW, head_tables
from tgo.observatory.families.attention import depth_profiles as attention_depth_profiles
from tgo.observatory.settings import FigureSettings
from tgo.records import DEFAULT_VIEW, layer_epoch_table, load_series, load_spectra
from tgo.spectral import CATALOGUE

from .figure_worker import FigureWorker
from .tensorboard_runs import PointRuns, point_run_names

__all__ = [
    "DEPTH_PROFILES",
    "FIGURES_IN_FLIGHT",
    "FIGURE_DRAIN_TIMEOUT_S",
    "TensorBoardDashboard",
    "custom_scalar_layout",
    "depth_profiles",
    "draw_figures",
    "figure_job",
    "geometry_scalars",
    "geometry_tag",
    "logged_metrics",
    "point_scalars",
    "tensorboard_logger",
]

FIGURES_IN_FLIGHT = 2
"""Observations whose figures may be queued or rendering at once; the next observation's hand-off waits for one."""
DEPTH_PROFILES = ("effective_rank", "participation_ratio", "stable_rank", "spectral_anisotropy")
"""The observables drawn against depth in TensorBoard, one figure each. The report also draws spectral entropy (the
log of the effective rank: the same profile) and flatness; TensorBoard keeps to four because every figure costs
background rendering time at each observation."""
FIGURE_DRAIN_TIMEOUT_S = 600.0
"""How long the end of ``fit`` (or an exception) waits for the figures in flight before warning and going on."""


# ------------------------------------------------------------------------------------------------ scalars
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


def custom_scalar_layout(
    views: Sequence[str], *, probes: bool, groups: int, attention: bool = False
) -> dict[str, dict[str, list[Any]]]:
    """TensorBoard's custom-scalars layout: ``{category: {chart title: [chart kind, [tag regexes]]}}``.

    The per-point runs already give every tag its own chart of coloured lines, one per point; this layout is
    kept because it is the curated page: only the charted observables (the Time Series page also lists standard
    errors, bands and diagnostics), in catalogue order rather than alphabetically, and standard-error bands,
    which no other page draws. Per recorded view (``views``: ``prefix`` only with registers or a distillation
    token, known in the callback's ``setup``) one category of Multiline charts, one per charted observable of that
    view (its probes included), each matching exactly ``geometry[_<view>]/<metric>`` (TensorBoard anchors the
    regex at the start of the tag; the ``$`` keeps ``effective_rank`` from also matching
    ``effective_rank_vs_noise``) and drawing one line per point run; with the probes off (``probes=False``), only the
    ``all`` view's charted covariance observables. With jackknife ``groups``, one more category of
    ``value -/+ 1 s.e.`` Margin charts, one per charted observable of the ``all`` view, each band a point run's;
    added in reverse catalogue order, because TensorBoard lists a category's Margin charts last-added first.
    With ``attention`` (the attention family records some block), one category of the charted attention metrics,
    ``geometry_attention/<metric>``, one line per block (`ATTENTION_CHARTED`: the covariance observables have no
    value on that view).
    """
    layout: dict[str, dict[str, list[Any]]] = {}
    for view in views if probes else (DEFAULT_VIEW,):  # without probes only the all view and no probe metric
        own = view != DEFAULT_VIEW  # the all view keeps the category and chart titles of before views existed
        category = f"TGO geometry, {view} view (one line per point)" if own else "TGO geometry (one line per point)"
        layout[category] = {
            f"{metric} ({view})" if own else metric: ["Multiline", [f"{_tag_prefix(view)}/{metric}$"]]
            for metric in (CATALOGUE.charted_on(view) if probes else CATALOGUE.charted)
        }
    if attention:
        layout["TGO attention geometry (one line per block)"] = {
            f"{metric} (attention)": ["Multiline", [f"{_tag_prefix(ATTENTION_VIEW)}/{metric}$"]]
            for metric in ATTENTION_CHARTED
        }
    if groups:
        layout["TGO geometry \u00b1 1 jackknife s.e. (one band per point)"] = {
            metric: [
                "Margin",
                [f"geometry/{metric}", f"geometry_band/{metric}/lower", f"geometry_band/{metric}/upper"],
            ]
            for metric in reversed(CATALOGUE.charted)  # TensorBoard lists Margin charts last-added first
        }
    return layout


# ------------------------------------------------------------------------------------------------ figures
def figure_job(
    writer: Any,
    root: str | os.PathLike[str],
    epoch: int,
    results: Results,
    recorded: Sequence[int],
    figures: FigureSettings,
) -> Callable[[], Iterator[None]]:
    """One observation's figures as a job for the background worker, drawn from what was just recorded.

    The arrays it needs are copied now (the job owns them); the history (spectra of the ``recorded`` epochs of the
    run directory ``root``, the metrics series up to ``epoch``) is read from the records by the job: they hold the
    whole history, also of a resumed run, and are written atomically, so a later observation being recorded meanwhile
    is harmless. ``writer`` is a TensorBoard ``SummaryWriter``; the job yields once per figure (the worker may pause
    between them) and flushes the writer at the end.
    """
    own = results.by_point()  # the default view of every point, in depth order
    eigenvalues = {point: np.array(result.spectrum.eigenvalues, copy=True) for point, result in own.items()}
    covariances = {
        point: np.array(result.covariance, copy=True)
        for point, result in own.items()
        if figures.heatmaps and np.all(np.isfinite(result.covariance))
    }
    recorded = list(recorded)
    names = list(own)
    attention = {key.point: dict(result.arrays) for key, result in results.items() if key.view == ATTENTION_VIEW}
    blocks = list(attention)  # the blocks the attention family recorded, in depth order
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
            _add_figure(writer, "decay/all_points", decay, epoch)
            yield
        if figures.layer_epoch:  # the layer x epoch summaries: one heatmap and one depth profile per observable
            series = load_series(root, metrics=CATALOGUE.charted)
            epochs = sorted(
                {int(e) for per_point in series.values() for es, _ in per_point.values() for e in es if e <= epoch}
            )
            tables = {metric: layer_epoch_table(series.get(metric, {}), names, epochs) for metric in CATALOGUE.charted}
            for metric, image in viz.layer_epoch_cards(tables, names, epochs):
                writer.add_image(f"layer_epoch/{metric}", image, global_step=epoch, dataformats="HWC")
                yield
            for metric, profiles in depth_profiles(root, names, epoch).items():
                figure = viz.depth_profile_figure(profiles, names, title=metric, fontsize=viz.CARD_FONTSIZE)
                _add_figure(writer, f"depth_profile/{metric}", figure, epoch)
                yield
        if figures.attention and blocks:  # attention: block x head heatmaps, then its depth profiles
            cards = viz.attention_cards(
                head_tables(attention, blocks), blocks, profiles=attention_depth_profiles(root, blocks, epoch)
            )
            for tag, image in cards:
                writer.add_image(tag, image, global_step=epoch, dataformats="HWC")
                yield
        writer.flush()

    return job


def draw_figures(
    writer: Any,
    root: str | os.PathLike[str],
    epoch: int,
    results: Results,
    recorded: Sequence[int],
    figures: FigureSettings,
) -> None:
    """Draws and writes one observation's figures on the calling thread (what the worker runs, in one call)."""
    for _ in figure_job(writer, root, epoch, results, recorded, figures)():
        pass


def _add_figure(writer: Any, tag: str, fig: Any, epoch: int) -> None:
    """Renders with the figure's own Agg canvas (never pyplot: this runs on the worker thread)."""
    writer.add_image(tag, viz.render_rgb(fig), global_step=epoch, dataformats="HWC")


def depth_profiles(
    root: str | os.PathLike[str], points: Sequence[str], up_to: int, metrics: Sequence[str] = DEPTH_PROFILES
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
        value_table = layer_epoch_table(values[metric], points, epochs)
        stderr_table = layer_epoch_table(stderrs.get(metric, {}), points, epochs)
        profiles[metric] = {e: (value_table[:, j], stderr_table[:, j]) for j, e in enumerate(epochs)}
    return profiles


# ------------------------------------------------------------------------------------------------ the writer side
def tensorboard_logger(trainer: L.Trainer) -> TensorBoardLogger | None:
    """The trainer's first ``TensorBoardLogger``, or ``None`` when it has none (then nothing here is written)."""
    return next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)


class TensorBoardDashboard:
    """Rank 0's TensorBoard side of one ``fit``: the per-point runs and the background figure worker.

    Both open on first use (`write_scalars`, `submit_figures`); `close` drains and closes them, after which a later
    use opens them again.

    Args:
        log_dir: The Lightning ``TensorBoardLogger.log_dir`` (the per-point runs go under ``<log_dir>/points/``).
        points: The observation points' names in depth order.
    """

    def __init__(self, log_dir: str | os.PathLike[str], points: Sequence[str]) -> None:
        self.log_dir = log_dir
        self.points = list(points)
        self._point_runs: PointRuns | None = None
        self._figures: FigureWorker | None = None

    def write_scalars(self, results: Results, epoch: int) -> None:
        """Writes one observation's `point_scalars` into the per-point runs at step ``epoch`` (and flushes them)."""
        if self._point_runs is None:
            self._point_runs = PointRuns(self.log_dir, self.points)
        self._point_runs.write(point_scalars(results), step=epoch)

    def submit_figures(
        self,
        writer: Any,
        root: str | os.PathLike[str],
        epoch: int,
        results: Results,
        recorded: Sequence[int],
        figures: FigureSettings,
    ) -> None:
        """Hands one observation's `figure_job` to the background worker (waits while ``FIGURES_IN_FLIGHT`` are)."""
        if self._figures is None:
            self._figures = FigureWorker(FIGURES_IN_FLIGHT, name="tgo-geometry-figures")
        job = figure_job(writer, root, epoch, results, recorded, figures)
        self._figures.submit(job, label=f"geometry figures of epoch {epoch}")

    def held(self) -> contextlib.AbstractContextManager[Any]:
        """A context inside which the figures still rendering are paused (between figures): the observation pass
        runs meanwhile, without contending with them for the GIL."""
        return self._figures.held() if self._figures is not None else contextlib.nullcontext()

    def drain_figures(self, timeout: float = FIGURE_DRAIN_TIMEOUT_S) -> tuple[bool, bool]:
        """Waits for every queued figure and stops the worker: ``(drained, a worker was running)``.

        Warns when figures were still rendering at ``timeout`` (the records are complete either way).
        """
        worker, self._figures = self._figures, None
        if worker is None:
            return True, False
        drained = worker.close(timeout)
        if not drained:
            warnings.warn(
                f"[tgo] TensorBoard figures still rendering after {timeout:.0f} s; going on without them "
                "(the records are complete)",
                RuntimeWarning,
                stacklevel=3,
            )
        return drained, True

    def close_point_runs(self) -> None:
        """Flushes and closes the per-point runs (a later `write_scalars` opens them again)."""
        runs, self._point_runs = self._point_runs, None
        if runs is not None:
            runs.close()
