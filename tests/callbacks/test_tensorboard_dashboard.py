"""TensorBoard as a researcher reads it: one run per point in depth order, the records' values, depth profiles."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import compose_train
from tgo.callbacks.dashboard import DEPTH_PROFILES
from tgo.callbacks.spectral_geometry import SpectralGeometryCallback
from tgo.callbacks.tensorboard_runs import PointRuns, point_run_names
from tgo.observatory.families.attention import ATTENTION_CHARTED
from tgo.records import read_metric_rows
from tgo.spectral import CATALOGUE
from tgo.train import run

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
    """Observations at epochs 0 and 1; of the figures only the layer x epoch summaries (the depth profiles)."""
    run_dir = tmp_path_factory.mktemp("dashboard") / "run"
    quick = ["experiment=smoke", "trainer.max_epochs=1", "trainer.limit_train_batches=1", "trainer.limit_val_batches=1"]
    figures_off = [f"observation.figures.{name}=false" for name in ("spectra", "decay", "heatmaps", "histograms")]
    run(
        compose_train(
            run_dir,
            [*quick, *figures_off, "observation.figures.attention=true"],
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
        assert {t for t in tags if not t.startswith("geometry_band/")} == expected, point
        assert {"geometry/effective_rank", "geometry_stderr/effective_rank"} <= tags
        assert ("geometry_cls/ncc_accuracy" in tags) == (point != "patch_embed"), "no class token before pos_embed"


def test_point_runs_hold_standard_error_bands(dashboard_run):
    rows = read_metric_rows(dashboard_run)
    row = next(
        r for r in rows if (r["metric"], r["point"], r["view"], r["epoch"]) == ("stable_rank", "cls", "all", "1")
    )
    value, se = float(row["value"]), float(row["stderr"])
    assert math.isfinite(se)
    ev = events(dashboard_run / "tensorboard" / "points" / "06_cls")
    lower = {e.step: e.value for e in ev.Scalars("geometry_band/stable_rank/lower")}
    upper = {e.step: e.value for e in ev.Scalars("geometry_band/stable_rank/upper")}
    assert (lower[1], upper[1]) == (pytest.approx(value - se, rel=1e-6), pytest.approx(value + se, rel=1e-6))


def test_main_run_keeps_only_run_level_geometry_scalars_and_draws_the_layer_epoch_cards(dashboard_run):
    ev = events(dashboard_run / "tensorboard")
    geometry = {t for t in ev.Tags()["scalars"] if t.startswith("geometry")}
    assert geometry == {"geometry/pass_seconds", "geometry/blocking_seconds"}, "per-point values live in point runs"
    for metric in DEPTH_PROFILES:
        images = ev.Images(f"depth_profile/{metric}")
        assert [e.step for e in images] == [0, 1], metric
        assert (images[-1].width, images[-1].height) == (480, 320), "sized for a TensorBoard card"
    image_tags = set(ev.Tags()["images"])
    for metric in ATTENTION_CHARTED:  # the attention family: a depth profile of each charted metric
        assert [e.step for e in ev.Images(f"attention_depth/{metric}")] == [0, 1], metric
    assert {t for t in image_tags if t.startswith("attention_heads/")}, "block x head heatmaps"
    for metric in CATALOGUE.charted:  # one layer x epoch card per charted observable, not one grid of them all
        images = ev.Images(f"layer_epoch/{metric}")
        assert [e.step for e in images] == [0, 1], metric
        assert (images[-1].width, images[-1].height) == (480, 240), metric


def test_custom_scalar_charts_match_one_tag_in_every_point_run():
    layout = SpectralGeometryCallback(settings={"groups": 4}).custom_scalar_layout()
    chart = layout["TGO geometry (one line per point)"]["effective_rank"]
    assert chart == ["Multiline", ["geometry/effective_rank$"]], "the $ keeps effective_rank_vs_noise out"
    assert layout["TGO geometry, cls view (one line per point)"]["ncc_accuracy (cls)"][1] == [
        "geometry_cls/ncc_accuracy$"
    ]
    margins = layout["TGO geometry \u00b1 1 jackknife s.e. (one band per point)"]
    assert list(margins) == list(reversed(CATALOGUE.charted)), "TensorBoard shows them in catalogue order"
    assert margins["stable_rank"] == [
        "Margin",
        ["geometry/stable_rank", "geometry_band/stable_rank/lower", "geometry_band/stable_rank/upper"],
    ]


@pytest.mark.parametrize(("reg_tokens", "has_prefix"), [(0, False), (4, True)])
def test_the_prefix_view_gets_charts_only_where_the_model_records_it(reg_tokens: int, has_prefix: bool):
    import lightning as L
    import timm

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = timm.create_model(
                "vit_tiny_patch16_224", img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2,
                reg_tokens=reg_tokens,
            )  # fmt: skip

    callback = SpectralGeometryCallback()
    callback.setup(L.Trainer(logger=False, enable_checkpointing=False), Module(), stage="validate")
    categories = callback.custom_scalar_layout()
    assert ("TGO geometry, prefix view (one line per point)" in categories) is has_prefix
    attention = categories["TGO attention geometry (one line per block)"]
    assert attention["attention_entropy (attention)"] == ["Multiline", ["geometry_attention/attention_entropy$"]]
    assert set(attention) == {f"{metric} (attention)" for metric in ATTENTION_CHARTED}
    assert "TGO geometry, patch view (one line per point)" in categories


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
    assert values == [(0, 3.0), (1, 4.0)]
    with pytest.raises(KeyError):
        runs.write({"block_99": {"geometry/effective_rank": 1.0}}, step=0)
