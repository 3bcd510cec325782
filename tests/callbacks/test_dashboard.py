"""`tgo.callbacks.dashboard` on its own: the figure job's cards and tags, the story slot, the dashboard's lifecycle.

What TensorBoard ends up showing for a real training is tested in `test_tensorboard_dashboard.py` and
`test_spectral_geometry_callback.py`; these tests need no training: a few synthetic observations are recorded into
a run directory and drawn from there, as the callback's background worker does.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from matplotlib.figure import Figure
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from tests.conftest import compose_train
from tgo import panels, viz
from tgo.callbacks import dashboard, spectral_geometry
from tgo.callbacks.dashboard import (
    DEPTH_PROFILES,
    STORY_TAG,
    TensorBoardDashboard,
    draw_figures,
)
from tgo.observatory import ObservationKey, ObservationSettings, Results
from tgo.observatory.settings import FigureSettings
from tgo.records import RecordWriter, RunDir

POINTS = ("patch_embed", "pos_embed", "block_01", "block_02", "cls")
EPOCHS = (0, 1, 2)
DIM = 6
ONLY_NEW = FigureSettings(spectra=False, histograms=False, decay=False, layer_epoch=False, attention=False)
"""The story, the depth profiles and the against-epoch cards, nothing else."""
PROBE_PROFILES = [
    (p.view, p.metric)
    for p in panels.declared("card", kind="depth")
    if p.switch == "depth_profiles" and p.view != "all"
]


def depth_profile_tag(metric: str, view: str = "all") -> str:
    return panels.Panel("depth", metric, view).tag_of()


def band_tag(metric: str) -> str:
    return panels.Panel("bands", metric).tag_of()


BAND_FIGURES = [
    p.metric
    for p in panels.declared("card", kind="bands")
    if p.view == "all" and p.metric in (*DEPTH_PROFILES, "between_image_fraction")
]
"""Every against-epoch card of the ``all`` view whose metric `synthetic_results` records, the core's and the
registered families' (a family's card is drawn when its metric is recorded)."""
"""Every against-epoch card of the ``all`` view, the core's and the registered families' (drawn when recorded)."""


def synthetic_results(epoch: int) -> Results:
    """One observation shaped like `tgo.observatory.Results`: the covariance observables and their standard errors on
    the ``all`` view of every point, the probe metrics of `PROBE_PROFILES` on their views (no CLS probes at the patch
    embedding, as in a real ViT)."""
    rng = np.random.default_rng(epoch)
    results = Results()
    for depth, point in enumerate(POINTS):
        rows = rng.normal(size=(40, DIM)) * (1.0 + 0.3 * np.arange(DIM))
        cov = np.cov(rows, rowvar=False)
        spectrum = SimpleNamespace(eigenvalues=np.linalg.eigvalsh(cov)[::-1].copy(), n_rows=40, n_nonfinite=0)
        observables = {metric: 1.0 + depth + 0.5 * epoch for metric in DEPTH_PROFILES}
        observables["between_image_fraction"] = 0.1 * depth
        stderr = {metric: 0.05 for metric in observables}
        base = dict(spectrum=spectrum, mean=rows.mean(0), covariance=cov, arrays={})
        results[ObservationKey(point)] = SimpleNamespace(observables=observables, stderr=stderr, **base)
        if point != "patch_embed":
            probes = {"ncc_accuracy": 0.2 + 0.1 * epoch, "ridge_accuracy": 0.3, "fisher_ratio": 10.0**epoch, "nc1": 5.0}
            for view in {view for view, _ in PROBE_PROFILES}:
                values = {m: probes.get(m, 1.0 + 0.1 * depth) for v, m in PROBE_PROFILES if v == view}
                results[ObservationKey(point, view)] = SimpleNamespace(
                    observables=values, stderr={m: 0.01 for m in values}, **base
                )
    return results


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[Path, dict[int, Results]]:
    """A run directory holding the synthetic observations of `EPOCHS`."""
    run = RunDir(tmp_path_factory.mktemp("dashboard") / "run")
    observations = {epoch: synthetic_results(epoch) for epoch in EPOCHS}
    for epoch, results in observations.items():
        RecordWriter(run).write_observation(epoch, 10 * epoch, results, with_covariance=False)
    return run.root, observations


class RecordingWriter:
    """A ``SummaryWriter`` stand-in that keeps every call: ``(kind, tag, value, step)`` in call order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any, int]] = []

    def add_image(self, tag: str, image: np.ndarray, global_step: int, dataformats: str) -> None:
        assert dataformats == "HWC" and image.dtype == np.uint8 and image.shape[2] == 3
        self.calls.append(("image", tag, image, global_step))

    def add_histogram(self, tag: str, values: np.ndarray, global_step: int) -> None:
        self.calls.append(("histogram", tag, values, global_step))

    def add_scalar(self, tag: str, value: float, global_step: int) -> None:
        self.calls.append(("scalar", tag, value, global_step))

    def flush(self) -> None:
        pass

    def images(self) -> dict[str, tuple[np.ndarray, int]]:
        return {tag: (image, step) for kind, tag, image, step in self.calls if kind == "image"}


def dummy_story() -> Figure:
    fig = Figure(figsize=(6.0, 3.0), dpi=80)
    fig.add_subplot().plot([0, 1], [1, 0])
    return fig


def test_the_callback_module_re_exports_the_presentation_names():
    for name in ("DEPTH_PROFILES", "geometry_scalars", "geometry_tag", "logged_metrics", "point_scalars"):
        assert getattr(spectral_geometry, name) is getattr(dashboard, name)
        assert name in spectral_geometry.__all__


def test_every_new_card_is_written_with_its_tag_at_the_epoch(recorded, tmp_path: Path):
    """Depth profiles of the main observables and of the probes on their views, the against-epoch cards: each one
    image at step = the epoch, in a real event file, at its card size; then the job's own rendering time."""
    root, observations = recorded
    writer = SummaryWriter(str(tmp_path / "tb"))
    for epoch in (1, 2):
        draw_figures(writer, root, epoch, observations[epoch], EPOCHS[: epoch + 1], ONLY_NEW)
    writer.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0, "scalars": 0}).Reload()
    expected = {depth_profile_tag(metric) for metric in DEPTH_PROFILES}
    expected |= {depth_profile_tag(metric, view) for view, metric in PROBE_PROFILES}
    expected |= {band_tag(metric) for metric in BAND_FIGURES}
    assert set(events.Tags()["images"]) == expected, "no story without a story function"
    assert "1_depth_profile/effective_rank" in expected and "1_depth_profile_cls/ncc_accuracy" in expected
    assert "1_depth_profile/between_image_fraction" in expected and "2_vs_epoch/stable_rank" in expected
    for tag in expected:
        cards = events.Images(tag)
        assert [e.step for e in cards] == [1, 2], tag
        size = panels.BAND_PIXELS if tag.startswith("2_vs_epoch/") else panels.PROFILE_PIXELS
        assert (cards[-1].width, cards[-1].height) == size, tag
    seconds = events.Scalars("geometry/figure_seconds")
    assert [e.step for e in seconds] == [1, 2] and all(e.value > 0 for e in seconds)


def test_every_switch_leaves_its_cards_out(recorded):
    root, observations = recorded
    switches = ObservationSettings().to_dict()["figures"]  # the core's and every registered family's
    off = FigureSettings(**{key: False if isinstance(on, bool) else on for key, on in switches.items()})
    writer = RecordingWriter()
    draw_figures(writer, root, 2, observations[2], EPOCHS, off, story=dummy_story)
    assert writer.images() == {}, "every card has its switch"
    assert [tag for kind, tag, _, _ in writer.calls] == ["geometry/figure_seconds"]


def test_ratio_type_observables_are_drawn_on_log_axes(recorded, monkeypatch):
    """The catalogue's ``scale == "log"`` observables (Fisher ratio, NC1) get log axes, the others linear."""
    assert viz.is_log_scale("fisher_ratio") and viz.is_log_scale("nc1")
    assert not viz.is_log_scale("effective_rank") and not viz.is_log_scale("ncc_accuracy")
    assert not viz.is_log_scale("not_in_the_catalogue")
    log = panels.depth_figure({0: (np.array([1.0, 10.0, 100.0]), np.full(3, 0.5))}, ["a", "b", "cls"],
                              title="fisher_ratio", log=True, size=panels.CARD)  # fmt: skip
    assert log.axes[0].get_yscale() == "log"
    assert log.axes[0].get_ylim()[1] >= 100.0, "nothing is left off the axes"
    epochs, values = [0, 1], np.array([[1.0, 2.0], [3.0, 40.0]])
    band = panels._EpochBandCard(["a", "cls"], epochs).draw(epochs, values, np.full((2, 2), 0.1), "x", log=True)
    assert band.axes[0].get_yscale() == "log"
    linear = panels._EpochBandCard(["a", "cls"], epochs).draw(epochs, values, values * 0, "x", log=False)
    assert linear.axes[0].get_yscale() == "linear" and linear.axes[0].get_ylim()[1] >= 40.0

    drawn: dict[str, bool] = {}
    for card in (panels._DepthProfile, panels._EpochBandCard):
        original = card.draw

        def spy(self: Any, *args: Any, _original: Any = original, _kind: str = card.__name__, **kwargs: Any) -> Any:
            drawn[f"{_kind}:{args[-1]}"] = kwargs["log"]
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(card, "draw", spy)
    root, observations = recorded
    draw_figures(RecordingWriter(), root, 2, observations[2], EPOCHS, ONLY_NEW)
    assert drawn["_DepthProfile:fisher_ratio (cls)"] and drawn["_DepthProfile:nc1 (cls)"]
    assert not drawn["_DepthProfile:effective_rank"] and not drawn["_DepthProfile:ncc_accuracy (cls)"]
    assert not any(log for key, log in drawn.items() if key.startswith("_EpochBandCard:")), "no band metric is a ratio"


def test_the_story_slot_is_drawn_first_at_the_epoch(recorded):
    root, observations = recorded
    writer = RecordingWriter()
    draw_figures(writer, root, 2, observations[2], EPOCHS, ONLY_NEW, story=dummy_story)
    images = [(tag, step) for kind, tag, _, step in writer.calls if kind == "image"]
    assert images[0] == (STORY_TAG, 2), "the first card written is the story"
    assert STORY_TAG == "0_story/story" and sorted(tag for tag, _ in images)[0] == STORY_TAG, "and it sorts first"
    story_image, _ = writer.images()[STORY_TAG]
    assert story_image.shape == (240, 480, 3), "the figure as drawn"
    assert len(images) > 1, "the other cards follow"


def test_a_story_of_several_card_sized_figures_is_one_card_each_in_the_story_group(recorded):
    """TensorBoard shrinks a tall image into a ~450 x 210 px card; a story may come as ``{name: figure}`` instead."""
    root, observations = recorded
    writer = RecordingWriter()
    panels = {"1_spread": dummy_story(), "2_where": dummy_story()}
    draw_figures(writer, root, 1, observations[1], EPOCHS[:2], ONLY_NEW, story=lambda: panels)
    images = [(tag, step) for kind, tag, _, step in writer.calls if kind == "image"]
    assert images[:2] == [("0_story/1_spread", 1), ("0_story/2_where", 1)] and STORY_TAG not in writer.images()


def test_the_story_slot_is_optional_switchable_and_cannot_cost_the_other_cards(recorded):
    root, observations = recorded
    calls = []

    def story() -> Figure:
        calls.append(1)
        return dummy_story()

    for settings, given in ((ONLY_NEW, lambda: None), (FigureSettings(**{**vars(ONLY_NEW), "story": False}), story)):
        writer = RecordingWriter()
        draw_figures(writer, root, 2, observations[2], EPOCHS, settings, story=given)
        assert STORY_TAG not in writer.images() and writer.images(), "no story card, the others drawn"
    assert calls == [], "figures.story=false does not call the story function"

    def broken() -> Figure:
        raise RuntimeError("no records yet")

    writer = RecordingWriter()
    with pytest.warns(RuntimeWarning, match="story card of epoch 2 failed.*no records yet"):
        draw_figures(writer, root, 2, observations[2], EPOCHS, ONLY_NEW, story=broken)
    assert STORY_TAG not in writer.images() and depth_profile_tag("effective_rank") in writer.images()


def test_the_dashboard_hands_the_story_function_the_run_directory_and_epoch(recorded, tmp_path: Path):
    root, observations = recorded
    seen: list[tuple[Path, int]] = []

    def story(run_dir: Path, epoch: int) -> Figure:
        seen.append((run_dir, epoch))
        return dummy_story()

    board = TensorBoardDashboard(tmp_path / "tb", list(POINTS), story=story)
    writer = RecordingWriter()
    board.submit_figures(writer, root, 1, observations[1], EPOCHS[:2], ONLY_NEW)
    assert board.drain_figures() == (True, True)
    assert seen == [(Path(root), 1)] and writer.images()[STORY_TAG][1] == 1
    callback = spectral_geometry.SpectralGeometryCallback(story=story)
    assert callback.story is story, "the callback passes its story function to its dashboard"


def test_recorded_tables_read_each_view_from_the_records(recorded):
    root, _ = recorded
    tables = dashboard.recorded_tables(root, [("cls", "fisher_ratio"), ("cls", "absent")], list(POINTS), 1)
    assert list(tables) == [("cls", "fisher_ratio")]
    epochs, values, stderrs = tables[("cls", "fisher_ratio")]
    assert epochs == [0, 1] and values.shape == stderrs.shape == (len(POINTS), 2)
    assert math.isnan(values[0, 1]) and values[1:, 1].tolist() == [10.0] * 4, "NaN where a point has no value"
    assert stderrs[1:, 1].tolist() == [0.01] * 4


def test_the_smoke_experiment_leaves_the_costly_cards_out(tmp_path: Path):
    figures = ObservationSettings.from_config(compose_train(tmp_path, ["experiment=smoke"]).observation).figures
    assert not (figures.story or figures.depth_profiles or figures.bands or figures.attention or figures.heatmaps)
    defaults = FigureSettings()
    assert defaults.story and defaults.depth_profiles and defaults.bands and not defaults.heatmaps


def test_by_default_tensorboard_gets_the_story_profiles_and_bands_and_the_report_the_detail_cards():
    """The default cards are the ones a reader looks at during training; the detail kinds (a card per point, heatmaps,
    the weights' profiles) cost most of the rendering time and are drawn once, from the records, by the report."""
    defaults = FigureSettings()
    assert defaults.story and defaults.depth_profiles and defaults.bands and defaults.histograms
    assert not (defaults.spectra or defaults.decay or defaults.layer_epoch or defaults.optimisation or defaults.heads)
    assert defaults.every_n_observations == 2, "cards at every 2nd observation and the last; scalars at every one"
    configured = ObservationSettings.from_config(compose_train(Path("unused"), []).observation).figures
    assert configured == defaults, "conf/observation/default.yaml and the library's defaults agree"


def test_a_dashboard_opens_nothing_until_used_and_closes_idempotently(tmp_path: Path):
    board = TensorBoardDashboard(tmp_path, ["patch_embed", "cls"])
    with board.held():  # no worker yet: nothing to pause
        pass
    assert board.drain_figures() == (True, False)
    board.close_point_runs()
    board.close_point_runs()
    assert not (tmp_path / "points").exists(), "no run is opened before a scalar is written"


def test_the_spectra_cards_mark_the_analysis_subsets_class_count(recorded, tmp_path: Path, monkeypatch):
    """The TensorBoard spectra cards draw the report's "C = N classes" line, from the run's manifest."""
    root, observations = recorded
    seen: list[int | None] = []
    original = dashboard.viz.spectrum_cards

    def spy(histories: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("classes"))
        return original(histories, **kwargs)

    monkeypatch.setattr(dashboard.viz, "spectrum_cards", spy)
    off = dict(depth_profiles=False, bands=False, histograms=False, decay=False, layer_epoch=False, attention=False)
    spectra_only = FigureSettings(story=False, spectra=True, **off)
    draw_figures(RecordingWriter(), root, 2, observations[2], EPOCHS, spectra_only)
    run = RunDir(tmp_path / "with_manifest")
    run.root.mkdir()
    for path in RunDir(root).geometry.rglob("*"):
        target = run.geometry / path.relative_to(RunDir(root).geometry)
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.is_file():
            target.write_bytes(path.read_bytes())
    run.manifest.write_text('{"version": 1, "num_classes": 10, "items": []}', encoding="utf-8")
    writer = RecordingWriter()
    draw_figures(writer, run.root, 2, observations[2], EPOCHS, spectra_only)
    assert seen == [None, 10], "no manifest: no line; a manifest of 10 classes: C = 10 on every card"
    assert any(tag.startswith("spectra/") for tag in writer.images())
