"""SpectralGeometryCallback: schedule, records, TensorBoard, exactness against numpy, DDP, bad activations."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import TensorDataset

from tests.conftest import NO_FIGURES, compose_train
from tgo import viz
from tgo.callbacks.spectral_geometry import NonFiniteActivationsError, SpectralGeometryCallback, nonfinite_notice
from tgo.callbacks.tensorboard_runs import point_run_names
from tgo.errors import UserInputError
from tgo.model import ViTClassifier
from tgo.observatory import ObservationSettings, RecordPlan, ShardPlan, observe_and_record, vit_points
from tgo.records import RecordWriter, RunDir, load_spectra, read_metric_rows
from tgo.spectral import CATALOGUE
from tgo.train import run

DEFAULTS = ObservationSettings()
FEW_IMAGES = DEFAULTS.replace(groups=2)
"""For the 4-6 images of the direct observation tests: more jackknife groups than images are refused."""
QUICK = [
    "experiment=smoke",
    "trainer.limit_train_batches=1",
    "trainer.limit_val_batches=1",
    "observation.figures.heatmaps=false",
]


def logger_tag(row: dict[str, str], kind: str = "geometry") -> str | None:
    """The logger key a metrics.csv row is logged under, or ``None`` where it is not logged (the tag scheme, spelled
    out here rather than taken from the callback): every metric of the ``all`` view as ``<kind>/<metric>/<point>``,
    of other views only their charted ones, as ``<kind>_<view>/<metric>/<point>``."""
    if row["view"] == "all":
        return f"{kind}/{row['metric']}/{row['point']}"
    if row["metric"] in CATALOGUE.charted_on(row["view"]):
        return f"{kind}_{row['view']}/{row['metric']}/{row['point']}"
    return None


def recorded_epochs(run_dir: Path) -> list[int]:
    with open(run_dir / "geometry" / "metrics.csv", encoding="utf-8", newline="") as fh:
        return sorted({int(row["epoch"]) for row in csv.DictReader(fh)})


@pytest.fixture(scope="module")
def tensorboard_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("tb") / "run"
    run(
        compose_train(
            run_dir,
            [
                *QUICK,
                "trainer.max_epochs=3",
                "observation.every_n_epochs=1",
                "observation.figures.heatmaps=true",
                "observation.figures.every_n_observations=2",
                "logger=[tensorboard,csv]",
            ],
        )
    )
    return run_dir


def test_schedule_is_initialisation_every_n_and_the_final_epoch(tmp_path):
    run(
        compose_train(
            tmp_path,
            [*QUICK, *NO_FIGURES, "trainer.max_epochs=5", "observation.every_n_epochs=2"],  # records, not figures
        )
    )
    assert recorded_epochs(tmp_path) == [0, 2, 4, 5]


def point_tag(tag: str) -> tuple[str, str]:
    """``(point, tag in the point's TensorBoard run)`` of a logger key ``<prefix>/<metric>/<point>``."""
    prefix, point = tag.rsplit("/", 1)
    return point, prefix


def point_run_events(run_dir: Path) -> dict[str, EventAccumulator]:
    """``{point: its TensorBoard run}`` (``tensorboard/points/<NN>_<point>``)."""
    runs = sorted((run_dir / "tensorboard" / "points").iterdir())
    return {
        path.name.split("_", 1)[1]: EventAccumulator(str(path), size_guidance={"scalars": 0}).Reload() for path in runs
    }


def test_tensorboard_point_runs_carry_every_view(tensorboard_run):
    """Views and probe metrics reach the points' runs under their own prefixes (the values: test_tensorboard_dashboard);
    the main run keeps only the run-level geometry scalars."""
    runs = point_run_events(tensorboard_run)
    tags = {point: set(ev.Tags()["scalars"]) for point, ev in runs.items()}
    for logger_key in (
        "geometry_within_image/effective_rank/block_02",
        "geometry_between_image/power_law_alpha/block_04",
        "geometry_patch/participation_ratio/block_01",
        "geometry_cls/fisher_ratio/block_04",
        "geometry_patch/ridge_accuracy/block_03",
        "geometry_cls/ncc_accuracy/cls",
        "geometry/between_image_fraction/block_02",
        "geometry/subspace_overlap_prev/block_04",
        "geometry/massive_activation_ratio/pos_embed",
        "geometry/massive_activation_dim/block_01",  # uncharted, but the all view logs every metric
    ):
        point, tag = point_tag(logger_key)
        assert tag in tags[point], logger_key
    assert "geometry_cls/n_rows" not in tags["block_01"], "uncharted metrics of other views are records only"
    main = EventAccumulator(str(tensorboard_run / "tensorboard"), size_guidance={"scalars": 0}).Reload()
    assert {t for t in main.Tags()["scalars"] if t.startswith("geometry")} == {
        "geometry/pass_seconds",
        "geometry/summary_seconds",
        "geometry/blocking_seconds",
        "geometry/figure_seconds",
    }


def test_tensorboard_figures_histograms_and_layout(tensorboard_run):
    events = EventAccumulator(str(tensorboard_run / "tensorboard"), size_guidance={"images": 0, "histograms": 0})
    events.Reload()
    images = set(events.Tags()["images"])
    points = ["patch_embed", "pos_embed", "block_01", "block_02", "block_03", "block_04", "cls"]
    names = point_run_names(points)
    for point in points:
        assert f"correlation/{names[point]}" in images
        assert f"spectrum_log10/{names[point]}" in events.Tags()["histograms"]
        assert f"spectra/{names[point]}" in images
    assert {"decay/all_points", *(f"layer_epoch/{metric}" for metric in CATALOGUE.charted)} <= images
    correlation = events.Images("correlation/03_block_02")[0]
    pixels = np.asarray(Image.open(io.BytesIO(correlation.encoded_image_string)).convert("RGB"))
    k = -(-viz.CARD_PIXELS // 32)  # 32 features enlarged by a whole factor to a card's height
    assert correlation.height == 32 * k and correlation.width > 32 * k, "the matrix, then its colour scale"
    blocks = pixels[: 32 * k, : 32 * k].reshape(32, k, 32, k, 3)
    assert (blocks == blocks[:, :1, :, :1]).all(), "every feature pair is one k x k square of one colour"
    # Figures are thinned to every 2nd observation (0, 2) plus the final one (3); scalars are never thinned.
    assert [e.step for e in events.Images("spectra/03_block_02")] == [0, 2, 3]
    cls_run = point_run_events(tensorboard_run)["cls"]
    assert [e.step for e in cls_run.Scalars("geometry/effective_rank")] == [0, 1, 2, 3]


def test_per_point_figure_tags_sort_in_depth_order_and_figures_fit_a_card(tensorboard_run):
    """TensorBoard lists tags as sorted strings: the per-point tags carry the point's depth index, so they list from
    the patch embedding to the CLS token (not ``block_01 .. cls, patch_embed, pos_embed``). Every card is drawn at
    one size, 480 x 240 px, that TensorBoard's Time Series shows nearly unshrunk."""
    events = EventAccumulator(str(tensorboard_run / "tensorboard"), size_guidance={"images": 0, "histograms": 0})
    events.Reload()
    depth = ["patch_embed", "pos_embed", "block_01", "block_02", "block_03", "block_04", "cls"]
    expected = [f"{i:02d}_{point}" for i, point in enumerate(depth)]
    images, histograms = events.Tags()["images"], events.Tags()["histograms"]
    for kind, tags in (("spectra", images), ("correlation", images), ("spectrum_log10", histograms)):
        listed = sorted(t.split("/", 1)[1] for t in tags if t.startswith(f"{kind}/"))
        assert listed == expected, kind
    cards = [*(f"spectra/{name}" for name in expected), "decay/all_points"]
    cards += [f"layer_epoch/{metric}" for metric in CATALOGUE.charted]
    width, height = (round(size * viz.CARD_DPI) for size in viz.CARD_FIGSIZE)
    for tag in cards:
        for event in events.Images(tag):
            assert (event.width, event.height) == (width, height) == (480, 240), tag


def test_no_custom_scalars_layout_is_written(tensorboard_run):
    """Custom Scalars smooths (0.6, ignoring ``?smoothing=0``) and ignores outliers by default, and a layout cannot
    change either: its charts clipped the default run's effective rank, stable rank, between-image share, Fisher ratio
    and NC1. The image cards show every value instead; no layout, so no Custom Scalars page."""
    events = EventAccumulator(str(tensorboard_run / "tensorboard"), size_guidance={"tensors": 0}).Reload()
    assert "custom_scalars__config__" not in events.Tags()["tensors"]


def test_validation_is_logged_against_the_epoch_too(tensorboard_run):
    """``val_epoch/<metric>`` at step = epoch (after k completed epochs, the geometry's axis) holds the values that
    ``val/<metric>`` holds at the optimiser step of that epoch's validation, in TensorBoard and in the CSV logger."""
    main = EventAccumulator(str(tensorboard_run / "tensorboard"), size_guidance={"scalars": 0}).Reload()
    for metric in ("loss", "acc_top1", "acc_top5"):
        by_step = [e.value for e in main.Scalars(f"val/{metric}")]
        by_epoch = main.Scalars(f"val_epoch/{metric}")
        assert [e.step for e in by_epoch] == [1, 2, 3], "one value per completed epoch, no sanity check"
        assert [e.value for e in by_epoch] == pytest.approx(by_step, rel=1e-6), metric
    with open(tensorboard_run / "csv" / "metrics.csv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    csv_epoch = {int(r["step"]): float(r["val_epoch/acc_top1"]) for r in rows if r.get("val_epoch/acc_top1")}
    csv_step = [float(r["val/acc_top1"]) for r in rows if r.get("val/acc_top1")]
    assert sorted(csv_epoch) == [1, 2, 3] and [csv_epoch[e] for e in (1, 2, 3)] == pytest.approx(csv_step, rel=1e-6)


def test_final_eigenvalues_equal_an_independent_numpy_recomputation(tensorboard_run):
    """Reload the last checkpoint, capture activations with plain hooks, np.cov in float64, eigvalsh."""
    module = ViTClassifier.load_from_checkpoint(tensorboard_run / "checkpoints" / "last.ckpt", map_location="cpu")
    net = module.net.eval()
    cfg = compose_train(tensorboard_run, [*QUICK])
    from hydra.utils import instantiate

    datamodule = instantiate(cfg.data, analysis={"manifest": str(tensorboard_run / "analysis_subset.json")})
    dataset = datamodule.validate().analysis_dataset
    images = torch.stack([dataset[i][0] for i in range(len(dataset))])
    captured: dict[str, list[np.ndarray]] = {}

    def keep(name, select):
        def hook(_module, args, output=None):
            tensor = args[0] if output is None else output
            captured.setdefault(name, []).append(select(tensor).reshape(-1, tensor.shape[-1]).double().numpy())

        return hook

    handles = [
        net.patch_embed.register_forward_hook(keep("patch_embed", lambda t: t)),
        net.pos_drop.register_forward_pre_hook(keep("pos_embed", lambda t: t)),
        net.norm.register_forward_hook(keep("cls", lambda t: t[:, 0])),
    ]
    handles += [
        block.register_forward_hook(keep(f"block_{i + 1:02d}", lambda t: t)) for i, block in enumerate(net.blocks)
    ]
    with torch.no_grad():
        net(images)
    for handle in handles:
        handle.remove()
    recorded = load_spectra(tensorboard_run)[3]
    for name, chunks in captured.items():
        rows = np.concatenate(chunks)
        expected = np.sort(np.linalg.eigvalsh(np.cov(rows, rowvar=False)))[::-1]
        got = recorded[name]["eigenvalues"]
        assert int(recorded[name]["n_rows"]) == rows.shape[0]
        np.testing.assert_allclose(got, np.clip(expected, 0, None), rtol=0, atol=1e-10 * expected[0], err_msg=name)


def test_row_counts_are_images_times_tokens(tensorboard_run):
    spectra = load_spectra(tensorboard_run)[0]
    images = 50
    assert int(spectra["patch_embed"]["n_rows"]) == images * 16
    assert all(int(spectra[f"block_0{i}"]["n_rows"]) == images * 17 for i in range(1, 5))
    assert int(spectra["pos_embed"]["n_rows"]) == images * 17 and int(spectra["cls"]["n_rows"]) == images


def test_covariance_kept_at_first_and_last_epoch_only(tensorboard_run):
    spectra = load_spectra(tensorboard_run)
    assert {epoch for epoch, points in spectra.items() if "covariance" in points["cls"]} == {0, 3}


def tiny_vit() -> torch.nn.Module:
    torch.manual_seed(0)
    return ViTClassifier(
        name="vit_tiny_patch16_224",
        num_classes=10,
        img_size=16,
        arch=dict(patch_size=4, embed_dim=32, depth=2, num_heads=2),
    ).net


def test_non_finite_activations_become_nan_observables_with_counts(tmp_path):
    images = torch.randn(6, 3, 16, 16)
    images[2, 0, 0, 0] = float("nan")  # one bad image poisons all of its tokens downstream
    dataset = TensorDataset(images, torch.zeros(6, dtype=torch.long))
    net = tiny_vit()
    plan = RecordPlan(writer=RecordWriter(tmp_path), epoch=0, step=0)
    with pytest.warns(RuntimeWarning, match="non-finite activations"):
        results = observe_and_record(
            net,
            dataset,
            vit_points(net),
            settings=FEW_IMAGES,
            plan=ShardPlan(batch_size=4),
            record=plan,
            all_reduce_sum=lambda t: t,
            is_global_zero=True,
        )
    assert results["block_02"].observables["n_nonfinite"] == 17
    assert results["block_02"].observables["n_rows"] == 5 * 17
    assert np.isnan(results["block_02"].observables["effective_rank"])
    with pytest.raises(NonFiniteActivationsError, match="non-finite"):
        observe_and_record(
            net,
            dataset,
            vit_points(net),
            settings=FEW_IMAGES.replace(nonfinite="error"),
            plan=ShardPlan(batch_size=4),
            record=RecordPlan(writer=RecordWriter(tmp_path), epoch=1, step=0),
            all_reduce_sum=lambda t: t,
            is_global_zero=True,
        )
    # The run's end repeats it once, with every affected epoch and point (the records are the source).
    notice = nonfinite_notice(RunDir(tmp_path))
    assert notice is not None and "1 observation(s)" in notice and "epoch 0: {" in notice
    assert "'block_02': 17" in notice


def test_a_run_with_finite_activations_ends_without_a_nonfinite_notice(tmp_path):
    observe_and_record(
        tiny_vit(),
        TensorDataset(torch.randn(4, 3, 16, 16), torch.zeros(4, dtype=torch.long)),
        vit_points(tiny_vit()),
        settings=FEW_IMAGES,
        plan=ShardPlan(batch_size=4),
        record=RecordPlan(writer=RecordWriter(tmp_path), epoch=0, step=0),
        all_reduce_sum=lambda t: t,
        is_global_zero=True,
    )
    assert nonfinite_notice(RunDir(tmp_path)) is None


def test_unknown_module_path_fails_before_training_listing_names(compose_cfg):
    cfg = compose_cfg(*QUICK, "observation.points.extra=[{name: x, module: blocks.99.attn}]")
    with pytest.raises(UserInputError, match=r"blocks\.99\.attn.*blocks"):
        run(cfg)
    assert not (Path(cfg.paths.output_dir) / "checkpoints").exists()


def test_hooks_are_removed_and_train_mode_restored(tmp_path):
    net = tiny_vit().train()
    dataset = TensorDataset(torch.randn(5, 3, 16, 16), torch.zeros(5, dtype=torch.long))
    observe_and_record(
        net,
        dataset,
        vit_points(net),
        settings=FEW_IMAGES,
        plan=ShardPlan(batch_size=2),
        record=RecordPlan(writer=RecordWriter(tmp_path), epoch=0, step=0),
        all_reduce_sum=lambda t: t,
        is_global_zero=True,
    )
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())
    assert all(m.training for m in net.modules())


@pytest.mark.parametrize(
    "kwargs", [dict(every_n_epochs=0), dict(gram_dtype="float16"), dict(nonfinite="ignore"), dict(batch_size=0)]
)
def test_bad_callback_arguments_are_rejected(kwargs):
    with pytest.raises(UserInputError, match=rf"observation\.{next(iter(kwargs))}: expected"):
        SpectralGeometryCallback(settings=kwargs)


def test_geometry_reaches_any_lightning_logger_csv(tmp_path):
    """Loggers other than TensorBoard get a readable table through Lightning's logger API: per point the default
    view's effective rank and power-law alpha, equal to the records, on rows whose ``step`` is the observation's
    optimizer step (as on the training rows) and whose ``geometry/epoch`` is its epoch; nothing else of the records
    (they are in geometry/metrics.csv), and the run-level seconds."""
    quick = [o for o in QUICK if not o.startswith("trainer.limit_train_batches")]
    run(compose_train(tmp_path, [*quick, "trainer.limit_train_batches=3", "trainer.max_epochs=2", "logger=csv"]))
    assert not (tmp_path / "tensorboard").exists()
    with open(tmp_path / "csv" / "metrics.csv", encoding="utf-8", newline="") as fh:
        logged = list(csv.DictReader(fh))
    columns = set(logged[0])
    records = [r for r in read_metric_rows(tmp_path) if r["view"] == "all"]
    points = list(dict.fromkeys(r["point"] for r in records))
    headline = {f"geometry/{m}/{p}" for p in points for m in ("effective_rank", "power_law_alpha")}
    seconds = {f"geometry/{s}_seconds" for s in ("pass", "summary", "blocking")}
    assert {c for c in columns if c.startswith("geometry")} == headline | seconds | {"geometry/epoch"}
    assert len(headline) == 2 * len(points) < 40, "a table a person can read"
    step_of = {int(r["epoch"]): int(r["step"]) for r in records}
    assert step_of == {0: 0, 1: 3, 2: 6}, "the optimizer steps the records hold (3 per epoch)"
    for row in records:
        column = f"geometry/{row['metric']}/{row['point']}"
        if column not in headline:
            continue
        found = [r for r in logged if r[column] != ""]
        assert [(int(r["geometry/epoch"]), int(r["step"])) for r in found] == [(e, step_of[e]) for e in step_of]
        value = next(float(r[column]) for r in found if int(r["geometry/epoch"]) == int(row["epoch"]))
        assert value == pytest.approx(float(row["value"]), rel=1e-6, nan_ok=True), column
    blocking = [r for r in logged if r["geometry/blocking_seconds"] != ""]
    assert [(int(r["geometry/epoch"]), int(r["step"])) for r in blocking] == list(step_of.items())
    train_steps = {int(r["step"]) for r in logged if r.get("train/loss_step")}
    assert train_steps and max(train_steps) < 6, "training rows keep Lightning's optimizer step in the same column"


def test_standard_errors_reach_the_point_runs(tensorboard_run):
    """Every finite jackknife stderr is logged beside its value (the image cards draw the bands)."""
    runs = point_run_events(tensorboard_run)
    tags = {point: set(ev.Tags()["scalars"]) for point, ev in runs.items()}
    rows = [r for r in read_metric_rows(tensorboard_run) if r["stderr"] != "nan"]
    assert {r["metric"] for r in rows} >= {"effective_rank", "participation_ratio", "effective_rank_vs_noise"}
    expected: dict[str, set[str]] = {point: set() for point in runs}
    for row in rows:
        logger_key = logger_tag(row, "geometry_stderr")
        if logger_key is None:
            continue
        point, tag = point_tag(logger_key)
        expected[point].add(tag)
        logged = {e.step: e.value for e in runs[point].Scalars(tag)}
        assert logged[int(row["epoch"])] == pytest.approx(float(row["stderr"]), rel=1e-6), logger_key
    for point in runs:
        assert {t for t in tags[point] if t.startswith("geometry_stderr")} == expected[point], "finite stderrs only"
    assert {"geometry_stderr_within_image/effective_rank", "geometry_stderr_cls/fisher_ratio"} <= tags["block_04"]
    assert "geometry_stderr/between_image_fraction" in tags["block_02"]
    assert not any(t.startswith("geometry_band") for ts in tags.values() for t in ts), "bands are drawn, not logged"


# ------------------------------------------------------------------------------------------- resume
def test_one_callback_resumed_from_an_earlier_checkpoint_observes_later_steps_and_epochs_again(tmp_path):
    """The callback reconciles a resume itself (every entry point), both series, from a mid-epoch checkpoint, and
    the same callback object carries nothing of the fit it resumes over: the checkpoint decides what was observed.

    2 epochs of 6 optimizer steps (12 batches, 2 per step), the step series due at 0, 1, 2, 3, 6, 10; a checkpoint
    every 3 steps. A resume from step 3 (mid epoch 0) sets aside steps 6 and 10 and epochs 1 and 2, and observes them
    again.
    """
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader

    from tests.callbacks.test_early_schedule import SETTINGS, Module
    from tests.test_library_use import images
    from tgo.records import recorded_epochs as recorded
    from tgo.resume import SET_ASIDE

    geometry = SpectralGeometryCallback(
        analysis=images(16, seed=5), every_n_epochs=1, early={"enabled": True, "until_step": 10}, **SETTINGS
    )

    def fit(ckpt_path: str | None) -> None:
        trainer = L.Trainer(
            max_epochs=2,
            default_root_dir=tmp_path,
            callbacks=[geometry, ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, every_n_train_steps=3)],
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accumulate_grad_batches=2,
            limit_val_batches=0,
        )
        torch.manual_seed(1)
        trainer.fit(Module(), DataLoader(images(48, seed=1), batch_size=4, shuffle=True), ckpt_path=ckpt_path)

    fit(None)
    steps = RunDir(tmp_path).step_series
    assert recorded(steps) == [0, 1, 2, 3, 6, 10] and recorded(tmp_path) == [0, 1, 2]
    (at_step_3,) = (tmp_path / "ckpt").glob("*step=3.ckpt")
    fit(str(at_step_3))

    assert recorded(steps) == [0, 1, 2, 3, 6, 10] and recorded(tmp_path) == [0, 1, 2]
    assert geometry.observed_steps == [0, 1, 2, 3, 6, 10] and geometry.observed_epochs == [0, 1, 2]
    for series in (steps, RunDir(tmp_path)):
        rows = [(r[series.key], r["point"], r["view"], r["metric"]) for r in read_metric_rows(series)]
        assert len(rows) == len(set(rows)), f"each {series.key} once"
    aside = sorted((tmp_path / SET_ASIDE).iterdir())
    moved_steps = {int(r["step"]) for a in aside for r in read_metric_rows(RunDir(a).step_series)}
    moved_epochs = {int(r["epoch"]) for a in aside for r in read_metric_rows(a)}
    assert moved_steps == {6, 10} and moved_epochs == {1, 2}
    assert all(
        f"recorded after {at_step_3.name} was saved" in (a / "REASON.txt").read_text(encoding="utf-8") for a in aside
    )
