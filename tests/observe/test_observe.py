"""``python -m tgo.observe``: re-observing saved models reproduces the callback's records; bad input is one error."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import TINY_TIMM
from tgo.checkpoints import CheckpointError, CheckpointMismatchError, checkpoint_epoch, find_checkpoints
from tgo.observatory import ObservationSettingsError
from tgo.observatory.families.noise_scale import NOISE_SCALE
from tgo.observatory.families.phases import PHASES
from tgo.observe import ObserveError, main
from tgo.observe import observe_models as observe
from tgo.records import load_spectra, read_metric_rows
from tgo.report.build import build_report


def metric_values(run_dir: Path, epoch: int) -> dict[tuple[str, str, str], float]:
    return {
        (r["point"], r["view"], r["metric"]): float(r["value"])
        for r in read_metric_rows(run_dir)
        if int(r["epoch"]) == epoch
    }


DRIFT = ("subspace_overlap_prev", "subspace_overlap_init", "subspace_overlap_prev_k90", "subspace_overlap_init_k90")
PREVIOUS = ("weight_relative_update", "weight_step", "weight_step_angle", *(o.name for o in PHASES.observables))
"""Compared with the previous observation: NaN for a lone observation, which has none."""
TRAINING_ONLY = tuple(o.name for o in NOISE_SCALE.observables)
"""Gradients between observations: recorded by the training callback, never by an offline observation."""


def test_the_last_checkpoint_reproduces_the_callbacks_last_record(smoke_run: Path, tmp_path: Path):
    out = tmp_path / "observed"
    (source,) = observe(checkpoint=str(smoke_run / "checkpoints" / "last.ckpt"), out=out)
    assert source.epoch == 2  # checkpoint["epoch"] == 1 at the end of the 2nd epoch; the callback says epoch 2
    trained = load_spectra(smoke_run, epochs=[2])[2]
    again = load_spectra(out)[2]
    assert list(again) == list(trained)  # every point, same order
    for point, arrays in trained.items():
        np.testing.assert_allclose(
            again[point]["eigenvalues"], arrays["eigenvalues"], rtol=1e-10, atol=1e-10 * arrays["eigenvalues"][0]
        )
        assert int(again[point]["n_rows"]) == int(arrays["n_rows"])
        np.testing.assert_allclose(again[point]["covariance"], arrays["covariance"], rtol=1e-10, atol=1e-12)
    ours, theirs = metric_values(out, 2), metric_values(smoke_run, 2)
    theirs = {k: v for k, v in theirs.items() if k[2] not in TRAINING_ONLY}
    assert ours.keys() == theirs.keys()
    for key in (k for k in ours if k[2] in PREVIOUS):
        assert np.isnan(ours[key]), key
    same = [k for k in theirs if k[2] not in DRIFT + PREVIOUS]
    np.testing.assert_allclose([ours[k] for k in same], [theirs[k] for k in same], rtol=1e-10, equal_nan=True)
    # Drift compares with earlier records: the training run has epochs 0 and 1 before, the lone observation none,
    # so there it is the initial subspace (overlap 1) with no previous one.
    for key in (k for k in ours if k[2] in DRIFT):
        assert ours[key] == 1.0 if key[2].startswith("subspace_overlap_init") else np.isnan(ours[key]), key
    assert (out / "analysis_subset.json").is_file() and (out / "config.yaml").is_file()
    build_report([out], correlation=False)  # the report reads what observe writes


def test_a_checkpoints_directory_is_a_trajectory_in_epoch_order(smoke_run: Path, tmp_path: Path):
    sources = find_checkpoints(smoke_run / "checkpoints")
    assert [(s.path.name, s.epoch) for s in sources] == [("best_epoch_001.ckpt", 1), ("last.ckpt", 2)]
    duplicate = tmp_path / "ckpts"
    shutil.copytree(smoke_run / "checkpoints", duplicate)
    shutil.copy(duplicate / "last.ckpt", duplicate / "copy_of_last.ckpt")  # same epoch and step: counted once
    assert [s.epoch for s in find_checkpoints(duplicate)] == [1, 2]


def test_epoch_label_is_the_number_of_completed_epochs():
    end_of_second = {
        "epoch": 1,
        "loops": {
            "fit_loop": {"epoch_progress": {"current": {"ready": 2, "started": 2, "processed": 2, "completed": 1}}}
        },
    }
    assert checkpoint_epoch(end_of_second) == (2, True)
    mid_second = {
        "epoch": 1,
        "loops": {
            "fit_loop": {"epoch_progress": {"current": {"ready": 2, "started": 2, "processed": 1, "completed": 1}}}
        },
    }
    assert checkpoint_epoch(mid_second) == (1, False)
    assert checkpoint_epoch({"epoch": 4}) == (5, True)  # no loop state: saved at an epoch end


@pytest.fixture(scope="module")
def timm_observed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``--timm vit_tiny_patch16_224 --seed 3`` with `TINY_TIMM`, observed in this process: read it, do not change it
    (a test of its own and the one-process reference of the two-process test)."""
    out = tmp_path_factory.mktemp("observe") / "timm"
    assert main(["--timm", "vit_tiny_patch16_224", "--seed", "3", "--out", str(out), *TINY_TIMM]) == 0
    return out


def test_a_random_timm_model_with_data_from_the_config_tree(timm_observed: Path):
    spectra = load_spectra(timm_observed)
    assert list(spectra) == [0]
    assert list(spectra[0]) == ["patch_embed", "pos_embed", "block_01", "block_02", "cls"]
    assert int(spectra[0]["cls"]["n_rows"]) == 20  # 2 images x 10 digit classes, one CLS row each


def test_a_weights_file_that_does_not_fit_names_the_keys(tmp_path: Path):
    import timm

    weights = tmp_path / "w.pth"
    net = timm.create_model("vit_tiny_patch16_224", img_size=16, patch_size=4, depth=3, embed_dim=16, num_heads=2)
    torch.save(net.state_dict(), weights)
    with pytest.raises(CheckpointMismatchError, match=r"unexpected keys: blocks\.2\."):
        observe(timm_name="vit_tiny_patch16_224", weights=str(weights), out=tmp_path / "o", overrides=TINY_TIMM)


def test_a_checkpoint_that_does_not_fit_its_model_names_the_keys(smoke_run: Path, tmp_path: Path):
    checkpoint = torch.load(smoke_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    checkpoint["hyper_parameters"]["arch"]["depth"] = 3  # the stored weights have 4 blocks
    bad = tmp_path / "bad.ckpt"
    torch.save(checkpoint, bad)
    with pytest.raises(CheckpointMismatchError, match=r"unexpected keys: blocks\.3\.norm1\.weight"):
        observe(checkpoint=str(bad), out=tmp_path / "o", overrides=["data=digits", "data.image_size=16"])


def test_bad_inputs_are_one_line_errors_with_status_2(
    smoke_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    assert main(["--checkpoint", str(tmp_path / "missing.ckpt"), "--out", str(tmp_path / "o")]) == 2
    assert "no such checkpoint file" in capsys.readouterr().err
    with pytest.raises(ObserveError, match="not a run directory"):
        observe(run=str(tmp_path), out=tmp_path / "o")
    with pytest.raises(CheckpointError, match=r"no \*\.ckpt files"):
        observe(checkpoints=str(tmp_path), out=tmp_path / "o")
    with pytest.raises(CheckpointError, match="not a readable PyTorch checkpoint"):
        observe(checkpoint=str(smoke_run / "config.yaml"), out=tmp_path / "o")
    with pytest.raises(ObserveError, match="already holds geometry records"):
        observe(checkpoint=str(smoke_run / "checkpoints" / "last.ckpt"), out=smoke_run)
    with pytest.raises(ObserveError, match="only apply to --timm"):
        observe(checkpoint=str(smoke_run / "checkpoints" / "last.ckpt"), weights="w.pth", out=tmp_path / "o")
    with pytest.raises(ObserveError, match="bad override"):
        observe(timm_name="vit_tiny_patch16_224", out=tmp_path / "o", overrides=["data.no_such_key=1"])
    with pytest.raises(ObservationSettingsError, match=r"observation\.gram_dtype: expected one of"):
        observe(timm_name="vit_tiny_patch16_224", out=tmp_path / "o", overrides=["observation.gram_dtype=float16"])
    assert not (tmp_path / "o").exists()  # every check ran before anything was written


def test_a_run_saved_before_the_observation_group_keeps_its_settings(tmp_path: Path):
    """Runs trained before ``observation`` existed kept their settings in the callback node; they still apply."""
    from omegaconf import OmegaConf

    from tgo.observe import compose_observe_config

    run = tmp_path / "old_run"
    run.mkdir()
    OmegaConf.save(
        {
            "data": {"_target_": "tgo.data.TGODataModule", "source": "digits"},
            "callbacks": {
                "spectral_geometry": {
                    "_target_": "tgo.callbacks.spectral_geometry.SpectralGeometryCallback",
                    "every_n_epochs": 1,
                    "gram_dtype": "float32",
                    "fit_range": [2, 9],
                    "covariance_epochs": [0, 4],
                }
            },
        },
        run / "config.yaml",
    )
    obs = compose_observe_config(["observation.fit_range=[1,5]"], run).observation
    assert (obs.gram_dtype, list(obs.keep_covariance), list(obs.fit_range)) == ("float32", [0, 4], [1, 5])


@pytest.mark.slow
def test_two_processes_share_the_summary_and_agree_with_one_process(tmp_path: Path, timm_observed: Path):
    """``fabric.devices=2``: each process summarises its share of the points, gathered over TGO's gloo group to rank
    0, which records them; every record agrees with one process's (the 2-rank sums are added in another order; the
    shared summary itself is bitwise: tests/observatory/test_share.py, tests/test_ddp.py)."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "tgo.observe", "--timm", "vit_tiny_patch16_224", "--seed", "3"]
    command += ["--out", str(tmp_path / "two"), *TINY_TIMM, "fabric.devices=2", "fabric.strategy=ddp"]
    done = subprocess.run(
        [*command, "fabric.accelerator=cpu"], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    two, one = metric_values(tmp_path / "two", 0), metric_values(timm_observed, 0)  # the same command, one process
    assert list(two) == list(one) and any(key[1] == "cls" for key in one)
    for key, value in one.items():  # attention: float32 weights on a CPU (observation.attention.dtype=auto)
        rel = 1e-6 if key[1] == "attention" else 1e-9
        assert two[key] == pytest.approx(value, rel=rel, abs=1e-12, nan_ok=True), key
