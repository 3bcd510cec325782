"""How an observation is presented to the loggers and to TensorBoard: tags, per-point runs, figures.

`tgo.callbacks.spectral_geometry` decides *when* an observation is made and *which* observations get figures; this
module decides *how* each one is shown. Nothing here changes a record: the scalars are the recorded values and the
figures are drawn from the records (a resumed run's cards show its whole history).

Scalars go to every Lightning logger as ``geometry[_<view>]/<metric>/<point>`` and ``geometry_stderr[_<view>]/...``
(`geometry_scalars`); TensorBoard, which colours lines by run, gets every point as its own run
(``points/<NN>_<point>``, `point_scalars`). Its scalar charts smooth and clip, so what it opens on are image cards,
declared once for TensorBoard and the report (`tgo.panels.declared`) and drawn by `figure_job` in numbered tag
groups (``0_story``, ``1_depth_profile``, ``2_vs_epoch``, then the detail cards). The tags and cards are listed in
docs/usage.md ("Loggers").

Figures are rendered off the training thread, on a bounded `tgo.callbacks.background.BackgroundLane` (at most
``FIGURES_IN_FLIGHT`` observations), with matplotlib's object API and an Agg canvas, through the same TensorBoard
writer; the callback drains it at every end of ``fit``, so a hard crash loses at most the figures in flight.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
from lightning.pytorch.loggers import TensorBoardLogger
from matplotlib.figure import Figure

from tgo import panels, viz
from tgo.observatory import ObservationKey, PointResult, Results
from tgo.observatory.settings import FigureSettings
from tgo.panels import recorded_tables
from tgo.records import DEFAULT_VIEW, load_spectra
from tgo.spectral import CATALOGUE

from .background import BACKGROUND_NICE, BackgroundLane
from .tensorboard_runs import PointRuns, point_run_names

__all__ = [
    "DEPTH_PROFILES",
    "FIGURES_IN_FLIGHT",
    "FIGURE_DRAIN_TIMEOUT_S",
    "STORY_GROUP",
    "STORY_TAG",
    "Story",
    "StoryFunction",
    "TensorBoardDashboard",
    "draw_figures",
    "figure_job",
    "geometry_scalars",
    "geometry_tag",
    "logged_metrics",
    "point_scalars",
    "recorded_tables",
    "tensorboard_logger",
    "tgo_story",
]

FIGURES_IN_FLIGHT = 2
"""Observations whose figures may be queued or rendering at once; the next observation's hand-off waits for one."""
STORY_GROUP = "0_story"
"""The story's tag group: it sorts first on TensorBoard's Time Series page (digits before letters, ``0`` before
``1_depth_profile``), so its cards are the first a user sees. Written at step = the observation's epoch."""
STORY_TAG = f"{STORY_GROUP}/story"
"""The tag of a story drawn as one figure. TensorBoard fits an image into a ~450 x 210 px box on a default card, so a
tall figure is shown small (480 x 1104 px at ~19 %); a story may instead be several card-sized figures, one card
each (`Story`)."""
DEPTH_PROFILES = tuple(p.metric for p in panels.declared("card", kind="depth") if p.view == DEFAULT_VIEW)
"""The ``all``-view observables drawn against depth on cards (`tgo.panels.declared`: the core's and the families')."""
FIGURE_DRAIN_TIMEOUT_S = 600.0
"""How long the end of ``fit`` (or an exception) waits for the figures in flight before warning and going on."""

Story = Callable[[], "Figure | Mapping[str, Figure] | None"]
"""`figure_job`'s story slot: draws the story (object-API ``Figure`` s, no pyplot: it runs on the figure worker's
thread) as one figure (written as `STORY_TAG`), or as ``{name: figure}``, one card ``0_story/<name>`` each (in the
group TensorBoard lists them by name, two to a row, so ``1_spread``, ``2_where`` ... keep their order), or returns
``None`` for no card."""
StoryFunction = Callable[[Path, int], "Figure | Mapping[str, Figure] | None"]
"""What `TensorBoardDashboard` and the callback take: ``story(run_dir, epoch)``, the run directory whose records hold
the history up to ``epoch`` (the observation being drawn; with figures still rendering, a later observation may
already be recorded too), returning what a `Story` returns."""


def tgo_story(run_dir: Path, epoch: int) -> Mapping[str, Figure] | None:
    """TGO's story function, the callback's default: `tgo.report.story.run_story_cards` of the records up to
    ``epoch`` (the report's story panels and verdicts at this point of training; imported on first use, on the figure
    worker's thread, so the training process pays for the report's modules only once a figure is drawn)."""
    from tgo.report.story import run_story_cards

    return run_story_cards(run_dir, epoch)


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
    """``{point: {tag: value}}``: `geometry_scalars` without the point in the tag.

    What each point's own TensorBoard run holds (`tgo.callbacks.tensorboard_runs.PointRuns`): the same tag in every run,
    so TensorBoard draws one chart per tag with one line per point.
    """
    scalars: dict[str, dict[str, float]] = {point: {} for point in results.by_point()}
    for point, tag, value in _metric_scalars(results):
        scalars.setdefault(point, {})[tag] = value
    return scalars


# ------------------------------------------------------------------------------------------------ figures
def figure_job(
    writer: Any,
    root: str | os.PathLike[str],
    epoch: int,
    results: Results,
    recorded: Sequence[int],
    figures: FigureSettings,
    *,
    story: Story | None = None,
) -> Callable[[], Iterator[None]]:
    """One observation's figures as a job for the background worker, drawn from what was just recorded.

    The arrays it needs are copied now (the job owns them); the history (spectra of the ``recorded`` epochs of the
    run directory ``root``, the metrics series up to ``epoch``) is read from the records by the job: they hold the
    whole history, also of a resumed run, and are written atomically, so a later observation being recorded meanwhile
    is harmless. ``writer`` is a TensorBoard ``SummaryWriter``; the job yields once per figure (the worker may pause
    between them), then writes ``geometry/figure_seconds`` (its rendering time, pauses excluded) and flushes.

    Every image is written at ``global_step=epoch``, in the order a reader wants them (the story, the depth
    profiles, the against-epoch cards, then the detail cards); the tags are listed in docs/usage.md ("Loggers").

    Args:
        writer: The TensorBoard ``SummaryWriter`` of the Lightning run.
        root: The run directory (its records).
        epoch: The observation's epoch (the step of every card).
        results: The observation just recorded.
        recorded: The epochs recorded so far (the spectra cards' history).
        figures: Which kinds to draw (`FigureSettings`).
        story: The story slot (`Story`): called first, on the worker's thread, when ``figures.story``; the figure
            it returns is written as `STORY_TAG` (a ``{name: figure}`` as ``0_story/<name>``). ``None`` (or a
            ``None`` result) writes no story card; an exception is warned about and the other figures are still
            drawn.
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
    declared = [  # the switches that are on; a family's per-head heatmaps also need figures.heads
        p for p in panels.declared("card") if getattr(figures, p.switch, True) and (p.kind != "heads" or figures.heads)
    ]
    heads = {p.view for p in declared if p.kind == "heads"}  # only their arrays are copied
    viewed: dict[str, list[str]] = {}  # view -> the points that recorded it now, in depth order
    arrays: dict[str, dict[str, dict[str, np.ndarray]]] = {}  # view -> point -> the observation's arrays
    for key, result in results.items():
        viewed.setdefault(key.view, []).append(key.point)
        if result.arrays and key.view in heads:
            arrays.setdefault(key.view, {})[key.point] = dict(result.arrays)
    tag_names = point_run_names(names)  # <NN>_<point>: TensorBoard sorts tags as strings, so in depth order

    def image(tag: str, rgb: np.ndarray) -> None:
        writer.add_image(tag, rgb, global_step=epoch, dataformats="HWC")

    def steps() -> Iterator[None]:  # one step per figure: the worker may pause between them
        if story is not None and figures.story:
            try:
                told = story()
            except Exception as error:  # the story must not cost the other figures
                warnings.warn(f"[tgo] story card of epoch {epoch} failed: {error!r}", RuntimeWarning, stacklevel=1)
                told = None
            story_cards: dict[str, Figure] = {STORY_TAG: told} if isinstance(told, Figure) else {}
            if isinstance(told, Mapping):
                story_cards = {f"{STORY_GROUP}/{name}": panel for name, panel in told.items()}
            for story_tag, panel in story_cards.items():
                image(story_tag, viz.render_rgb(panel))
            yield
        wanted = list(dict.fromkeys((p.view, p.metric) for p in declared if p.kind in panels.RECORDED_KINDS))
        tables = recorded_tables(root, wanted, names, epoch) if wanted else {}  # one read of metrics.csv
        for tag, rgb in panels.cards(declared, tables, names, viewed, arrays):
            image(tag, rgb)
            yield
        if any(p.kind == "spectra" for p in declared):  # a card per point: a grid of them is unreadable on a card
            spectra = load_spectra(root, recorded, arrays=("eigenvalues",))
            histories = {
                name: [(e, per_point[name]["eigenvalues"]) for e, per_point in spectra.items() if name in per_point]
                for name in names
            }
            for name, rgb in viz.spectrum_cards(histories, classes=panels.class_count(root)):
                image(f"spectra/{tag_names[name]}", rgb)
                yield
        if figures.decay:
            image(
                "decay/all_points",
                viz.render_rgb(viz.decay_curves_figure(eigenvalues, title=f"spectral decay, epoch {epoch}")),
            )
            yield
        for point, values in eigenvalues.items():
            positive = values[np.isfinite(values) & (values > 0)]
            if figures.histograms and positive.size:
                writer.add_histogram(f"spectrum_log10/{tag_names[point]}", np.log10(positive), global_step=epoch)
            if point in covariances:
                image(
                    f"correlation/{tag_names[point]}",
                    viz.correlation_card(covariances[point], max_dim=figures.heatmap_max_dim),
                )
        yield

    def job() -> Iterator[None]:
        seconds = 0.0
        drawing = steps()
        while True:
            start = time.perf_counter()
            try:
                next(drawing)
            except StopIteration:
                break
            finally:
                seconds += time.perf_counter() - start
            yield
        writer.add_scalar("geometry/figure_seconds", seconds, global_step=epoch)
        writer.flush()

    return job


def draw_figures(
    writer: Any,
    root: str | os.PathLike[str],
    epoch: int,
    results: Results,
    recorded: Sequence[int],
    figures: FigureSettings,
    *,
    story: Story | None = None,
) -> None:
    """Draws and writes one observation's figures on the calling thread (what the worker runs, in one call)."""
    for _ in figure_job(writer, root, epoch, results, recorded, figures, story=story)():
        pass


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
        story: The story function (`StoryFunction`, ``story(run_dir, epoch)``), drawn first in every figure job as
            `STORY_TAG`; ``None``: no story card.
    """

    def __init__(
        self, log_dir: str | os.PathLike[str], points: Sequence[str], *, story: StoryFunction | None = None
    ) -> None:
        self.log_dir = log_dir
        self.points = list(points)
        self.story = story
        self._point_runs: PointRuns | None = None
        self._figures: BackgroundLane | None = None

    def write_scalars(self, results: Results, epoch: int, *, prefix: str = "") -> None:
        """Writes one observation's `point_scalars` into the per-point runs at step ``epoch`` (and flushes them);
        each tag prefixed with ``prefix`` (the step series: ``steps_``, at step = the optimizer step)."""
        if self._point_runs is None:
            self._point_runs = PointRuns(self.log_dir, self.points)
        scalars = point_scalars(results)
        if prefix:
            scalars = {point: {prefix + tag: value for tag, value in tags.items()} for point, tags in scalars.items()}
        self._point_runs.write(scalars, step=epoch)

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
            self._figures = BackgroundLane(FIGURES_IN_FLIGHT, name="tgo-geometry-figures", nice=BACKGROUND_NICE)
        story = self.story
        slot = None if story is None else (lambda: story(Path(root), epoch))
        job = figure_job(writer, root, epoch, results, recorded, figures, story=slot)
        self._figures.submit(job, label=f"geometry figures of epoch {epoch}")

    @property
    def figures_in_flight(self) -> int:
        """Figure jobs queued or rendering now."""
        return self._figures.in_flight if self._figures is not None else 0

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
