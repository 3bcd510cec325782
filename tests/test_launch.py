"""Scale-out paths that must work for real: a local multirun of DDP jobs, SLURM preemption and requeue, the
submitit launchers, and the trainer settings that only make sense on a cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import REPO, compose_train, run_cli
from tests.test_ddp import EPOCH0
from tgo.launch import slurm_requeue_plugins
from tgo.records import load_spectra, read_metric_rows, recorded_epochs
from tgo.train import run

SBATCH_SNAPSHOT = Path(__file__).parent / "fixtures" / "sbatch_tgo1_2x8.sh"
LIGHT = ["observation.groups=0", "observation.probes.enabled=false"]
"""No jackknife and no probes: for the tests of where jobs run and what they leave, not of the numbers an observation
computes (test_ddp.py compares those across processes with both on): the same launches, seconds shorter."""
JOB = [*(o for o in EPOCH0 if not o.startswith("data.analysis.per_class=")), "data.analysis.per_class=2", *LIGHT]
"""`EPOCH0` observing 20 images with `LIGHT`: for the tests that check only which records and checkpoints a job
leaves where."""


@pytest.mark.slow
def test_a_multirun_of_two_ddp_jobs_runs_each_job_in_its_own_directory(tmp_path):
    """Lightning's DDP launcher leaves a process group and LOCAL_RANK behind; the second job must not reuse them."""
    sweep = tmp_path / "sweep"
    ddp = ["trainer.accelerator=cpu", "trainer.devices=2", "trainer.strategy=ddp"]
    result = run_cli(["-m", *EPOCH0, *LIGHT, *ddp, "seed=0,1", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]
    for job, seed in (("0", 0), ("1", 1)):
        run_dir = sweep / job
        assert recorded_epochs(run_dir) == [0, 1], job
        assert (run_dir / "checkpoints" / "last.ckpt").is_file(), job
        single = tmp_path / f"single_{seed}"
        run(compose_train(single, [*EPOCH0, *LIGHT, f"seed={seed}"]))
        one, two = load_spectra(single, epochs=[0])[0], load_spectra(run_dir, epochs=[0])[0]
        assert list(one) == list(two)
        for name in one:
            assert int(two[name]["n_rows"]) == int(one[name]["n_rows"]), (job, name)
            top = one[name]["eigenvalues"][0]
            np.testing.assert_allclose(
                two[name]["eigenvalues"], one[name]["eigenvalues"], rtol=1e-10, atol=1e-10 * top, err_msg=name
            )


def _fake_slurm_commands(bin_dir: Path) -> None:
    """``srun`` (submitit checks it exists) and an ``sbatch`` that keeps the script it was given and submits nothing."""
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    (bin_dir / "sbatch").write_text(
        '#!/bin/sh\ncp "$1" "$SBATCH_CAPTURE"\necho "sbatch: test double" >&2\nexit 1\n', encoding="utf-8"
    )
    for tool in ("srun", "sbatch"):
        (bin_dir / tool).chmod(0o755)


def _slurm_sweep(tmp_path: Path, overrides: list[str]) -> tuple[subprocess.CompletedProcess, Path]:
    _fake_slurm_commands(tmp_path / "bin")
    captured = tmp_path / "sbatch.sh"
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "SBATCH_CAPTURE": str(captured),
        "TGO_ROOT": str(tmp_path),
        "PYTHONPATH": str(REPO),
    }
    args = ["-m", "hydra/launcher=slurm", "experiment=tgo1", "data.root=/data/imagenet100", *overrides]
    result = subprocess.run(
        [sys.executable, "-m", "tgo.train", *args, f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return result, captured


def test_the_slurm_launcher_renders_the_sbatch_script_of_the_snapshot(tmp_path):
    """Nodes, tasks and GPUs per node follow the trainer; the preemption signal, time limit and requeue are set."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    _, captured = _slurm_sweep(tmp_path, ["trainer.devices=8", "trainer.num_nodes=2"])
    assert captured.is_file(), "sbatch was never called"
    rendered = (
        captured.read_text(encoding="utf-8")
        .replace(str(tmp_path / "sweep"), "<SWEEP>")
        .replace(sys.executable, "<PYTHON>")
    )
    assert rendered == SBATCH_SNAPSHOT.read_text(encoding="utf-8")


def test_devices_auto_with_the_slurm_launcher_is_one_clear_line(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    result, captured = _slurm_sweep(tmp_path, ["trainer.devices=auto"])
    assert result.returncode == 2 and not captured.exists()
    assert result.stderr.strip().splitlines() == [
        "tgo.train: error: trainer.devices: 'auto' with hydra/launcher=slurm; expected a positive integer "
        "(SLURM gets one task and one GPU per device, e.g. trainer.devices=8)"
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_asking_for_a_gpu_on_a_machine_without_one_is_one_clear_line(tmp_path):
    result = run_cli(["experiment=smoke", "trainer.accelerator=gpu", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("tgo.train: error: trainer.accelerator: 'gpu' but no CUDA GPU is visible on this machine")
    )
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_submitit_local_launcher_runs_a_two_job_sweep(tmp_path):
    """The launcher a SLURM user swaps in (hydra-submitit-launcher), run by its local executor: each job complete."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep = tmp_path / "sweep"
    result = run_cli(
        ["-m", "hydra/launcher=submitit_local", *JOB, "seed=0,1", f"hydra.sweep.dir={sweep}"], tmp_path, timeout=400
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")) == ["0", "1"]
    for job in ("0", "1"):
        assert recorded_epochs(sweep / job) == [0, 1], job
        assert (sweep / job / "checkpoints" / "last.ckpt").is_file(), job
        assert "[tgo] done:" in (sweep / job / "train.log").read_text(encoding="utf-8"), job


SLURM_TASK = {  # one task of a one-node job, as srun would describe it (Lightning's own tests mock it this way)
    "SLURM_JOB_ID": "1234",
    "SLURM_JOB_NAME": "tgo",
    "SLURM_NTASKS": "1",
    "SLURM_NODELIST": "localhost",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
}


def test_on_a_slurm_task_lightning_takes_the_preemption_signal_over_from_submitit(monkeypatch):
    from lightning.fabric.plugins.environments import SLURMEnvironment

    for name, value in SLURM_TASK.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)
    previous = signal.signal(signal.SIGUSR2, lambda *_: None)  # stands for submitit's resubmit-only handler
    try:
        (environment,) = slurm_requeue_plugins([])
        assert isinstance(environment, SLURMEnvironment) and environment.auto_requeue
        assert environment.requeue_signal == signal.SIGUSR2  # what submitit's sbatch header asks SLURM to send
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL  # so Lightning registers its own at fit start
        monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")
        assert slurm_requeue_plugins([])[0].requeue_signal == signal.SIGUSR1
        assert slurm_requeue_plugins([environment]) == []  # a configured cluster environment is left alone
    finally:
        signal.signal(signal.SIGUSR2, previous)
    monkeypatch.delenv("SLURM_NTASKS")
    assert slurm_requeue_plugins([]) == []  # not a SLURM task


@pytest.mark.slow
def test_a_preempted_slurm_job_checkpoints_requeues_and_resumes_in_its_directory(tmp_path):
    """The preemption signal reaches a real training process; ``scontrol requeue`` (a test double) records the
    request and kills the job as SLURM would; the relaunched job, same command, resumes without a human."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    requeued = tmp_path / "scontrol.args"
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" > {requeued}\nkill -9 $PPID\n', encoding="utf-8")
    (bin_dir / "scontrol").chmod(0o755)
    run_dir = tmp_path / "run"
    args = [*JOB, "trainer.max_epochs=2", "trainer.limit_train_batches=4", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, **SLURM_TASK, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("SUBMITIT_PREEMPT_SIGNAL", None)
    preempt = ["+callbacks.preempt._target_=tests.helpers.SignalAtBatch", "+callbacks.preempt.epoch=1"]
    first = run_cli([*args, *preempt, "+callbacks.preempt.batch=1"], tmp_path, env=env)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert requeued.read_text(encoding="utf-8").split() == ["requeue", "1234"]
    assert (run_dir / "hpc_ckpt_1.ckpt").is_file() and recorded_epochs(run_dir) == [0, 1]

    second = run_cli(args, tmp_path, env={**env, "SLURM_RESTART_COUNT": "1"})
    assert second.returncode == 0, second.stderr[-3000:]
    assert "hpc_ckpt_1.ckpt" in (run_dir / "train.log").read_text(encoding="utf-8")
    rows = [
        r for r in read_metric_rows(run_dir) if (r["point"], r["view"], r["metric"]) == ("cls", "all", "effective_rank")
    ]
    assert sorted(int(r["epoch"]) for r in rows) == [0, 1, 2]  # every scheduled epoch exactly once
