"""TensorBoard as a researcher reads it: one run per point in depth order, the records' values, the image cards."""

from __future__ import annotations

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import compose_train
from tgo import panels
from tgo.callbacks.tensorboard_runs import PointRuns, point_run_names
from tgo.observatory import ObservationSettings
from tgo.observatory.families import enabled_families
from tgo.observatory.families.attention import ATTENTION_CHARTED
from tgo.observatory.families.weights import WEIGHT_VIEWS
from tgo.records import read_metric_rows
from tgo.spectral import CATALOGUE
from tgo.train import run

FAMILY_PANELS = [p for family in enabled_families(ObservationSettings()) for p in family.panels]
ON = [p for p in (*panels.core_panels(), *FAMILY_PANELS) if p.card]
"""The cards of the core and of the families a default run records (a family that is off records nothing to draw)."""
DEPTH_PROFILES = [p.metric for p in ON if p.kind == "depth" and p.view == "all"]
PROBE_PROFILES = [
    (p.view, p.metric) for p in ON if p.kind == "depth" and p.switch == "depth_profiles" and p.view != "all"
]
BAND_FIGURES = [p.metric for p in ON if p.kind == "bands" and p.view == "all"]


def depth_profile_tag(metric: str, view: str = "all") -> str:
    return panels.Panel("depth", metric, view).tag_of()


SMOKE_POINTS = ["patch_embed", "pos_embed", "block_01", "block_02", "block_03", "block_04", "cls"]
"""The smoke experiment's points (a 4-block ViT) in depth order, spelled out rather than taken from the callback."""


def point_tag(row: dict[str, str], kind: str = "geometry") -> str | None:
    """The tag a metrics.csv row has in its point's run (the logger key without the point), or ``None`` where it is
    not logged: every metric of the ``all`` view, of other views only their charted ones."""
    if row["view"] == "all":
        return f"{kind}/{row['metric']}"
    if row["metric"] in CATALOGUE.charted_on(row["view"]):
        return f"{kind}_{row['view']}/{row['metric']}"
    return None


def events(path: Path) -> EventAccumulator:
    return EventAccumulator(str(path), size_guidance={"scalars": 0, "images": 0}).Reload()


@pytest.fixture(scope="module")
def dashboard_run(tmp_path_factory) -> Path:
    """Observations at epochs 0 and 1; of the figures the depth profiles, the against-epoch cards, the layer x epoch
    heatmaps, the attention family's cards (its per-head heatmaps included) and the optimisation cards."""
    run_dir = tmp_path_factory.mktemp("dashboard") / "run"
    quick = ["experiment=smoke", "trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1"]
    quick.append("trainer.accumulate_grad_batches=2")  # two batch sizes on one device: the noise scale is defined
    figures_off = [f"observation.figures.{name}=false" for name in ("spectra", "decay", "heatmaps", "histograms")]
    run(
        compose_train(
            run_dir,
            [
                *quick,
                *figures_off,
                *(
                    f"observation.figures.{name}=true"
                    for name in ("attention", "heads", "optimisation", "depth_profiles", "bands")
                ),
            ],
        )
    )
    return run_dir


def test_one_run_per_point_named_in_depth_order(dashboard_run):
    runs = sorted(p.name for p in (dashboard_run / "tensorboard" / "points").iterdir())
    assert runs == [f"{i:02d}_{point}" for i, point in enumerate(SMOKE_POINTS)], "sorted names are the depth order"


def test_point_runs_hold_each_points_records(dashboard_run):
    """Every logged value and finite stderr of a point is in that point's run, under the tag without the point."""
    rows = read_metric_rows(dashboard_run)
    names = point_run_names(SMOKE_POINTS)
    for point in SMOKE_POINTS:
        ev = events(dashboard_run / "tensorboard" / "points" / names[point])
        expected: set[str] = set()
        for row in (r for r in rows if r["point"] == point):
            for kind, column in (("geometry", "value"), ("geometry_stderr", "stderr")):
                tag = point_tag(row, kind)
                if tag is None or (column == "stderr" and row[column] == "nan"):
                    continue
                expected.add(tag)
                logged = {e.step: e.value for e in ev.Scalars(tag)}
                assert logged[int(row["epoch"])] == pytest.approx(float(row[column]), rel=1e-6, nan_ok=True), tag
        tags = set(ev.Tags()["scalars"])
        assert tags == expected, point
        assert {"geometry/effective_rank", "geometry_stderr/effective_rank"} <= tags
        assert ("geometry_cls/ncc_accuracy" in tags) == (point != "patch_embed"), "no class token before pos_embed"


def test_main_run_keeps_only_run_level_geometry_scalars_and_draws_the_image_cards(dashboard_run):
    ev = events(dashboard_run / "tensorboard")
    geometry = {t for t in ev.Tags()["scalars"] if t.startswith("geometry")}
    assert geometry == {
        "geometry/pass_seconds",
        "geometry/summary_seconds",
        "geometry/blocking_seconds",
        "geometry/figure_seconds",
    }
    image_tags = set(ev.Tags()["images"])
    profiles = {depth_profile_tag(m) for m in DEPTH_PROFILES} | {depth_profile_tag(m, v) for v, m in PROBE_PROFILES}
    for tag in profiles:  # the main observables and the probes on their views, against depth
        images = ev.Images(tag)
        assert [e.step for e in images] == [0, 1], tag
        assert (images[-1].width, images[-1].height) == (480, 320), "sized for a TensorBoard card"
    for metric in BAND_FIGURES:  # against epoch, one line per point
        images = ev.Images(f"2_vs_epoch/{metric}")
        assert [e.step for e in images] == [0, 1], metric
        assert (images[-1].width, images[-1].height) == (480, 240), metric
    for metric in ATTENTION_CHARTED:  # the attention family: a depth profile of each charted metric, with the others
        assert [e.step for e in ev.Images(f"1_depth_profile_attention/{metric}")] == [0, 1], metric
    assert {t for t in image_tags if t.startswith("attention_heads/")}, "block x head heatmaps"
    assert not {t for t in image_tags if t.startswith(("attention_depth/", "depth_profile/", "correlation/"))}
    for metric in CATALOGUE.charted:  # one layer x epoch card per charted observable, not one grid of them all
        images = ev.Images(f"layer_epoch/{metric}")
        assert [e.step for e in images] == [0, 1], metric
        assert (images[-1].width, images[-1].height) == (480, 240), metric
    for view in (v for name, v in WEIGHT_VIEWS.items() if name != "patch"):  # each block map's spectra against depth
        for metric in ("weight_alpha", "weight_stable_rank", "weight_relative_update"):
            images = ev.Images(depth_profile_tag(metric, view))
            assert [e.step for e in images] == ([1] if metric == "weight_relative_update" else [0, 1]), (view, metric)
            assert (images[-1].width, images[-1].height) == (480, 320), (view, metric)
    assert [e.step for e in ev.Images("layer_epoch/phase")] == [1], (
        "phases label a change: none at the first observation"
    )
    assert [e.step for e in ev.Images("2_vs_epoch/gradient_trace_covariance")] == [1], "the steps before epoch 1"
    assert "layer_epoch/phase_code" not in image_tags, "a category: the phase map, not a continuous heatmap"
    assert "0_story/story" not in image_tags, "tgo.train gives the callback no story function yet"
    assert sorted(image_tags)[0].startswith("1_depth_profile/"), "the first group TensorBoard opens"


def test_run_names_pad_to_the_deepest_index_for_any_point_list():
    registers = point_run_names(["patch_embed", "pos_embed", "registers", "block_01", "cls"])
    assert list(registers.values()) == ["00_patch_embed", "01_pos_embed", "02_registers", "03_block_01", "04_cls"]
    many = point_run_names([f"p{i}" for i in range(101)])
    assert many["p0"] == "000_p0" and many["p100"] == "100_p100"
    assert sorted(many.values()) == list(many.values())
    with pytest.raises(ValueError, match="unique"):
        point_run_names(["cls", "cls"])


def test_point_runs_open_lazily_and_reopen_after_close(tmp_path):
    runs = PointRuns(tmp_path, ["patch_embed", "block_01", "cls"])
    assert not (tmp_path / "points").exists(), "no writer before the first scalar"
    runs.write({"cls": {"geometry/effective_rank": 3.0}}, step=0)
    assert [p.name for p in (tmp_path / "points").iterdir()] == ["02_cls"]
    runs.close()
    runs.write({"cls": {"geometry/effective_rank": 4.0}}, step=1)
    runs.close()
    values = [(e.step, e.value) for e in events(tmp_path / "points" / "02_cls").Scalars("geometry/effective_rank")]
    # Two event files; read in name order, where the writer's per-process counter can sort "...10" before "...9".
    assert sorted(values) == [(0, 3.0), (1, 4.0)]
    with pytest.raises(KeyError):
        runs.write({"block_99": {"geometry/effective_rank": 1.0}}, step=0)
