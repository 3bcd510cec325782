"""SpectralGeometryCallback: schedule, records, TensorBoard, exactness against numpy, DDP, bad activations."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import TensorDataset

from callbacks.spectral_geometry import NonFiniteActivationsError, SpectralGeometryCallback
from tests.conftest import compose_train
from tgo.errors import UserInputError
from tgo.model import ViTClassifier
from tgo.observatory import ObservationSettings, RecordPlan, ShardPlan, observe_and_record, vit_points
from tgo.records import RecordWriter, load_spectra
from tgo.train import run

DEFAULTS = ObservationSettings()
QUICK = [
    "experiment=smoke",
    "trainer.limit_train_batches=1",
    "trainer.limit_val_batches=1",
    "observation.figures.heatmaps=false",
]


def recorded_epochs(run_dir: Path) -> list[int]:
    with open(run_dir / "geometry" / "metrics.csv", newline="") as fh:
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
            ],
        )
    )
    return run_dir


def test_schedule_is_initialisation_every_n_and_the_final_epoch(tmp_path):
    run(
        compose_train(
            tmp_path,
            [*QUICK, "trainer.max_epochs=5", "observation.every_n_epochs=2", "observation.figures.spectra=false"],
        )
    )
    assert recorded_epochs(tmp_path) == [0, 2, 4, 5]


def test_tensorboard_scalars_equal_the_records(tensorboard_run):
    events = EventAccumulator(
        str(tensorboard_run / "tensorboard"), size_guidance={"scalars": 0, "images": 0, "histograms": 0}
    ).Reload()
    tags = set(events.Tags()["scalars"])
    with open(tensorboard_run / "geometry" / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    for row in rows:
        tag = f"geometry/{row['metric']}/{row['point']}"
        assert tag in tags
        logged = {e.step: e.value for e in events.Scalars(tag)}
        assert logged[int(row["epoch"])] == pytest.approx(float(row["value"]), rel=1e-6, nan_ok=True)
    assert "geometry/pass_seconds" in tags


def test_tensorboard_figures_histograms_and_layout(tensorboard_run):
    events = EventAccumulator(str(tensorboard_run / "tensorboard"), size_guidance={"images": 0, "histograms": 0})
    events.Reload()
    images = set(events.Tags()["images"])
    points = ["patch_embed", "pos_embed", "block_01", "block_02", "block_03", "block_04", "cls"]
    for point in points:
        assert f"correlation/{point}" in images
        assert f"spectrum_log10/{point}" in events.Tags()["histograms"]
    assert {"spectra/all_points", "decay/all_points", "layer_epoch/all_observables"} <= images
    correlation = events.Images("correlation/block_02")[0]
    assert (correlation.width, correlation.height) == (32, 32), "one pixel per feature pair"
    # Figures are thinned to every 2nd observation (0, 2) plus the final one (3); scalars are never thinned.
    assert [e.step for e in events.Images("spectra/all_points")] == [0, 2, 3]
    assert [e.step for e in events.Scalars("geometry/effective_rank/cls")] == [0, 1, 2, 3]
    layout_files = list((tensorboard_run / "tensorboard").glob("events.out.tfevents.*"))
    assert any(b"custom_scalars" in f.read_bytes() for f in layout_files)


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
            settings=DEFAULTS,
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
            settings=DEFAULTS.replace(nonfinite="error"),
            plan=ShardPlan(batch_size=4),
            record=RecordPlan(writer=RecordWriter(tmp_path), epoch=1, step=0),
            all_reduce_sum=lambda t: t,
            is_global_zero=True,
        )


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
        settings=DEFAULTS,
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
    """Scalars go through Lightning's logger API: with logger=csv the CSVLogger's own file holds every observable."""
    run(compose_train(tmp_path, [*QUICK, "trainer.max_epochs=1", "logger=csv"]))
    assert not (tmp_path / "tensorboard").exists()
    with open(tmp_path / "csv" / "metrics.csv", newline="") as fh:
        logged = list(csv.DictReader(fh))
    columns = set(logged[0])
    with open(tmp_path / "geometry" / "metrics.csv", newline="") as fh:
        records = list(csv.DictReader(fh))
    for row in records:
        column = f"geometry/{row['metric']}/{row['point']}"
        assert column in columns
        values = [float(r[column]) for r in logged if r[column] != "" and int(r["step"]) == int(row["epoch"])]
        assert values == [pytest.approx(float(row["value"]), rel=1e-6, nan_ok=True)]
    assert "geometry/effective_rank/block_01" in columns and "train/loss" in " ".join(columns)


def test_standard_errors_reach_the_loggers_and_tensorboard_draws_bands(tensorboard_run):
    """Every finite jackknife stderr is logged beside its value; TensorBoard gets value -/+ stderr for its charts."""
    from tgo.records import read_metric_rows

    events = EventAccumulator(str(tensorboard_run / "tensorboard"), size_guidance={"scalars": 0}).Reload()
    tags = set(events.Tags()["scalars"])
    rows = [r for r in read_metric_rows(tensorboard_run) if r["stderr"] != "nan"]
    assert {r["metric"] for r in rows} >= {"effective_rank", "participation_ratio", "effective_rank_vs_noise"}
    for row in rows:
        tag = f"geometry_stderr/{row['metric']}/{row['point']}"
        logged = {e.step: e.value for e in events.Scalars(tag)}
        assert logged[int(row["epoch"])] == pytest.approx(float(row["stderr"]), rel=1e-6)
    row = next(r for r in rows if r["metric"] == "effective_rank" and r["point"] == "cls")
    lower = {e.step: e.value for e in events.Scalars("geometry_band/effective_rank/cls/lower")}
    upper = {e.step: e.value for e in events.Scalars("geometry_band/effective_rank/cls/upper")}
    value, se = float(row["value"]), float(row["stderr"])
    epoch = int(row["epoch"])
    assert (lower[epoch], upper[epoch]) == (pytest.approx(value - se, rel=1e-6), pytest.approx(value + se, rel=1e-6))
    assert "geometry_band/power_law_alpha/block_01/upper" in tags
