"""End-to-end training: the smoke run, resume from a checkpoint, the CLI, multirun directories."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.conftest import NO_FIGURES, compose_train, run_cli
from tests.helpers import SimulatedCrash
from tests.processes import terminate_when
from tests.test_run_lock import REPO, holding_lock
from tgo.errors import ConfigError
from tgo.model import cosine_factor, schedule_steps
from tgo.observatory.pipeline import NonFiniteActivationsError
from tgo.records import RunDir, recorded_epochs
from tgo.run_lock import LOCK_NAME, RunLockError
from tgo.train import error_line, make_ddp_relaunch_job_local, mark_run_directory, resolve_ckpt_path, run

FAST = ["experiment=smoke", *NO_FIGURES]  # records, checkpoints and messages are checked here, not figures


def metric_epochs(run_dir: Path) -> Counter:
    with open(run_dir / "geometry" / "metrics.csv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    return Counter((int(r["epoch"]), r["point"], r["view"], r["metric"]) for r in rows)


def test_smoke_run_writes_everything_a_user_reads(smoke_run, smoke_metrics):
    run_dir, metrics = smoke_run, smoke_metrics
    assert 0.0 <= metrics["val/acc_top1"] <= 1.0 and "val/acc_top5" in metrics
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert any(p.name.startswith("best_epoch_") for p in (run_dir / "checkpoints").iterdir()), "best checkpoint"
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert (run_dir / "config.yaml").is_file()
    manifest = json.loads((run_dir / "analysis_subset.json").read_text(encoding="utf-8"))
    assert manifest["source"] == "digits" and len(manifest["items"]) == 50
    spectra = sorted(p.name for p in (run_dir / "geometry" / "spectra").glob("*.npz"))
    assert spectra == ["epoch_0000.npz", "epoch_0001.npz", "epoch_0002.npz"]


def test_smoke_run_records_each_epoch_once_per_point_and_metric(smoke_run):
    run_dir = smoke_run
    counts = metric_epochs(run_dir)
    assert set(counts.values()) == {1}
    assert {epoch for epoch, *_ in counts} == {0, 1, 2}
    assert len({point for _, point, *_ in counts}) == 7, "patch_embed, pos_embed, block_01..04, cls"
    views = {point: {view for _, p, view, _ in counts if p == point} for _, point, *_ in counts}
    weights = {"weights_qkv", "weights_proj", "weights_fc1", "weights_fc2"}  # the weights family's views
    # no noise-scale views (network, gradient): one device without accumulation measures no noise scale
    assert views["block_01"] == {"all", "cls", "patch", "between_image", "within_image", "attention"} | weights
    assert views["cls"] == {"all", "cls", "network"}  # network: the weights family's trajectory (weight_step)
    assert views["patch_embed"] == {"all", "patch", "between_image", "within_image", "weights_patch"}


def test_checkpoint_holds_the_trained_model_and_callback_state(smoke_run):
    run_dir = smoke_run
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["epoch"] == 1 and checkpoint["hyper_parameters"]["arch"]["depth"] == 4
    geometry_state = [v for k, v in checkpoint["callbacks"].items() if "SpectralGeometryCallback" in k]
    assert geometry_state and 1 in geometry_state[0]["observed_epochs"]


CRASH_AFTER_2 = ["+callbacks.crash._target_=tests.helpers.CrashAtEpochStart", "+callbacks.crash.epoch=2"]


@pytest.mark.slow
def test_resume_after_a_crash_continues_records_without_duplicates(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(SimulatedCrash):
        run(compose_train(run_dir, [*FAST, "trainer.max_epochs=4", *CRASH_AFTER_2]))
    assert {e for e, *_ in metric_epochs(run_dir)} == {0, 1, 2}
    run(compose_train(run_dir, [*FAST, "trainer.max_epochs=4", "ckpt_path=last"]))
    counts = metric_epochs(run_dir)
    assert {e for e, *_ in counts} == {0, 1, 2, 3, 4}
    assert set(counts.values()) == {1}, "no epoch observed twice"
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["epoch"] == 3


@pytest.mark.slow
def test_resume_observes_a_due_epoch_that_a_crash_left_unrecorded(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(SimulatedCrash):
        run(compose_train(run_dir, [*FAST, "trainer.max_epochs=3", *CRASH_AFTER_2]))
    # As if the crash came after epoch 2's checkpoint was saved but before its observation was recorded.
    (run_dir / "geometry" / "spectra" / "epoch_0002.npz").unlink()
    run(compose_train(run_dir, [*FAST, "trainer.max_epochs=3", "ckpt_path=last"]))
    counts = metric_epochs(run_dir)
    assert {e for e, *_ in counts} == {0, 1, 2, 3} and set(counts.values()) == {1}


def test_a_fresh_run_refuses_a_directory_that_holds_a_run(smoke_run):
    run_dir = smoke_run
    before = (run_dir / "geometry" / "metrics.csv").read_bytes()
    with pytest.raises(ConfigError, match=r"already holds a run.*ckpt_path=last"):
        run(compose_train(run_dir, ["experiment=smoke"]))
    assert (run_dir / "geometry" / "metrics.csv").read_bytes() == before


def test_ckpt_path_last_without_a_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"ckpt_path: .*last.ckpt' does not exist"):
        resolve_ckpt_path("last", tmp_path)


def test_an_empty_truncated_or_damaged_checkpoint_is_refused_before_training(smoke_run, tmp_path):
    """torch.load gives a bare EOFError for an empty file, and loads a damaged archive without complaint."""
    data = (smoke_run / "checkpoints" / "last.ckpt").read_bytes()
    damaged = bytearray(data)
    damaged[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    cases = {"empty": (b"", "is empty"), "truncated": (data[: len(data) // 2], "is not a torch.save archive")}
    cases["damaged"] = (bytes(damaged), r"is damaged \(archive/.* fails its checksum\)")
    for name, (content, problem) in cases.items():
        path = tmp_path / f"{name}.ckpt"
        path.write_bytes(content)
        with pytest.raises(ConfigError, match=rf"^ckpt_path: '{path}' {problem}.*; expected a complete Lightning"):
            resolve_ckpt_path(str(path), tmp_path)
    assert resolve_ckpt_path("last", smoke_run) == str(smoke_run / "checkpoints" / "last.ckpt")


def test_extending_a_finished_run_is_refused_because_its_schedule_is_fixed(smoke_run, tmp_path):
    """``max_epochs`` 2 -> 4 with ``ckpt_path=last`` used to die on OneCycleLR's step count in the third epoch."""
    run_dir = tmp_path / "run"
    shutil.copytree(smoke_run, run_dir)
    before = (run_dir / "checkpoints" / "last.ckpt").read_bytes()
    message = (
        r"trainer\.max_epochs: the checkpoint's onecycle learning-rate schedule spans 12 optimizer steps but this "
        r"run would take 24; expected the trainer\.max_epochs .* the run started with"
    )
    with pytest.raises(ConfigError, match=message):
        run(compose_train(run_dir, ["experiment=smoke", "trainer.max_epochs=4", "ckpt_path=last"]))
    assert (run_dir / "checkpoints" / "last.ckpt").read_bytes() == before, "nothing trained"


def test_a_saved_schedule_length_is_read_from_either_scheduler():
    net = torch.nn.Linear(2, 2)
    onecycle = torch.optim.lr_scheduler.OneCycleLR(torch.optim.SGD(net.parameters(), lr=0.1), 0.1, total_steps=12)
    cosine = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD(net.parameters(), lr=0.1), cosine_factor(30, 3, 0.01))
    constant = cosine_factor(30, 0, 1.0, constant=True)
    flat = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD(net.parameters(), lr=0.1), constant)
    assert [schedule_steps(s.state_dict()) for s in (onecycle, cosine, flat)] == [12, 30, None]


def test_bad_input_and_a_nonfinite_stop_are_one_line_and_a_bug_is_not():
    from hydra.errors import InstantiationException

    wrapped = InstantiationException("Error in call to target 'tgo.model.ViTClassifier'")
    wrapped.__cause__ = ConfigError("model.lr: expected a positive number, got 'fast'")
    assert error_line(wrapped) == "tgo.train: error: model.lr: expected a positive number, got 'fast'"
    stop = NonFiniteActivationsError("epoch 1: non-finite activations (rows per point): {'cls': 50}; set ...")
    assert error_line(stop) == f"tgo.train: error: observation.nonfinite: {stop}"
    assert error_line(RuntimeError("a bug")) is None


def test_an_empty_checkpoint_on_the_command_line_is_one_line_with_status_2(tmp_path):
    """It used to end in a bare EOFError from torch.load inside trainer.fit, after the data had been read."""
    empty = tmp_path / "empty.ckpt"
    empty.touch()
    result = run_cli(["experiment=smoke", f"ckpt_path={empty}"], cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"tgo.train: error: ckpt_path: '{empty}' is empty (0 bytes); expected a complete Lightning checkpoint file "
        "(resume from another checkpoint of the run, or start a new run)"
    ]


@pytest.mark.slow
def test_cli_prints_run_directory_and_tensorboard_command(tmp_path):
    # one batch of each kind and no jackknife: what the command line prints and logs does not depend on them
    cheap = ["trainer.limit_train_batches=1", "trainer.limit_val_batches=1", "observation.groups=0"]
    result = run_cli([*FAST, *cheap, "trainer.max_epochs=1", f"hydra.run.dir={tmp_path / 'cli_run'}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert f"[tgo] run directory: {tmp_path / 'cli_run'}" in output
    assert "tensorboard --logdir" in output
    assert (tmp_path / "cli_run" / "geometry" / "metrics.csv").is_file()
    # train.log holds the run's messages, TGO's and Lightning's, as Hydra users expect
    log = (tmp_path / "cli_run" / "train.log").read_text(encoding="utf-8")
    assert f"[tgo] run directory: {tmp_path / 'cli_run'}" in log and "[tgo] done:" in log
    assert "[lightning.pytorch" in log and "max_epochs=1" in log


def test_ddp_relaunch_in_a_multirun_reruns_only_this_job(monkeypatch):
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    hydra_cfg = OmegaConf.create(
        {
            "hydra": {
                "mode": "MULTIRUN",
                "overrides": {"task": ["seed=1", "experiment=smoke"]},
                "run": {"dir": "outputs/default"},
                "runtime": {"output_dir": "/sweep/1"},
            }
        }
    )
    from hydra.types import RunMode

    hydra_cfg.hydra.mode = RunMode.MULTIRUN
    OmegaConf.set_readonly(hydra_cfg.hydra, True)
    monkeypatch.setattr(HydraConfig.instance(), "cfg", hydra_cfg)
    monkeypatch.setattr("sys.argv", ["tgo/train.py", "-m", "seed=0,1", "experiment=smoke"])
    make_ddp_relaunch_job_local()
    import sys

    assert sys.argv == ["tgo/train.py", "seed=1", "experiment=smoke"]
    assert HydraConfig.get().run.dir == "/sweep/1"


def test_a_second_training_or_a_resume_of_a_directory_in_use_is_refused_before_anything_is_written(tmp_path):
    """Issue 33: two trainings started 2 s apart in one directory both ran and mixed their records, and a resume of a
    run still training was not noticed. The directory's lock (tgo.run_lock) refuses the second in one line naming the
    first, before anything is planned, moved or written."""
    fresh = tmp_path / "fresh"
    with holding_lock(fresh) as first:
        expected = rf"hydra.run.dir '{fresh}' is in use by another TGO process \(pid {first.pid} on host "
        with pytest.raises(RunLockError, match=expected):
            run(compose_train(fresh, FAST))
        assert sorted(p.name for p in fresh.iterdir()) == [LOCK_NAME], "nothing written beside the holder's lock"
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    mark_run_directory(resumed)
    with holding_lock(resumed) as first:
        with pytest.raises(RunLockError, match=rf"\(pid {first.pid} on host "):
            run(compose_train(resumed, [*FAST, "ckpt_path=last"]))
        assert sorted(p.name for p in resumed.iterdir()) == [LOCK_NAME, RunDir.MARKER]


def test_the_cli_refuses_a_directory_in_use_in_one_line_before_hydra_writes_there(tmp_path):
    held = tmp_path / "held"
    with holding_lock(held) as first:
        result = run_cli([*FAST, f"hydra.run.dir={held}"], cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"tgo.train: error: hydra.run.dir '{held}' is in use by another TGO process (pid {first.pid} on host "
    ), result.stderr
    assert not (held / ".hydra").exists(), "Hydra did not rewrite the running run's .hydra/"


def test_sigterm_before_training_starts_ends_with_one_line_and_the_lock_released(tmp_path, monkeypatch):
    """Issue 33: a signal must end a run with one line and a non-zero status. Before ``fit`` (the data scan, the model,
    the run directory's files) Lightning's handler is not installed yet; TGO's ends the run at once with one line, and
    inside ``fit`` leaves the signal to Lightning (which installs its handler only where none is set)."""
    import tgo.train

    real = tgo.train.instantiate

    def instantiate_then_signal(config, *args, **kwargs):
        made = real(config, *args, **kwargs)
        if "datamodule" in str(config.get("_target_", "")).lower():
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while the data is being prepared
        return made

    monkeypatch.setattr(tgo.train, "instantiate", instantiate_then_signal)
    run_dir = tmp_path / "run"
    with pytest.raises(tgo.train.RunStopped) as stopped:
        run(compose_train(run_dir, FAST))
    assert stopped.value.signum == signal.SIGTERM
    line = str(stopped.value)
    assert "\n" not in line and line.startswith("tgo.train: stopped by SIGTERM before training started: "), line
    assert not RunDir(run_dir).checkpoints.exists() and recorded_epochs(run_dir) == []
    assert not (run_dir / LOCK_NAME).exists(), "the lock is released on the way out"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "the previous handler is back"


@pytest.mark.slow
def test_sigterm_during_training_ends_with_one_line_status_143_and_the_records_intact(tmp_path):
    """Issue 33: SIGTERM during training exited 0 with no message (Lightning's signal exit is a SystemExit that the
    entry point let through). It now ends with one line saying what is kept and how to resume, status 128 + 15."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "TGO_ROOT": str(tmp_path), "PYTHONPATH": str(REPO)}
    args = [*FAST, "trainer.max_epochs=50", "trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tgo.train", *args], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True
    )
    returncode, stderr = terminate_when(
        proc, lambda: RunDir(run_dir).last_checkpoint.is_file() and 1 in recorded_epochs(run_dir), "training"
    )
    assert returncode == 128 + signal.SIGTERM, stderr[-3000:]
    ours = [line for line in stderr.splitlines() if line.startswith("tgo.train")]
    stopped = r"tgo.train: stopped by SIGTERM after \d+ completed training epochs?: "
    assert len(ours) == 1 and re.match(stopped, ours[0]), stderr[-3000:]
    epochs = recorded_epochs(run_dir)
    assert (
        f"the records of epochs {epochs} are intact, checkpoints/last.ckpt holds the last completed epoch;" in ours[0]
    )
    assert ours[0].endswith(f"resume with ckpt_path=last hydra.run.dir={run_dir.resolve()}")
    assert epochs == list(range(len(epochs))) and len(epochs) >= 2
    completed = int(re.findall(r"after (\d+) completed", ours[0])[0])
    assert completed in (epochs[-1], epochs[-1] + 1), "the epoch in progress is the last recorded one or the next"
    assert sorted(RunDir(run_dir).spectra_files()) == epochs, "every recorded epoch has its spectra, none extra"
    rows = metric_epochs(run_dir)
    per_epoch = [{key[1:] for key in rows if key[0] == e} for e in epochs]
    assert set(rows.values()) == {1} and all(keys == per_epoch[0] for keys in per_epoch), "no epoch half-written"
    checkpoint = torch.load(RunDir(run_dir).last_checkpoint, map_location="cpu", weights_only=True)
    assert checkpoint["epoch"] + 1 in epochs, "last.ckpt holds an observed, completed epoch"
    assert not (run_dir / LOCK_NAME).exists(), "the lock is released"


def test_the_launching_process_locks_the_named_run_directory_before_hydra_writes_there(tmp_path, monkeypatch, capsys):
    """A second launch a moment after the first (before the first reached `run`) must not replace the first's
    ``.hydra/`` record: `main` takes the lock of ``hydra.run.dir`` before Hydra writes anything."""
    from tgo.train import _early_lock

    for name in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        monkeypatch.delenv(name, raising=False)
    mine = tmp_path / "mine"
    lock = _early_lock(["experiment=smoke", f"hydra.run.dir={mine}"])
    assert lock is not None and json.loads((mine / LOCK_NAME).read_text(encoding="utf-8"))["pid"] == os.getpid()
    lock.release()
    assert not mine.exists(), "nothing else was written: the directory the lock made is gone again"
    assert _early_lock(["-m", "experiment=smoke", f"hydra.run.dir={mine}"]) is None, "a multirun's jobs lock their own"
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert _early_lock([f"hydra.run.dir={mine}"]) is None, "DDP's other ranks never take it"
    monkeypatch.delenv("LOCAL_RANK")
    held = tmp_path / "held"
    with holding_lock(held) as first, pytest.raises(SystemExit) as stopped:
        _early_lock([f"hydra.run.dir={held}"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"tgo.train: error: hydra.run.dir '{held}' is in use by another TGO")
    assert f"(pid {first.pid} on host " in err[0]
