"""Scale-out paths that must work for real: a local multirun of DDP jobs, SLURM preemption and requeue, the
submitit launchers, and the trainer settings that only make sense on a cluster."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import compose_train, run_cli
from tests.test_ddp import EPOCH0
from tgo.records import load_spectra, recorded_epochs
from tgo.train import run


@pytest.mark.slow
def test_a_multirun_of_two_ddp_jobs_runs_each_job_in_its_own_directory(tmp_path):
    """Lightning's DDP launcher leaves a process group and LOCAL_RANK behind; the second job must not reuse them."""
    sweep = tmp_path / "sweep"
    ddp = ["trainer.accelerator=cpu", "trainer.devices=2", "trainer.strategy=ddp"]
    result = run_cli(["-m", *EPOCH0, *ddp, "seed=0,1", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]
    for job, seed in (("0", 0), ("1", 1)):
        run_dir = sweep / job
        assert recorded_epochs(run_dir) == [0, 1], job
        assert (run_dir / "checkpoints" / "last.ckpt").is_file(), job
        single = tmp_path / f"single_{seed}"
        run(compose_train(single, [*EPOCH0, f"seed={seed}"]))
        one, two = load_spectra(single, epochs=[0])[0], load_spectra(run_dir, epochs=[0])[0]
        assert list(one) == list(two)
        for name in one:
            assert int(two[name]["n_rows"]) == int(one[name]["n_rows"]), (job, name)
            top = one[name]["eigenvalues"][0]
            np.testing.assert_allclose(
                two[name]["eigenvalues"], one[name]["eigenvalues"], rtol=1e-10, atol=1e-10 * top, err_msg=name
            )
