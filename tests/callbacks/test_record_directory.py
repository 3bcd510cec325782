"""Where a user's own training records (issue 37 items 1 and 7): like Lightning's own callbacks, under the logger's
versioned directory, so a rerun starts new records and a resume continues its own; several networks, one callback each
with a ``name``; a refusal prints as one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from tests.test_library_use import FAST, Classifier, images, tiny_vit
from tgo.callbacks import SpectralGeometryCallback
from tgo.data import stratified_subset
from tgo.errors import UserInputError, print_user_errors_as_one_line
from tgo.records import RunDir, load_series, recorded_epochs
from tgo.resume import recorded_run_id


def fit(root: Path, module: L.LightningModule, *callbacks: L.Callback, epochs: int = 1, **kwargs: Any) -> L.Trainer:
    """A user's script; its logger versions like Lightning's default one (``root/lightning_logs/version_N``)."""
    ckpt_path = kwargs.pop("ckpt_path", None)
    kwargs.setdefault("logger", CSVLogger(root))
    trainer = L.Trainer(
        max_epochs=epochs,
        default_root_dir=root,
        callbacks=list(callbacks),
        accelerator="cpu",
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_train_batches=1,
        limit_val_batches=0,
        **kwargs,
    )
    trainer.fit(module, DataLoader(images(8, seed=1), batch_size=4), ckpt_path=ckpt_path)
    return trainer


NO_FIGURES = dict.fromkeys(
    ("story", "depth_profiles", "bands", "spectra", "histograms", "heatmaps", "decay", "layer_epoch", "optimisation"),
    False,
)


def geometry(**settings: Any) -> SpectralGeometryCallback:
    """The callback with the scalars only (TensorBoard's figures are tested in test_dashboard.py)."""
    analysis = stratified_subset(images(8), per_class=2)
    return SpectralGeometryCallback(analysis=analysis, **{**FAST, "figures": NO_FIGURES, **settings})


def test_rerunning_a_script_records_each_training_in_the_loggers_next_version(tmp_path: Path) -> None:
    for _ in range(2):
        fit(tmp_path, Classifier(), geometry(every_n_epochs=1))
    versions = tmp_path / "lightning_logs"
    assert recorded_epochs(versions / "version_0") == recorded_epochs(versions / "version_1") == [0, 1]
    assert recorded_run_id(RunDir(versions / "version_0")) != recorded_run_id(RunDir(versions / "version_1"))
    assert not (tmp_path / "geometry").exists()


def test_without_a_logger_records_go_to_default_root_dir_and_dirpath_wins_over_both(tmp_path: Path) -> None:
    fit(tmp_path / "plain", Classifier(), geometry(), logger=False)
    assert recorded_epochs(tmp_path / "plain") == [0, 1]
    fit(tmp_path / "logged", Classifier(), geometry(dirpath=tmp_path / "mine"), logger=CSVLogger(tmp_path / "logged"))
    assert recorded_epochs(tmp_path / "mine") == [0, 1]
    assert not (tmp_path / "logged" / "lightning_logs" / "version_0" / "geometry").exists()


def test_a_resume_continues_the_checkpoints_records_although_the_logger_starts_a_new_version(tmp_path: Path) -> None:
    saved = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    fit(tmp_path, Classifier(), geometry(every_n_epochs=1), saved, epochs=1)
    first = tmp_path / "lightning_logs" / "version_0"
    run_id = recorded_run_id(RunDir(first))
    fit(tmp_path, Classifier(), geometry(every_n_epochs=1), epochs=2, ckpt_path=tmp_path / "ckpt" / "last.ckpt")
    assert recorded_epochs(first) == [0, 1, 2]
    assert recorded_run_id(RunDir(first)) == run_id
    assert not (tmp_path / "lightning_logs" / "version_1" / "geometry").exists()


def test_a_directory_holding_another_training_is_refused_in_one_line_before_any_step(tmp_path: Path) -> None:
    fit(tmp_path, Classifier(), geometry(dirpath=tmp_path / "records"))
    module = Classifier()
    with pytest.raises(UserInputError, match="already holds the geometry records of another training") as caught:
        fit(tmp_path, module, geometry(dirpath=tmp_path / "records"))
    assert "\n" not in str(caught.value) and module.steps == 0
    assert recorded_epochs(tmp_path / "records") == [0, 1]


def test_an_uncaught_tgo_error_ends_a_users_script_with_one_line_and_other_errors_keep_their_traceback(
    tmp_path: Path,
) -> None:
    script = (
        "from tgo.errors import UserInputError, print_user_errors_as_one_line\n"
        "import sys\n"
        "print_user_errors_as_one_line(); print_user_errors_as_one_line()\n"
        "try:\n    raise UserInputError('dirpath: holds another training; choose another')\n"
        "except UserInputError as e:\n    raise RuntimeError('wrapped by Lightning') from e\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "tgo: error: dirpath: holds another training; choose another  (TGO_TRACEBACK=1 shows where)"
    ]
    other = subprocess.run(
        [sys.executable, "-c", "from tgo.errors import print_user_errors_as_one_line as p; p(); 1/0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" in other.stderr and "ZeroDivisionError" in other.stderr
    assert callable(print_user_errors_as_one_line)


class TeacherStudent(L.LightningModule):
    """Self-distillation: the student learns to match an EMA teacher (two ViTs in one module)."""

    def __init__(self) -> None:
        super().__init__()
        self.student = tiny_vit(0)
        self.teacher = tiny_vit(1)
        self.teacher.requires_grad_(False)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, _ = batch
        loss = F.mse_loss(self.student(x), self.teacher(x))
        return loss

    def on_train_batch_end(self, *args: Any) -> None:
        with torch.no_grad():
            for t, s in zip(self.teacher.parameters(), self.student.parameters(), strict=True):
                t.mul_(0.9).add_(s, alpha=0.1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_teacher_and_student_are_observed_in_one_training_each_in_its_own_records(tmp_path: Path) -> None:
    csv = CSVLogger(tmp_path, name="distill")
    module = TeacherStudent()
    saved = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    student = geometry(model="student", name="student", every_n_epochs=1)
    teacher = geometry(model="teacher", name="teacher", every_n_epochs=1)
    fit(tmp_path, module, student, teacher, saved, logger=csv)
    version = Path(csv.log_dir)
    assert recorded_epochs(version / "student") == recorded_epochs(version / "teacher") == [0, 1]
    assert student.state_key != teacher.state_key
    state = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)["callbacks"]
    assert {student.state_key, teacher.state_key} <= set(state)
    header = (version / "metrics.csv").read_text(encoding="utf-8").splitlines()[0].split(",")
    assert "student/geometry/pass_seconds" in header and "teacher/geometry/pass_seconds" in header
    # the two networks differ, so their records must too (nothing written twice into one place)
    rank_student = load_series(version / "student", metrics=["effective_rank"])["effective_rank"]
    rank_teacher = load_series(version / "teacher", metrics=["effective_rank"])["effective_rank"]
    assert rank_student.keys() == rank_teacher.keys()
    assert any(list(rank_student[p][1]) != list(rank_teacher[p][1]) for p in rank_student)


def test_a_callback_name_is_one_path_segment(tmp_path: Path) -> None:
    for bad in ("../up", "a/b", "", 3):
        with pytest.raises(UserInputError, match="name="):
            SpectralGeometryCallback(name=bad)  # type: ignore[arg-type]
    assert SpectralGeometryCallback(name="ema.1").state_key != SpectralGeometryCallback().state_key


def test_a_named_callbacks_tensorboard_runs_are_its_own(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import TensorBoardLogger

    tensorboard = TensorBoardLogger(tmp_path, name="tb")
    fit(tmp_path, Classifier(), geometry(name="ema", figures={**NO_FIGURES, "bands": True}), logger=tensorboard)
    log_dir = Path(tensorboard.log_dir)
    assert recorded_epochs(log_dir / "ema") == [0, 1]
    assert sorted(p.name for p in (log_dir / "ema" / "points").iterdir())[0] == "00_patch_embed"
    assert list((log_dir / "ema").glob("events.out.tfevents.*")), "its figures in its own run"
    assert not (log_dir / "points").exists()
