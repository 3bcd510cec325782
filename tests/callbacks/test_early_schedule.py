"""The step series (``observation.early``): observations at log-spaced optimizer steps early in training.

A specification of what a user relies on when turning it on:

* the schedule is step 0 and ``round(10 ** (k / per_decade))`` up to the first epoch's optimizer steps (or
  ``until_step``), counted in optimizer steps, not batches, whatever the gradient accumulation;
* each step observation is of the weights after that many optimizer steps (step 0 is bitwise epoch 0; the step at
  an epoch's end is bitwise that epoch's observation);
* turning it on changes nothing in the epoch series (training draws the same random numbers, the noise scale keeps
  its window): its ``metrics.csv`` is byte-identical to a run without it;
* the phases of the step series compare consecutive step observations; a resumed run neither repeats nor loses a
  step, and records of steps after the checkpoint are set aside, never deleted.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from tests.test_library_use import images, tiny_vit
from tgo.callbacks import SpectralGeometryCallback
from tgo.errors import UserInputError
from tgo.observatory import ObservationSettings
from tgo.observatory.settings import EarlySettings, ObservationSettingsError
from tgo.records import VIEWS, RecordWriter, RunDir, load_series, load_spectra, read_metric_rows, recorded_epochs
from tgo.resume import NewerRecords, records_after, set_aside_records_after

SETTINGS: dict[str, Any] = {"probes": {"enabled": False}, "groups": 4, "figures": {"heatmaps": False}}


class Module(L.LightningModule):
    """A user's own module with a timm ViT: AdamW, so that early steps move the representation."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = tiny_vit(0)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.backbone(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def fit(
    root: Path,
    *,
    early: dict[str, Any] | None,
    epochs: int = 1,
    accumulate: int = 2,
    ckpt_path: str | None = None,
    checkpoints: bool = False,
) -> SpectralGeometryCallback:
    """12 batches of 4 images per epoch; with ``accumulate=2``: 6 optimizer steps per epoch."""
    overrides = {**SETTINGS, "every_n_epochs": 1, **({"early": early} if early is not None else {})}
    geometry = SpectralGeometryCallback(analysis=images(16, seed=5), **overrides)
    callbacks: list[L.Callback] = [geometry]
    if checkpoints:
        callbacks.append(ModelCheckpoint(dirpath=root / "checkpoints", save_last=True, save_top_k=0))
    trainer = L.Trainer(
        max_epochs=epochs,
        default_root_dir=root,
        callbacks=callbacks,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=checkpoints,
        enable_progress_bar=False,
        enable_model_summary=False,
        accumulate_grad_batches=accumulate,
        limit_val_batches=0,
    )
    torch.manual_seed(1)
    trainer.fit(Module(), DataLoader(images(48, seed=1), batch_size=4, shuffle=True), ckpt_path=ckpt_path)
    return geometry


# ------------------------------------------------------------------------------------------------ the schedule
@pytest.mark.parametrize(
    ("per_decade", "until", "expected"),
    [
        (4, 100, (0, 1, 2, 3, 6, 10, 18, 32, 56, 100)),
        (1, 500, (0, 1, 10, 100)),
        (2, 30, (0, 1, 3, 10)),  # round(10 ** 0.5) = 3, round(10 ** 1.5) = 32 > 30
        (10, 3, (0, 1, 2, 3)),  # 1.26 and 1.58 round to 1 and 2: each step once
        (4, 1, (0, 1)),
    ],
)
def test_steps_are_zero_and_log_spaced_up_to_the_last_step(per_decade, until, expected):
    assert EarlySettings(enabled=True, per_decade=per_decade).steps(until) == expected


def test_until_step_overrides_the_first_epochs_steps():
    assert EarlySettings(enabled=True, until_step=10).steps(10_000) == (0, 1, 2, 3, 6, 10)


@pytest.mark.parametrize(
    ("early", "message"),
    [
        ({"per_decade": 0}, "observation.early.per_decade: expected a positive integer, got 0"),
        ({"until_step": 0}, "observation.early.until_step"),
        ({"enabled": "yes"}, "observation.early.enabled: expected true or false"),
        ({"every": 3}, "observation.early.every: unknown setting"),
    ],
)
def test_bad_early_settings_fail_naming_the_key(early, message):
    with pytest.raises(ObservationSettingsError, match=message):
        ObservationSettings.from_config({"early": early})


def test_off_by_default_and_in_the_config_group(tmp_path):
    from tests.conftest import compose_train

    composed = ObservationSettings.from_config(compose_train(tmp_path).observation)
    assert composed.early == ObservationSettings().early == EarlySettings()
    assert not composed.early.enabled


def test_an_unsized_training_loader_needs_until_step(tmp_path):
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield from images(8, seed=1)

    geometry = SpectralGeometryCallback(analysis=images(16, seed=5), **SETTINGS, early={"enabled": True})
    trainer = L.Trainer(
        max_epochs=1, default_root_dir=tmp_path, callbacks=[geometry], accelerator="cpu", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
    )  # fmt: skip
    with pytest.raises(UserInputError, match=r"observation\.early\.until_step: null means the first epoch's"):
        trainer.fit(Module(), DataLoader(Stream(), batch_size=4))
    assert not RunDir(tmp_path).has_records() and not RunDir(tmp_path).step_series.has_records()  # nothing observed


# ------------------------------------------------------------------------------------------------ one fit
@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The same training with and without the step series (accumulating 2 batches per optimizer step)."""
    root = tmp_path_factory.mktemp("early")
    fit(root / "early", early={"enabled": True})
    fit(root / "plain", early=None)
    return {"early": root / "early", "plain": root / "plain"}


def test_steps_count_optimizer_steps_not_batches(runs):
    # 12 batches, 2 per optimizer step: 6 steps in the first epoch, so steps 0, 1, 2, 3, 6 (10 > 6).
    assert recorded_epochs(RunDir(runs["early"]).step_series) == [0, 1, 2, 3, 6]
    rows = read_metric_rows(RunDir(runs["early"]).step_series)
    assert {(r["epoch"], r["step"]) for r in rows} == {("0", "0"), ("0", "1"), ("0", "2"), ("0", "3"), ("0", "6")}
    assert sorted(p.name for p in RunDir(runs["early"]).step_series.spectra_dir.iterdir()) == [
        f"step_{s:06d}.npz" for s in (0, 1, 2, 3, 6)
    ]


def test_the_epoch_series_is_byte_identical_with_and_without_the_step_series(runs):
    early, plain = RunDir(runs["early"]), RunDir(runs["plain"])
    assert recorded_epochs(early) == recorded_epochs(plain) == [0, 1]
    assert early.metrics.read_bytes() == plain.metrics.read_bytes()
    assert not plain.step_series.geometry.exists()


def _eigenvalues(run: RunDir, key: int) -> dict[str, np.ndarray]:
    spectra = load_spectra(run, [key], arrays=("eigenvalues",))[key]
    return {point: arrays["eigenvalues"] for point, arrays in spectra.items()}


def test_each_step_observes_the_weights_after_that_many_optimizer_steps(runs):
    run = RunDir(runs["early"])
    for step, epoch in ((0, 0), (6, 1)):  # step 6 ends the first epoch (6 optimizer steps)
        at_step, at_epoch = _eigenvalues(run.step_series, step), _eigenvalues(run, epoch)
        assert at_step.keys() == at_epoch.keys()
        for point in at_step:
            np.testing.assert_array_equal(at_step[point], at_epoch[point], err_msg=f"{point}: step {step}")
    middle = _eigenvalues(run.step_series, 3)
    assert all(not np.array_equal(middle[p], _eigenvalues(run, 0)[p]) for p in middle)  # training moved it


def test_the_step_series_leaves_out_the_noise_scale_and_keeps_no_covariances(runs):
    rows = read_metric_rows(RunDir(runs["early"]).step_series)
    metrics = {r["metric"] for r in rows}
    assert not {m for m in metrics if m.startswith(("gradient_", "hessian_"))}
    assert "gradient_noise_scale" in {r["metric"] for r in read_metric_rows(runs["early"])}  # the epoch series has it
    spectra = load_spectra(RunDir(runs["early"]).step_series, [0])[0]
    assert all("covariance" not in arrays for arrays in spectra.values())


def test_the_step_series_phases_and_weight_updates_compare_consecutive_steps(runs):
    steps = RunDir(runs["early"]).step_series
    series = load_series(steps, metrics=["phase_code", "rank_change_z"])
    for point, (keys, codes) in series["phase_code"].items():
        assert keys.tolist() == [0, 1, 2, 3, 6]
        assert np.isnan(codes[0]) and np.isfinite(codes[1:]).all(), point  # nothing before step 0
    updates = load_series(steps, view="weights_qkv", metrics=["weight_relative_update"])["weight_relative_update"]
    for point, (_, values) in updates.items():
        assert np.isnan(values[0]) and (values[1:] > 0).all(), point
        # Against the kept weights of the step before: step 6's update spans three optimizer steps, more than one.
        assert values[4] > values[1], point
    kept = sorted(p.name for p in (steps.geometry / "weights").iterdir())
    assert kept == ["step_000002.npz", "step_000003.npz", "step_000006.npz"]  # three: the step angle needs them


# ------------------------------------------------------------------------------------------------ resume
def test_a_resumed_run_observes_the_remaining_steps_once(tmp_path):
    root = tmp_path / "run"
    fit(root, early={"enabled": True, "until_step": 10}, epochs=1, checkpoints=True)
    steps = RunDir(root).step_series
    first = {s: steps.spectra(s).stat().st_mtime_ns for s in recorded_epochs(steps)}
    assert sorted(first) == [0, 1, 2, 3, 6]
    resumed = fit(
        root,
        early={"enabled": True, "until_step": 10},
        epochs=2,
        checkpoints=True,
        ckpt_path=str(root / "checkpoints" / "last.ckpt"),
    )
    assert recorded_epochs(steps) == [0, 1, 2, 3, 6, 10]
    assert {s: steps.spectra(s).stat().st_mtime_ns for s in first} == first  # none observed again
    assert resumed.observed_steps == [0, 1, 2, 3, 6, 10]
    assert recorded_epochs(root) == [0, 1, 2]


def test_records_of_steps_after_the_checkpoint_are_set_aside(tmp_path, runs):
    run = RunDir(tmp_path / "run")
    source = RunDir(runs["early"]).step_series
    writer = RecordWriter(run.step_series)
    assert writer.run.series == "step"
    for path in source.spectra_dir.iterdir():
        (run.step_series.spectra_dir).mkdir(parents=True, exist_ok=True)
        run.step_series.spectra(int(path.stem.split("_")[1])).write_bytes(path.read_bytes())
    run.step_series.metrics.write_bytes(source.metrics.read_bytes())
    checkpoint = tmp_path / "at_step_2.ckpt"
    torch.save({"global_step": 2, "callbacks": {}}, checkpoint)
    newer = records_after(run, (), epoch=0, step=2)  # what the callback sets aside at a resume from step 2
    assert newer.steps == [3, 6]
    set_aside_records_after(run, checkpoint, NewerRecords([], newer.steps), step=2)
    assert recorded_epochs(run.step_series) == [0, 1, 2]
    aside = next((run.root / "set_aside").iterdir())
    assert sorted(p.name for p in (aside / "geometry" / "steps" / "spectra").iterdir()) == [
        "step_000003.npz",
        "step_000006.npz",
    ]
    moved = {r["step"] for r in read_metric_rows(RunDir(aside).step_series)}
    assert moved == {"3", "6"}
    kept = read_metric_rows(run.step_series)
    assert {r["step"] for r in kept} == {"0", "1", "2"}
    original = [r for r in read_metric_rows(source) if r["step"] in {"0", "1", "2"}]
    assert kept == copy.deepcopy(original)  # the rows kept are unchanged


# ------------------------------------------------------------------------------------------------ what users see
def test_loggers_get_the_step_series_at_step_equal_to_the_optimizer_step(tmp_path):
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    geometry = SpectralGeometryCallback(
        analysis=images(16, seed=5), dirpath=tmp_path, **SETTINGS, early={"enabled": True, "until_step": 3}
    )
    loggers = [TensorBoardLogger(tmp_path, name="tb", version=0), CSVLogger(tmp_path, name="csv", version=0)]
    trainer = L.Trainer(
        max_epochs=1, default_root_dir=tmp_path, callbacks=[geometry], accelerator="cpu", logger=loggers,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        limit_train_batches=4,
    )  # fmt: skip
    trainer.fit(Module(), DataLoader(images(16, seed=1), batch_size=4))
    recorded = load_series(RunDir(tmp_path).step_series, metrics=["effective_rank"])["effective_rank"]
    # The per-point runs: one chart per metric, one line per point, x = the optimizer step.
    runs = sorted((tmp_path / "tb" / "version_0" / "points").iterdir())
    assert runs
    for path in runs:
        point = path.name.split("_", 1)[1]
        events = EventAccumulator(str(path), size_guidance={"scalars": 0}).Reload()
        logged = events.Scalars("steps_geometry/effective_rank")
        assert [e.step for e in logged] == [0, 1, 2, 3]
        np.testing.assert_allclose([e.value for e in logged], recorded[point][1], rtol=1e-6)  # TensorBoard's float32
        tags = events.Tags()["scalars"]
        assert "steps_geometry_stderr/effective_rank" in tags
        assert not [t for t in tags if t.startswith(tuple(f"steps_geometry_{view}/" for view in VIEWS[1:]))]  # all only
    import csv

    with open(tmp_path / "csv" / "version_0" / "metrics.csv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    logged_steps = sorted({int(r["step"]) for r in rows if r.get("steps_geometry/effective_rank/block_01")})
    assert logged_steps == [0, 1, 2, 3]


def test_the_report_has_an_early_training_section_with_its_phases(runs, tmp_path):
    import shutil

    from tests.report.synthetic import write_synthetic_run
    from tgo.report.build import build_report
    from tgo.report.context import judge
    from tgo.report.phases import early_section
    from tgo.report.runs import load_run_data

    (section,) = early_section(judge([load_run_data(runs["early"])], figures_dir=tmp_path / "figures"))
    assert section.title == "Early training"
    assert "Observed early: steps 0, 1, 2, 3, 6." in " ".join(section.paragraphs)
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == [
        "early_phases_early.png",
        "early_series_early.png",
    ]
    (table,) = section.tables
    assert {row[0] for row in table.rows} == set(load_run_data(runs["early"]).points)  # every point's phases
    assert early_section(judge([load_run_data(runs["plain"])], figures_dir=tmp_path / "none")) == []
    # The page: a small synthetic run carrying the step series gets the section; without one it has none.
    curve = {"effective_rank": {"block_01": lambda e: 2.0 + e}, "power_law_alpha": {"block_01": lambda e: 3.0 - e}}
    with_steps, without = write_synthetic_run(tmp_path / "a", curve), write_synthetic_run(tmp_path / "b", curve)
    shutil.copytree(RunDir(runs["early"]).step_series.geometry, RunDir(with_steps).step_series.geometry)
    assert 'id="early"' in build_report([with_steps], out=tmp_path / "a_report").read_text(encoding="utf-8")
    assert 'id="early"' not in build_report([without], out=tmp_path / "b_report").read_text(encoding="utf-8")


def test_a_users_file_in_the_step_series_is_refused_before_training(tmp_path):
    steps = RunDir(tmp_path).step_series
    steps.geometry.mkdir(parents=True)
    (steps.geometry / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(Exception, match=r"geometry/steps/notes.txt"):
        fit(tmp_path, early={"enabled": True})
    assert (steps.geometry / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert not RunDir(tmp_path).metrics.exists()
